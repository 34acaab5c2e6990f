"""One connection class per wire protocol for the load generator (loadgen.py), each both a
publisher and a subscriber over the plumbing of loadwire.py.

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
"""

from __future__ import annotations

from loadwire import (
    _ONE_FIELD_D,
    _U32,
    _XENTRY,
    NatsLines,
    ProtocolError,
    Publisher,
    Subscriber,
    TtLogon,
    _Conn,
    _now_ns,
    nats_connect,
    nats_subs,
    resp_command,
    tickertape_frame,
    xread_head,
)

# ---- Tickertape ----------------------------------------------------------------------------


class TickertapeConn(TtLogon, _Conn, Publisher, Subscriber):
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


class NatsConn(NatsLines, _Conn, Publisher, Subscriber):
    """role pub: PUB with reply inbox, PubAcks counted. role sub: SUB `subject`, MSGs counted."""

    def __init__(self, subject: str = "", inbox: str = "_INBOX.bench") -> None:
        super().__init__()
        self.subject = subject
        self.inbox = inbox
        self.role = "pub"

    def _hello(self) -> bytes:
        sub = self.inbox if self.role == "pub" else self.subject
        return nats_connect("bench") + nats_subs([sub]) + b"PING\r\n"

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
            self._line(bytes(buf[pos:eol]))
            pos = eol + 2
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
        if not self._pong_ready():
            return
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
        head = xread_head(buf)
        if head is None:
            return
        k, pos = head
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
