"""The `<SOW><Topic>` elements: State of the World topics (docs/sow.md).

docs/configuration.md ("`<Topic>` in `<SOW>`") describes every element. A SOW topic keeps the
latest message per key of a topic recorded in the transaction log; the journal stays the one
source of truth, so a SOW topic the journal does not record is a problem here, with the
`<Topic>` to add. `<Name>` is a literal topic or a pattern over topic names (the rule of
`config.queues.is_topic_pattern`); of the topics a pattern matches, only recorded ones are SOW
topics. `<Key>` paths are written as filter fields (`/sym`, `/a/b`, `/arr[0]`) and checked by
the filter engine's own path reader, the one that evaluates them.
"""

from __future__ import annotations

from typing import cast

from .model import MessageType, QueueSpec, SowTopicSpec, TransactionLog
from .queues import is_topic_pattern, read_queue, underlying_topic
from .rules import Checker, Section, message_type, positive_interval, size_between
from .schema import SOW, SOW_HISTORY, SOW_TOPIC
from .xmltree import Node

__all__ = ["read_sow", "read_sow_topics"]


def _key_path(text: str) -> str:
    from protocol.filters import FilterError, compile_path  # the filter engine's path reader

    try:
        compile_path(text)
    except FilterError as e:
        raise ValueError(f"{e}; a <Key> is one field path, such as /sym or /order/id") from None
    return text


def _expiration(text: str) -> float | None:
    """An interval, or AMPS's `disabled` (no expiration)."""
    if text.lower() == "disabled":
        return None
    return positive_interval(text)


def read_sow_topics(
    checker: Checker,
    nodes: list[Node],
    tlog: TransactionLog | None,
    tlog_node: Node | None,
    queues: list[QueueSpec],
) -> list[SowTopicSpec]:
    """The `<Topic>` elements of `<SOW>`: names unique, recorded, not a queue's name."""
    topics = []
    names: dict[str, Node] = {}
    queue_names = {q.name for q in queues}
    for tnode in nodes:
        topic = _read_topic(checker, tnode, tlog, tlog_node)
        if topic is None:
            continue
        if topic.name in names:
            checker.report(
                tnode,
                f"SOW topic {topic.name!r} is already defined at line {names[topic.name].line}; "
                "give each <SOW><Topic> its own <Name>",
            )
            continue
        if topic.name in queue_names:
            checker.report(
                tnode,
                f"{topic.name!r} is both a queue and a SOW topic; a queue name is a topic of "
                "its own: rename one of them",
            )
            continue
        names[topic.name] = tnode
        topics.append(topic)
    return topics


def _read_topic(
    checker: Checker, tnode: Node, tlog: TransactionLog | None, tlog_node: Node | None
) -> SowTopicSpec | None:
    t = Section(checker, tnode, SOW_TOPIC)
    name = t.value("Name", underlying_topic, None, required=True, hint=" (a topic or a regex)")
    mtype = t.value("MessageType", message_type, "json")
    keys: list[str] = []
    seen: set[str] = set()
    for knode in t.many("Key"):
        text = checker.leaf(knode)
        if text is None:
            continue
        try:
            path = _key_path(text)
        except ValueError as e:
            checker.report(knode, str(e))
            continue
        if path in seen:
            checker.report(knode, f"<Key> {path} is given twice; keep one")
            continue
        seen.add(path)
        keys.append(path)
    expiration = t.value("Expiration", _expiration, None)
    window = None
    hnode = t.one("History")
    if hnode is not None:
        h = Section(checker, hnode, SOW_HISTORY)
        window = h.value("Window", positive_interval, None)
    if name is None:
        return None
    where = t.at("Name")
    if tlog is None:
        checker.report(
            where,
            f"SOW topic {name!r} must be recorded in a transaction log (the SOW store is kept "
            f"from the journal); add <TransactionLog> with <Topic><Name>{name}</Name></Topic>",
        )
    elif not is_topic_pattern(name) and not tlog.records_topic(name):
        assert tlog_node is not None
        checker.report(
            where,
            f"SOW topic {name!r} is not recorded in the transaction log (line "
            f"{tlog_node.line}); the SOW store is kept from the journal: add "
            f"<Topic><Name>{name}</Name></Topic> to <TransactionLog>",
        )
    return SowTopicSpec(
        name=name,
        message_type=cast(MessageType, mtype),
        keys=tuple(keys),
        expiration=expiration,
        history_window=window,
    )


def read_sow(
    checker: Checker, node: Node | None, tlog: TransactionLog | None, tlog_node: Node | None
) -> tuple[list[QueueSpec], list[SowTopicSpec], int | None]:
    """The queues, the SOW topics (config.sow) and `<MaxCheckpointSize>` of `<SOW>` (none
    without it); queue names are unique.

    `tlog` and `tlog_node` are the transaction log and its element, or None without one.
    """
    if node is None:
        return [], [], None
    sec = Section(checker, node, SOW)
    max_checkpoints = sec.value(
        "MaxCheckpointSize", size_between(1, None, "MaxCheckpointSize"), None
    )
    queues = []
    names: dict[str, Node] = {}
    for qnode in sec.many("Queue"):
        queue = read_queue(checker, qnode, tlog, tlog_node)
        if queue is None:
            continue
        checker.unique_name(names, "queue", queue.name, qnode)
        queues.append(queue)
    topics = read_sow_topics(checker, sec.many("Topic"), tlog, tlog_node, queues)
    return queues, topics, max_checkpoints
