"""The `publish` command of a session (docs/protocol.md §3; docs/publishing.md): one publish,
a run of plain publishes from one read, and a run of publish frames the decoder left whole.

`cmd_publish` handles one decoded publish (topic, entitlement, the pipeline's outcome, its acks;
a publish past its publisher's gap is refused). `_publish_run` takes the plain publishes of one
read (no ack of their own) in one `Pipeline.publish_run` call. `raw_publishes` takes the whole
frames the decoder left undecoded (server/publish_scan.py): `Pipeline.publish_raw` stores the
plain publishes among them straight from the bytes, and any other frame is decoded and handled
as `Session.receive` handles it. `PublishCommands` is the object a session builds at logon
(server/session_caller.py says what it is handed); it is also the pipeline's `Publisher` for
the session: the `persisted` acks (conflated with the logon's `ack_conflation`), flush
markers and their failures.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from journal.record import RecordFieldError
from protocol.framing import frame_end
from protocol.headers import Header

from . import frames
from .outbox import Outbox
from .pipeline import ABOVE_GAP, DUPLICATE
from .reasons import Disconnect, Failure
from .services import SessionServices
from .session_caller import Caller
from .sow import BadSowKey
from .sow.keys import k_fragment
from .subscriptions import ack_types

__all__ = ["PublishCommands"]

log = logging.getLogger("tickertape.connection")

_json = msgspec.json.encode


@dataclass(eq=False, repr=False, slots=True)
class PublishCommands:
    """One logged-on session's publishes, and the pipeline's `Publisher` for it (the acks a
    commit owes this client). `receive_raw`: the session's way with frames that are not plain
    publishes; `waiting`: whether the session holds its frames (a check runs off the loop)."""

    caller: Caller  # who publishes (server/session_caller.py)
    svc: SessionServices
    _receive_raw: Callable[[bytes], None]
    _waiting: Callable[[], bool]
    ack_conflation: float
    out: Outbox = field(init=False)  # the persisted acks, per commit
    fail: Callable[[Header, str, str], None] = field(init=False)
    pub: int = field(init=False)
    server_pub: int = field(init=False)
    wants_persisted: bool = field(default=False, init=False)
    is_publisher: bool = field(default=False, init=False)
    received: int = field(default=0, init=False)
    # the gap a persisted failure was sent for (_refuse_above_gap)
    _gap_told: int = field(default=0, init=False)
    _persist_pending: int = field(default=0, init=False)
    _ack_timer: asyncio.TimerHandle | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        c = self.caller
        self.out, self.fail, self.pub, self.server_pub = c.out, c.fail, c.pub, c.server_pub

    def closed(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()

    def bind_name(self) -> None:
        """This connection's first publish: with <Authentication>, its client name is bound to
        its user from now on, durably (the logon of another user under that name is refused
        `name in use`, connected or not: docs/security.md)."""
        svc = self.svc
        if svc.guard.checker is not None and self.caller.user_id is not None:
            if not svc.pipeline.bind_owner(self.pub, self.caller.user_id):
                log.warning(
                    "%s: client name is bound to another user (both logged on before either "
                    "published); its publishes are taken, the binding stays",
                    self.caller.describe(),
                )

    # -- the pipeline's Publisher (server/pipeline.py) --------------------------------------------

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

    def cmd_flush(self, h: Header, body: bytes) -> None:
        self.svc.pipeline.add_flush(self, h.cid, sorted(ack_types(h.a)))

    # -- publish -----------------------------------------------------------------------------------

    def cmd_publish(self, h: Header, body: bytes) -> None:
        svc = self.svc
        topic = svc.topics.publish_topic(h.t) if h.t else None
        if not topic:
            self.fail(h, Failure.INVALID_TOPIC, f"publish needs a literal topic, got {h.t!r}")
            return
        if not self.caller.may(h, "publish", topic, "publish"):
            return
        a = h.a
        if a is not None and "persisted" in a:
            self.wants_persisted = True
        if not self.is_publisher:
            self.bind_name()
        self.is_publisher = True
        self.received += 1
        hdr = b',"x":' + _json(h.x) if h.x is not None else b""
        sow = svc.sow
        if sow is not None and sow.is_sow(topic):
            try:
                k = sow.key(topic, body, h.k)  # the record's key, `k` (server/sow/)
            except BadSowKey as exc:
                self.fail(h, Failure.BAD_SOW_KEY, str(exc))
                return
            hdr += k_fragment(k)
        try:
            seq, outcome = svc.pipeline.publish(
                self,
                self.pub if h.s is not None else self.server_pub,
                h.s,
                topic,
                body,
                hdr,
                h.e,
            )
        except RecordFieldError as exc:
            self.fail(h, Failure.BAD_FRAME, str(exc))
            return
        if outcome == ABOVE_GAP:
            self._refuse_above_gap(h, seq)
            return
        if a is not None and ("processed" in a or "received" in a):
            for kind in ack_types(a) & {"received", "processed"}:
                self.out.send_ack(
                    kind, h.cid, s=seq, reason="duplicate" if outcome == DUPLICATE else None
                )

    def _refuse_above_gap(self, h: Header, seq: int) -> None:
        """A publish past this publisher's gap (an earlier sequence failed to commit): refused
        and not stored, with a failure ack for each ack type asked for; logged once per gap (a
        pipelining publisher may have thousands in flight)."""
        gap = self.svc.pipeline.gaps.get(self.pub, 0)
        detail = (
            f"sequence {gap} was not persisted; nothing after it is stored until it is sent "
            f"again: resend from {gap}"
        )
        if self._gap_told != gap:
            self._gap_told = gap
            log.warning(
                "%s: publishes from s=%d refused until s=%d is sent again",
                self.caller.describe(),
                seq,
                gap,
            )
        out = self.out
        if self.wants_persisted:
            out.send_ack(
                "persisted", None, "failure", Failure.JOURNAL_UNAVAILABLE, detail=detail, s=seq
            )
        for kind in ack_types(h.a) & {"received", "processed"}:
            out.send_ack(kind, h.cid, "failure", Failure.JOURNAL_UNAVAILABLE, detail=detail, s=seq)
        out.flush()

    def raw_publishes(self, raw: bytes) -> int:
        """Publish frames left whole by the decoder (server/publish_scan.py): the pipeline
        stores the plain publishes among them straight from the bytes (Pipeline.publish_raw);
        any other frame is decoded and handled as receive() handles it. Returns where it
        stopped: the end, or the first frame the session holds (a check runs off the loop)."""
        publish_raw = self.svc.pipeline.publish_raw
        literal = self.svc.topics.publish_topic
        pos, n = 0, len(raw)
        while pos < n and not self.out.closing and not self._waiting():
            try:
                pos, took = publish_raw(self, self.pub, raw, pos, literal)
            except Exception:  # a bug must cost one connection, never the server
                log.exception("connection %d: error handling a run of publishes", self.caller.id)
                self.fail(Header(c="publish"), Failure.BAD_FRAME, "internal error")
                self.out.close(Disconnect.BAD_FRAME)
                return n
            if took:
                if not self.is_publisher:
                    self.bind_name()
                self.is_publisher = True
                self.received += took
            if pos < n and not self.out.closing:
                end = frame_end(raw, pos)
                self._receive_raw(raw[pos:end])
                pos = end
        return pos

    def _publish_run(self, run: list[tuple[Header, bytes]]) -> None:
        """Publishes that need no ack of their own, in order, with what cmd_publish does for
        each: the pipeline takes the leading ones it can store as they are in one call
        (Pipeline.publish_run); the first it does not take (a duplicate, a gap, a topic that
        is not literal or not recorded, ...) goes through cmd_publish, then the rest again."""
        try:
            self._publish_leading(run)
        except Exception:  # a bug must cost one connection, never the server
            log.exception("connection %d: error handling a run of publishes", self.caller.id)
            self.fail(run[-1][0], Failure.BAD_FRAME, "internal error handling this command")
            self.out.close(Disconnect.BAD_FRAME)

    def _publish_leading(self, run: list[tuple[Header, bytes]]) -> None:
        pipeline = self.svc.pipeline
        publish_topic = self.svc.topics.publish_topic
        # a SOW topic's publishes take the ordinary path (their key is computed there): the
        # run stops before them, rather than be rebuilt after each one (quadratic in the run)
        keyed = self.svc.sow.is_sow if self.svc.sow is not None else None
        i, n = 0, len(run)
        while i < n:
            items: list[tuple[int, str, bytes]] = []
            for h, body in run[i:]:
                topic = publish_topic(h.t) if h.t else None
                if not topic or (keyed is not None and keyed(topic)):
                    break
                if h.a is not None and not self.wants_persisted:
                    if items:  # the ack bookkeeping changes here: a new run
                        break
                    self.wants_persisted = True
                items.append((h.s, topic, body))  # type: ignore[arg-type]  # s checked above
            if items:
                if not self.is_publisher:
                    self.bind_name()
                self.is_publisher = True
                took = pipeline.publish_run(self, self.pub, items)
                self.received += took
                i += took
            if i < n and not self.out.closing:
                h, body = run[i]
                self.cmd_publish(h, body)
                i += 1
