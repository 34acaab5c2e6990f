"""The server's lifecycle: start, listeners, the periodic tick, the ordered shutdown.

`Server` builds the parts and wires each with the narrow collaborators it uses (nothing below
holds the server): the journal, the pipeline and its live fan-out, the queues, the replay
engine, the sessions' shared services, the connection registry, statistics and the admin
endpoint, journal maintenance. docs/architecture.md draws the rooms and their doors.

    created -> start() -> serving -> shutdown(reason) -> stopped

Shutdown runs in a fixed order with a timeout (CONVENTIONS 10): stop accepting; stop reading
from every connection; cancel replays; commit what was received; wait for the journal
(bounded); send the last acks; close every connection with reason `shutdown`; stop the tick,
the admin endpoint and maintenance; close the journal.

Security (server/guard.py) is built first: a certificate or password file that no longer loads
stops the start. `reload(config)` (SIGHUP, server/cli.py) re-reads the password file, the roles
and the certificates, and re-checks every open subscription against the new roles.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from config.model import Config
from journal.fileio import io_from_env
from journal.journal import Journal
from journal.record import raw_origin
from protocol.security.tls import ServerTls, server_context

from . import frames, splice
from .admin import AdminEndpoint
from .admission import Admission
from .connection import Connection, ConnectionEnv, Connections
from .core import build_core
from .guard import Guard, build_guard
from .maintenance import Maintenance
from .pipeline import Pipeline
from .reasons import Disconnect
from .replication import AckSink, NullAckSink
from .replication.catchup import CatchUp
from .replication.handoff import foreign_tail
from .replication.identity import journal_identity
from .replication.receiver import Receiver
from .replication.sender import Sender
from .replication.sync import SyncGate, UnknownDestination
from .services import compile_now
from .session_rights import recheck
from .sow import SowManager
from .sow.query_console import SowConsole
from .stats import Stats
from .tls_accept import TlsAcceptor
from .topics import never

log = logging.getLogger("tickertape.server")

HEARTBEAT_TICK = 0.2
SHUTDOWN_TIMEOUT = 10.0


def _read_password(path: str | None) -> str | None:
    """A replication link's password: the first line of its file (read at each connect)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\r\n")


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.name = config.name
        self.journal: Journal | None = None
        self.connections = Connections()
        self.listeners: list[asyncio.Server] = []
        self.acceptors: list[TlsAcceptor] = []  # the TLS handshakes of tcps transports
        self.guard = Guard()
        self.addresses: list[tuple[str, str, int]] = []  # (transport name, host, port)
        self.admin: AdminEndpoint | None = None
        self.gate: SyncGate | None = None  # with <Replication> destinations (and a journal)
        self.jid: str | None = None  # the journal's identity, with replication
        self.catch_up: CatchUp | None = None  # a new journal with sync destinations
        self.maintenance: Maintenance | None = None
        self.readers = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="journal-reader"
        )
        # large filters are compiled here, one at a time, never on the event loop
        # (SessionServices.compile_later)
        self.filter_compiler = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="filter-compile"
        )
        self._ticker: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self.started_at = time.time()
        self.shutting_down = False
        self.receiver: Receiver | None = None
        self.sow: SowManager | None = None
        self.senders: list[Sender] = []
        # what the senders report: the SyncGate when there are destinations (and a journal)
        self.repl_sink: AckSink = NullAckSink()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        config = self.config
        self.guard = build_guard(config)
        tl = config.transaction_log
        recorded: Callable[[str], bool] = never
        if tl is not None:
            faults = io_from_env()  # tests and the fault campaign only (journal/fileio.py)
            if faults is not None:
                log.warning(
                    "fault injection enabled: TICKERTAPE_FAULTS=%s", os.environ["TICKERTAPE_FAULTS"]
                )
            self.journal = await loop.run_in_executor(
                None,
                lambda: Journal(tl.journal_directory, tl.journal_size, tl.durability, io=faults),
            )
            recorded = tl.records_topic
        journal = self.journal
        dests = config.replication.destinations
        if (
            journal is not None
            and tl is not None
            and (dests or any(t.type == "replication" for t in config.transports))
        ):
            jid, made = await loop.run_in_executor(None, journal_identity, tl.journal_directory)
            self.jid = jid
            new = made and journal.end_position == journal.start_position
            first = [d.name for d in dests] if new else []
            self.catch_up = CatchUp(jid, first, self._close_clients, loop.call_later)
        core = build_core(
            config,
            journal,
            recorded,
            loop,
            self.readers,
            self.guard,
            self.connections.backlog,
            compile_later=self._compile_later,
            logons_refused=self.catch_up.reason if self.catch_up is not None else lambda: None,
            publisher_logon=self._publisher_logon,
        )
        self.counters, self.intake, self.fanout = core.counters, core.intake, core.fanout
        self.pipeline, self.gate, self.replays = core.pipeline, core.gate, core.replays
        self.queues, self.index, self.poller = core.queues, core.index, core.poller
        services = core.services
        if self.gate is not None:
            self.repl_sink = self.gate
        await loop.run_in_executor(None, self.queues.recover)
        if core.sow is not None:  # State of the World (server/sow/)
            await loop.run_in_executor(None, core.sow.recover)
        core.attach_recovered()
        self.sow = core.sow
        gate = self.gate
        env = ConnectionEnv(
            registry=self.connections,
            intake=self.intake,
            counters=self.counters,
            services=services,
            max_logon_message_size=config.limits.max_logon_message_size,
            max_client_buffer=config.limits.client_max_buffer_size,
            max_publish_inflight=config.limits.client_publish_memory_limit,
            offline_threshold=config.limits.offline_threshold,
            input_seen=self.poller.input_seen,
            admission=Admission(config.limits, self.intake.counts),
        )
        self.stats = Stats(
            self.name,
            self.started_at,
            self.counters,
            self.intake,
            self.connections,
            self.pipeline,
            self.fanout,
            journal,
            self.queues,
            self.replays,
            lambda: self.poller.rounds,
        )
        if self.sow is not None:  # the console's and /stats' view of the SOW topics
            self.stats.sow = SowConsole(self.sow, self.replays.readers)
        if gate is not None:
            self.stats.replication = gate.snapshot
            self.stats.held_batches = lambda: gate.held
        log.info(
            "stored messages are framed by %s",
            "the C accelerator (server/_splice.c)"
            if splice.ACCELERATED
            else "pure Python (server/splice.py): no C accelerator was built, or TICKERTAPE_PURE_PYTHON is set",
        )
        for t in config.transports:
            if t.type == "replication":
                continue  # not a client listener: _start_replication
            factory: Callable[[], asyncio.Protocol]
            if t.type == "tcps":
                acceptor = TlsAcceptor(
                    env,
                    t.name,
                    t.max_message_size,
                    self.guard.tls[t.name],
                    config.limits.logon_timeout,
                )
                self.acceptors.append(acceptor)
                factory = acceptor.protocol
            else:
                factory = partial(Connection, env, t.name, t.max_message_size)
            srv = await loop.create_server(
                factory, t.host, t.port, reuse_address=True, backlog=1024
            )
            self.listeners.append(srv)
            host, port = srv.sockets[0].getsockname()[:2]
            self.addresses.append((t.name, host, port))
            log.info(
                "listening on %s:%d (transport %s, %s/%s%s)",
                host,
                port,
                t.name,
                t.protocol,
                t.message_type,
                ", TLS" if t.type == "tcps" else "",
            )
        await self._start_replication()
        if self.catch_up is not None:
            # a journal made at this start: whether a peer knew another journal of this
            # instance is known before the server says it is ready
            await self.catch_up.first_answers()
        if config.admin is not None:
            self.admin = AdminEndpoint(
                self.stats,
                self.name,
                config.admin.host,
                config.admin.port,
                self.guard,
                self._disconnect_client,
                self._run_action,
                self._replication,
                config.admin.allowed_hosts,
                self.stats.sow,
            )
            await self.admin.start()
        self._ticker = loop.create_task(self._tick())
        if journal is not None:
            self.maintenance = Maintenance(config, journal, loop, self.replays.floor)
            self.maintenance.start()
            self.stats.actions = self.maintenance.status

    async def _start_replication(self) -> None:
        """The replication listeners (`replication` transports) and one sender per destination
        (server/replication/); both need the journal."""
        config = self.config
        inbound = [t for t in config.transports if t.type == "replication"]
        if not inbound and not config.replication.destinations:
            return
        journal = self.journal
        if journal is None:
            log.error("replication is configured but there is no <TransactionLog>: not started")
            return
        self.receiver = Receiver(
            self.name,
            self.pipeline,
            journal,
            self.guard,
            self.queues,
            self.jid,
            self.catch_up,
        )
        self.stats.replication_sources = self.receiver.snapshot
        for t in inbound:
            ctx = server_context(ServerTls.of(t)) if t.certificate and t.private_key else None
            srv = await asyncio.start_server(
                self.receiver.handle, t.host, t.port, ssl=ctx, reuse_address=True
            )
            self.listeners.append(srv)
            host, port = srv.sockets[0].getsockname()[:2]
            self.addresses.append((t.name, host, port))
            log.info(
                "replication listener on %s:%d (transport %s%s)",
                host,
                port,
                t.name,
                ", TLS" if ctx else "",
            )
        if inbound:
            self.queues.links_listening()
        group = config.group or config.name
        for dest in config.replication.destinations:
            sender = Sender(
                dest,
                self.name,
                group,
                journal,
                self.pipeline,
                self.repl_sink,
                partial(_read_password, dest.password_file),
                self.queues.translate_out,
                self.jid,
                self.catch_up.answered if self.catch_up is not None else None,
            )
            sender.start()
            self.senders.append(sender)
        if self.receiver is not None and self.senders:
            by_dest = {s.dest.name: s for s in self.senders}

            def source_back(source: str) -> None:
                sender = by_dest.get(source)
                if sender is not None:
                    sender.retry_now()

            self.receiver.source_back = source_back
        if self.senders:
            log.info(
                "replication: instance %s (group %s) sends to %s",
                self.name,
                group,
                "; ".join(s.describe() for s in self.senders),
            )

    def _publisher_logon(self, pub: int, seq: int) -> None:
        """A publisher whose newest message here came from another instance moved here: its
        records from there go to every destination ahead of what it publishes now
        (server/replication/handoff.py)."""
        if not self.senders or self.journal is None:
            return
        records = foreign_tail(self.journal, pub, seq)
        if records:
            log.info(
                "replication: publisher %d moved here (its newest, seq %d, came from %s): %d of "
                "its records from other instances go to the destinations first",
                pub,
                seq,
                (raw_origin(records[-1][7]) or (0, b"?", b""))[1].decode(errors="replace"),
                len(records),
            )
            for sender in self.senders:
                sender.hand_off(records)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def _compile_later(self, text: str, done: Callable[[Any], None]) -> None:
        """Compile a filter on the filter thread; done(predicate or FilterError) on the loop.
        A compile cancelled by the shutdown is never reported: its connection is closing."""

        def report(fut: asyncio.Future[Any]) -> None:
            if not fut.cancelled():
                done(fut.result())

        asyncio.get_running_loop().run_in_executor(
            self.filter_compiler, compile_now, text
        ).add_done_callback(report)

    async def shutdown(self, reason: str = "shutdown") -> None:
        if self.shutting_down:
            await self._stopped.wait()
            return
        self.shutting_down = True
        started = time.monotonic()
        log.info("shutting down (%s)", reason)
        self.connections.accepting = False
        for srv in self.listeners:
            srv.close()
        for acceptor in self.acceptors:
            acceptor.cancel()
        for conn in self.connections:
            conn.pause_reading("shutdown")
        for sender in self.senders:  # before the journal closes: they read it
            await sender.stop()
        if self.receiver is not None:  # before the last commit: what it took is acked or resent
            await self.receiver.stop()
        pipeline: Pipeline | None = getattr(self, "pipeline", None)  # None: start() failed early
        if pipeline is not None:
            self.replays.cancel_all()
            self.queues.stop()
            pipeline.flush()
            deadline = time.monotonic() + SHUTDOWN_TIMEOUT
            while pipeline.inflight_batches and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            if pipeline.inflight_batches:
                log.error(
                    "shutdown: %d journal batches still not durable after %.0fs",
                    pipeline.inflight_batches,
                    SHUTDOWN_TIMEOUT,
                )
        for conn in self.connections:
            conn.out.flush()
            conn.out.close(Disconnect.SHUTDOWN)
        if self._ticker is not None:
            self._ticker.cancel()
        if self.gate is not None:
            self.gate.stop()
        if self.admin is not None:
            await self.admin.stop()
        if self.maintenance is not None:
            await self.maintenance.stop()  # stop a running journal job before the journal closes
        if self.sow is not None:
            self.sow.close()  # derived data: nothing to flush (the journal has it all)
        if self.journal is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.journal.close)
        self.readers.shutdown(wait=False, cancel_futures=True)
        self.filter_compiler.shutdown(wait=False, cancel_futures=True)
        self.guard.close()
        for srv in self.listeners:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(srv.wait_closed(), 2.0)
        log.info("stopped in %.3fs", time.monotonic() - started)
        self._stopped.set()

    def reload(self, config: Config) -> None:
        """SIGHUP with a configuration that loads: re-read the password file, take its roles,
        re-read the certificates; subscriptions that lost their right end. The rest of the
        configuration is not applied (that takes a restart)."""
        problems = self.guard.reload(config)
        for problem in problems:
            log.error("reload: %s", problem)
        ended = sum(recheck(conn.session) for conn in self.connections if not conn.closing)
        log.info(
            "reload: password file, roles and certificates re-read%s; %d subscription(s) "
            "ended as no longer entitled",
            f" ({len(problems)} problem(s) above)" if problems else "",
            ended,
        )

    def _close_clients(self) -> None:
        """A replaced journal begins catching up (CatchUp): every client goes (and comes back,
        or goes to another instance, once it has)."""
        for conn in list(self.connections):
            if not conn.closing:
                conn.close(Disconnect.CATCHING_UP)

    def _disconnect_client(self, conn_id: int) -> str | None:
        """The console's action: close connection `conn_id` (reason `admin`); what it was, or
        None when there is no such open connection."""
        for conn in self.connections:
            if conn.id == conn_id and not conn.closing:
                what = conn.describe()
                conn.close(Disconnect.ADMIN)
                return what
        return None

    def _run_action(self, name: str) -> str | None:
        """The console's action: run journal action `name` now (Maintenance.run_now)."""
        return self.maintenance.run_now(name) if self.maintenance is not None else None

    def _replication(self, name: str, command: str, who: str) -> bool | None:
        """The admin's `downgrade` / `upgrade` of destination `name` (SyncGate)."""
        if self.gate is None:
            return None
        try:
            if command == "downgrade":
                return self.gate.downgrade(name, who)
            return self.gate.upgrade(name, who)
        except UnknownDestination:
            return None

    # -- periodic work ------------------------------------------------------------------------

    async def _tick(self) -> None:
        last_stats = time.monotonic()
        while True:
            await asyncio.sleep(HEARTBEAT_TICK)
            now = time.monotonic()
            for conn in self.connections:
                iv = conn.session.hb_interval
                if not iv or conn.closing:
                    continue
                if now - conn.last_recv > 2 * iv:
                    conn.out.close(Disconnect.HEARTBEAT)
                elif now - conn.out.last_send >= iv:
                    conn.out.buf.append(frames.HEARTBEAT)
                    conn.out.flush()
            self.intake.sweep(self.connections, now)
            self.queues.tick()
            if self.sow is not None:
                self.sow.tick()  # records past their <Expiration>
            if self.maintenance is not None:
                self.maintenance.tick(now)
            if now - last_stats >= 1.0:
                self.stats.sample(now - last_stats)
                last_stats = now
                self.index.send_bookmark_acks()
