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

import itertools
import logging
import operator
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from functools import partial
from typing import Any

import msgspec

from protocol.bookmarks import format_bookmark
from protocol.filters import FilterError, cached_filter, compile_filter
from protocol.framing import RAW_RUN, FrameError, RawFrames, expand
from protocol.headers import (
    FAST_PUBLISH_ACK,
    SLOW_PUBLISH_FIELDS,
    FieldError,
    Header,
    check_fields,
)
from protocol.options import InvalidOptions, heartbeat_options, logon_options

from .ids import publisher_id, server_publisher_id
from .matching import Predicate
from .outbox import Outbox
from .reasons import Disconnect, Failure
from .security.authenticator import AuthFailure, Identity, certificate_identity
from .security.entitlements import Entitlements
from .services import SessionServices
from .session_caller import Caller
from .session_delta import DeltaCommands
from .session_publish import PublishCommands
from .session_sow import SowCommands
from .session_subscribe import SubscribeCommands
from .subscription_table import SubscriptionTable
from .subscriptions import ack_types

__all__ = ["Session"]

log = logging.getLogger("tickertape.connection")

_json = msgspec.json.encode
_ids = itertools.count(1)
# a publish with a field that only cmd_publish acts on is not one for a run (protocol/headers.py)
_slow_fields = operator.attrgetter(*sorted(SLOW_PUBLISH_FIELDS))
_NO_SLOW_FIELDS = _slow_fields(Header())


@dataclass(eq=False, repr=False)
class Session:
    out: Outbox
    services: InitVar[SessionServices]
    on_logon: Callable[[], None] = lambda: None  # the connection raises its frame limit
    conn_id: InitVar[int | None] = None
    hold: Callable[[bool], None] = lambda on: None  # the connection stops reading (a logon check)

    def __post_init__(self, services: SessionServices, conn_id: int | None) -> None:
        self.id = next(_ids) if conn_id is None else conn_id
        self.svc = services
        self.peer = "?"
        self.peer_cert: Any = None  # the verified client certificate of a TLS connection
        self.transport_name: str | None = None
        # frames behind a logon being checked, or a filter being compiled (filter_ready)
        self._held: list[tuple[Header, Any]] | None = None
        self._compiled: tuple[str, Any] | None = None  # a filter compiled off the loop
        self._ent: Entitlements | None = None  # what this user may do; None: everything
        self.client_name: str | None = None
        self.user_id: str | None = None
        self.logged_on = False
        self.table = SubscriptionTable(self.describe, services.index, services.replays)
        self.out.on_lag = self.table.fall_back  # past <ClientOfflineThreshold>
        self.hb_interval = 0.0
        self._sub_ids = itertools.count(1)
        # the command handlers (server/session_caller.py), each built at its first command after
        # the logon (publisher, subscribing, sowing, delta); _ROUTES names them
        self._caller: Caller
        self._ack_conflation = 0.0
        self.publishing: PublishCommands | None = None  # built at the first publish (publisher)
        # Built at first use like `publishing`, not functools.cached_property: that writes
        # through the instance's __dict__, and a session whose __dict__ was once read loses the
        # 3.11 interpreter's specialised attribute reads, on every read of every attribute
        # (some 15 a queue acknowledgement, each a generic lookup; tests/server/test_attribute_reads.py)
        self._sowing: SowCommands | None = None
        self._subscribing: SubscribeCommands | None = None
        self._delta: DeltaCommands | None = None

    @property
    def is_publisher(self) -> bool:
        return self.publishing is not None and self.publishing.is_publisher

    @property
    def received(self) -> int:
        return self.publishing.received if self.publishing is not None else 0

    def describe(self) -> str:
        return f"connection {self.id} client={self.client_name or '-'} peer={self.peer}"

    # -- input -------------------------------------------------------------------------------

    def receive(self, frames_in: list[tuple[Header, Any]]) -> None:
        """Handle the frames decoded from one read, in order; stop at a close. Frames behind a
        logon that is checked off the event loop wait for its outcome."""
        self._receive(frames_in)
        p = self.publishing
        if p is not None and p.is_publisher:
            self.svc.pipeline.read_done()

    def _receive(self, frames_in: list[tuple[Header, Any]]) -> None:
        if self._held is not None:
            self._held.extend(frames_in)
            return
        routes = _ROUTES
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
                    self.publisher._publish_run(run)
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
                self.publisher._publish_run(run)
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
            route = routes.get(header.c or "")
            if route is None:
                self.fail(
                    header,
                    Failure.UNKNOWN_COMMAND,
                    f"unknown command {header.c!r}; see docs/protocol.md §3",
                )
                out.close(Disconnect.UNKNOWN_COMMAND)
                break
            owner, handler = route
            if not self.logged_on and handler is not Session.cmd_logon:
                self.fail(header, Failure.LOGON_REQUIRED, "the first command must be logon")
                out.close(Disconnect.LOGON_REQUIRED)
                break
            try:
                handler(getattr(self, owner) if owner else self, header, body)
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
            self.publisher._publish_run(run)

    def _raw_publishes(self, frames_in: RawFrames) -> None:
        """Publish frames the decoder left whole: the publisher's fast path once logged on
        without entitlements to check; what waits behind a check off the loop is held."""
        raw = frames_in.data
        if not self.logged_on or self._ent is not None:
            self._receive_raw(raw)
            return
        pos = (self.publishing or self.publisher).raw_publishes(raw)  # built: no property call
        if pos < len(raw) and self._held is not None:  # behind a logon being checked
            self._held.append((RAW_RUN, RawFrames(raw[pos:])))

    def _receive_raw(self, raw: bytes) -> None:
        try:
            got = expand(raw)
        except FrameError as exc:
            self._receive(exc.frames)
            self.bad_input(exc)
            return
        self._receive(got)

    # -- the filter wait -------------------------------------------------------------------------

    def filter_ready(self, h: Header, body: Any) -> bool:
        """Whether the command's filter `h.f` can be had now (cached, short, or compiled off
        the loop for this very command). If not, its compile starts on the server's filter
        thread, the connection stops reading and its frames wait (as behind a logon), and the
        command is handled again when the compile is done: a large filter never stalls the
        event loop, and one connection has at most one compile under way."""
        done = self._compiled
        if done is not None and done[0] == h.f:
            return True
        try:
            if cached_filter(h.f or "") is not None:
                return True
        except FilterError:
            return True  # refused by the command, at once
        self._held = []
        self.hold(True)
        self.svc.compile_later(h.f or "", partial(self._filter_compiled, h, body))
        return False

    def _filter_compiled(self, h: Header, body: Any, result: Predicate | FilterError) -> None:
        held, self._held = self._held, None
        if self.out.closing:
            return
        self._compiled = (h.f or "", result)
        self.hold(False)
        self.receive([(h, body), *(held or ())])
        self.out.flush()

    def compiled_filter(self, h: Header) -> Predicate | None:
        """The command's filter `h.f` compiled (from filter_ready's compile, if it made one);
        refused with `bad filter` (and None) when it does not compile."""
        done, self._compiled = self._compiled, None
        try:
            if done is not None and done[0] == h.f:
                if isinstance(done[1], FilterError):
                    raise done[1]
                return done[1]
            return compile_filter(h.f or "")
        except FilterError as exc:
            self.fail(h, Failure.BAD_FILTER, str(exc))
            return None

    def bad_input(self, error: FrameError) -> None:
        """Input that does not frame: a failure ack, then the connection closes."""
        if self.out.closing:
            return
        self.out.send_ack("processed", None, "failure", Failure.BAD_FRAME, detail=str(error))
        log.warning("connection %d (%s): bad frame: %s", self.id, self.describe(), error)
        self.out.close(Disconnect.BAD_FRAME)

    def closed(self) -> None:
        """The connection is gone: drop every subscription and the client name."""
        if self.publishing is not None:
            self.publishing.closed()
        if self._sowing is not None and self._sowing._queries:
            self._sowing.stop_queries()
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
        pub = publisher_id(self.client_name)
        self._logged_on(pub, ack_conflation or 0.0)
        self.logged_on = True
        self.on_logon()
        seq = svc.pipeline.durable.get(pub, 0)
        log.info("logon: %s user=%s last_seq=%d", self.describe(), self.user_id or "-", seq)
        # the handoff covers what the journal holds of it, which is more than the logon reports
        # while the sync gate holds replicated batches (server/replication/handoff.py)
        held = max(seq, svc.pipeline.highest.get(pub, 0))
        if held:
            svc.publisher_logon(pub, held)
        if "processed" in acks or not acks:
            self.out.send_ack(
                "processed",
                h.cid,
                s=seq,
                bm=format_bookmark(pub, seq) if seq else "",
                client_name=self.client_name,
            )

    def _logged_on(self, pub: int, ack_conflation: float) -> None:
        """What the command handlers are handed (each is built at its first command: most
        connections use one or two of them)."""
        assert self.client_name is not None
        self._caller = Caller(
            self.id,
            self.peer,
            self.user_id,
            self._ent,
            self.svc.guard,
            pub,
            server_publisher_id(self.client_name, self.svc.instance),
            self.out,
            self.table,
            self.describe,
            self.fail,
            self.not_entitled,
            self._new_sub_id,
            self.filter_ready,
            self.compiled_filter,
        )
        self._ack_conflation = ack_conflation

    @property
    def publisher(self) -> PublishCommands:
        p = self.publishing
        if p is None:
            p = self.publishing = PublishCommands(
                self._caller, self.svc, self._receive_raw, self._waiting, self._ack_conflation
            )
        return p

    @property
    def subscribing(self) -> SubscribeCommands:
        s = self._subscribing
        if s is None:
            s = self._subscribing = SubscribeCommands(self._caller, self.svc)
        return s

    @property
    def sowing(self) -> SowCommands:
        s = self._sowing
        if s is None:
            s = self._sowing = SowCommands(
                self._caller, self.svc, self.subscribing.cmd_subscribe, self.publisher.cmd_publish
            )
        return s

    @property
    def delta(self) -> DeltaCommands:
        d = self._delta
        if d is None:
            d = self._delta = DeltaCommands(self._caller, self.svc, self.sowing)
        return d

    def _waiting(self) -> bool:
        return self._held is not None

    def _new_sub_id(self) -> str:
        return f"{self.id}.{next(self._sub_ids)}"

    def cmd_unsubscribe(self, h: Header, body: bytes) -> None:
        ids = (h.sub_id or "").strip()
        if h.query_id or (self._sowing is not None and self._sowing._queries and ids):
            # a SOW query still sending, by its query_id or the sub_id of a sow_and_subscribe
            names = [x.strip() for x in (h.query_id or "").split(",") if x.strip()]
            names += [x.strip() for x in ids.split(",") if x.strip()] if ids != "all" else []
            self.sowing.stop_queries(None if ids == "all" else names)
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

    def cmd_sow_delete(self, h: Header, body: bytes) -> None:
        """Queue acknowledgements: bookmarks (the normal, batched case) or a filter; on a SOW
        topic, deleted records (server/session_sow.py)."""
        if h.f and not h.bm and not self.filter_ready(h, body):
            return
        q = self.svc.queues.queues.get(h.t or "")  # one dict lookup: a consumer's ack each read
        if q is None and self.svc.sow is not None and self.svc.sow.is_sow(h.t or ""):
            self.sowing.sow_delete_records(h, body, self.svc.sow)
            return
        if q is None:
            self.fail(
                h,
                Failure.NOT_A_QUEUE,
                f"topic {h.t!r} is not a queue; sow_delete acknowledges queue messages",
            )
            return
        self.subscribing.queue_ack(h, q)


# command -> (the session's handler attribute that takes it, "" for the session's own; the
# method): only logon before the logon, after which each is built at its first command
_ROUTES: dict[str, tuple[str, Callable[[Any, Header, Any], None]]] = {
    "logon": ("", Session.cmd_logon),
    "publish": ("publisher", PublishCommands.cmd_publish),
    "subscribe": ("subscribing", SubscribeCommands.cmd_subscribe),
    "unsubscribe": ("", Session.cmd_unsubscribe),
    "heartbeat": ("", Session.cmd_heartbeat),
    "flush": ("publisher", PublishCommands.cmd_flush),
    "sow_delete": ("", Session.cmd_sow_delete),
    "sow": ("sowing", SowCommands.cmd_sow),
    "sow_and_subscribe": ("sowing", SowCommands.cmd_sow_and_subscribe),
    "delta_subscribe": ("delta", DeltaCommands.cmd_delta_subscribe),
    "sow_and_delta_subscribe": ("delta", DeltaCommands.cmd_sow_and_delta_subscribe),
    "delta_publish": ("delta", DeltaCommands.cmd_delta_publish),
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
