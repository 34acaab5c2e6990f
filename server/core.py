"""The server's core: the parts below the listeners, built and wired in one place.

`build_core` is what `Server.start` (server/app.py) builds once the journal is open and before
it opens listeners, and what the tests' in-process core (tests/server/core_harness.py) builds
over a journal in tmp_path: the counters and intake limits, the live fan-out and its router,
the pipeline, the sync gate (with replication destinations and a journal), the replay engine,
the queues, the State of the World store (with `<SOW><Topic>`s), the live index, the idle
poller and the sessions' shared services. The caller recovers the queues and the SOW store
(`queues.recover()`, `sow.recover()`: blocking, the server runs them on an executor), then
calls `attach_recovered`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from config.model import Config
from journal.journal import Journal

from .counters import Counters
from .fanout import Fanout
from .guard import Guard
from .intake import Intake
from .pipeline import Pipeline
from .queues import QueueManager
from .replay_engine import ReplayEngine
from .replication.sync import SyncGate
from .router import Router
from .services import SessionServices, compile_now
from .sow import SowManager
from .subscription_table import LiveIndex
from .topics import TopicPolicy

__all__ = ["Core", "IdlePoller", "build_core"]


@dataclass(eq=False, repr=False)
class IdlePoller:
    """Network input arrived: keep the loop polling for <IdlePoll> before it sleeps.

    While a callback is ready the event loop polls its sockets without blocking, so a reply
    that comes back within the window (a queue consumer's next ack, a request/response client)
    is read at once; a sleeping CPU takes tens of microseconds to wake on a virtual machine,
    more than the server's own work per round trip. Go runtimes spin the same way. A commit in
    flight needs the GIL back when its fdatasync returns (`busy`): then the loop sleeps.
    """

    loop: asyncio.AbstractEventLoop
    window: float
    busy: Callable[[], bool]
    rounds: int = field(default=0, init=False)  # loop iterations spent polling (stats)
    _polling: bool = field(default=False, init=False)
    _input_at: float = field(default=0.0, init=False)

    def input_seen(self, now: float) -> None:
        # The window runs from the end of the read's work, not `now` (its start): an inline
        # commit outlasts the window, and a loop that sleeps right after it misses the next
        # publish of a one-in-flight publisher by a wake-up.
        self._input_at = time.monotonic()
        if not self._polling and self.window:
            self._polling = True
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        if not self.busy() and time.monotonic() - self._input_at < self.window:
            self.rounds += 1
            self.loop.call_soon(self._poll)
        else:
            self._polling = False


@dataclass(eq=False)
class Core:
    journal: Journal | None
    counters: Counters
    intake: Intake
    fanout: Fanout
    pipeline: Pipeline
    gate: SyncGate | None  # with <Replication> destinations (and a journal)
    replays: ReplayEngine
    queues: QueueManager
    sow: SowManager | None  # with <SOW><Topic>s (and a journal)
    index: LiveIndex
    poller: IdlePoller
    services: SessionServices

    def attach_recovered(self) -> None:
        """After `queues.recover()` (and `sow.recover()`): committed messages reach the queues
        (without queues they need no Message objects) and the SOW store."""
        if self.queues.queues:
            self.queues.attach(self.pipeline)
        if self.sow is not None:
            self.sow.attach(self.pipeline, self.fanout.router)
            self.pipeline.topics.keyed = self.sow.is_sow
            self.pipeline.topics.key_spec = self.sow.key_spec


def build_core(
    config: Config,
    journal: Journal | None,
    recorded: Callable[[str], bool],
    loop: asyncio.AbstractEventLoop,
    readers: concurrent.futures.Executor,
    guard: Guard,
    on_backlog: Callable[[bool], None],
    instance: str | None = None,
    compile_later: Callable[[str, Callable[[Any], None]], None] | None = None,
    logons_refused: Callable[[], str | None] | None = None,
    publisher_logon: Callable[[int, int], None] | None = None,
) -> Core:
    """The core for `config` over `journal` (None: nothing is recorded). `recorded`: whether a
    topic is stored; `readers`: the executor replays read on; `on_backlog`: told when the
    journal falls behind and catches up; `instance`: the name (the configuration's by default);
    `compile_later`: compiles a large filter off the loop (the server's filter thread; by
    default at once, on the caller's thread); `logons_refused`: why logons are refused now (a
    new journal catching up from its replication peers), None while they are served;
    `publisher_logon(pub, seq)`: a client logged on, told `seq` (replication's handoff of a
    publisher that moved here)."""
    name = config.name if instance is None else instance
    counters = Counters()
    intake = Intake(config.limits)
    fanout = Fanout(Router())
    pipeline = Pipeline(
        journal, recorded, loop, fanout, on_backlog, config.limits.publish_memory_limit
    )
    gate = None
    dests = config.replication.destinations
    if dests and journal is not None:
        gate = SyncGate(
            ((d.name, d.sync, d.downgrade_after) for d in dests),
            lambda: pipeline.delivered_end,
            loop.call_later,
        )
        pipeline.attach_gate(gate)
        gate.start()
    replays = ReplayEngine(
        journal,
        readers,
        pipeline,
        (lambda: gate.durable_end) if gate is not None and gate.has_sync else None,
    )
    queues = QueueManager(
        config.queues if journal is not None else (),
        name,
        journal,
        loop,
        pipeline,
        config.replication,
    )
    sow = SowManager(config, journal) if config.sow_topics and journal is not None else None
    index = LiveIndex(fanout.router, fanout, pipeline)
    poller = IdlePoller(loop, config.limits.idle_poll, lambda: pipeline.inflight_batches > 0)
    services = SessionServices(
        instance=name,
        has_journal=journal is not None,
        max_subscriptions=config.limits.client_max_subscriptions,
        names={},
        pipeline=pipeline,
        queues=queues,
        replays=replays,
        index=index,
        topics=TopicPolicy(config, journal is not None),
        counters=counters,
        limit_counts=intake.counts,
        call_later=loop.call_later,
        guard=guard,
        compile_later=compile_later or (lambda text, done: done(compile_now(text))),
        sow=sow,
        logons_refused=logons_refused or (lambda: None),
        publisher_logon=publisher_logon or (lambda pub, seq: None),
    )
    return Core(
        journal,
        counters,
        intake,
        fanout,
        pipeline,
        gate,
        replays,
        queues,
        sow,
        index,
        poller,
        services,
    )
