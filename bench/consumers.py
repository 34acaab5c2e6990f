"""The consuming half of the load generator: replay readers and queue consumers, one per peer.

Same discipline as loadgen.py (whose plumbing it reuses): raw protocols over asyncio.Protocol
on uvloop, one process, replies parsed with `find` / `unpack_from` over one bytearray, no
per-message task, future or object; everything a consumer sends in answer to one read (acks,
the next request) goes out in ONE `transport.write`.

Replay (bench_replay):
  TtReplay        logon, subscribe {bm: "0", a: "processed,completed"[, f]}; counts `p` frames
                  until the `completed` ack (replay caught up).
  NatsOrdered     an ordered consumer as the NATS clients make one: ephemeral push consumer,
                  deliver all, ack none, max_deliver 1, flow control, idle heartbeat 5 s, memory
                  storage for its state; every flow-control request (and a stalled heartbeat)
                  is answered. Counts MSGs on the deliver subscription (no gap tracking: a gap
                  would show as a count short of n).
  redis           loadgen.RedisConn as a reader: XREAD COUNT c STREAMS key last-id in a loop.

The queue consumers (bench_queue) are in queue_consumers.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import loadgen
from loadgen import _U32, ProtocolError, _Conn, _now_ns, tickertape_frame
from loadwire import NatsLines, TtLogon, nats_connect, nats_subs

_P = b'{"c":"p"'


class _Counting(_Conn):
    """Counts to `expect` (into _Conn's `received`); t_start / t_last in perf_counter ns."""

    def __init__(self) -> None:
        super().__init__()
        self.expect = 0
        self.t_start = 0

    def _go(self, expect: int, first: bytes) -> None:
        """Start the clock on `expect` messages with `first` (the subscribe, or the request)."""
        self.expect = expect
        self.running = True
        self.t_start = _now_ns()
        self.transport.write(first)

    def _got(self, k: int) -> None:
        self.received += k


# ---- Tickertape ----------------------------------------------------------------------------


class _TtBase(TtLogon, _Counting):
    def __init__(self, client_name: str) -> None:
        super().__init__()
        self.client_name = client_name
        self._stage = "logon"

    def _control(self, h: dict) -> None:
        if h.get("c") != "ack":
            return
        if h.get("status") == "failure":
            self._fail(f"{h.get('cid')} failed: {h}")
            return
        if self._stage == "logon" and h.get("cid") == "logon":
            self._stage = "run"
            self.ready.set_result(None)
            return
        self._ack(h)

    def _ack(self, h: dict) -> None:
        pass


class TtReplay(_TtBase):
    """Bookmark replay from EPOCH to `completed`."""

    def __init__(self, client_name: str, topic: str, filt: str | None = None) -> None:
        super().__init__(client_name)
        self.topic = topic
        self.filt = filt

    def start(self, expect: int) -> None:
        h = {
            "c": "subscribe",
            "cid": "replay",
            "t": self.topic,
            "sub_id": "replay",
            "bm": "0",
            "a": "processed,completed",
        }
        if self.filt:
            h["f"] = self.filt
        self._go(expect, tickertape_frame(h))

    def _ack(self, h: dict) -> None:
        if h.get("a") == "completed":
            self.t_last = _now_ns()
            self._finish()

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        got = 0
        unpack = _U32.unpack_from
        try:
            while n - pos >= 4:
                ln = unpack(buf, pos)[0]
                end = pos + 4 + ln
                if end > n:
                    break
                if buf.startswith(_P, pos + 4):
                    got += 1
                elif ln:
                    if got:
                        self._got(got)
                        got = 0
                    self._control(self._header(pos + 4, end))
                pos = end
        except ProtocolError as e:
            self._fail(str(e))
        if got:
            self._got(got)
        if pos:
            del buf[:pos]


# ---- NATS ----------------------------------------------------------------------------------


class _NatsBase(NatsLines, _Counting):
    """CONNECT, the subscriptions of `subs()` (sid 1, 2, ...), PING; ready at the PONG."""

    def subs(self) -> list[str]:
        return []

    def _hello(self) -> bytes:
        return (
            nats_connect("bench-consumer", no_responders=True)
            + nats_subs(self.subs())
            + b"PING\r\n"
        )

    @staticmethod
    def _api_request(subject: str, cfg: dict, inbox: str) -> bytes:
        """A JetStream API request (cfg as JSON) whose reply comes on inbox."""
        body = json.dumps(cfg).encode()
        return b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), inbox.encode(), len(body), body)

    def _api_reply(self, payload: bytes) -> None:
        r = json.loads(payload) if payload else {}
        if "error" in r:
            self._fail(f"JetStream API error: {r['error']}")

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n = len(buf)
        pos = 0
        find = buf.find
        msgs = []  # (sid, reply or None, header bytes or None, payload start, payload end)
        fast = self._fast
        flen = len(fast)
        while pos < n:
            eol = find(b"\r\n", pos)
            if eol < 0:
                break
            c = buf[pos]
            if c == 77 and buf.startswith(fast, pos):  # MSG <subject> 1 <reply> <len>: data
                sp = buf.rfind(b" ", pos, eol)
                start = eol + 2
                end = start + int(buf[sp + 1 : eol])
                if end + 2 > n:
                    break
                msgs.append((1, buf[pos + flen : sp], None, start, end))
                pos = end + 2
                continue
            if c == 77 or c == 72:  # MSG subj sid [reply] len / HMSG subj sid [reply] hlen tlen
                parts = bytes(buf[pos:eol]).split()
                hmsg = c == 72
                total = int(parts[-1])
                start = eol + 2
                end = start + total
                if end + 2 > n:
                    break
                hlen = int(parts[-2]) if hmsg else 0
                nfix = 5 if hmsg else 4
                reply = parts[3] if len(parts) > nfix else None
                hdr = bytes(buf[start : start + hlen]) if hmsg else None
                msgs.append((int(parts[2]), reply, hdr, start + hlen, end))
                pos = end + 2
                continue
            line = bytes(buf[pos:eol])
            pos = eol + 2
            self._line(line)
        if msgs:
            self._messages(msgs)
        if pos:
            del buf[:pos]

    _fast = b"\x00"  # set per instance: b"MSG <data subject> 1 "

    def _messages(self, msgs) -> None:
        raise NotImplementedError


class NatsOrdered(_NatsBase):
    """An ordered push consumer over the whole stream (flow control answered)."""

    def __init__(self, stream: str, data_subject: str, tag: str) -> None:
        super().__init__()
        self.stream = stream
        self.deliver = f"_bench.ord.{tag}"
        self.inbox = f"_INBOX.ord.{tag}"
        self._fast = b"MSG %s 1 " % data_subject.encode()
        self.fc_replies = 0

    def subs(self) -> list[str]:
        return [self.deliver, self.inbox]

    def start(self, expect: int) -> None:
        cfg = {
            "stream_name": self.stream,
            "config": {
                "deliver_subject": self.deliver,
                "deliver_policy": "all",
                "ack_policy": "none",
                "max_deliver": 1,
                "replay_policy": "instant",
                "flow_control": True,
                "idle_heartbeat": 5_000_000_000,
                "mem_storage": True,
                "num_replicas": 1,
                "inactive_threshold": 300_000_000_000,
            },
        }
        self._go(
            expect, self._api_request(f"$JS.API.CONSUMER.CREATE.{self.stream}", cfg, self.inbox)
        )

    def _messages(self, msgs) -> None:
        got = 0
        out = []
        buf = self.buf
        for sid, reply, hdr, start, end in msgs:
            if sid == 1:
                if hdr is not None and hdr.startswith(b"NATS/1.0 100"):
                    # flow control request (reply set) or idle heartbeat (maybe stalled)
                    if reply:
                        out.append(b"PUB %s 0\r\n\r\n" % reply)
                        self.fc_replies += 1
                    else:
                        i = hdr.find(b"Nats-Consumer-Stalled:")
                        if i >= 0:
                            subj = hdr[i + 22 :].split(b"\r\n", 1)[0].strip()
                            out.append(b"PUB %s 0\r\n\r\n" % subj)
                            self.fc_replies += 1
                    continue
                got += 1
            else:
                self._api_reply(bytes(buf[start:end]))
        if out:
            self.transport.write(b"".join(out))
        if got:
            self._got(got)
            if self.received >= self.expect:
                self.t_last = _now_ns()
                self._finish()


# ---- running ------------------------------------------------------------------------------


async def consume(factory, host: str, port: int, expect: int, timeout: float):
    """Connect with factory, start(expect), wait for done or timeout. Returns (conn, timed_out)."""
    conn = await loadgen._connect(factory, host, port, 30)
    try:
        conn.start(expect)
        done, pending = await asyncio.wait([conn.done], timeout=timeout)
        timed_out = bool(pending)
        if done and conn.done.exception() is not None:
            raise conn.done.exception()
        if not conn.t_last:
            conn.t_last = _now_ns()
        return conn, timed_out
    finally:
        conn.close()
        await asyncio.sleep(0)


def consume_sync(*args, **kw):
    return loadgen.run_coro(consume(*args, **kw))


def measured(peer, factory, want: int, timeout: float) -> tuple[object, dict, list[str]]:
    """consume_sync of `want` messages with the server's CPU and peak RSS and this process's
    CPU around it: (the consumer, the figures every consuming benchmark shows, its problems)."""
    cpu0, ccpu0 = peer.cpu_seconds(), time.process_time()
    conn, timed_out = consume_sync(factory, peer.host, peer.port, want, timeout)
    client_cpu, cpu = time.process_time() - ccpu0, peer.cpu_seconds() - cpu0
    secs = (conn.t_last - conn.t_start) / 1e9
    got = conn.received
    out = {
        "msgs_s": got / secs if secs > 0 else None,
        "cpu_us": cpu / max(got, 1) * 1e6,
        "cpu_pct": cpu / secs * 100 if secs > 0 else None,
        "peak_rss_mib": peer.peak_rss_bytes() / 2**20,
        "client_pct": client_cpu / secs * 100 if secs > 0 else None,
        "received": got,
        "seconds": secs,
    }
    problems = [f"timed out after {timeout}s with {got}/{want} received"] if timed_out else []
    if conn.error:
        problems.append(conn.error)
    if got != want:
        problems.append(f"received {got} of {want}")
    return conn, out, problems


class RedisReplay(loadgen.RedisConn):
    """loadgen's XREAD reader (COUNT c, from 0-0) with the start(expect) of the others."""

    def __init__(self, key: str, count: int = 1000) -> None:
        super().__init__(key, count=count, block_ms=2000)
        self.t_start = 0

    def start(self, expect: int) -> None:
        self.role = "sub"
        self.setup_subscriber(expect)
        self.t_start = _now_ns()
        self.start_reading()


def preload(peer, dest: str, n: int, size: int, window: int, timeout: float, tag: str) -> float:
    """Publish n messages to dest with loadgen's pipelined publisher (outside any measure);
    raises unless all n are acked. Returns the seconds it took."""
    r = loadgen.run_sync(
        peer.kind,
        peer.host,
        peer.port,
        n=n,
        pub_dest=dest,
        body_size=size,
        window=window,
        timeout=timeout,
        tag=tag,
    )
    if r["acked"] != n or r["errors"] or r["pub_errors"]:
        raise RuntimeError(
            f"preload: {r['acked']}/{n} acked, {r['pub_errors']} failed, errors {r['errors'][:2]}"
            + (" (timed out)" if r["timed_out"] else "")
        )
    return r["pub_seconds"]
