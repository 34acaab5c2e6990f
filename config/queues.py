"""The `<SOW>` section: queues over topics recorded in the transaction log.

docs/configuration.md ("`<Queue>`") describes every element. A queue's checks that span elements
live here: at-most-once queues refuse the settings that would do nothing there, a dead-letter
topic may not be the queue's own, the underlying topic must be recorded by the journal, and a
`<DefaultPublishTarget>` must be one of the underlying topics.

`<UnderlyingTopic>` is a literal topic or a pattern over topic names (seed 004: "a view over an
underlying topic or set of topics"; RE2, whole name, the same rule as subscription topics: a
pattern has one of `^ $ * + ? { } [ ] | ( )` or a backslash; a lone `.` does not make one). Of
the topics a pattern matches, only the recorded ones can join the queue; whether the pattern
and the transaction log's `<Topic>` patterns overlap cannot be checked here.
"""

from __future__ import annotations

from typing import cast

from protocol.patterns import PatternError, compile_pattern

from .model import (
    DEFAULT_LEASE_PERIOD,
    FairnessModel,
    Leasing,
    MessageType,
    QueueSpec,
    Semantics,
    TransactionLog,
    is_topic_pattern,
)
from .rules import Checker, Section, at_least, enum, literal_topic, message_type, positive_interval
from .schema import QUEUE
from .values import parse_count
from .xmltree import Node

__all__ = ["is_topic_pattern", "read_queue"]


def _filter_expression(text: str) -> str:
    """A `<Filter>` or `<BarrierExpression>`: checked here, so a bad one is a configuration
    problem with its line, not a failure when the server starts the queue."""
    from protocol.filters import FilterError, compile_filter  # the server's own filter compiler

    try:
        compile_filter(text)
    except FilterError as e:
        raise ValueError(f"{e}; a queue's filter is written as a subscription's") from None
    return text


def underlying_topic(text: str) -> str:
    """A literal topic name, or a pattern RE2 can run."""
    if not is_topic_pattern(text):
        return literal_topic(text)
    try:
        compile_pattern(text)
    except PatternError as exc:
        raise ValueError(str(exc)) from None
    return text


def read_queue(
    checker: Checker, qnode: Node, tlog: TransactionLog | None, tlog_node: Node | None
) -> QueueSpec | None:
    """One `<Queue>`; None when its name or underlying topic is unusable (already reported)."""
    q = Section(checker, qnode, QUEUE)
    name = q.value("Name", literal_topic, None, required=True, hint=" (the queue's topic)")
    underlying = q.value("UnderlyingTopic", underlying_topic, None)
    if not q.has("UnderlyingTopic"):
        underlying = name  # the AMPS default; an invalid one stays None (reported)
    mtype = q.value("MessageType", message_type, "json")
    semantics = q.value("Semantics", enum("at-least-once", "at-most-once"), "at-least-once")
    at_most_once = semantics == "at-most-once"
    lease_period = q.value("LeasePeriod", positive_interval, DEFAULT_LEASE_PERIOD)
    per_sub = q.value("MaxPerSubscriptionBacklog", at_least(parse_count, 1, "of 1"), 1)
    max_backlog = q.value("MaxBacklog", at_least(parse_count, 1, "of 1"), None)
    fairness = q.value(
        "FairnessModel",
        enum("fast", "round-robin", "proportional"),
        "round-robin" if at_most_once else "proportional",
    )
    max_deliveries = q.value("MaxDeliveries", parse_count, 0)
    max_cancels = q.value("MaxCancels", parse_count, 0)
    expiration = q.value("Expiration", positive_interval, None)
    leasing = q.value("Leasing", enum("strict", "sublet"), "sublet")
    filter_ = q.value("Filter", _filter_expression, None)
    barrier = q.value("BarrierExpression", _filter_expression, None)
    dead_letter = q.value("DeadLetterTopic", literal_topic, None)
    target = q.value("DefaultPublishTarget", literal_topic, None)
    pattern = underlying is not None and is_topic_pattern(underlying)

    if at_most_once:
        if fairness != "round-robin":
            checker.report(
                q.at("FairnessModel"),
                f"at-most-once queues only allow round-robin fairness, not {fairness}; "
                "remove <FairnessModel> or make the queue at-least-once",
            )
            fairness = "round-robin"
        for element in ("LeasePeriod", "MaxDeliveries", "MaxCancels", "Leasing"):
            if q.has(element):
                checker.report(
                    q.at(element),
                    f"<{element}> has no effect on an at-most-once queue (a message leaves "
                    "the queue when it is delivered); remove it or use at-least-once",
                )
    if dead_letter is not None and (
        dead_letter in (name, underlying)
        or (pattern and compile_pattern(underlying).fullmatch(dead_letter))  # type: ignore[arg-type]
    ):
        checker.report(
            q.at("DeadLetterTopic"),
            f"the dead-letter topic {dead_letter!r} is this queue's own topic; expired "
            "messages would come straight back; choose another topic",
        )
    if target is not None and underlying is not None:
        if not (compile_pattern(underlying).fullmatch(target) if pattern else target == underlying):
            checker.report(
                q.at("DefaultPublishTarget"),
                f"the default publish target {target!r} is not one of the underlying topics "
                f"{underlying!r}: what is published there would not join the queue",
            )
    if underlying is not None:
        where = q.one("UnderlyingTopic") or q.one("Name") or qnode
        recorded_name = target if pattern else underlying
        if tlog is None:
            checker.report(
                where,
                f"queue {name!r} needs its underlying topic {underlying!r} recorded in a "
                f"transaction log; add <TransactionLog> with <Topic><Name>{underlying}"
                "</Name></Topic>",
            )
        elif recorded_name is not None and not tlog.records_topic(recorded_name):
            assert tlog_node is not None
            checker.report(
                where,
                f"the {'default publish target' if pattern else 'underlying topic'} "
                f"{recorded_name!r} of queue {name!r} is not recorded in the transaction log "
                f"(line {tlog_node.line}); add <Topic><Name>{recorded_name}</Name></Topic> to "
                "<TransactionLog>",
            )
    if name is None or underlying is None:
        return None
    return QueueSpec(
        name=name,
        underlying_topic=underlying,
        message_type=cast(MessageType, mtype),
        semantics=cast(Semantics, semantics),
        lease_period=lease_period,
        max_per_subscription_backlog=per_sub,
        max_backlog=max_backlog,
        fairness_model=cast(FairnessModel, fairness),
        max_deliveries=max_deliveries,
        max_cancels=max_cancels,
        expiration=expiration,
        leasing=cast(Leasing, leasing),
        filter=filter_,
        barrier_expression=barrier,
        dead_letter_topic=dead_letter,
        default_publish_target=target,
    )
