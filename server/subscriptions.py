"""A subscription: what one client asked for under one sub_id, and the state it is in.

The states and what moves a subscription between them are owned by its session's
`SubscriptionTable` (server/subscription_table.py, where the diagram is); the engines read the
state (live fan-out delivers to LIVE, or LIVE_EARLY at publish time) and report the events that
change it through the subscription's `owner` (`SubscriptionOwner`).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
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


@dataclass(eq=False, repr=False, slots=True)
class Subscription:
    owner: SubscriptionOwner
    out: Outbox
    sub_id: str
    # Shared, not copied per subscription: thousands subscribe to one topic with no options
    topic: str
    regex: Any  # a compiled pattern for a regex topic, else None
    filter: Predicate | None
    filter_text: str | None
    opts: SubscribeOptions
    acks: frozenset[str]
    cid: Any
    bookmark: str | None = None  # the `bm` it was made with: a bookmark subscription
    # the content entitlement alone (server/guard.py Grant), for out-of-focus reasons
    entitled: Predicate | None = field(default=None, init=False)
    timestamp: bool = field(init=False)
    prefix: bytes = field(init=False)
    state: SubState = field(default=SubState.LIVE, init=False)
    replay: Any = field(default=None, init=False)  # the Replay feeding it (server/replay.py)
    queue: Any = field(default=None, init=False)  # a queue subscription's Queue (server/queue.py)
    topic_b: bytes = field(init=False)
    regex_b: Any = field(default=None, init=False)
    acked_bm: tuple[int, int] | None = field(default=None, init=False)  # last `persisted` bm
    # a bookmark subscription over a pattern is a stream of the transaction log: before the
    # join (the replay reads only recorded topics) and after it (seed 001)
    recorded_only: bool = field(init=False)
    conflation: Any = field(default=None, init=False)  # a LiveConflation (server/conflation.py)
    journal_fed: bool = field(default=False, init=False)  # TopicPolicy.journal_fed

    def __post_init__(self) -> None:
        self.topic = topic = sys.intern(self.topic)
        opts = self.opts
        self.opts = _NO_OPTIONS if opts == _NO_OPTIONS else opts
        self.timestamp = opts.timestamp
        self.prefix = frames.sub_prefix(self.sub_id)
        self.topic_b = _topic_bytes(topic)
        if self.regex is not None:
            try:
                self.regex_b = compile_pattern(self.topic_b)
            except PatternError:  # pragma: no cover - the str pattern compiled already
                self.regex_b = None
        self.recorded_only = self.regex is not None and self.bookmark is not None

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
