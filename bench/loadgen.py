"""One lean load generator for every server under test, so the client is not what is measured.

Design (the same for Tickertape, NATS JetStream and Redis Streams):
  - raw protocol over asyncio.Protocol (uvloop when installed), one event loop, one process;
  - every publish frame / command is built before the clock starts, into ONE bytes buffer with
    an offsets array: sending frames [i, j) is one slice and one transport.write;
  - a bounded in-flight window (default 1000 unacked messages): the publisher sends whatever
    the window allows each time acks arrive, so writes are batched by the ack rhythm;
  - replies are parsed in data_received over one bytearray with bytes.find / struct.unpack_from;
    no per-message task, future, dict or object beyond what the wire format forces.

Wire protocols:
  tickertape  4-byte big-endian length, flat JSON header, body (docs/protocol.md).
              logon(client_name, a=processed), then publish {"c":"publish","t":T,"s":N,
              "a":"persisted"}; the server sends conflated persisted acks {"c":"ack",
              "a":"persisted","s":N} covering every sequence <= N: window = sent - highest s.
              Subscribers: subscribe (a=processed), then count {"c":"p",...} frames.
  nats        text protocol: CONNECT, SUB <inbox>, then PUB <subject> <inbox> <len>; JetStream
              answers each PUB with a PubAck MSG on the inbox (counted; `"error"` counted as a
              failure). Subscribers: SUB on the subject (core) or on a push consumer's deliver
              subject; MSG / HMSG parsed by length.
  redis       RESP: XADD <key> * d <body>, pipelined; each bulk-string reply is an ack.
              Subscribers: XREAD COUNT c BLOCK ms STREAMS <key> <last-id>, one outstanding;
              when only counting, the entries of a reply are found by one regex scan (C speed;
              sound for JSON bodies, which hold no raw CR LF), else walked entry by entry.

Client cost per delivery, parsing only (bench machine): tickertape ~0.17 µs, redis ~0.17 µs
(counting) / ~0.7 µs (walking, latency runs), nats ~0.4 µs.

Bodies are JSON of exactly `size` bytes: {"seq":0000000042,"pad":"xxx..."}; the sequence sits at
body[7:17] so a latency subscriber reads it without decoding JSON.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import struct
import time
from array import array

try:
    import uvloop  # the client loop; the same for every peer
except ImportError:  # pragma: no cover
    uvloop = None

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


def body_seq(body) -> int:
    return int(body[7:17])


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

    def close(self) -> None:
        self.closing = True
        for f in (self.ready, self.done):
            if f.done() and not f.cancelled():
                f.exception()  # retrieved: no "never retrieved" noise
            else:
                f.cancel()
        if self.transport is not None:
            self.transport.close()


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
        self.window = window
        self.sent = 0
        self.acked = 0
        self.errors = 0
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
        self.expect = expect
        self.received = 0
        self.send_ns = send_ns
        self.skip_below = skip_below
        self.lat = array("q") if send_ns is not None else None
        self.t_last = 0

    def _count(self, k: int) -> None:
        self.received += k
        if self.received >= self.expect:
            self.t_last = _now_ns()
            self._finish()

    def _latency(self, body, now: int) -> None:
        s = int(body[7:17])
        if s > self.skip_below:
            self.lat.append(now - self.send_ns[s])


# ---- Tickertape ----------------------------------------------------------------------------


class TickertapeConn(_Conn, Publisher, Subscriber):
    def __init__(
        self, client_name: str, topic: str = "", sub_id: str = "", body_size: int = 100
    ) -> None:
        super().__init__()
        self.client_name = client_name
        self.topic = topic
        self.sub_id = sub_id
        self.body_size = body_size
        self.role = "pub"
        self.logon_s = None
        self._stage = "logon"

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.write(
            tickertape_frame(
                {"c": "logon", "cid": "logon", "a": "processed", "client_name": self.client_name}
            )
        )

    def _header(self, pos: int, end: int) -> dict:
        raw = bytes(self.buf[pos:end])
        try:
            obj, _ = json.JSONDecoder().raw_decode(raw.decode("utf-8", "replace"))
        except ValueError:
            raise ProtocolError(f"undecodable header {raw[:120]!r}") from None
        return obj

    def _setup_frame(self, h: dict) -> None:
        if h.get("c") != "ack":
            return
        if h.get("status") not in (None, "success"):
            self._fail(f"{self._stage} failed: {h}")
            return
        if self._stage == "logon" and h.get("cid") == "logon":
            self.logon_s = int(h.get("s") or 0)
            if self.role == "sub":
                self._stage = "subscribe"
                self.transport.write(
                    tickertape_frame(
                        {
                            "c": "subscribe",
                            "cid": "sub",
                            "t": self.topic,
                            "sub_id": self.sub_id,
                            "a": "processed",
                        }
                    )
                )
            else:
                self._stage = "run"
                self.ready.set_result(None)
        elif self._stage == "subscribe" and h.get("cid") == "sub":
            self._stage = "run"
            self.ready.set_result(None)

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        unpack = _U32.unpack_from
        try:
            if self.role == "sub" and self._stage == "run":
                got = 0
                now = _now_ns() if self.lat is not None else 0
                bs = self.body_size
                while n - pos >= 4:
                    ln = unpack(buf, pos)[0]
                    end = pos + 4 + ln
                    if end > n:
                        break
                    if buf[pos + 4 : pos + 12] == b'{"c":"p"':
                        got += 1
                        if now:
                            self._latency(buf[end - bs : end], now)
                    elif ln:
                        h = self._header(pos + 4, end)
                        if h.get("c") == "p":
                            got += 1
                            if now:
                                self._latency(buf[end - bs : end], now)
                        elif h.get("status") == "failure":
                            self._fail(f"server failure: {h}")
                    pos = end
                if got:
                    self._count(got)
            else:
                top = -1
                while n - pos >= 4:
                    ln = unpack(buf, pos)[0]
                    end = pos + 4 + ln
                    if end > n:
                        break
                    if ln:
                        h = self._header(pos + 4, end)
                        if self._stage != "run":
                            self._setup_frame(h)
                        elif h.get("c") == "ack":
                            if h.get("status") == "failure":
                                self.errors += 1
                                self._fail(f"publish failed: {h}")
                            elif h.get("a") == "persisted" and "s" in h:
                                s = int(h["s"])
                                top = max(top, s)
                    pos = end
                if top > self.acked and self.running:
                    self.acked = top
                    self.on_acked()
        except ProtocolError as e:
            self._fail(str(e))
        if pos:
            del buf[:pos]


# ---- NATS ----------------------------------------------------------------------------------


class NatsConn(_Conn, Publisher, Subscriber):
    """role pub: PUB with reply inbox, PubAcks counted. role sub: SUB `subject`, MSGs counted."""

    def __init__(self, subject: str = "", inbox: str = "_INBOX.bench") -> None:
        super().__init__()
        self.subject = subject
        self.inbox = inbox
        self.role = "pub"
        self._got_info = False

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        got = 0
        errs = 0
        now = _now_ns() if self.role == "sub" and self.lat is not None else 0
        pub = self.role == "pub"
        find = buf.find
        rfind = buf.rfind
        while pos < n:
            eol = find(b"\r\n", pos)
            if eol < 0:
                break
            c = buf[pos]
            if c == 77 or c == 72:  # MSG subj sid [reply] len / HMSG subj sid [reply] hlen len
                sp = rfind(b" ", pos, eol)
                start = eol + 2
                end = start + int(buf[sp + 1 : eol]) + 2
                if end > n:
                    break
                if c == 72:
                    start += int(buf[rfind(b" ", pos, sp) + 1 : sp])
                got += 1
                if pub:
                    if find(b'"error"', start, end) >= 0:
                        errs += 1
                        if self.error is None:
                            self.error = f"PubAck error: {bytes(buf[start:end])[:200]!r}"
                elif now and buf.startswith(b'{"seq":', start):
                    self._latency(buf[start : start + 17], now)
                pos = end
                continue
            line = bytes(buf[pos:eol])
            pos = eol + 2
            if line.startswith(b"PING"):
                self.transport.write(b"PONG\r\n")
            elif line.startswith(b"PONG"):
                if not self.ready.done():
                    self.ready.set_result(None)
            elif line.startswith(b"INFO") and not self._got_info:
                self._got_info = True
                sub = self.inbox if self.role == "pub" else self.subject
                self.transport.write(
                    b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true,'
                    b'"no_responders":false,"name":"bench"}\r\n'
                    + b"SUB %s 1\r\nPING\r\n"
                    % sub.encode()
                )
            elif line.startswith(b"-ERR"):
                self._fail(line.decode(errors="replace"))
        if pos:
            del buf[:pos]
        if got:
            if self.role == "pub":
                self.errors += errs
                if self.running:
                    self.acked += got
                    self.on_acked()
            elif self.running:
                self._count(got)


# ---- Redis ---------------------------------------------------------------------------------


class RedisConn(_Conn, Publisher, Subscriber):
    """role pub: pipelined XADD, one bulk reply per message. role sub: XREAD BLOCK loop."""

    def __init__(self, key: str = "", count: int = 1000, block_ms: int = 2000) -> None:
        super().__init__()
        self.key = key
        self.role = "pub"
        self.last_id = b"0-0"
        self.count = count
        self.block_ms = block_ms

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.write(resp_command("PING"))

    def _xread(self) -> None:
        self.transport.write(
            resp_command(
                "XREAD",
                "COUNT",
                self.count,
                "BLOCK",
                self.block_ms,
                "STREAMS",
                self.key,
                self.last_id,
            )
        )

    def start_reading(self) -> None:
        self.running = True
        self._xread()

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        if not self.ready.done():
            eol = buf.find(b"\r\n")
            if eol < 0:
                return
            line = bytes(buf[:eol])
            del buf[: eol + 2]
            if line != b"+PONG":
                self._fail(f"unexpected reply to PING: {line!r}")
                return
            self.ready.set_result(None)
        if self.role == "pub":
            self._pub_replies()
        elif self.running and buf.endswith(b"\r\n"):
            self._xread_reply()

    def _pub_replies(self) -> None:
        buf = self.buf
        n = len(buf)
        pos = 0
        got = 0
        while pos < n:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            c = buf[pos]
            if c == 36:  # '$' bulk string: the new entry id
                end = eol + 2 + int(buf[pos + 1 : eol]) + 2
                if end > n:
                    break
                pos = end
                got += 1
            else:  # '-ERR ...' or a simple reply
                if c == 45:
                    self.errors += 1
                    got += 1
                    if self.error is None:
                        self.error = bytes(buf[pos:eol]).decode(errors="replace")
                pos = eol + 2
        if pos:
            del buf[:pos]
        if got and self.running:
            self.acked += got
            self.on_acked()

    def _count_fast(self, pos: int, k: int) -> bool:
        """Counting-only path: the k entries found by one regex scan (in C), the last id from
        the last match. Sound for JSON bodies (a JSON text holds no raw CR LF, so no value can
        contain an entry header). True when the reply was complete and consumed."""
        buf = self.buf
        n = len(buf)
        ids = _XENTRY.findall(buf, pos)
        if len(ids) != k:
            return False  # not all here yet (or not our entries): the walking parser decides
        e = buf.rfind(b"\r\nd\r\n$")  # the last entry's field; then $vlen and the value
        if e < pos:
            return False
        e2 = buf.find(b"\r\n", e + 6)
        if e2 < 0 or e2 + 2 + int(buf[e + 6 : e2]) + 2 != n:
            return False  # the last value is not all here yet
        self.last_id = ids[-1]
        buf.clear()
        self._xread()
        self._count(k)
        return True

    def _xread_reply(self) -> None:
        """Parse one whole XREAD reply, or return and wait for the rest of it.

        Layout (RESP2): *1 *2 $key *K, then K times: *2 $id *2 $field $value.
        """
        buf = self.buf
        n = len(buf)
        find = buf.find
        if buf[0] == 45:  # -ERR
            self._fail(bytes(buf[: find(b"\r\n")]).decode(errors="replace"))
            return
        if buf.startswith(b"*-1\r\n"):  # BLOCK timed out, no data
            del buf[:5]
            self._xread()
            return
        e = find(b"\r\n")  # *1
        if e < 0:
            return
        e = find(b"\r\n", e + 2)  # *2
        if e < 0:
            return
        pos = e + 2
        e = find(b"\r\n", pos)  # $klen, key
        if e < 0:
            return
        pos = e + 2 + int(buf[pos + 1 : e]) + 2
        e = find(b"\r\n", pos)  # *K
        if e < 0:
            return
        k = int(buf[pos + 1 : e])
        pos = e + 2
        id_at = id_end = 0
        now = _now_ns() if self.lat is not None else 0
        if not now and self._count_fast(pos, k):
            return
        bodies = [] if now else None
        startswith = buf.startswith
        for _ in range(k):
            if startswith(b"*2\r\n$", pos):  # *2, then $idlen
                e = find(b"\r\n", pos + 5)
                if e < 0:
                    return
                id_at = e + 2
                id_end = id_at + int(buf[pos + 5 : e])
            else:
                return  # incomplete (or not an entry: the caller waits / times out)
            pos = id_end + 2
            if startswith(_ONE_FIELD_D, pos):  # *2 $1 d: the field the publisher writes
                pos += len(_ONE_FIELD_D)
            else:  # any one field: *2, $flen, field
                e = find(b"\r\n", pos)
                if e < 0:
                    return
                pos = e + 2
                e = find(b"\r\n", pos)
                if e < 0:
                    return
                pos = e + 2 + int(buf[pos + 1 : e]) + 2
            e = find(b"\r\n", pos)  # $vlen, value
            if e < 0:
                return
            if now:
                bodies.append(e + 2)
            pos = e + 2 + int(buf[pos + 1 : e]) + 2
            if pos > n:
                return
        if pos > n or k == 0:
            return
        self.last_id = bytes(buf[id_at:id_end])
        if now:
            for a in bodies:
                self._latency(buf[a : a + 17], now)
        del buf[:pos]
        self._xread()
        self._count(k)


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def new_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def loop_name() -> str:
    return f"uvloop {uvloop.__version__}" if uvloop is not None else "asyncio"


async def _connect(factory, host: str, port: int, timeout: float, ssl=None):
    """ssl: an ssl.SSLContext for a TLS server (bench_security), None for plain TCP."""
    loop = asyncio.get_running_loop()
    conn = loop.create_connection(
        factory, host, port, ssl=ssl, server_hostname="localhost" if ssl else None
    )
    _t, proto = await asyncio.wait_for(conn, timeout)
    try:
        await asyncio.wait_for(asyncio.shield(proto.ready), timeout)
    except BaseException:
        proto.close()
        raise
    return proto


def _pub_factory(proto: str, dest: str, tag: str, body_size: int):
    if proto == "tickertape":
        return lambda: TickertapeConn(f"bench-pub-{tag}", body_size=body_size)
    if proto == "nats":
        return lambda: NatsConn(inbox=f"_INBOX.bench.{tag}")
    return lambda: RedisConn(dest)


def _sub_factory(proto: str, dest: str, i: int, tag: str, body_size: int, redis_count: int):
    if proto == "tickertape":

        def f():
            c = TickertapeConn(
                f"bench-sub-{tag}-{i}", topic=dest, sub_id=f"s{i}", body_size=body_size
            )
            c.role = "sub"
            return c
    elif proto == "nats":

        def f():
            c = NatsConn(subject=dest)
            c.role = "sub"
            return c
    else:

        def f():
            c = RedisConn(dest, count=redis_count)
            c.role = "sub"
            return c

    return f


class _Cpu:
    def __init__(self) -> None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        self.t0 = r.ru_utime + r.ru_stime

    def seconds(self) -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime - self.t0


async def run(
    proto: str,
    host: str,
    port: int,
    *,
    n: int,
    pub_dest: str,
    sub_dests: list[str] = (),
    body_size: int = 100,
    window: int = 1000,
    rate: float = 0.0,
    warmup_msgs: int = 0,
    timeout: float = 120.0,
    tag: str = "0",
    redis_count: int = 1000,
    on_start=None,
    ssl=None,
    per_send: int = 0,
    ack_latency: bool = False,
) -> dict:
    """One publisher of n messages and len(sub_dests) subscribers (each expects all n).
    `ssl`: connect over TLS with this context (Tickertape tcps transports).

    Returns counts, elapsed seconds (first send to last ack / last delivery), client CPU
    seconds, errors, and latencies (ns, array) when rate > 0 and there is a subscriber.
    A run that passes `timeout` stops and reports what it got, with timed_out=True.
    on_start() is called just before the first publish (the caller reads server CPU there).
    per_send: frames per write (0: the whole window's worth in one write). ack_latency: the
    publisher's send -> ack times (ns, array) in "ack_latency_ns".
    """
    frames = build_publish_frames(proto, pub_dest, n, body_size, inbox=f"_INBOX.bench.{tag}")
    subs = []
    conns = []
    try:
        for i, d in enumerate(sub_dests):
            s = await _connect(
                _sub_factory(proto, d, i, tag, body_size, redis_count), host, port, 30, ssl
            )
            conns.append(s)
            subs.append(s)
        pub = await _connect(_pub_factory(proto, pub_dest, tag, body_size), host, port, 30, ssl)
        conns.append(pub)
        if proto == "tickertape" and pub.logon_s:
            raise ProtocolError(f"publisher name already has sequence {pub.logon_s} stored")
        pub.setup_publisher(frames, window, rate, per_send, ack_latency)
        for s in subs:
            s.setup_subscriber(n, pub.send_ns if rate > 0 else None, warmup_msgs)
            if proto == "redis":
                s.start_reading()
            else:
                s.running = True
        if on_start is not None:
            on_start()
        cpu = _Cpu()
        pub.start_publishing()
        waits = [pub.done] + [s.done for s in subs]
        done, pending = await asyncio.wait(
            waits, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
        )
        failed = [f for f in done if f.exception() is not None]
        timed_out = bool(pending) and not failed
        t_end = _now_ns()
        errors = [c.error for c in conns if c.error]
        t_pub = (pub.t_end or t_end) - pub.t_start
        t_all = max([pub.t_end or t_end] + [s.t_last or t_end for s in subs]) - pub.t_start
        out = {
            "sent": pub.sent,
            "acked": pub.acked,
            "pub_errors": pub.errors,
            "received": sum(s.received for s in subs),
            "subscribers": len(subs),
            "pub_seconds": t_pub / 1e9,
            "seconds": t_all / 1e9,
            "client_cpu": cpu.seconds(),
            "timed_out": timed_out,
            "errors": errors,
        }
        if pub.ack_lat is not None:
            out["ack_latency_ns"] = pub.ack_lat
        if rate > 0 and subs:
            lat = array("q")
            for s in subs:
                lat.extend(s.lat)
            out["latency_ns"] = lat
        return out
    finally:
        for c in conns:
            c.close()
        await asyncio.sleep(0)


def run_sync(*args, **kw) -> dict:
    loop = new_loop()
    try:
        return loop.run_until_complete(run(*args, **kw))
    finally:
        loop.close()
