"""The load generator's foundations (loadgen.py says how it measures): publish frames built
before the clock starts into one buffer, the bodies, and the plumbing every connection shares
(_Conn: receive buffer, setup / closed futures; Publisher: the window; Subscriber: counting
and latency stamps).
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
import time
from array import array

_U32 = struct.Struct(">I")
_XENTRY = re.compile(rb"\*2\r\n\$\d+\r\n(\d+-\d+)\r\n\*2\r\n\$1\r\nd\r\n\$\d+\r\n")
_ONE_FIELD_D = b"*2\r\n$1\r\nd\r\n"  # an XREAD entry's field list as XADD ... d <body> writes it
_now_ns = time.perf_counter_ns


class ProtocolError(Exception):
    """The server answered something the generator does not expect (named in the message)."""


# --------------------------------------------------------------------------------------------
# Pre-built frames
# --------------------------------------------------------------------------------------------


def make_body(seq: int, size: int = 100) -> bytes:
    head = b'{"seq":%010d,"pad":"' % seq
    pad = size - len(head) - 2
    if pad < 0:
        raise ValueError(f"body size {size} too small (minimum {len(head) + 2})")
    return head + b"x" * pad + b'"}'


class Frames:
    """Frames 1..n in one bytes buffer; chunk(i, j) is frames with seq i+1..j (0-based slice)."""

    __slots__ = ("_mv", "buf", "n", "offs")

    def __init__(self, parts: list[bytes]):
        self.n = len(parts)
        offs = array("q", [0]) * (self.n + 1)
        pos = 0
        for i, p in enumerate(parts):
            offs[i] = pos
            pos += len(p)
        offs[self.n] = pos
        self.buf = b"".join(parts)
        self.offs = offs
        self._mv = memoryview(self.buf)

    def chunk(self, i: int, j: int):
        return self._mv[self.offs[i] : self.offs[j]]


def tickertape_frame(header: dict | bytes, body: bytes = b"") -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    return _U32.pack(len(h) + len(body)) + h + body


def build_publish_frames(proto: str, dest: str, n: int, size: int, inbox: str = "") -> Frames:
    """n publish frames for proto, seq 1..n, to topic / subject / stream key `dest`."""
    parts = []
    if proto == "tickertape":
        t = dest.encode()
        for s in range(1, n + 1):
            body = make_body(s, size)
            h = b'{"c":"publish","t":"%s","s":%d,"a":"persisted"}' % (t, s)
            parts.append(_U32.pack(len(h) + len(body)) + h + body)
    elif proto == "nats":
        head = b"PUB %s %s %d\r\n" % (dest.encode(), inbox.encode(), size)
        for s in range(1, n + 1):
            parts.append(head + make_body(s, size) + b"\r\n")
    elif proto == "redis":
        k = dest.encode()
        head = b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$1\r\nd\r\n$%d\r\n" % (len(k), k, size)
        for s in range(1, n + 1):
            parts.append(head + make_body(s, size) + b"\r\n")
    else:
        raise ValueError(f"unknown protocol {proto!r}")
    return Frames(parts)


def resp_command(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def xread_head(buf: bytearray) -> tuple[int, int] | None:
    """(K, where its first entry starts) of the XREAD / XREADGROUP reply at the start of buf,
    RESP2 `*1 *2 $key *K`; None while that much is not here yet."""
    find = buf.find
    e = find(b"\r\n")  # *1
    if e < 0:
        return None
    e = find(b"\r\n", e + 2)  # *2
    if e < 0:
        return None
    pos = e + 2
    e = find(b"\r\n", pos)  # $klen, key
    if e < 0:
        return None
    pos = e + 2 + int(buf[pos + 1 : e]) + 2
    e = find(b"\r\n", pos)  # *K
    if e < 0:
        return None
    return int(buf[pos + 1 : e]), e + 2


# --------------------------------------------------------------------------------------------
# Connections
# --------------------------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """Shared plumbing: a receive buffer, a setup future, a closed future, an error slot.

    States: connecting -> setup (handshake sent, waiting for its reply) -> running -> closed.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport = None
        self.buf = bytearray()
        self.ready = self.loop.create_future()  # handshake done
        self.done = self.loop.create_future()  # role finished (all acked / all received)
        self.error: str | None = None
        self.running = False
        self.closing = False
        self.lat = None
        self.received = 0
        self.t_last = 0
        self.sent = self.acked = self.errors = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if not self.closing:
            self._fail(f"connection lost: {exc or 'closed by server'}")

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        for f in (self.ready, self.done):
            if not f.done():
                f.set_exception(ProtocolError(why))

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _pong_ready(self) -> bool:
        """Redis: take the setup PING's +PONG off the buffer; True once the connection is ready
        (False: the reply is not complete yet, or it was not +PONG and the connection failed)."""
        if self.ready.done():
            return True
        eol = self.buf.find(b"\r\n")
        if eol < 0:
            return False
        line = bytes(self.buf[:eol])
        del self.buf[: eol + 2]
        if line != b"+PONG":
            self._fail(f"unexpected reply to PING: {line!r}")
            return False
        self.ready.set_result(None)
        return True

    def close(self) -> None:
        self.closing = True
        for f in (self.ready, self.done):
            if f.done() and not f.cancelled():
                f.exception()  # retrieved: no "never retrieved" noise
            else:
                f.cancel()
        if self.transport is not None:
            self.transport.close()


class TtLogon:
    """Tickertape, before _Conn in the bases: logon on connect (client_name, ack processed) and
    a frame header decoded from the receive buffer."""

    client_name: str
    buf: bytearray

    def connection_made(self, transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        transport.write(
            tickertape_frame(
                {"c": "logon", "cid": "logon", "a": "processed", "client_name": self.client_name}
            )
        )

    def _header(self, pos: int, end: int) -> dict:
        raw = bytes(self.buf[pos:end]).decode("utf-8", "replace")
        try:
            return json.JSONDecoder().raw_decode(raw)[0]
        except ValueError:
            raise ProtocolError(f"undecodable header {raw[:120]!r}") from None


def nats_connect(name: str, no_responders: bool = False) -> bytes:
    """The CONNECT line every NATS connection of the bench sends (headers on, quiet)."""
    return (
        b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true,'
        b'"no_responders":%s,"name":"%s"}\r\n'
        % (b"true" if no_responders else b"false", name.encode())
    )


def nats_subs(subjects: list[str], first_sid: int = 1) -> bytes:
    """SUB lines for subjects, sids first_sid, first_sid + 1, ..."""
    return b"".join(b"SUB %s %d\r\n" % (s.encode(), i) for i, s in enumerate(subjects, first_sid))


class NatsLines:
    """NATS, before _Conn in the bases: the control lines. PING is answered, the first INFO
    gets `_hello()` (CONNECT, SUBs, PING), the PONG after it makes the connection ready, -ERR
    fails it."""

    _got_info = False

    def _hello(self) -> bytes:
        raise NotImplementedError

    def _line(self, line: bytes) -> None:
        if line.startswith(b"PING"):
            self.transport.write(b"PONG\r\n")
        elif line.startswith(b"PONG"):
            if not self.ready.done():
                self.ready.set_result(None)
        elif line.startswith(b"INFO") and not self._got_info:
            self._got_info = True
            self.transport.write(self._hello())
        elif line.startswith(b"-ERR"):
            self._fail(line.decode(errors="replace"))


class Publisher:
    """Window-bounded publishing over pre-built frames; `acked` is advanced by the connection.

    Mixed into each protocol's connection class. Unpaced: send all the window allows whenever
    acks arrive. Paced (rate > 0): a 1 ms tick sends the frames due by then (window permitting)
    and records their send time per sequence in send_ns (for latency).
    """

    def setup_publisher(
        self,
        frames: Frames,
        window: int,
        rate: float = 0.0,
        per_send: int = 0,
        ack_latency: bool = False,
    ) -> None:
        """per_send: at most this many frames per transport.write (0: all the window allows in
        one write). ack_latency: record send -> ack time per message in `ack_lat` (ns)."""
        self.frames = frames
        self.n = frames.n
        self.window = window  # sent, acked, errors: 0 from _Conn
        self.rate = rate
        self.per_send = per_send
        self.send_ns = array("q", [0]) * (self.n + 1) if rate > 0 or ack_latency else None
        self.ack_lat = array("q") if ack_latency else None
        self._lat_done = 0
        self.t_start = 0
        self.t_end = 0

    def start_publishing(self) -> None:
        self.t_start = _now_ns()
        self.running = True
        if self.rate > 0:
            self._t0 = self.loop.time()
            self._tick_n = 0
            self._tick()
        else:
            self.pump()

    def pump(self) -> None:
        room = self.window - (self.sent - self.acked)
        if room <= 0 or self.sent >= self.n:
            return
        j = min(self.n, self.sent + room)
        if self.rate > 0:
            j = min(j, self._due)
            if j <= self.sent:
                return
        if self.send_ns is not None:
            now = _now_ns()
            sn = self.send_ns
            for s in range(self.sent + 1, j + 1):
                sn[s] = now
        k = self.per_send
        if k and j - self.sent > k:
            write, chunk = self.transport.write, self.frames.chunk
            for i in range(self.sent, j, k):
                write(chunk(i, min(j, i + k)))
        else:
            self.transport.write(self.frames.chunk(self.sent, j))
        self.sent = j

    def _tick(self) -> None:
        if self.sent >= self.n or self.error is not None:
            return
        self._tick_n += 1
        self._due = int(self._tick_n * 0.001 * self.rate)
        self.pump()
        self.loop.call_at(self._t0 + self._tick_n * 0.001, self._tick)

    def on_acked(self) -> None:
        if self.ack_lat is not None:
            now = _now_ns()
            sn = self.send_ns
            for s in range(self._lat_done + 1, min(self.acked, self.n) + 1):
                self.ack_lat.append(now - sn[s])
            self._lat_done = max(self._lat_done, self.acked)
        if self.acked >= self.n:
            self.t_end = _now_ns()
            self._finish()
        elif self.rate <= 0 or self.sent < self._due:
            self.pump()


class Subscriber:
    """Counts deliveries; with latency on, records recv - send per message (ns)."""

    def setup_subscriber(
        self, expect: int, send_ns: array | None = None, skip_below: int = 0
    ) -> None:
        self.expect = expect  # received, t_last: 0 from _Conn
        self.send_ns = send_ns
        self.skip_below = skip_below
        self.lat = array("q") if send_ns is not None else None

    def _count(self, k: int) -> None:
        self.received += k
        if self.received >= self.expect:
            self.t_last = _now_ns()
            self._finish()

    def _latency(self, body, now: int) -> None:
        s = int(body[7:17])
        if s > self.skip_below:
            self.lat.append(now - self.send_ns[s])
