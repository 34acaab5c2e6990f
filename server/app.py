"""The server: state shared by all connections, listeners, and the ordered shutdown.

Server state (journal, pipeline, router, client names, stats) lives here; connection state
lives in connection.py. Lifecycle:

    created -> start() -> serving -> shutdown(reason) -> stopped

Shutdown runs in a fixed order with a timeout (CONVENTIONS 10): stop accepting; stop reading
from every connection; commit what was received; wait for the journal (bounded); send the last
acks; close every connection with reason `shutdown`; close the journal; stop the admin endpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time

from config.model import Config
from journal.fileio import io_from_env
from journal.journal import Journal
from protocol.bookmarks import Now, format_bookmark
from protocol.options import InvalidOptions, sow_delete_options

from . import frames, splice
from .connection import Connection, Subscription
from .filters import FilterError, compile_filter
from .intake import Intake
from .pipeline import Pipeline
from .queues import QueueManager
from .replay import Cursor, Plan, Replay, plan_replay
from .router import Router, is_pattern
from .stats import Stats

log = logging.getLogger("tickertape.server")

HEARTBEAT_TICK = 0.2
SHUTDOWN_TIMEOUT = 10.0


class Server:
    def __init__(self, config: Config):
        self.config = config
        self.name = config.name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.journal: Journal | None = None
        self.pipeline: Pipeline | None = None
        self.queues: QueueManager = QueueManager(self, ())
        self.router = Router()
        self.connections: set[Connection] = set()
        self.names: dict[str, Connection] = {}
        self.heartbeats: set[Connection] = set()
        self.replays: set[Replay] = set()
        self.persist_ack_subs: set[Subscription] = set()
        self.listeners: list[asyncio.base_events.Server] = []
        self.addresses: list[tuple[str, str, int]] = []  # (transport name, host, port)
        self.max_client_buffer = config.limits.client_max_buffer_size
        self.idle_poll = config.limits.idle_poll
        self.intake = Intake(config.limits)
        self._polling = False
        self._input_at = 0.0
        self.poll_rounds = 0  # loop iterations spent polling instead of sleeping (stats)
        self.stats = Stats(self)
        self.admin = None
        self.readers = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="journal-reader"
        )
        self._ticker: asyncio.Task | None = None
        self.maintenance = None  # journal maintenance (server/maintenance.py), with a journal
        self._stopped = asyncio.Event()
        self.started_at = time.time()
        self.shutting_down = False
        self._literal: dict[str, bool] = {}

    # -- idle polling ----------------------------------------------------------------------

    def input_seen(self, now: float) -> None:
        """Network input arrived: keep the loop polling for <IdlePoll> before it sleeps.

        While a callback is ready the event loop polls its sockets without blocking, so a reply
        that comes back within the window (a queue consumer's next ack, a request/response
        client) is read at once; a sleeping CPU takes tens of microseconds to wake on a virtual
        machine, more than the server's own work per round trip. Go runtimes spin the same way.
        """
        self._input_at = now  # time.monotonic() of the input
        if not self._polling and self.idle_poll:
            self._polling = True
            self.loop.call_soon(self._poll)

    def _poll(self) -> None:
        p = self.pipeline
        # a commit in flight needs the GIL back when its fdatasync returns: sleep instead
        if (
            p is None or p.inflight_batches == 0
        ) and time.monotonic() - self._input_at < self.idle_poll:
            self.poll_rounds += 1
            self.loop.call_soon(self._poll)
        else:
            self._polling = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        tl = self.config.transaction_log
        if tl is not None:
            faults = io_from_env()  # tests and the fault campaign only (journal/fileio.py)
            if faults is not None:
                log.warning(
                    "fault injection enabled: TICKERTAPE_FAULTS=%s", os.environ["TICKERTAPE_FAULTS"]
                )
            self.journal = await self.loop.run_in_executor(
                None,
                lambda: Journal(tl.journal_directory, tl.journal_size, tl.durability, io=faults),
            )
            recorded = tl.records_topic
        else:
            recorded = _never
        self.pipeline = Pipeline(self, self.journal, recorded)
        self.queues = QueueManager(self, self.config.queues if self.journal is not None else ())
        await self.loop.run_in_executor(None, self.queues.recover)
        self.queues.attach(self.pipeline)
        log.info(
            "stored messages are framed by %s",
            "the C accelerator (server/_splice.c)"
            if splice.ACCELERATED
            else "pure Python (server/splice.py): no C accelerator was built, or TICKERTAPE_PURE_PYTHON is set",
        )
        for t in self.config.transports:
            srv = await self.loop.create_server(
                lambda t=t: Connection(self, t.name, t.max_message_size),
                t.host,
                t.port,
                reuse_address=True,
                backlog=1024,
            )
            self.listeners.append(srv)
            host, port = srv.sockets[0].getsockname()[:2]
            self.addresses.append((t.name, host, port))
            log.info(
                "listening on %s:%d (transport %s, %s/%s)",
                host,
                port,
                t.name,
                t.protocol,
                t.message_type,
            )
        if self.config.admin is not None:
            from .admin import AdminEndpoint

            self.admin = AdminEndpoint(self, self.config.admin.host, self.config.admin.port)
            await self.admin.start()
        self._ticker = self.loop.create_task(self._tick())
        self._start_maintenance()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def shutdown(self, reason: str = "shutdown") -> None:
        if self.shutting_down:
            await self._stopped.wait()
            return
        self.shutting_down = True
        started = time.monotonic()
        log.info("shutting down (%s)", reason)
        for srv in self.listeners:
            srv.close()
        for conn in list(self.connections):
            conn.pause_reading("shutdown")
        for r in list(self.replays):
            r.cancel()
        if self.pipeline is not None:
            self.pipeline.flush()
            deadline = time.monotonic() + SHUTDOWN_TIMEOUT
            while self.pipeline.inflight_batches and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            if self.pipeline.inflight_batches:
                log.error(
                    "shutdown: %d journal batches still not durable after %.0fs",
                    self.pipeline.inflight_batches,
                    SHUTDOWN_TIMEOUT,
                )
        for conn in list(self.connections):
            conn.flush_out()
            conn.close("shutdown")
        if self._ticker is not None:
            self._ticker.cancel()
        if self.admin is not None:
            await self.admin.stop()
        if self.maintenance is not None:
            await self.maintenance.stop()  # stop a running journal job before the journal closes
        if self.journal is not None:
            await self.loop.run_in_executor(None, self.journal.close)
        self.readers.shutdown(wait=False, cancel_futures=True)
        for srv in self.listeners:
            try:
                await asyncio.wait_for(srv.wait_closed(), 2.0)
            except (TimeoutError, Exception):
                pass
        log.info("stopped in %.3fs", time.monotonic() - started)
        self._stopped.set()

    # -- connections -----------------------------------------------------------------------

    def connection_opened(self, conn: Connection) -> None:
        if self.shutting_down:
            conn.close("shutdown")
            return
        self.connections.add(conn)
        self.stats.connections_total += 1

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.heartbeats.discard(conn)
        self.intake.forget(conn)
        if conn.client_name and self.names.get(conn.client_name) is conn:
            del self.names[conn.client_name]
        if self.pipeline is not None:
            self.pipeline.paused_conns.discard(conn)

    # -- subscriptions ----------------------------------------------------------------------

    def add_subscription(self, sub: Subscription) -> None:
        self.router.add(sub)
        if sub.bookmark is not None and "persisted" in sub.acks:
            self.persist_ack_subs.add(sub)

    def remove_subscription(self, sub: Subscription) -> None:
        if sub.queue is not None:
            sub.queue.remove_sub(sub)
            sub.queue = None
            return
        self.router.remove(sub)
        if sub.early:
            sub.early = False
            self.pipeline.early_subs -= 1
        self.persist_ack_subs.discard(sub)
        if sub.replay is not None:
            sub.replay.detach(sub)
            sub.replay = None

    def replace_subscription(self, old: Subscription, new: Subscription) -> None:
        """`replace`: new filter / options, same place in the stream."""
        self.router.remove(old)
        self.persist_ack_subs.discard(old)
        new.live = old.live
        new.early = old.early
        new.replay = old.replay
        new.acked_bm = old.acked_bm
        if old.replay is not None:
            old.replay.replace(old, new)
        old.conn.subs[new.sub_id] = new
        self.add_subscription(new)

    def replayable(self, topic: str, regex) -> bool:
        tl = self.config.transaction_log
        if tl is None or self.journal is None:
            return False
        if regex is None:
            return tl.records_topic(topic)
        # a pattern replays only the logged topics it matches; accept it if anything is logged
        return bool(tl.topics)

    def replay_topic(self, topic: str) -> str:
        """A bookmark subscription to a queue name replays the queue's underlying topic."""
        q = self.config.queue(topic)
        return q.underlying_topic if q is not None else topic

    def literal_topic(self, topic: str) -> bool:
        """Publish needs a literal topic (cached: this runs per publish)."""
        ok = self._literal.get(topic)
        if ok is None:
            if len(self._literal) > 50_000:
                self._literal.clear()
            ok = self._literal[topic] = not is_pattern(topic)
        return ok

    def plan_replay(self, spec, opts) -> Plan:
        end_now = self.pipeline.delivered_end
        if spec is None or isinstance(spec, Now):
            return Plan(("at", end_now))  # conflation from now on
        return plan_replay(self.journal, spec, opts.bookmark_not_found, end_now)

    def start_replay(self, sub: Subscription, plan: Plan) -> None:
        opts = sub.opts
        if plan.start is None:
            start, wait = self.pipeline.delivered_end, None
        elif plan.start[0] == "wait":
            start, wait = self.pipeline.delivered_end, plan.start[1]
        else:
            start, wait = plan.start[1], None
        cursor = Cursor(sub, start, plan.end)
        Replay(
            self,
            [cursor],
            start,
            paused=opts.pause,
            wait_until=wait,
            rate=opts.rate,
            rate_max_gap=opts.rate_max_gap,
        ).start()

    def pause_subscriptions(self, subs) -> None:
        for sub in subs:
            if sub.replay is not None:
                sub.replay.pause()
            elif sub.live:
                # a bookmark subscription that already went live keeps its place in the journal
                sub.live = False
                pos = self.pipeline.delivered_end
                Replay(
                    self,
                    [Cursor(sub, pos, None)],
                    pos,
                    paused=True,
                    rate=sub.opts.rate,
                    rate_max_gap=sub.opts.rate_max_gap,
                ).start()

    def resume_subscriptions(self, subs) -> None:
        """Resume; subscriptions resumed together share one replay pass so they stay in step."""
        replays = []
        for sub in subs:
            if sub.replay is not None and sub.replay not in replays:
                replays.append(sub.replay)
        if not replays:
            return
        if len(replays) == 1 and {c.sub for c in replays[0].cursors} <= set(subs):
            replays[0].resume()
            return
        wanted = set(subs)
        cursors = []
        for r in replays:
            for c in list(r.cursors):
                if c.sub in wanted:
                    c.start = max(c.start, r.position)
                    r.cursors.remove(c)
                    cursors.append(c)
            if not r.cursors:
                r.cancel()
        first = subs[0].opts
        Replay(
            self,
            cursors,
            min(c.start for c in cursors),
            rate=first.rate,
            rate_max_gap=first.rate_max_gap,
        ).start()

    def sow_delete(self, conn: Connection, h, body) -> None:
        """Queue acknowledgements: bookmarks (the normal, batched case) or a filter."""
        q = self.queues.queues.get(h.t or "")
        if q is None:
            conn.fail(
                h,
                "not a queue",
                f"topic {h.t!r} is not a queue; sow_delete acknowledges queue messages",
            )
            return
        try:
            opts = sow_delete_options(h.o)
        except InvalidOptions as exc:
            conn.fail(h, "invalid options", str(exc))
            return
        if h.bm:
            try:
                bms = q.normalize_bookmarks(h.bm.split(","))
            except ValueError as exc:
                conn.fail(
                    h, "invalid bookmark", f"{exc.args[0]!r} is not a bookmark (publisher|seq|)"
                )
                return
            n, refused = q.ack(
                conn, bms, cancel=opts.cancel, expire=opts.expire, extend=opts.lease_extend
            )
        elif h.f:
            try:
                f = compile_filter(h.f)
            except FilterError as exc:
                conn.fail(h, "bad filter", str(exc))
                return
            n, refused = q.ack_filter(conn, f, expire=opts.expire), []
        else:
            conn.fail(
                h, "invalid options", "sow_delete on a queue needs bm (bookmarks) or f (a filter)"
            )
            return
        acks = [a.strip() for a in (h.a or "").split(",") if a.strip()]
        if not acks:
            return
        if refused:
            log.warning(
                "%s: sow_delete on %s refused for %d: %s",
                conn.describe(),
                q.name,
                len(refused),
                refused[0],
            )

        def reply(err, conn=conn, cid=h.cid, n=n, refused=refused):
            if conn.closing:
                return
            for kind in acks:
                if err is not None:
                    conn.send_ack(
                        kind,
                        cid,
                        "failure",
                        getattr(err, "reason", "journal unavailable"),
                        detail=str(err),
                    )
                elif refused:
                    conn.send_ack(
                        kind,
                        cid,
                        "failure",
                        "not entitled",
                        detail="; ".join(refused[:5]),
                        records_deleted=n,
                    )
                else:
                    conn.send_ack(kind, cid, records_deleted=n)
            conn.flush_out()

        self.pipeline.after_commit(reply)  # acked only once the acknowledgement is durable

    # -- periodic work ------------------------------------------------------------------------

    async def _tick(self) -> None:
        last_stats = time.monotonic()
        while True:
            await asyncio.sleep(HEARTBEAT_TICK)
            now = time.monotonic()
            for conn in list(self.heartbeats):
                iv = conn.hb_interval
                if now - conn.last_recv > 2 * iv:
                    conn.close("heartbeat")
                elif now - conn.out.last_send >= iv:
                    conn.out.buf.append(frames.HEARTBEAT)
                    conn.out.flush()
            self.intake.sweep(self.connections, now)
            self.queues.tick()
            if self.maintenance is not None:
                self.maintenance.tick(now)
            if now - last_stats >= 1.0:
                self.stats.sample(now - last_stats)
                last_stats = now
                self._bookmark_persisted_acks()

    def _bookmark_persisted_acks(self) -> None:
        """Periodic `persisted` acks on bookmark subscriptions that asked for them: the newest
        durable bookmark the subscription has passed, so a client's bookmark store can advance
        even when a filter lets nothing through."""
        for sub in list(self.persist_ack_subs):
            conn = sub.conn
            if conn.closing:
                continue
            if sub.replay is not None:
                bm = next((c.last_bm for c in sub.replay.cursors if c.sub is sub), None)
            elif sub.live:
                bm = self.pipeline.last_bm
            else:
                bm = None
            if bm is None or bm == sub.acked_bm:
                continue
            sub.acked_bm = bm
            conn.out.send_ack("persisted", None, sub_id=sub.sub_id, bm=format_bookmark(*bm))
            conn.out.flush()

    # -- journal maintenance (archive / compaction; server/maintenance.py) ---------------------------

    def _start_maintenance(self) -> None:
        if self.journal is None:
            return
        from .maintenance import Maintenance

        self.maintenance = Maintenance(self)
        self.maintenance.start()


def _never(topic: str) -> bool:
    return False
