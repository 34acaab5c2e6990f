"""A subscription: what one client asked for under one sub_id, and the state it is in.

The states and what moves a subscription between them are owned by its session's
`SubscriptionTable` (server/subscription_table.py, where the diagram is); the engines read the
state (live fan-out delivers to LIVE, or LIVE_EARLY at publish time) and report the events that
change it through the subscription's `owner` (`SubscriptionOwner`).
"""

from __future__ import annotations

import functools
import sys
from enum import Enum
from typing import Any, Protocol

from protocol.options import SubscribeOptions
from protocol.patterns import PatternError, compile_pattern

from . import frames
from .matching import Predicate
from .outbox import Outbox

__all__ = ["LIVE_STATES", "SubState", "Subscription", "SubscriptionOwner", "ack_types"]


class SubState(Enum):
    REPLAYING = "replaying"  # a Replay feeds it from the journal
    PAUSED = "paused"  # its Replay waits for resume (or, paused when live, a new one)
    LIVE = "live"  # live fan-out of committed messages
    LIVE_EARLY = "live-early"  # live fan-out at publish time (`live` option), before the commit
    QUEUED = "queued"  # a queue subscription: its queue delivers
    REMOVED = "removed"  # unsubscribed, range done, or its connection closed


LIVE_STATES = (SubState.LIVE, SubState.LIVE_EARLY)
_NO_OPTIONS = SubscribeOptions()


@functools.lru_cache(maxsize=4096)
def _topic_bytes(topic: str) -> bytes:
    return topic.encode()


class SubscriptionOwner(Protocol):
    """What engines may tell the table that owns a subscription."""

    def describe(self) -> str: ...
    def went_live(self, sub: Subscription) -> None: ...
    def range_done(self, sub: Subscription) -> None: ...


class Subscription:
    __slots__ = (
        "acked_bm",
        "acks",
        "bookmark",
        "cid",
        "conflation",
        "entitled",
        "filter",
        "filter_text",
        "journal_fed",
        "opts",
        "out",
        "owner",
        "prefix",
        "queue",
        "recorded_only",
        "regex",
        "regex_b",
        "replay",
        "state",
        "sub_id",
        "timestamp",
        "topic",
        "topic_b",
    )

    def __init__(
        self,
        owner: SubscriptionOwner,
        out: Outbox,
        sub_id: str,
        topic: str,
        regex: Any,
        filt: Predicate | None,
        filter_text: str | None,
        opts: SubscribeOptions,
        acks: frozenset[str],
        cid: Any,
        bookmark: str | None = None,
    ) -> None:
        self.owner = owner
        self.out = out
        self.sub_id = sub_id
        # Shared, not copied per subscription: thousands subscribe to one topic with no options
        self.topic = sys.intern(topic)
        self.regex = regex  # a compiled pattern for a regex topic, else None
        self.filter = filt
        self.filter_text = filter_text
        # the content entitlement alone (server/guard.py Grant), for out-of-focus reasons
        self.entitled: Predicate | None = None
        self.opts = _NO_OPTIONS if opts == _NO_OPTIONS else opts
        self.timestamp = opts.timestamp
        self.prefix = frames.sub_prefix(sub_id)
        self.state = SubState.LIVE
        self.bookmark = bookmark  # the `bm` it was made with: a bookmark subscription
        self.replay: Any = None  # the Replay feeding it (server/replay.py), if any
        self.queue: Any = None  # the Queue of a queue subscription (server/queue.py)
        self.acks = acks
        self.cid = cid
        self.topic_b = _topic_bytes(self.topic)
        self.regex_b = None
        if regex is not None:
            try:
                self.regex_b = compile_pattern(self.topic_b)
            except PatternError:  # pragma: no cover - the str pattern compiled already
                self.regex_b = None
        self.acked_bm: tuple[int, int] | None = None  # the last periodic `persisted` bookmark
        # a bookmark subscription over a pattern is a stream of the transaction log: before the
        # join (the replay reads only recorded topics) and after it (seed 001)
        self.recorded_only = regex is not None and bookmark is not None
        self.conflation: Any = None  # a LiveConflation (server/conflation.py) on the live stream
        self.journal_fed = False  # all it gets is in the journal (TopicPolicy.journal_fed)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def matches_topic(self, topic: str) -> bool:
        return (
            self.regex.fullmatch(topic) is not None
            if self.regex is not None
            else topic == self.topic
        )

    def matches_topic_bytes(self, topic: bytes) -> bool:
        if self.regex is None:
            return topic == self.topic_b
        if self.regex_b is not None:
            return self.regex_b.fullmatch(topic) is not None
        return self.regex.fullmatch(topic.decode("utf-8", "replace")) is not None


@functools.lru_cache(maxsize=256)
def ack_types(a: str | None) -> frozenset[str]:
    """The ack types of an `a` header ("processed,completed"), shared between callers."""
    if not a:
        return frozenset()
    return frozenset(x.strip() for x in a.split(",") if x.strip())
