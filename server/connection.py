"""One client connection: the socket, the frame decoder, the intake limits. Nothing else.

A `Connection` is a thin asyncio.Protocol. It feeds what it reads to a FrameDecoder
(protocol/framing.py) under the intake bounds (server/intake.py), hands the frames to its
`Session` (server/session.py: every command), and owns the client's `Outbox`
(server/outbox.py: every byte sent). The transport's flow control drives the Outbox
(`pause_writing` / `resume_writing`) and, when the journal falls behind or the server shuts
down, the connection stops reading (`pause_reading(why)`; reading resumes when no reason is
left).

States: connected -> (session logged on) -> closing (Outbox.close, with a reason) -> closed
(`connection_lost`: the session drops its subscriptions, the registry forgets it). Every close
is logged once with its reason and counted (`Counters.disconnects`). A connection is admitted
by the connection limits (server/admission.py) when it is accepted, or refused and closed at
once; on a `tcps` transport that happens before its TLS handshake (server/tls_accept.py), and
the Connection is made with the TLS transport once the handshake is done. While its logon is
checked (authentication, off the event loop) it does not read.

`Connections` is the server's set of open connections: it refuses new ones during shutdown,
and pauses publishers while the journal is behind (`backlog`, the pipeline's `on_backlog`).
A publisher also stops reading while its own reads not yet committed pass
<ClientPublishMemoryLimit> (`_publishing`).
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from protocol.framing import FrameDecoder, FrameError, FrameTooLarge

from .admission import Admission
from .counters import Counters
from .intake import Intake
from .outbox import Outbox
from .reasons import Disconnect
from .security.authenticator import peer_address
from .services import SessionServices
from .session import Session

__all__ = ["Connection", "ConnectionEnv", "Connections", "peer_of"]

log = logging.getLogger("tickertape.connection")

_conn_ids = itertools.count(1)
_OUTQ: int | None = getattr(termios, "TIOCOUTQ", None)
JOURNAL_BEHIND = "journal behind"
LOGON_CHECK = "logon check"
PUBLISH_BACKLOG = "publish backlog"


def peer_of(transport: Any) -> str:
    """`host:port` of a transport's peer."""
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


class Connections:
    """The open connections of a server."""

    def __init__(self) -> None:
        self.open: set[Connection] = set()
        self.accepting = True
        self._paused: set[Connection] = set()  # stopped while the journal is behind

    def __len__(self) -> int:
        return len(self.open)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self.open))

    def opened(self, conn: Connection) -> bool:
        """Take a new connection; False (it is closed) once the server shuts down."""
        if not self.accepting:
            return False
        self.open.add(conn)
        return True

    def closed(self, conn: Connection) -> None:
        self.open.discard(conn)
        self._paused.discard(conn)

    def backlog(self, behind: bool) -> None:
        """The pipeline's back-pressure: publishers stop reading while the journal is behind."""
        if behind:
            for conn in list(self.open):
                if conn.session.is_publisher and conn not in self._paused:
                    conn.pause_reading(JOURNAL_BEHIND)
                    self._paused.add(conn)
        else:
            for conn in self._paused:
                conn.resume_reading(JOURNAL_BEHIND)
            self._paused.clear()


@dataclass(frozen=True, slots=True)
class ConnectionEnv:
    """What every connection of a server shares."""

    registry: Connections
    intake: Intake
    counters: Counters
    services: SessionServices
    max_logon_message_size: int  # <MaxLogonMessageSize>: the frame limit before logon
    max_client_buffer: int  # <ClientMaxBufferSize>
    offline_threshold: int  # <ClientOfflineThreshold>: subscribers read the journal past it
    input_seen: Callable[[float], None]  # idle polling (server/app.py)
    admission: Admission  # the connection limits
    # <ClientPublishMemoryLimit>: a publisher's bytes read and not yet committed, past which it
    # stops reading (until half of them are committed)
    max_publish_inflight: int = 4 * 1024 * 1024


@dataclass(eq=False, repr=False)
class Connection(asyncio.Protocol):
    env: ConnectionEnv
    transport_name: str
    max_frame: int  # after logon; before it, <MaxLogonMessageSize>
    admitted: str | None = None  # the peer address the connection limits counted it under

    def __post_init__(self) -> None:
        env = self.env
        self.id = next(_conn_ids)
        self.decoder = FrameDecoder(
            min(self.max_frame, env.max_logon_message_size), refuse_fields=True
        )
        self.buffered = 0  # bytes of a partial frame, as the intake last counted them
        self.publish_inflight = 0  # bytes of reads of a publisher not yet committed
        # [the open batch, bytes of this connection's reads into it]: its one after_commit
        self._publish_open: list[Any] | None = None
        self.partial_since: float | None = None
        self.drained_mark = 0
        self.drained_at = 0.0
        self.unsent_mark = 0
        self.transport: asyncio.Transport | None = None
        self.out = Outbox(env.max_client_buffer, self._closed_with, env.offline_threshold)
        self.session = Session(self.out, env.services, self._logged_on, self.id, self._hold)
        self._lost = False
        self._before_made: list[bytes] | None = None  # TLS data ahead of connection_made
        now = time.monotonic()
        self.connected_at = now
        self.last_recv = now
        self.bytes_in = 0  # bytes read from the peer (the console's Clients view)
        self.logon_at: float | None = None  # wall-clock time of the logon, None before it
        self._read_pauses: set[str] = set()

    @property
    def closing(self) -> bool:
        return self.out.closing

    @property
    def logged_on(self) -> bool:
        return self.session.logged_on

    def describe(self) -> str:
        return self.session.describe()

    def close(self, reason: str, abort: bool = False) -> None:
        self.out.close(reason, abort)

    def unsent(self) -> int | None:
        """Bytes in the kernel's send queue of this socket (Linux SIOCOUTQ); None if unknown."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or _OUTQ is None:
            return None
        try:
            got = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
        except OSError:
            return None
        return int.from_bytes(got, sys.byteorder, signed=True)

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        if self._lost:  # pragma: no cover - a TLS peer gone as its handshake completed
            return
        self.transport = transport
        self.out.attach(transport)
        session = self.session
        session.peer = peer = peer_of(transport)
        session.transport_name = self.transport_name
        session.peer_cert = transport.get_extra_info("peercert") or None
        if self.admitted is None:
            address = peer_address(peer)
            if not self.env.admission.admit(address, peer, self.transport_name):
                self._lost = True  # refused (logged, counted): no disconnect line
                transport.abort()
                return
            self.admitted = address
        if not self.env.registry.opened(self):
            self.out.close(Disconnect.SHUTDOWN)
            return
        self.env.counters.connections_total += 1
        log.debug("connection %d from %s on %s", self.id, self.session.peer, self.transport_name)
        early, self._before_made = self._before_made, None
        for data in early or ():
            if not self.closing:
                self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            # TLS: the handshake completed and data came with it, before the acceptor's
            # task could make the connection (server/tls_accept.py)
            if self._before_made is None:
                self._before_made = []
            self._before_made.append(data)
            return
        self.last_recv = time.monotonic()
        self.bytes_in += len(data)
        error = None
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            frames = exc.frames
            error = exc
            if not self.logged_on and isinstance(exc, FrameTooLarge):
                self.env.intake.frame_too_large_before_logon(self)
                error = FrameError(
                    f"{exc}; before logon frames are at most <MaxLogonMessageSize> "
                    f"{self.decoder.max_size} bytes",
                    exc.frames,
                )
        if not self.env.intake.after_feed(self):
            return
        self.session.receive(frames)
        if self.session.is_publisher:
            self._publishing(len(data))
        if error is not None:
            self.session.bad_input(error)
        if self.out.buf:
            self.out.flush()
        self.env.input_seen(self.last_recv)

    def _publishing(self, n: int) -> None:
        """A publisher's read is held in memory (decoded, batched, copied to the journal writer)
        until the commit after it is done: past <ClientPublishMemoryLimit> bytes of such reads
        the connection stops reading until half of them are committed. (All connections
        together are bounded by <PublishMemoryLimit>: the pipeline's back-pressure.)

        The reads that go into one open batch share one `after_commit` callback, which frees
        their bytes together when that batch's commit is done: a callback per read cost a
        publisher of one frame per send about a microsecond a read (bench_publish 1/send)."""
        self.publish_inflight += n
        pipeline = self.env.services.pipeline
        open_ = self._publish_open
        if open_ is not None and open_[0] is pipeline.batch:
            open_[1] += n
        else:
            self._publish_open = open_ = [pipeline.batch, n]
            pipeline.after_commit(partial(self._published, open_))
        if self.publish_inflight > self.env.max_publish_inflight:
            self.pause_reading(PUBLISH_BACKLOG)

    def _published(self, reads: list[Any], err: BaseException | None) -> None:
        if self._publish_open is reads:  # its batch is done: the next read opens another
            self._publish_open = None
        # the batch holds this callback, which holds `reads`: without the batch in it, the
        # batch is freed as soon as the pipeline drops it, not at a garbage collection
        reads[0] = None
        self.publish_inflight -= reads[1]
        if self.publish_inflight <= self.env.max_publish_inflight // 2:
            self.resume_reading(PUBLISH_BACKLOG)

    @property
    def lost(self) -> bool:
        return self._lost

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self.transport is None:  # a TLS handshake that failed: tls_accept.py reports it
            return
        if self.admitted is not None:
            self.env.admission.release(self.admitted, self.logged_on)
        out = self.out
        if out.close_reason is None:
            out.close_reason = Disconnect.CONNECTION_CLOSED
            log.info(
                "disconnect: %s reason=connection closed%s",
                self.describe(),
                f" ({exc})" if exc else "",
            )
        out.lost()
        self.session.closed()
        self.env.registry.closed(self)
        self.env.intake.forget(self)

    def pause_writing(self) -> None:
        self.out.pause_writing()

    def resume_writing(self) -> None:
        self.out.resume_writing()

    # -- reading ---------------------------------------------------------------------------

    def pause_reading(self, why: str) -> None:
        if not self._read_pauses and self.transport is not None and not self.closing:
            self.transport.pause_reading()
        self._read_pauses.add(why)

    def resume_reading(self, why: str) -> None:
        self._read_pauses.discard(why)
        if not self._read_pauses and self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def _logged_on(self) -> None:
        self.logon_at = time.time()
        self.decoder.max_size = self.max_frame
        if self.admitted is not None:
            self.env.admission.logged_on()

    def _hold(self, on: bool) -> None:
        if on:
            self.pause_reading(LOGON_CHECK)
        else:
            self.resume_reading(LOGON_CHECK)

    def _closed_with(self, reason: str) -> None:
        log.info("disconnect: %s reason=%s", self.describe(), reason)
        self.env.counters.disconnects[reason] += 1
