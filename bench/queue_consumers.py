"""The queue consumers of the load generator (bench_queue): one consumer of n waiting messages,
at most `backlog` unacked, for each protocol; the same discipline as consumers.py (whose base
classes they extend): everything sent in answer to one read goes out in ONE `transport.write`.

  TtQueue         subscribe {t: queue, o: "max_backlog=N"}; per read, ONE sow_delete with every
                  bookmark received in it; the last one asks for a `processed` ack (sent once
                  the ack events are durable): the clock stops there.
  NatsQueuePush   durable push consumer on a work-queue stream, ack explicit, max_ack_pending =
                  backlog: per read, one +ACK PUB per message (JetStream has no batched ack on
                  a work-queue stream: it requires AckExplicit) in one write; the last ack is a
                  request (AckSync): the clock stops at its reply.
  NatsQueuePull   durable pull consumer, same acks: a pull request of `backlog` messages; when
                  the batch is in, its acks and the next pull request go in one write.
  RedisQueue      XREADGROUP GROUP g c COUNT backlog STREAMS key >; when a reply is in,
                  XACK key g id1..idK (one command for the batch) and the next XREADGROUP are
                  pipelined in one write; the clock stops at the last XACK's reply.
"""

from __future__ import annotations

from consumers import _P, _U32, _Counting, _NatsBase, _TtBase
from loadgen import ProtocolError, _now_ns, resp_command, tickertape_frame
from loadwire import xread_head

# ---- Tickertape ----------------------------------------------------------------------------


class TtQueue(_TtBase):
    """One queue consumer: one sow_delete (comma list of bookmarks) per read."""

    def __init__(self, client_name: str, queue: str, backlog: int) -> None:
        super().__init__(client_name)
        self.queue = queue
        self.backlog = backlog
        self.acked = 0
        self.ack_writes = 0
        self._ack_head = b'{"c":"sow_delete","t":"%s","bm":"' % queue.encode()

    def start(self, expect: int) -> None:
        h = {"c": "subscribe", "cid": "qsub", "t": self.queue, "sub_id": "q"}
        h |= {"o": f"max_backlog={self.backlog}", "a": "processed"}
        self._go(expect, tickertape_frame(h))

    def _ack(self, h: dict) -> None:
        if h.get("cid") == "last":
            self.t_last = _now_ns()
            self._finish()

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        bms = []
        unpack = _U32.unpack_from
        find = buf.find
        try:
            while n - pos >= 4:
                ln = unpack(buf, pos)[0]
                end = pos + 4 + ln
                if end > n:
                    break
                if buf.startswith(_P, pos + 4):
                    b = find(b'"bm":"', pos + 12, end)
                    if b < 0:
                        raise ProtocolError("queue delivery without bm")
                    e = find(b'"', b + 6, end)
                    bms.append(buf[b + 6 : e])
                elif ln:
                    self._control(self._header(pos + 4, end))
                pos = end
        except ProtocolError as e:
            self._fail(str(e))
        if pos:
            del buf[:pos]
        if bms:
            k = len(bms)
            self._got(k)
            self.acked += k
            h = self._ack_head + b",".join(bms)
            if self.acked >= self.expect:
                h += b'","cid":"last","a":"processed"}'
            else:
                h += b'"}'
            self.ack_writes += 1
            self.transport.write(_U32.pack(len(h)) + h)


# ---- NATS ----------------------------------------------------------------------------------


class _NatsQueue(_NatsBase):
    def __init__(self, stream: str, durable: str, data_subject: str, backlog: int, tag: str):
        super().__init__()
        self.stream = stream
        self.durable = durable
        self.backlog = backlog
        self.inbox = f"_INBOX.q.{tag}"
        self.done_inbox = f"_INBOX.qdone.{tag}"
        self._fast = b"MSG %s 1 " % data_subject.encode()
        self.acked = 0
        self.ack_writes = 0

    def _acks(self, replies: list) -> list[bytes]:
        """+ACK for each; the very last one as a request whose reply stops the clock."""
        out = []
        for r in replies:
            self.acked += 1
            if self.acked >= self.expect:
                out.append(b"PUB %s %s 4\r\n+ACK\r\n" % (r, self.done_inbox.encode()))
            else:
                out.append(b"PUB %s 4\r\n+ACK\r\n" % r)
        return out

    def _done_reply(self) -> None:
        self.t_last = _now_ns()
        self._finish()


class NatsQueuePush(_NatsQueue):
    """Durable push consumer, created at start() (the clock starts there): deliver subject
    subscribed as sid 1, ack explicit, max_ack_pending = backlog."""

    def __init__(self, stream, durable, data_subject, backlog, tag):
        super().__init__(stream, durable, data_subject, backlog, tag)
        self.deliver = f"_bench.wq.{tag}"
        self.api_inbox = f"_INBOX.qapi.{tag}"

    def subs(self) -> list[str]:
        return [self.deliver, self.done_inbox, self.api_inbox]

    def start(self, expect: int) -> None:
        cfg = {
            "stream_name": self.stream,
            "config": {
                "durable_name": self.durable,
                "deliver_subject": self.deliver,
                "deliver_policy": "all",
                "ack_policy": "explicit",
                "ack_wait": 30_000_000_000,
                "max_ack_pending": self.backlog,
                "replay_policy": "instant",
            },
        }
        subject = f"$JS.API.CONSUMER.DURABLE.CREATE.{self.stream}.{self.durable}"
        self._go(expect, self._api_request(subject, cfg, self.api_inbox))

    def _messages(self, msgs) -> None:
        replies = []
        for sid, reply, hdr, start, end in msgs:
            if sid == 1:
                if hdr is not None and hdr.startswith(b"NATS/1.0 1"):
                    continue  # status messages (heartbeats): not data
                replies.append(reply)
            elif sid == 2:
                self._done_reply()
            else:
                self._api_reply(bytes(self.buf[start:end]))
        if replies:
            self._got(len(replies))
            self.ack_writes += 1
            self.transport.write(b"".join(self._acks(replies)))


class NatsQueuePull(_NatsQueue):
    """Durable pull consumer: pull `backlog`, ack the batch and pull again in one write."""

    def subs(self) -> list[str]:
        return [self.inbox, self.done_inbox]

    def _pull(self) -> bytes:
        want = min(self.backlog, self.expect - self.requested)
        self.requested += want
        self._batch_left = want
        body = b'{"batch":%d,"expires":30000000000}' % want
        return b"PUB $JS.API.CONSUMER.MSG.NEXT.%s.%s %s %d\r\n%s\r\n" % (
            self.stream.encode(),
            self.durable.encode(),
            self.inbox.encode(),
            len(body),
            body,
        )

    def start(self, expect: int) -> None:
        self.expect = expect  # _pull() asks for at most what is still expected
        self.requested = 0
        self._pending: list = []
        self._go(expect, self._pull())

    def _messages(self, msgs) -> None:
        got = 0
        for sid, reply, hdr, _start, _end in msgs:
            if sid == 1:
                if hdr is not None and hdr.startswith(b"NATS/1.0 4"):
                    # 404 no messages / 408 request timeout: pull again
                    self._fail(f"pull answered {hdr.splitlines()[0]!r}")
                    return
                if hdr is not None and hdr.startswith(b"NATS/1.0 1"):
                    continue
                self._pending.append(reply)
                got += 1
            elif sid == 2:
                self._done_reply()
        if got:
            self._got(got)
            self._batch_left -= got
            if self._batch_left <= 0:
                out = self._acks(self._pending)
                self._pending = []
                if self.requested < self.expect:
                    out.append(self._pull())
                self.ack_writes += 1
                self.transport.write(b"".join(out))


# ---- Redis ---------------------------------------------------------------------------------


class RedisQueue(_Counting):
    """XREADGROUP COUNT backlog; XACK of the batch pipelined with the next XREADGROUP."""

    def __init__(self, key: str, group: str, backlog: int) -> None:
        super().__init__()
        self.key = key
        self.group = group
        self.backlog = backlog
        self.acked = 0
        self.xack_replies = 0
        self.acked_total = 0  # sum of the XACK replies: entries Redis says it acknowledged
        self.ack_writes = 0
        self._read = resp_command(
            "XREADGROUP", "GROUP", group, "bench-consumer", "COUNT", backlog, "STREAMS", key, ">"
        )
        self._xack_head = [b"XACK", key.encode(), group.encode()]

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.write(resp_command("PING"))

    def start(self, expect: int) -> None:
        self._go(expect, self._read)

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        if not self._pong_ready():
            return
        while buf and self.running:
            c = buf[0]
            if c == 58:  # ':' XACK reply
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return
                self.acked_total += int(buf[1:eol])
                del buf[: eol + 2]
                self.xack_replies += 1
                if self.acked >= self.expect and self.xack_replies >= self.ack_writes:
                    self.t_last = _now_ns()
                    self._finish()
                    return
            elif c == 45:  # -ERR
                self._fail(bytes(buf[: buf.find(b"\r\n")]).decode(errors="replace"))
                return
            elif buf.startswith(b"*-1\r\n"):  # nothing new (should not happen: all are waiting)
                del buf[:5]
                self.transport.write(self._read)
            else:
                ids = self._reply_ids()
                if ids is None:
                    return  # incomplete
                self._got(len(ids))
                self.acked += len(ids)
                out = resp_command(*self._xack_head, *ids)
                self.ack_writes += 1
                if self.acked < self.expect:
                    out += self._read
                self.transport.write(out)

    def _reply_ids(self):
        """Ids of one whole XREADGROUP reply at the start of buf (consumed), or None."""
        buf = self.buf
        find = buf.find
        n = len(buf)
        head = xread_head(buf)
        if head is None:
            return None
        k, pos = head
        ids = []
        for _ in range(k):
            # *2 $idlen id *2 ($flen field $vlen value)
            e = find(b"\r\n", pos + 4)  # after "*2\r\n": $idlen
            if e < 0:
                return None
            a = e + 2
            b = a + int(buf[pos + 5 : e])
            ids.append(bytes(buf[a:b]))
            pos = b + 2 + 4  # skip id CRLF and "*2\r\n"
            for _f in range(2):
                e = find(b"\r\n", pos)
                if e < 0:
                    return None
                pos = e + 2 + int(buf[pos + 1 : e]) + 2
            if pos > n:
                return None
        if pos > n:
            return None
        del buf[:pos]
        return ids
