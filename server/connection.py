"""One client connection: frames in, commands dispatched, acks and deliveries out.

States: connected -> logged on -> closing -> closed. The first command must be `logon`
(PROTOCOL.md §3); anything else fails with `logon required` and closes the connection.

Output is coalesced: acks and deliveries are appended to `out` and written with one
`transport.write` per batch of input or per committed journal batch. The transport's buffer is
bounded (`<ClientMaxBufferSize>`): past it the client is disconnected with reason `slow client`
(a live subscriber that cannot keep up must not grow the server's memory). Replays are paced
instead: they wait for the transport to drain (`pause_writing` / `resume_writing`).

Every close has a reason from PROTOCOL.md §9 and is logged once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

import msgspec

from journal.record import RecordFieldError
from protocol.bookmarks import InvalidBookmark, Now, format_bookmark, parse_bookmark
from protocol.framing import FrameDecoder, FrameError, FrameTooLarge
from protocol.headers import MAX_SUB_ID_BYTES, FieldError, check_fields
from protocol.options import InvalidOptions, heartbeat_options, logon_options, subscribe_options
from protocol.patterns import PatternError, compile_pattern

from . import frames
from .filters import FilterError, compile_filter
from .ids import publisher_id, server_publisher_id
from .outbox import Outbox
from .pipeline import ABOVE_GAP, DUPLICATE
from .reasons import Disconnect
from .router import is_pattern

if TYPE_CHECKING:  # pragma: no cover
    from .app import Server

log = logging.getLogger("tickertape.connection")

_json = msgspec.json.encode
_conn_ids = itertools.count(1)


class Subscription:
    """A subscription of one connection. `live` is False while it replays or is paused."""

    __slots__ = (
        "acked_bm",
        "acks",
        "bookmark",
        "cid",
        "conn",
        "early",
        "filter",
        "filter_text",
        "live",
        "opts",
        "out",
        "prefix",
        "queue",
        "regex",
        "regex_b",
        "replay",
        "sub_id",
        "timestamp",
        "topic",
        "topic_b",
    )

    def __init__(self, conn, sub_id, topic, regex, filt, filter_text, opts, acks, cid):
        self.sub_id = sub_id
        self.conn = conn
        self.out = conn.out
        self.topic = topic
        self.regex = regex
        self.filter = filt
        self.filter_text = filter_text
        self.opts = opts
        self.timestamp = opts.timestamp
        self.prefix = frames.sub_prefix(sub_id)
        self.live = True
        self.bookmark = None
        self.replay = None
        self.acks = acks
        self.cid = cid
        self.topic_b = topic.encode()
        self.regex_b = None
        if regex is not None:
            try:
                self.regex_b = compile_pattern(self.topic_b)
            except PatternError:  # pragma: no cover - the str pattern compiled already
                self.regex_b = None
        self.acked_bm = None
        self.early = False  # `live` option: delivered at publish time, before the commit
        self.queue = None  # the Queue of a queue subscription

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


def _ack_types(a: str | None) -> frozenset:
    if not a:
        return frozenset()
    return frozenset(x.strip() for x in a.split(",") if x.strip())


class Connection(asyncio.Protocol):
    def __init__(self, server: Server, transport_name: str, max_frame: int):
        self.server = server
        self.id = next(_conn_ids)
        self.transport_name = transport_name
        self.max_frame = (
            max_frame  # after logon; before it, <MaxLogonMessageSize> (server/intake.py)
        )
        self.decoder = FrameDecoder(
            min(max_frame, server.config.limits.max_logon_message_size), refuse_fields=True
        )
        self.buffered = 0  # bytes of a partial frame, as the intake last counted them
        self.partial_since: float | None = None
        self.out = Outbox(server.max_client_buffer, self._closed_with)
        self.drained_mark = 0
        self.drained_at = 0.0
        self.transport = None
        self.peer = "?"
        self.client_name: str | None = None
        self.user_id: str | None = None
        self.pub = 0
        self.server_pub = 0
        self.logged_on = False
        self.subs: dict[str, Subscription] = {}
        self.wants_persisted = False
        self._gap_told = 0  # the gap a persisted failure was sent for (_refuse_above_gap)
        self.is_publisher = False
        self.hb_interval = 0.0
        now = time.monotonic()
        self.connected_at = now
        self.last_recv = now
        self.ack_conflation = 0.0
        self._persist_pending = 0
        self._ack_timer = None
        self._read_pauses: set[str] = set()
        self._sub_counter = 0
        self.received = 0

    @property
    def closing(self) -> bool:
        return self.out.closing

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.out.attach(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.server.connection_opened(self)
        log.debug("connection %d from %s on %s", self.id, self.peer, self.transport_name)

    def data_received(self, data: bytes) -> None:
        self.last_recv = time.monotonic()
        error = None
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            frames = exc.frames
            error = exc
            if not self.logged_on and isinstance(exc, FrameTooLarge):
                self.server.intake.frame_too_large_before_logon(self)
                error = FrameError(
                    f"{exc}; before logon frames are at most <MaxLogonMessageSize> "
                    f"{self.decoder.max_size} bytes",
                    exc.frames,
                )
        if not self.server.intake.after_feed(self):
            return
        handlers = _HANDLERS
        for header, body in frames:
            if self.closing:
                break
            problem = body if type(body) is FieldError else check_fields(header)
            if problem is not None:
                self.fail(header, problem.reason, problem.detail)
                if not self.logged_on:  # a logon is refused with its connection
                    self.close(problem.reason)
                    break
                continue
            handler = handlers.get(header.c)
            if handler is None:
                self.fail(
                    header, "unknown command", f"unknown command {header.c!r}; see PROTOCOL.md §3"
                )
                self.close("unknown command")
                break
            if not self.logged_on and handler is not Connection.cmd_logon:
                self.fail(header, "logon required", "the first command must be logon")
                self.close("logon required")
                break
            try:
                handler(self, header, body)
            except Exception:  # a bug must cost one connection, never the server
                log.exception("connection %d: error handling %s", self.id, header.c)
                self.fail(header, "bad frame", "internal error handling this command")
                self.close("bad frame")
                break
        if error is not None and not self.closing:
            self.send_ack("processed", None, "failure", "bad frame", detail=str(error))
            log.warning("connection %d (%s): bad frame: %s", self.id, self.describe(), error)
            self.close("bad frame")
        if self.out.buf:
            self.out.flush()
        self.server.input_seen(self.last_recv)

    def connection_lost(self, exc) -> None:
        if self.out.close_reason is None:
            self.out.close_reason = Disconnect.CONNECTION_CLOSED
            log.info(
                "disconnect: %s reason=connection closed%s",
                self.describe(),
                f" ({exc})" if exc else "",
            )
        self.out.lost()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        for sub in list(self.subs.values()):
            self.server.remove_subscription(sub)
        self.subs.clear()
        self.server.connection_closed(self)

    def pause_writing(self) -> None:
        self.out.pause_writing()

    def resume_writing(self) -> None:
        self.out.resume_writing()

    # -- output ----------------------------------------------------------------------------

    def describe(self) -> str:
        return f"connection {self.id} client={self.client_name or '-'} peer={self.peer}"

    def flush_out(self) -> None:
        self.out.flush()

    def send_ack(
        self, kind: str, cid, status: str = "success", reason: str | None = None, **fields
    ) -> None:
        self.out.send_ack(kind, cid, status, reason, **fields)

    def fail(self, header, reason: str, detail: str) -> None:
        """Refuse a command: failure ack if one was asked for, and always a log line."""
        log.warning("%s: %s refused: %s: %s", self.describe(), header.c, reason, detail)
        self.server.stats.refused += 1
        acks = _ack_types(header.a)
        kind = "processed" if "processed" in acks or not acks else sorted(acks)[0]
        if acks or header.c in ("logon", "subscribe", "unsubscribe", "sow_delete"):
            self.send_ack(
                kind, header.cid, "failure", reason, detail=detail, sub_id=header.sub_id, s=header.s
            )

    def persisted(self, seq: int) -> None:
        """A commit made everything up to `seq` durable: one conflated ack."""
        if self.closing:
            return
        if self.ack_conflation:
            self._persist_pending = max(self._persist_pending, seq)
            if self._ack_timer is None:
                self._ack_timer = self.server.loop.call_later(
                    self.ack_conflation, self._send_conflated
                )
            return
        self.out.buf.append(frames.persisted_ack(seq))
        self.out.flush()

    def _send_conflated(self) -> None:
        self._ack_timer = None
        if self._persist_pending and not self.closing:
            seq, self._persist_pending = self._persist_pending, 0
            self.send_ack("persisted", None, s=seq)
            self.flush_out()

    def persist_failed(self, reason: str, detail: str) -> None:
        if self.closing:
            return
        self.send_ack("persisted", None, "failure", reason, detail=detail)
        self.flush_out()

    def flush_done(self, cid, acks) -> None:
        if self.closing:
            return
        for kind in acks or ("completed",):
            self.send_ack(kind, cid)
        self.flush_out()

    def flush_failed(self, cid, acks, reason) -> None:
        if self.closing:
            return
        for kind in acks or ("completed",):
            self.send_ack(kind, cid, "failure", reason)
        self.flush_out()

    def close(self, reason: str, abort: bool = False) -> None:
        self.out.close(reason, abort)

    def _closed_with(self, reason: str) -> None:
        log.info("disconnect: %s reason=%s", self.describe(), reason)
        self.server.stats.disconnects[reason] = self.server.stats.disconnects.get(reason, 0) + 1

    def pause_reading(self, why: str) -> None:
        if not self._read_pauses and self.transport is not None and not self.closing:
            self.transport.pause_reading()
        self._read_pauses.add(why)

    def resume_reading(self, why: str) -> None:
        self._read_pauses.discard(why)
        if not self._read_pauses and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    # -- commands ----------------------------------------------------------------------------

    def cmd_logon(self, h, body) -> None:
        server = self.server
        acks = _ack_types(h.a)
        if self.logged_on:
            self.fail(
                h, "auth failure", "this connection is already logged on; open a new connection"
            )
            return
        name = h.client_name
        if not name and server.journal is not None:
            self.fail(
                h, "logon required", "client_name is required: this instance has a transaction log"
            )
            self.close("logon required")
            return
        try:
            opts = logon_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, "invalid options", str(exc))
            self.close("auth failure")
            return
        if name:
            other = server.names.get(name)
            if other is not None and other is not self:
                if other.user_id == h.user_id:
                    other.close("name in use")
                    server.names.pop(name, None)
                else:
                    self.fail(
                        h, "name in use", f"client name {name!r} is connected with another user id"
                    )
                    self.close("name in use")
                    return
            server.names[name] = self
        self.client_name = name or f"anonymous-{self.id}"
        self.user_id = h.user_id
        self.pub = publisher_id(self.client_name)
        self.server_pub = server_publisher_id(self.client_name, server.name)
        self.ack_conflation = opts.ack_conflation or 0.0
        self.logged_on = True
        self.decoder.max_size = self.max_frame
        seq = server.pipeline.durable.get(self.pub, 0)
        log.info("logon: %s user=%s last_seq=%d", self.describe(), self.user_id or "-", seq)
        if "processed" in acks or not acks:
            self.send_ack(
                "processed",
                h.cid,
                s=seq,
                bm=format_bookmark(self.pub, seq) if seq else "",
                client_name=self.client_name,
            )

    def cmd_publish(self, h, body) -> None:
        topic = h.t
        if not topic or not self.server.literal_topic(topic):
            self.fail(h, "invalid topic", f"publish needs a literal topic, got {topic!r}")
            return
        a = h.a
        if a is not None and "persisted" in a:
            self.wants_persisted = True
        self.is_publisher = True
        self.received += 1
        try:
            seq, outcome = self.server.pipeline.publish(
                self,
                self.pub if h.s is not None else self.server_pub,
                h.s,
                topic,
                body,
                b',"x":' + _json(h.x) if h.x is not None else b"",
                h.e,
            )
        except RecordFieldError as exc:
            self.fail(h, "bad frame", str(exc))
            return
        if outcome == ABOVE_GAP:
            self._refuse_above_gap(h, seq)
            return
        if a is not None and ("processed" in a or "received" in a):
            for kind in _ack_types(a) & {"received", "processed"}:
                self.send_ack(
                    kind, h.cid, s=seq, reason="duplicate" if outcome == DUPLICATE else None
                )

    def _room_for_subscription(self, h, sub_id: str) -> bool:
        """A new subscription fits the connection's bounds: <ClientMaxSubscriptions>, and a
        sub_id short enough that a delivery's `sids` (every matching sub_id) stays small."""
        if len(sub_id.encode()) > MAX_SUB_ID_BYTES or "," in sub_id:
            self.fail(
                h, "bad frame", f"sub_id is at most {MAX_SUB_ID_BYTES} bytes and has no comma"
            )
            return False
        limit = self.server.config.limits.client_max_subscriptions
        if len(self.subs) >= limit:
            self.server.intake.counts["subscriptions_refused"] += 1
            self.fail(
                h,
                "not entitled",
                f"this connection has {len(self.subs)} subscriptions, the most "
                f"<ClientMaxSubscriptions> allows; unsubscribe some or open another connection",
            )
            return False
        return True

    def _refuse_above_gap(self, h, seq: int) -> None:
        """A publish past this publisher's gap (an earlier sequence failed to commit): refused
        and not stored, with a failure ack for each ack type asked for; logged once per gap (a
        pipelining publisher may have thousands in flight)."""
        gap = self.server.pipeline.gaps.get(self.pub)
        detail = (
            f"sequence {gap} was not persisted; nothing after it is stored until it is sent "
            f"again: resend from {gap}"
        )
        if self._gap_told != gap:
            self._gap_told = gap
            log.warning(
                "%s: publishes from s=%d refused until s=%d is sent again",
                self.describe(),
                seq,
                gap,
            )
        if self.wants_persisted:
            self.send_ack("persisted", None, "failure", "journal unavailable", detail=detail, s=seq)
        for kind in _ack_types(h.a) & {"received", "processed"}:
            self.send_ack(kind, h.cid, "failure", "journal unavailable", detail=detail, s=seq)
        self.flush_out()

    def cmd_subscribe(self, h, body) -> None:
        server = self.server
        acks = _ack_types(h.a)
        try:
            opts = subscribe_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, "invalid options", str(exc))
            return
        if opts.resume or (
            opts.pause and h.sub_id and all(i.strip() in self.subs for i in h.sub_id.split(","))
        ):
            self._pause_or_resume(h, opts, acks)
            return
        topic = h.t
        if not topic:
            self.fail(h, "invalid topic", "subscribe needs a topic (t)")
            return
        sub_id = h.sub_id
        if sub_id is None:
            self._sub_counter += 1
            sub_id = f"{self.id}.{self._sub_counter}"
        existing = self.subs.get(sub_id)
        if existing is None and not self._room_for_subscription(h, sub_id):
            return
        if existing is not None and not opts.replace:
            self.fail(
                h,
                "subscription already exists",
                f"sub_id {sub_id!r} is in use; unsubscribe first or add the replace option",
            )
            return
        queue = server.queues.queues.get(topic) if not h.bm else None
        if queue is not None:
            self._subscribe_queue(h, queue, sub_id, opts, acks, existing)
            return
        if opts.max_backlog is not None:
            self.fail(
                h,
                "invalid options",
                f"max_backlog applies to queue subscriptions; {topic!r} is not a queue",
            )
            return
        match_topic = server.replay_topic(topic) if h.bm else topic
        regex = None
        if is_pattern(match_topic):
            try:
                regex = compile_pattern(match_topic)
            except PatternError as exc:
                self.fail(h, "bad regex topic", str(exc))
                return
        filt = None
        if h.f:
            try:
                filt = compile_filter(h.f)
            except FilterError as exc:
                self.fail(h, "bad filter", str(exc))
                return
        spec = None
        if h.bm:
            try:
                spec = parse_bookmark(h.bm)
            except InvalidBookmark as exc:
                self.fail(h, "invalid bookmark", str(exc))
                return
        elif opts.bookmark_only():
            self.fail(
                h,
                "invalid options",
                f"options {', '.join(opts.bookmark_only())} need a bookmark subscription (bm)",
            )
            return
        needs_journal = (
            spec is not None and not isinstance(spec, Now)
        ) or opts.conflation is not None
        if needs_journal and not server.replayable(match_topic, regex):
            what = "replayed" if spec is not None else "conflated"
            self.fail(
                h,
                "invalid topic",
                f"topic {topic!r} is not recorded in the transaction log, so it cannot be {what}",
            )
            return
        plan = None
        if needs_journal and existing is None:
            try:
                plan = server.plan_replay(spec, opts)
            except InvalidBookmark as exc:
                self.fail(h, "invalid bookmark", str(exc))
                return
        sub = Subscription(self, sub_id, match_topic, regex, filt, h.f, opts, acks, h.cid)
        sub.bookmark = h.bm
        if existing is not None:  # replace: same place in the stream, new filter / options
            server.replace_subscription(existing, sub)
        else:
            self.subs[sub_id] = sub
            if plan is not None:
                sub.live = False
            server.add_subscription(sub)
        if "processed" in acks:
            self.send_ack("processed", h.cid, sub_id=sub_id)
        if plan is not None:
            server.start_replay(sub, plan)
        elif existing is None and spec is not None and "completed" in acks:
            self.send_ack("completed", h.cid, sub_id=sub_id)  # NOW: nothing to replay

    def _subscribe_queue(self, h, queue, sub_id, opts, acks, existing) -> None:
        filt = None
        if h.f:
            try:
                filt = compile_filter(h.f)
            except FilterError as exc:
                self.fail(h, "bad filter", str(exc))
                return
        if opts.bookmark_only() or opts.conflation is not None:
            self.fail(
                h,
                "invalid options",
                "a queue subscription takes max_backlog (and timestamp); replay options need a bookmark",
            )
            return
        if existing is not None:
            self.server.remove_subscription(existing)
        sub = Subscription(self, sub_id, h.t, None, filt, h.f, opts, acks, h.cid)
        sub.live = False  # queue deliveries come from the queue, never from pub/sub fan-out
        self.subs[sub_id] = sub
        if "processed" in acks:
            self.send_ack("processed", h.cid, sub_id=sub_id)
        queue.add_sub(sub, opts.max_backlog)

    def _pause_or_resume(self, h, opts, acks) -> None:
        ids = [i.strip() for i in (h.sub_id or "").split(",") if i.strip()]
        subs = [self.subs[i] for i in ids if i in self.subs]
        missing = [i for i in ids if i not in self.subs]
        if missing or not subs:
            self.fail(
                h,
                "invalid options",
                f"{'resume' if opts.resume else 'pause'} names unknown sub_id(s) {', '.join(missing) or '(none)'}",
            )
            return
        plain = [s.sub_id for s in subs if s.bookmark is None]
        if plain:
            self.fail(
                h,
                "invalid options",
                f"pause and resume apply to bookmark subscriptions; {', '.join(plain)} has no bookmark",
            )
            return
        if opts.resume:
            self.server.resume_subscriptions(subs)
        else:
            self.server.pause_subscriptions(subs)
        if "processed" in acks:
            self.send_ack("processed", h.cid, sub_id=h.sub_id)

    def cmd_unsubscribe(self, h, body) -> None:
        ids = (h.sub_id or "").strip()
        if not ids:
            self.fail(
                h, "invalid options", "unsubscribe needs sub_id (an id, a comma list, or all)"
            )
            return
        if ids == "all":
            targets = list(self.subs.values())
        else:
            targets = [self.subs[i] for i in (x.strip() for x in ids.split(",")) if i in self.subs]
        for sub in targets:
            del self.subs[sub.sub_id]
            self.server.remove_subscription(sub)
        if "processed" in _ack_types(h.a):
            self.send_ack("processed", h.cid, sub_id=h.sub_id)

    def cmd_heartbeat(self, h, body) -> None:
        try:
            opts = heartbeat_options(h.o) if h.o else None
        except InvalidOptions as exc:
            self.fail(h, "invalid options", str(exc))
            return
        if opts is not None and opts.start:
            self.hb_interval = opts.start
            self.server.heartbeats.add(self)
        if "processed" in _ack_types(h.a):
            self.send_ack("processed", h.cid)

    def cmd_flush(self, h, body) -> None:
        self.server.pipeline.add_flush(self, h.cid, sorted(_ack_types(h.a)))

    def cmd_sow_delete(self, h, body) -> None:
        self.server.sow_delete(self, h, body)


_HANDLERS = {
    "logon": Connection.cmd_logon,
    "publish": Connection.cmd_publish,
    "subscribe": Connection.cmd_subscribe,
    "unsubscribe": Connection.cmd_unsubscribe,
    "heartbeat": Connection.cmd_heartbeat,
    "flush": Connection.cmd_flush,
    "sow_delete": Connection.cmd_sow_delete,
}
