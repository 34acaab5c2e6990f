"""One client's session: logon, every command, its subscriptions, its acks. No sockets.

A `Session` gets decoded frames from its connection (server/connection.py) and answers through
its `Outbox`; everything else it uses is injected (`SessionServices`): the pipeline it publishes
to, the queues, the replay engine, the live index, the topic rules, the counters, a timer.
Subscribe, pause, resume and replace are in server/session_subscribe.py; the state of each
subscription is owned by the session's `SubscriptionTable` (server/subscription_table.py).

States: connected -> logged on -> closed. The first command must be `logon`
(docs/protocol.md §3); anything else fails with `logon required` and closes the connection. A
command a session refuses gets a failure ack (when one was asked for; always for logon,
subscribe, unsubscribe and sow_delete) and a log line. Every close has a reason
(server/reasons.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from protocol.bookmarks import format_bookmark
from protocol.framing import FrameError, RawFrames
from protocol.headers import (
    FAST_PUBLISH_ACK,
    SLOW_PUBLISH_FIELDS,
    FieldError,
    Header,
    check_fields,
)
from protocol.options import InvalidOptions, heartbeat_options, logon_options, sow_delete_options

from . import frames
from .ids import publisher_id, server_publisher_id
from .matching import Predicate
from .outbox import Outbox
from .queue import Queue
from .reasons import Disconnect, Failure
from .security.authenticator import AuthFailure, Identity, certificate_identity
from .security.entitlements import Entitlements
from .services import SessionServices
from .session_publish import PublishCommands
from .session_sow import SowCommands
from .session_subscribe import SubscribeCommands
from .sow import SowQuery
from .subscription_table import SubscriptionTable
from .subscriptions import ack_types

__all__ = ["Session"]

log = logging.getLogger("tickertape.connection")

_json = msgspec.json.encode
_ids = itertools.count(1)
# a publish with a field that only cmd_publish acts on is not one for a run (protocol/headers.py)
_slow_fields = operator.attrgetter(*sorted(SLOW_PUBLISH_FIELDS))
_NO_SLOW_FIELDS = _slow_fields(Header())


class Session(SubscribeCommands, PublishCommands, SowCommands):
    def __init__(
        self,
        out: Outbox,
        services: SessionServices,
        on_logon: Callable[[], None] = lambda: None,
        conn_id: int | None = None,
        hold: Callable[[bool], None] = lambda on: None,
    ) -> None:
        self.id = next(_ids) if conn_id is None else conn_id
        self.out = out
        self.svc = services
        self.on_logon = on_logon  # the connection raises its frame limit
        self.hold = hold  # the connection stops reading while a logon is checked
        self.peer = "?"
        self.peer_cert: Any = None  # the verified client certificate of a TLS connection
        self.transport_name: str | None = None
        # frames behind a logon being checked, or a filter being compiled (filter_ready)
        self._held: list[tuple[Header, Any]] | None = None
        self._compiled: tuple[str, Any] | None = None  # a filter compiled off the loop
        self._ent: Entitlements | None = None  # what this user may do; None: everything
        self.client_name: str | None = None
        self.user_id: str | None = None
        self.pub = 0
        self.server_pub = 0
        self.logged_on = False
        self.table = SubscriptionTable(self.describe, services.index, services.replays)
        out.on_lag = self.table.fall_back  # past <ClientOfflineThreshold>
        self.wants_persisted = False
        self._gap_told = 0  # the gap a persisted failure was sent for (_refuse_above_gap)
        self.is_publisher = False
        self.hb_interval = 0.0
        self.ack_conflation = 0.0
        self._persist_pending = 0
        self._ack_timer: asyncio.TimerHandle | None = None
        self._sub_counter = 0
        self._queries: dict[str, SowQuery] = {}  # SOW answers still sending (server/session_sow.py)
        self.received = 0

    def describe(self) -> str:
        return f"connection {self.id} client={self.client_name or '-'} peer={self.peer}"

    # -- input -------------------------------------------------------------------------------

    def receive(self, frames_in: list[tuple[Header, Any]]) -> None:
        """Handle the frames decoded from one read, in order; stop at a close. Frames behind a
        logon that is checked off the event loop wait for its outcome."""
        self._receive(frames_in)
        if self.is_publisher:
            self.svc.pipeline.read_done()

    def _receive(self, frames_in: list[tuple[Header, Any]]) -> None:
        if self._held is not None:
            self._held.extend(frames_in)
            return
        handlers = _HANDLERS
        out = self.out
        rest = iter(frames_in)
        # consecutive plain publishes (no ack of their own to send) are taken as one run
        run: list[tuple[Header, bytes]] = []
        plain = self.logged_on and self._ent is None
        for header, body in rest:
            if out.closing:
                break
            if type(body) is RawFrames:
                if run:
                    self._publish_run(run)
                    run = []
                self._raw_publishes(body)
                if self._held is not None:  # a logon inside the run is being checked
                    self._held.extend(rest)
                    break
                plain = self.logged_on and self._ent is None
                continue
            if (
                plain
                and header.c == "publish"
                and type(body) is bytes
                and header.s is not None
                and _slow_fields(header) == _NO_SLOW_FIELDS
                and (header.a is None or header.a == FAST_PUBLISH_ACK)
                and check_fields(header) is None
            ):
                run.append((header, body))
                continue
            if run:
                self._publish_run(run)
                run = []
                if out.closing:
                    break
            problem = body if type(body) is FieldError else check_fields(header)
            if problem is not None:
                self.fail(header, problem.reason, problem.detail)
                if not self.logged_on:  # a logon is refused with its connection
                    out.close(problem.reason)
                    break
                continue
            handler = handlers.get(header.c or "")
            if handler is None:
                self.fail(
                    header,
                    Failure.UNKNOWN_COMMAND,
                    f"unknown command {header.c!r}; see docs/protocol.md §3",
                )
                out.close(Disconnect.UNKNOWN_COMMAND)
                break
            if not self.logged_on and handler is not Session.cmd_logon:
                self.fail(header, Failure.LOGON_REQUIRED, "the first command must be logon")
                out.close(Disconnect.LOGON_REQUIRED)
                break
            try:
                handler(self, header, body)
            except Exception:  # a bug must cost one connection, never the server
                log.exception("connection %d: error handling %s", self.id, header.c)
                self.fail(header, Failure.BAD_FRAME, "internal error handling this command")
                out.close(Disconnect.BAD_FRAME)
                break
            if self._held is not None:  # the logon is being checked
                self._held.extend(rest)
                break
            plain = self.logged_on and self._ent is None
        if run:
            self._publish_run(run)

    def bad_input(self, error: FrameError) -> None:
        """Input that does not frame: a failure ack, then the connection closes."""
        if self.out.closing:
            return
        self.out.send_ack("processed", None, "failure", Failure.BAD_FRAME, detail=str(error))
        log.warning("connection %d (%s): bad frame: %s", self.id, self.describe(), error)
        self.out.close(Disconnect.BAD_FRAME)

    def closed(self) -> None:
        """The connection is gone: drop every subscription and the client name."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        if self._queries:
            self.stop_queries()
        self.table.remove_all()
        names = self.svc.names
        if self.client_name and names.get(self.client_name) is self:
            del names[self.client_name]

    # -- refusals and acks ---------------------------------------------------------------------

    def fail(self, header: Header, reason: str, detail: str) -> None:
        """Refuse a command: failure ack if one was asked for, and always a log line."""
        log.warning("%s: %s refused: %s: %s", self.describe(), header.c, reason, detail)
        self.svc.counters.refused += 1
        acks = ack_types(header.a)
        kind = "processed" if "processed" in acks or not acks else sorted(acks)[0]
        if acks or header.c in _ALWAYS_ANSWERED:
            self.out.send_ack(
                kind, header.cid, "failure", reason, detail=detail, sub_id=header.sub_id, s=header.s
            )

    def not_entitled(self, h: Header, right: str, topic: str) -> None:
        """Refuse a command the user's roles do not allow (audited by the caller's check);
        the connection stays open."""
        self.svc.counters.not_entitled += 1
        self.fail(
            h,
            Failure.NOT_ENTITLED,
            f"user {self.user_id!r} has no {right} right on {topic!r} (<Entitlement>)",
        )

    # Publisher (server/pipeline.py): what the pipeline tells a publishing client

    def persisted(self, seq: int) -> None:
        """A commit made everything up to `seq` durable: one conflated ack.

        With `ack_conflation` the acks of one interval are conflated on its leading edge: the
        first ack after a quiet interval goes out at once (a lone publish waits for no timer),
        and opens an interval; what becomes durable during it is acked once, at its end, which
        opens the next. So a publisher gets at most about one ack per interval, and none later
        than the interval (docs/protocol.md §3)."""
        out = self.out
        if out.closing:
            return
        if self.ack_conflation:
            if self._ack_timer is not None:
                self._persist_pending = max(self._persist_pending, seq)
                return
            self._ack_timer = self.svc.call_later(self.ack_conflation, self._send_conflated)
        out.buf.append(frames.persisted_ack(seq))
        out.flush()

    def _send_conflated(self) -> None:
        self._ack_timer = None
        if self._persist_pending and not self.out.closing:
            seq, self._persist_pending = self._persist_pending, 0
            self.out.send_ack("persisted", None, s=seq)
            self.out.flush()
            self._ack_timer = self.svc.call_later(self.ack_conflation, self._send_conflated)

    def persist_failed(self, reason: str, detail: str) -> None:
        if self.out.closing:
            return
        self.out.send_ack("persisted", None, "failure", reason, detail=detail)
        self.out.flush()

    def flush_done(self, cid: Any, acks: list[str]) -> None:
        if self.out.closing:
            return
        for kind in acks or ("completed",):
            self.out.send_ack(kind, cid)
        self.out.flush()

    def flush_failed(self, cid: Any, acks: list[str], reason: str) -> None:
        if self.out.closing:
            return
        for kind in acks or ("completed",):
            self.out.send_ack(kind, cid, "failure", reason)
        self.out.flush()

    # -- commands ------------------------------------------------------------------------------

    def cmd_logon(self, h: Header, body: bytes) -> None:
        svc = self.svc
        if self.logged_on:
            self.fail(
                h,
                Failure.AUTH_FAILURE,
                "this connection is already logged on; open a new connection",
            )
            return
        why = svc.logons_refused()
        if why is not None:
            self.fail(h, Failure.CATCHING_UP, why)
            self.out.close(Disconnect.CATCHING_UP)
            return
        name = h.client_name
        if not name and svc.has_journal:
            self.fail(
                h,
                Failure.LOGON_REQUIRED,
                "client_name is required: this instance has a transaction log",
            )
            self.out.close(Disconnect.LOGON_REQUIRED)
            return
        try:
            opts = logon_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            self.out.close(Disconnect.AUTH_FAILURE)
            return
        guard = svc.guard
        if guard.checker is None:
            # no <Authentication>: the user is who the client says, unless a verified client
            # certificate (mutual TLS) names it
            user = certificate_identity(self.peer_cert) if self.peer_cert else None
            self._accept_logon(h, opts.ack_conflation, user or h.user_id)
            return
        self._held = []
        self.hold(True)
        guard.logon(
            self.peer,
            h.user_id,
            h.pw,
            self.peer_cert,
            self.transport_name,
            partial(self._logon_checked, h, opts.ack_conflation),
        )

    def _logon_checked(
        self, h: Header, ack_conflation: float | None, outcome: Identity | AuthFailure
    ) -> None:
        """The outcome of an authenticated logon; then the frames that waited behind it."""
        held, self._held = self._held, None
        out = self.out
        if out.closing:
            return
        if isinstance(outcome, AuthFailure):
            self.svc.counters.auth_failures += 1
            self.fail(
                h,
                Failure.AUTH_FAILURE,
                f"logon as {h.user_id or '(no user_id)'!r} not accepted; the server's audit "
                "trail says why",
            )
            out.close(Disconnect.AUTH_FAILURE)
            return
        self._accept_logon(h, ack_conflation, outcome.user)
        self.hold(False)
        if held:
            self.receive(held)
        out.flush()

    def _accept_logon(self, h: Header, ack_conflation: float | None, user: str | None) -> None:
        """Log on as `user` (authenticated, or as claimed without <Authentication>): the
        `name in use` rule compares it with the user of the connection holding the name, and
        with <Authentication> also with the user the name is bound to (the first to publish
        under it, bind_name), connected or not."""
        svc = self.svc
        name = h.client_name
        acks = ack_types(h.a)
        if name and svc.guard.checker is not None:
            owner = svc.pipeline.owners.get(publisher_id(name))
            if owner is not None and owner != user:
                self.fail(
                    h,
                    Failure.NAME_IN_USE,
                    f"client name {name!r} is bound to another user (the first to publish "
                    "under it); choose another client_name",
                )
                self.out.close(Disconnect.NAME_IN_USE)
                return
        if name:
            other = svc.names.get(name)
            if other is not None and other is not self:
                if other.user_id == user:
                    other.out.close(Disconnect.NAME_IN_USE)
                    svc.names.pop(name, None)
                else:
                    self.fail(
                        h,
                        Failure.NAME_IN_USE,
                        f"client name {name!r} is connected with another user id",
                    )
                    self.out.close(Disconnect.NAME_IN_USE)
                    return
            svc.names[name] = self
        self.client_name = name or f"anonymous-{self.id}"
        self.user_id = user
        self._ent = svc.guard.entitlements
        self.pub = publisher_id(self.client_name)
        self.server_pub = server_publisher_id(self.client_name, svc.instance)
        self.ack_conflation = ack_conflation or 0.0
        self.logged_on = True
        self.on_logon()
        seq = svc.pipeline.durable.get(self.pub, 0)
        log.info("logon: %s user=%s last_seq=%d", self.describe(), self.user_id or "-", seq)
        if seq:
            svc.publisher_logon(self.pub, seq)
        if "processed" in acks or not acks:
            self.out.send_ack(
                "processed",
                h.cid,
                s=seq,
                bm=format_bookmark(self.pub, seq) if seq else "",
                client_name=self.client_name,
            )

    def cmd_unsubscribe(self, h: Header, body: bytes) -> None:
        ids = (h.sub_id or "").strip()
        if h.query_id or (self._queries and ids):
            # a SOW query still sending, by its query_id or the sub_id of a sow_and_subscribe
            names = [x.strip() for x in (h.query_id or "").split(",") if x.strip()]
            names += [x.strip() for x in ids.split(",") if x.strip()] if ids != "all" else []
            self.stop_queries(None if ids == "all" else names)
            if not ids:
                if "processed" in ack_types(h.a):
                    self.out.send_ack("processed", h.cid, query_id=h.query_id)
                return
        if not ids:
            self.fail(
                h, Failure.INVALID_OPTIONS, "unsubscribe needs sub_id (an id, a comma list, or all)"
            )
            return
        table = self.table
        if ids == "all":
            targets = list(table)
        else:
            targets = [s for s in (table.get(x.strip()) for x in ids.split(",")) if s is not None]
        for sub in targets:
            table.remove(sub)
        if "processed" in ack_types(h.a):
            self.out.send_ack("processed", h.cid, sub_id=h.sub_id)

    def cmd_heartbeat(self, h: Header, body: bytes) -> None:
        try:
            opts = heartbeat_options(h.o) if h.o else None
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return
        if opts is not None and opts.start:
            self.hb_interval = opts.start
        if "processed" in ack_types(h.a):
            self.out.send_ack("processed", h.cid)

    def cmd_flush(self, h: Header, body: bytes) -> None:
        self.svc.pipeline.add_flush(self, h.cid, sorted(ack_types(h.a)))

    def cmd_sow_delete(self, h: Header, body: bytes) -> None:
        """Queue acknowledgements: bookmarks (the normal, batched case) or a filter; on a SOW
        topic, deleted records (server/session_sow.py)."""
        if h.f and not h.bm and not self.filter_ready(h, body):
            return
        q = self.svc.queues.queues.get(h.t or "")  # one dict lookup: a consumer's ack each read
        if q is None and self.svc.sow is not None and self.svc.sow.is_sow(h.t or ""):
            self.sow_delete_records(h, body, self.svc.sow)
            return
        if q is None:
            self.fail(
                h,
                Failure.NOT_A_QUEUE,
                f"topic {h.t!r} is not a queue; sow_delete acknowledges queue messages",
            )
            return
        ent = self._ent
        if ent is not None and not ent.check(
            self.peer, self.user_id or "", "consume", q.name, "sow_delete"
        ):
            self.not_entitled(h, "consume", q.name)
            return
        try:
            opts = sow_delete_options(h.o)
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return
        if h.bm:
            try:
                bms = q.normalize_bookmarks(h.bm.split(","))
            except ValueError as exc:
                self.fail(
                    h,
                    Failure.INVALID_BOOKMARK,
                    f"{exc.args[0]!r} is not a bookmark (publisher|seq|)",
                )
                return
            n, refused = q.ack(
                self.table,
                bms,
                cancel=opts.cancel,
                expire=opts.expire,
                extend=opts.lease_extend,
                visible=self._queue_view(q, None),
            )
        elif h.f:
            f = self.compiled_filter(h)
            if f is None:
                return
            n, refused = q.ack_filter(
                self.table,
                self._queue_view(q, f) or f,
                cancel=opts.cancel,
                expire=opts.expire,
                extend=opts.lease_extend,
            )
        else:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                "sow_delete on a queue needs bm (bookmarks) or f (a filter)",
            )
            return
        acks = [a.strip() for a in (h.a or "").split(",") if a.strip()]
        if not acks:
            return
        if refused:
            log.warning(
                "%s: sow_delete on %s refused for %d: %s",
                self.describe(),
                q.name,
                len(refused),
                refused[0],
            )
        out = self.out

        def reply(err: BaseException | None) -> None:
            if out.closing:
                return
            for kind in acks:
                if err is not None:
                    out.send_ack(
                        kind,
                        h.cid,
                        "failure",
                        getattr(err, "reason", Failure.JOURNAL_UNAVAILABLE),
                        detail=str(err),
                    )
                elif refused:
                    out.send_ack(
                        kind,
                        h.cid,
                        "failure",
                        Failure.NOT_ENTITLED,
                        detail="; ".join(refused[:5]),
                        records_deleted=n,
                    )
                else:
                    out.send_ack(kind, h.cid, records_deleted=n)
            out.flush()

        self.svc.pipeline.after_commit(reply)  # acked only once the acknowledgement is durable

    def _queue_view(self, q: Queue, own: Predicate | None) -> Predicate | None:
        """What a sow_delete of this user may act on in `q`: `own` (a filter, None: anything)
        AND the user's content entitlement on the queue and its topic, the filter a queue
        subscription of this user reads through. A user acks, cancels or expires only what it
        could be delivered."""
        if self._ent is None:
            return own
        grant = self.svc.guard.grant(
            self.peer, self.user_id, "consume", q.name, False, own, "sow_delete",
            also=(q.spec.underlying_topic,),
        )  # fmt: skip
        return own if grant is None else grant.filter


_HANDLERS: dict[str, Callable[[Session, Header, Any], None]] = {
    "logon": Session.cmd_logon,
    "publish": Session.cmd_publish,
    "subscribe": Session.cmd_subscribe,
    "unsubscribe": Session.cmd_unsubscribe,
    "heartbeat": Session.cmd_heartbeat,
    "flush": Session.cmd_flush,
    "sow_delete": Session.cmd_sow_delete,
    "sow": Session.cmd_sow,
    "sow_and_subscribe": Session.cmd_sow_and_subscribe,
    "delta_subscribe": Session.cmd_delta_subscribe,
    "sow_and_delta_subscribe": Session.cmd_sow_and_delta_subscribe,
    "delta_publish": Session.cmd_delta_publish,
}
# commands refused with a failure ack even when the client asked for no ack
_ALWAYS_ANSWERED = frozenset(
    (
        "logon",
        "subscribe",
        "unsubscribe",
        "sow_delete",
        "sow",
        "sow_and_subscribe",
        "delta_subscribe",
        "sow_and_delta_subscribe",
    )
)
