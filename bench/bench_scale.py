"""Scale: how the server's cost grows with subscriptions, topics and connections (issue 15).

    ./run bench bench_scale [--count 20000] [--subs 1,100,1000,10000] [--topics 1,1000]
                            [--js-max 1000] [--conns 1000] [--reps 3] [--quick] [--no-plot]

Sections (each repetition on a fresh server; medians of the repetitions):

  curve       publish throughput (persisted acks, window 1000) and server CPU µs per message
              with S live subscriptions, each with its own content filter, over T topics.
              Tickertape: subscription i is on topic scale.<i mod T> with filter `/id = i`,
              on 10 connections (<ClientMaxSubscriptions> is 1,000 a connection); message k
              has body {"id": k mod S, ...} on topic scale.<id mod T>: each message matches
              exactly one subscription, so every point delivers as many messages and only the
              cost of finding the subscriber grows. JetStream: the subject is the filter, so
              the same thing is message subject bench.scale.<id>, and either S subject-filtered
              push consumers (ack none) on the stored stream ("consumers", up to --js-max: each
              is a durable consumer, slow to make) or S core SUBs ("core subs", delivered at
              publish time beside the store). Topics mean nothing more to NATS (the subject
              tree is the index): it runs with T = 1 only. Redis has no content filter: with
              a stream per key and XREAD blocking readers the equivalent needs one reader
              reissuing XREAD over S keys; not measured here.
  publishers  1,000 connections publishing at once, 20 messages each (window 20): msgs/s
              and server CPU µs/msg; every peer (Redis: XADD to one stream).
  memory      server RSS (VmRSS) growth per idle connection (1,000 logged on / CONNECTed /
              PINGed, idle) and per idle subscription (10,000 over 10 connections, each with
              its own filter; NATS: core SUBs on distinct subjects and, up to --js-max,
              JetStream consumers); RSS read after 1 s of quiet, minus RSS before (after the
              connections, for subscriptions). RSS counts what the process really holds
              (allocator slack included), where tracemalloc would count only Python objects:
              tests/server/test_memory.py keeps the tracemalloc figures under bounds.

The machine is shared and noisy: figures are medians; compare ratios within one run.
Writes the `bench_scale` section of RESULTS.md and draws bench/scale.png.
"""

from __future__ import annotations

import asyncio
import time

import benchlib
import loadgen
import peers
import scale_report
from loadgen import _U32
from loadwire import NatsLines, TtLogon, nats_connect, nats_subs

SUB_CONNS = 10
DELIVER = "_scale.d"


def body(i: int, size: int) -> bytes:
    head = b'{"id":%d,"pad":"' % i
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


# ---- Tickertape ----------------------------------------------------------------------------


class TtSubs(TtLogon, loadgen._Conn):
    """Logs on, subscribes `subs` [(sub_id, topic, filter)] in one write, counts deliveries."""

    def __init__(self, name: str, subs: list[tuple[str, str, str | None]]) -> None:
        super().__init__()
        self.client_name = name
        self.subs = subs
        self.stage = "logon"

    def _subscribe(self) -> None:
        parts = []
        for k, (sid, topic, filt) in enumerate(self.subs):
            h: dict = {"c": "subscribe", "t": topic, "sub_id": sid}
            if filt:
                h["f"] = filt
            if k == len(self.subs) - 1:
                h.update(cid="subs", a="processed")
            parts.append(loadgen.tickertape_frame(h))
        self.stage = "subscribe"
        self.transport.write(b"".join(parts))
        if not self.subs:
            self.stage = "run"
            self.ready.set_result(None)

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n, pos, got = len(buf), 0, 0
        while n - pos >= 4:
            ln = _U32.unpack_from(buf, pos)[0]
            end = pos + 4 + ln
            if end > n:
                break
            if buf[pos + 4 : pos + 12] == b'{"c":"p"':
                got += 1
            elif self.stage != "run":
                h = self._header(pos + 4, end)
                if h.get("status") == "failure":
                    self._fail(f"{self.stage}: {h}")
                elif h.get("cid") == "logon":
                    self._subscribe()
                elif h.get("cid") == "subs":
                    self.stage = "run"
                    self.ready.set_result(None)
            pos = end
        if pos:
            del buf[:pos]
        self.received += got


class NatsSubs(NatsLines, loadgen._Conn):
    """CONNECTs, SUBs `subjects` in one write, counts MSGs (PONG after the SUBs = ready)."""

    def __init__(self, subjects: list[str]) -> None:
        super().__init__()
        self.subjects = subjects

    def _hello(self) -> bytes:
        return nats_connect("scale") + nats_subs(self.subjects, 0) + b"PING\r\n"

    def data_received(self, data) -> None:
        buf = self.buf
        buf += data
        n, pos, got = len(buf), 0, 0
        while pos < n:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if buf[pos] == 77 or buf[pos] == 72:  # MSG subj sid [reply] len / HMSG .. hlen len
                end = eol + 2 + int(buf[buf.rfind(b" ", pos, eol) + 1 : eol]) + 2
                if end > n:
                    break
                got += 1
                pos = end
                continue
            self._line(bytes(buf[pos:eol]))
            pos = eol + 2
        if pos:
            del buf[:pos]
        self.received += got


async def _connect_all(factories, batch: int = 100) -> list:
    out = []
    for i in range(0, len(factories), batch):
        out += await asyncio.gather(
            *(loadgen._connect(f, *a, timeout=60) for f, *a in factories[i : i + batch])
        )
    return out


def _subscriptions(s: int, t: int) -> list[list[tuple[str, str, str | None]]]:
    per: list[list[tuple[str, str, str | None]]] = [[] for _ in range(min(SUB_CONNS, s))]
    for i in range(s):
        per[i % len(per)].append((f"s{i}", f"scale.{i % t}", f"/id = {i}"))
    return per


def _publish_frames(kind: str, n: int, s: int, t: int, size: int, tag: str) -> loadgen.Frames:
    parts = []
    for k in range(1, n + 1):
        i = (k - 1) % s
        b = body(i, size)
        if kind == "tickertape":
            h = b'{"c":"publish","t":"scale.%d","s":%d,"a":"persisted"}' % (i % t, k)
            parts.append(_U32.pack(len(h) + len(b)) + h + b)
        else:
            parts.append(
                b"PUB bench.scale.%d _INBOX.s.%s %d\r\n%s\r\n" % (i, tag.encode(), len(b), b)
            )
    return loadgen.Frames(parts)


async def _curve_async(peer, mode: str, s: int, t: int, args, tag: str) -> dict:
    host, port = peer.host, peer.port
    conns = []
    try:
        if peer.kind == "tickertape":
            subs = await _connect_all(
                [
                    (lambda j=j, lst=lst: TtSubs(f"scale-sub-{tag}-{j}", lst), host, port)
                    for j, lst in enumerate(_subscriptions(s, t))
                ]
            )
            pub_f = lambda: loadgen.TickertapeConn(f"scale-pub-{tag}")
        else:
            if mode == "consumers":  # interest first: a consumer notes it when it is made
                groups = [[f"{DELIVER}.{i}" for i in range(s)]]
            else:
                groups = [
                    [f"bench.scale.{i}" for i in range(j, s, SUB_CONNS)]
                    for j in range(min(SUB_CONNS, s))
                ]
            subs = await _connect_all([(lambda g=g: NatsSubs(g), host, port) for g in groups])
            if mode == "consumers":
                for i in range(s):
                    peer.create_push_consumer(f"c{i}", f"{DELIVER}.{i}", f"bench.scale.{i}")
            pub_f = lambda: loadgen.NatsConn(inbox=f"_INBOX.s.{tag}")
        conns += subs
        pub = (await _connect_all([(pub_f, host, port)]))[0]
        conns.append(pub)
        pub.setup_publisher(
            _publish_frames(peer.kind, args.count, s, t, args.size, tag), args.window
        )
        for c in subs:
            c.running = True
        await asyncio.sleep(0.2)
        cpu0 = peer.cpu_seconds()
        t0 = time.perf_counter()
        pub.start_publishing()
        deadline = t0 + args.timeout
        while time.perf_counter() < deadline:
            if pub.done.done() and sum(c.received for c in subs) >= args.count:
                break
            if any(c.error for c in conns):
                break
            await asyncio.sleep(0.002)
        secs = (pub.t_end - pub.t_start) / 1e9 if pub.t_end else None
        got = sum(c.received for c in subs)
        cpu = peer.cpu_seconds() - cpu0
        out = {
            "msgs_s": args.count / secs if secs else None,
            "cpu_us": cpu / args.count * 1e6,
            "delivered": got,
        }
        errors = [c.error for c in conns if c.error]
        if errors or got != args.count or not secs:
            out["problem"] = f"delivered {got}/{args.count}, acked {pub.acked}; {errors[:2]}"
            out["valid"] = False
        return out
    finally:
        for c in conns:
            c.close()
        await asyncio.sleep(0)


# ---- 1,000 publishers ----------------------------------------------------------------------


async def _publishers_async(peer, args, tag: str) -> dict:
    m = args.per_conn
    conns = []
    try:
        kind = peer.kind
        fs = []
        for i in range(args.conns):
            if kind == "tickertape":
                f = lambda i=i: loadgen.TickertapeConn(f"p{tag}-{i}")
                frames = loadgen.build_publish_frames(kind, "scale.pubs", m, args.size)
            elif kind == "nats":
                f = lambda i=i: loadgen.NatsConn(inbox=f"_INBOX.p.{i}")
                frames = loadgen.build_publish_frames(
                    kind, "bench.pubs", m, args.size, f"_INBOX.p.{i}"
                )
            else:
                f = lambda: loadgen.RedisConn("scale:pubs")
                frames = loadgen.build_publish_frames(kind, "scale:pubs", m, args.size)
            fs.append((f, peer.host, peer.port, frames))
        conns = await _connect_all([(f, h, p) for f, h, p, _ in fs])
        for c, (*_, frames) in zip(conns, fs, strict=True):
            c.setup_publisher(frames, m)
        await asyncio.sleep(0.3)
        cpu0 = peer.cpu_seconds()
        t0 = time.perf_counter()
        for c in conns:
            c.start_publishing()
        await asyncio.wait([c.done for c in conns], timeout=args.timeout)
        secs = time.perf_counter() - t0
        total = args.conns * m
        acked = sum(c.acked for c in conns)
        cpu = peer.cpu_seconds() - cpu0
        out = {"msgs_s": acked / secs, "cpu_us": cpu / max(acked, 1) * 1e6}
        if acked != total or any(c.error for c in conns):
            errs = [c.error for c in conns if c.error][:2]
            out.update(problem=f"acked {acked}/{total}; {errs}", valid=False)
        return out
    finally:
        for c in conns:
            c.close()
        await asyncio.sleep(0)


# ---- memory --------------------------------------------------------------------------------


class Idle(loadgen._Conn):
    """A connection that says hello in its protocol and then nothing."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__()
        self.kind = kind
        self.name = name

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self.kind == "tickertape":
            transport.write(
                loadgen.tickertape_frame({"c": "logon", "a": "processed", "client_name": self.name})
            )
        elif self.kind == "redis":
            transport.write(loadgen.resp_command("PING"))

    def data_received(self, data) -> None:
        if self.kind == "nats" and data.startswith(b"INFO"):
            self.transport.write(nats_connect("scale") + b"PING\r\n")
        elif not self.ready.done() and (self.kind != "nats" or b"PONG" in data):
            self.ready.set_result(None)


async def _quiet_rss(peer, settle: float) -> int:
    await asyncio.sleep(settle)
    return peer.rss_bytes()


async def _memory_async(peer, args, tag: str) -> dict:
    conns = []
    out: dict = {}
    try:
        kind = peer.kind
        rss0 = await _quiet_rss(peer, args.settle)
        n = args.conns
        conns = await _connect_all(
            [(lambda i=i: Idle(kind, f"idle{tag}-{i}"), peer.host, peer.port) for i in range(n)]
        )
        rss1 = await _quiet_rss(peer, args.settle)
        out["conn_kib"] = (rss1 - rss0) / n / 1024
        if kind == "redis":  # no subscriptions to hold: idle connections only
            return out
        for c in conns:
            c.close()
        conns = []
        await asyncio.sleep(0.5)
        s = args.mem_subs
        if kind == "tickertape":
            mk = [
                (lambda j=j, lst=lst: TtSubs(f"msub{tag}-{j}", []), peer.host, peer.port)
                for j, lst in enumerate(_subscriptions(s, 1))
            ]
            conns = await _connect_all(mk)
            rss2 = await _quiet_rss(peer, args.settle)
            for c, lst in zip(conns, _subscriptions(s, 1), strict=True):
                c.subs = lst
                c.ready = asyncio.get_running_loop().create_future()
                c._subscribe()
            await asyncio.gather(*(c.ready for c in conns))
            rss3 = await _quiet_rss(peer, args.settle)
            out["sub_b"] = (rss3 - rss2) / s
        else:
            rss2 = await _quiet_rss(peer, 0)
            groups = [[f"bench.m.{i}" for i in range(j, s, SUB_CONNS)] for j in range(SUB_CONNS)]
            conns = await _connect_all(
                [(lambda g=g: NatsSubs(g), peer.host, peer.port) for g in groups]
            )
            rss3 = await _quiet_rss(peer, args.settle)
            out["sub_b"] = (rss3 - rss2) / s  # includes 10 connections: noise at this count
            k = args.js_max
            for i in range(k):
                peer.create_push_consumer(f"m{i}", f"{DELIVER}.m.{i}", f"bench.m.{i}")
            rss4 = await _quiet_rss(peer, args.settle)
            out["consumer_b"] = (rss4 - rss3) / k
        return out
    finally:
        for c in conns:
            c.close()
        await asyncio.sleep(0)


# ---- driver --------------------------------------------------------------------------------


def _median_runs(peer_name: str, reps: int, fn) -> tuple[dict, list[str]]:
    """fn(peer, tag) on a fresh peer per repetition -> (median of every figure, problems)."""
    results, problems = benchlib.run_variant(
        benchlib.Variant(peer_name, peer_name), reps, lambda peer, _v, r: fn(peer, f"{r}")
    )
    return benchlib.medians(results), problems


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=20_000, help="messages per curve point")
    p.add_argument("--subs", default="1,100,1000,10000")
    p.add_argument("--topics", default="1,1000")
    p.add_argument("--js-max", type=int, default=1000, help="most JetStream consumers made")
    p.add_argument("--conns", type=int, default=1000, help="publishing / idle connections")
    p.add_argument("--per-conn", type=int, default=20, help="messages per publishing connection")
    p.add_argument("--mem-subs", type=int, default=10_000, help="idle subscriptions (memory)")
    p.add_argument("--settle", type=float, default=1.0, help="seconds of quiet before an RSS")
    p.add_argument("--no-plot", action="store_true")
    benchlib.common_args(p)
    args = p.parse_args()
    if args.peers == "all":
        args.peers = "tickertape,jetstream,redis-everysec"
    sizes = [int(x) for x in args.subs.split(",")]
    topics = [int(x) for x in args.topics.split(",")]
    if args.quick:
        args.count, args.reps, args.js_max = 2000, 1, 100
        args.conns, args.mem_subs = 100, 1000
        sizes = [x for x in sizes if x <= 1000]
    names, skipped = benchlib.peers_to_run(args.peers)
    t_start = time.time()
    curve: list[tuple[str, int, dict]] = []  # (series, subs, medians)
    problems: list[str] = []

    def point(head: str, shown: str, said: str, peer_name: str, fn) -> dict:
        """The medians of fn on peer_name, printed as `head` padded and `shown`; its problems
        are named `said`."""
        med, probs = _median_runs(peer_name, args.reps, fn)
        problems.extend(f"{said} {x}" for x in probs)
        print(f"  {head:28}{shown}: {benchlib.summary(med)}", flush=True)
        return med

    for name in names:
        kind = peers.make_peer(name).kind
        points = []  # (series, S, curve mode, T)
        if kind == "tickertape":  # T topics need at least T subscriptions
            points = [(f"{name} T={t}", s, "", t) for t in topics for s in sizes if t <= s]
        elif kind == "nats":
            points = [
                (f"{name} ({mode})", s, mode.split()[0], 1)
                for mode in ("consumers", "core subs")
                for s in sizes
                if mode != "consumers" or s <= args.js_max
            ]
        for series, s, mode, t in points:
            fn = lambda peer, tag, s=s, t=t, mode=mode: loadgen.run_coro(
                _curve_async(peer, mode, s, t, args, tag)
            )
            curve.append((series, s, point(series, f" S={s:>6}", f"{series} S={s}", name, fn)))
    pubs: list[tuple[str, dict]] = []
    mem: list[tuple[str, dict]] = []
    for name in names:
        fn = lambda peer, tag: loadgen.run_coro(_publishers_async(peer, args, tag))
        pubs.append(
            (name, point(name, f" {args.conns} publishers", f"{name} publishers", name, fn))
        )
        fn = lambda peer, tag: loadgen.run_coro(_memory_async(peer, args, tag))
        mem.append((name, point(name, " memory", f"{name} memory", name, fn)))
    elapsed = time.time() - t_start
    text = scale_report.report(args, SUB_CONNS, curve, pubs, mem, problems, skipped, elapsed)
    benchlib.emit("bench_scale", text, args.no_results)
    if not args.no_plot:
        scale_report.plot(curve, pubs, mem, args)


if __name__ == "__main__":
    main()
