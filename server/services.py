"""What every session of a server shares (`SessionServices`): the narrow doors to the server's
parts, built once by the server (server/app.py) and handed to each Session. The `guard` is the
door to security: without one, logons are open and nothing is checked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocol.filters import FilterError, compile_filter

from .counters import Counters
from .guard import Guard
from .outbox import Outbox
from .pipeline import Pipeline
from .queues import QueueManager
from .replay_engine import ReplayEngine
from .sow import SowManager
from .subscription_table import LiveIndex
from .topics import TopicPolicy

__all__ = ["NamedClient", "SessionServices", "compile_now"]


def compile_now(text: str) -> Any:
    """The compiled filter, or the FilterError that says why it does not compile."""
    try:
        return compile_filter(text)
    except FilterError as exc:
        return exc


class NamedClient(Protocol):
    """A logged-on session, as another logon with the same client name sees it."""

    user_id: str | None
    out: Outbox


@dataclass(frozen=True, slots=True)
class SessionServices:
    instance: str
    has_journal: bool
    max_subscriptions: int  # <ClientMaxSubscriptions>
    names: dict[str, NamedClient]  # logged-on client names
    pipeline: Pipeline
    queues: QueueManager
    replays: ReplayEngine
    index: LiveIndex
    topics: TopicPolicy
    counters: Counters
    limit_counts: dict[str, int]  # the intake's refusal counts (server/intake.py)
    call_later: Callable[[float, Callable[[], None]], asyncio.TimerHandle]
    # compile_later(text, done): compile a filter off the event loop, then done(the predicate or
    # the FilterError) on the loop; the default compiles at once (tests without a server)
    compile_later: Callable[[str, Callable[[Any], None]], None] = field(
        default=lambda text, done: done(compile_now(text))
    )
    guard: Guard = field(default_factory=Guard)  # logons, entitlements (server/guard.py)
    sow: SowManager | None = None  # State of the World topics (server/sow/); None without any
    # why logons are refused now (a new journal catching up, server/replication/catchup.py)
    logons_refused: Callable[[], str | None] = lambda: None
    # a client logged on under publisher id `pub`, told its highest stored `seq`: replication
    # hands off what it published on other instances (server/replication/handoff.py)
    publisher_logon: Callable[[int, int], None] = lambda pub, seq: None
