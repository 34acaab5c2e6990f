"""Replication (issue 14): what a sync, an async, and no destination cost the publisher, in the
same run; replication lag under load; resync time for 1M missed messages.

    ./run bench bench_replication [--count 100000] [--rate 5000] [--seconds 10] [--resync 1000000]
                                  [--reps 3] [--quick] [--no-results]
                                  [--peers tickertape[,tickertape-base]]

Tickertape only: two instances on this machine (tests/support/cluster.py, links straight to the
other instance's replication port, no proxy); `tickertape-base` (TICKERTAPE_BASE_BIN, another
build) runs the same modes in the same run, for a change's before/after. Modes, run interleaved
(rep 1 of each, then rep 2):

  none   one instance, no <Replication>
  async  tt-a -> tt-b, <SyncType>async
  sync   tt-a -> tt-b, <SyncType>sync: a persisted ack waits for tt-b's ack after its fsync

Per mode and repetition, on a fresh pair:
  1. throughput: `--count` publishes of `--size` B, at most `--window` unacked, persisted acks;
     msgs/s = count / time to the last ack.
  2. latency, once the destination has caught up with step 1 (an async destination may still be
     receiving it, and that would be measured as latency): a publisher paced at `--rate` msg/s
     for `--seconds` (1 ms tick); a persisted ack covering seq k stamps every seq <= k:
     publish -> persisted-ack p50 / p99 / p99.9; the first second is not counted. A subscriber on tt-b (async, sync) measures publish -> delivery on
     the destination: the replication lag under load (p50 / p99 / max).
Then once (the first peer): tt-b stopped, `--resync` messages published to tt-a (async destination), tt-b started;
resync time = from tt-b listening to tt-a's /stats showing it caught up (lag 0), checked by a
replay of tt-b's count.

The machine is shared: the 1-minute load average is sampled around every repetition and
reported, with each repetition's p99 of `none` and `sync` side by side, so a sync p99 can be
read against the unreplicated p99 of the same moment. The load generator runs in this process
on uvloop (as the header says; its own scheduling delay is in every latency figure, replicated
or not).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import urllib.request

import benchlib
import peers
from benchlib import Metric, pct
from loadgen import run_coro as run
from loadgen import tickertape_frame as frame

sys.path.insert(0, peers.REPO)
from tests.support import proc
from tests.support.cluster import Cluster

TOPIC = "bench.repl"
LAT_TOPIC = "bench.lat"
MODES = ["none", "async", "sync"]
METRICS = [
    Metric("tput", "publish msg/s", "{:,.0f}", spread=True),
    Metric("p50", "ack p50 µs", "{:,.0f}", "lower"),
    Metric("p99", "ack p99 µs", "{:,.0f}", "lower", spread=True),
    Metric("p999", "ack p99.9 µs", "{:,.0f}", "lower"),
    Metric("rate", "paced msg/s", "{:,.0f}"),
    Metric("lag50", "lag p50 µs", "{:,.0f}", "lower", ratio=False),
    Metric("lag99", "lag p99 µs", "{:,.0f}", "lower", ratio=False),
    Metric("lagmax", "lag max µs", "{:,.0f}", "lower", ratio=False),
]


async def read_frames(reader: asyncio.StreamReader):
    while True:
        head = await reader.readexactly(4)
        (n,) = struct.unpack(">I", head)
        data = await reader.readexactly(n)
        header, end = json.JSONDecoder().raw_decode(data.decode("utf-8", "surrogateescape"))
        yield header, data[end:]


async def logon(port: int, name: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    writer.write(frame({"c": "logon", "cid": "l", "client_name": name, "a": "processed"}))
    frames = read_frames(reader)
    async for h, _ in frames:
        if h.get("c") == "ack" and h.get("cid") == "l":
            break
    return reader, writer, frames


async def publish(port: int, n: int, size: int, window: int, rate: float, timeout: float,
                  name: str, sent: list[int] | None = None, topic: str = TOPIC) -> dict:  # fmt: skip
    """Publish n messages (paced at `rate` when > 0, else as fast as the window allows);
    returns send times by seq (into `sent` when given), ack times by seq, elapsed time."""
    _, writer, frames = await logon(port, name)
    body = b'{"pad":"' + b"x" * max(0, size - 10) + b'"}'
    sent = sent if sent is not None else [0] * (n + 1)
    acked = [0] * (n + 1)
    state = {"acked": 0}
    room = asyncio.Event()
    room.set()
    done = asyncio.Event()

    async def acks():
        async for h, _ in frames:
            if h.get("c") == "ack" and h.get("a") == "persisted":
                k = int(h.get("s", 0))
                now = time.perf_counter_ns()
                for s in range(state["acked"] + 1, min(k, n) + 1):
                    acked[s] = now
                state["acked"] = max(state["acked"], k)
                if k >= n:
                    done.set()
                    return
                room.set()

    reader_task = asyncio.ensure_future(acks())
    start = time.perf_counter()
    seq = 0
    tick = 0.001
    try:
        async with asyncio.timeout(timeout):
            while seq < n:
                due = min(n, int((time.perf_counter() - start) * rate) + 1) if rate else n
                due = min(due, state["acked"] + window)
                if due <= seq:
                    room.clear()
                    if rate:
                        await asyncio.sleep(tick)
                    else:
                        await room.wait()
                    continue
                out = []
                while seq < due:
                    seq += 1
                    sent[seq] = time.perf_counter_ns()
                    out.append(frame({"c": "publish", "t": topic, "s": seq, "a": "persisted"},
                                     body))  # fmt: skip
                writer.write(b"".join(out))
                await writer.drain()
            await done.wait()
    finally:
        reader_task.cancel()
        writer.close()
    return {"sent": sent, "acked": acked, "seconds": time.perf_counter() - start}


async def subscribe_lag(port: int, sent: list[int], n: int, stop: asyncio.Event) -> list[int]:
    """Deliveries on the destination: receive - send (ns) by the seq in the bookmark."""
    _, writer, frames = await logon(port, f"lag-{time.monotonic_ns()}")
    # its own topic: the throughput run's messages may still be arriving at an async destination
    writer.write(frame({"c": "subscribe", "t": LAT_TOPIC, "cid": "s", "a": "processed"}))
    lags = []
    try:
        async for h, _ in frames:
            if h.get("c") != "p":
                continue
            now = time.perf_counter_ns()
            s = int(h["bm"].split("|")[1])
            if 0 < s <= n and sent[s]:
                lags.append(now - sent[s])
            if s >= n or stop.is_set():
                break
    finally:
        writer.close()
    return lags


def make_cluster(root: str, mode: str) -> Cluster:
    d = tempfile.mkdtemp(prefix=f"repl-{mode}-", dir=root)
    if mode == "none":
        return Cluster(d, ["tt-a"], links=[], topics=(r"bench\..*",), proxy=False)
    return Cluster(d, ["tt-a", "tt-b"], links=[("tt-a", "tt-b")], sync=mode == "sync",
                   topics=(r"bench\..*",), proxy=False)  # fmt: skip


def caught_up(admin_port: int, dest: str, timeout: float) -> None:
    """Until tt-a's /stats shows `dest` connected with no lag."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = stats_dest(admin_port, dest)
        if d.get("connected") and d.get("lag_messages") == 0 and d.get("lag_bytes") == 0:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{dest} did not catch up within {timeout:g}s")


def one_rep(args, mode: str, rep: int, peer: str = "tickertape") -> dict:
    proc.TICKERTAPE = peers.tickertape_bin(peer)  # the build the cluster's instances run
    cl = make_cluster(args.root, mode).start()
    try:
        a = cl["tt-a"]
        load = [os.getloadavg()[0]]
        r = run(publish(a.port, args.count, args.size, args.window, 0, args.timeout,
                                f"tput-{rep}"))  # fmt: skip
        out = {"tput": args.count / r["seconds"]}
        if mode != "none":
            caught_up(a.admin_port, "tt-b", args.timeout)
        n = int(args.rate * args.seconds)
        warm = int(args.rate)

        async def paced():
            sent = [0] * (n + 1)
            pub = publish(a.port, n, args.size, args.window, args.rate, args.timeout,
                          f"lat-{rep}", sent, LAT_TOPIC)  # fmt: skip
            if mode == "none":
                return await pub, []
            stop = asyncio.Event()
            lag_task = asyncio.ensure_future(subscribe_lag(cl["tt-b"].port, sent, n, stop))
            await asyncio.sleep(0.2)  # subscribed before the first publish
            try:
                res = await pub
                lags = await asyncio.wait_for(lag_task, 30)
            finally:
                stop.set()
                lag_task.cancel()
            return res, lags

        res, lags = run(paced())
        lat = sorted(res["acked"][s] - res["sent"][s] for s in range(warm + 1, n + 1)
                     if res["acked"][s])  # fmt: skip
        out.update(p50=pct(lat, 0.5), p99=pct(lat, 0.99), p999=pct(lat, 0.999),
                   rate=n / res["seconds"])  # fmt: skip
        lags = sorted(lags[warm:])
        if lags:
            out.update(lag50=pct(lags, 0.5), lag99=pct(lags, 0.99), lagmax=lags[-1] / 1e3)
        load.append(os.getloadavg()[0])
        out["load"] = load
        return out
    finally:
        cl.close()


def stats_dest(port: int, dest: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        repl = json.loads(r.read()).get("replication") or {}
    return repl.get(dest) or (repl.get("destinations") or {}).get(dest) or {}


def resync_time(args) -> float | None:
    proc.TICKERTAPE = peers.tickertape_bin(args.peers[0])
    cl = make_cluster(args.root, "async")
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        a.start()
        run(publish(a.port, args.resync, args.size, max(args.window, 5000), 0,
                            args.timeout * 5, "resync-pub"))  # fmt: skip
        b.start()
        t0 = time.monotonic()
        deadline = t0 + args.timeout
        while time.monotonic() < deadline:
            d = stats_dest(a.admin_port, "tt-b")
            if d.get("connected") and d.get("lag_messages") == 0 and d.get("acked_position"):
                took = time.monotonic() - t0
                got = sum(len(v) for v in b.per_publisher(TOPIC).values())
                if got != args.resync:
                    print(f"resync: tt-b holds {got} of {args.resync}")
                    return None
                return took
            time.sleep(0.02)
        print(f"resync: not caught up within {args.timeout}s")
        return None
    finally:
        cl.close()


def label_of(peer: str, mode: str) -> str:
    return peer if mode == "none" else f"{peer} ({mode})"


def fmt_us(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=100_000, help="throughput publishes per rep")
    p.add_argument("--rate", type=float, default=5000.0, help="paced latency run, msg/s")
    p.add_argument("--seconds", type=float, default=10.0, help="paced run length")
    p.add_argument("--resync", type=int, default=1_000_000, help="messages missed, then resynced")
    benchlib.common_args(p)
    p.set_defaults(peers="tickertape")  # tickertape and/or tickertape-base
    args = p.parse_args()
    if args.quick:
        args.count, args.seconds, args.reps, args.resync = 20_000, 3.0, 1, 100_000
    args.peers, skipped = benchlib.peers_to_run(args.peers, show=False)
    args.peers = [n for n in args.peers if peers.is_tickertape(n)]
    if not args.peers:
        sys.exit(f"no Tickertape build is runnable: {'; '.join(skipped)}")
    os.makedirs(peers.DATA_ROOT, exist_ok=True)
    args.root = tempfile.mkdtemp(prefix="replication-", dir=peers.DATA_ROOT)
    keys = [(peer, m) for peer in args.peers for m in MODES]
    results: dict[tuple[str, str], list[dict]] = {k: [] for k in keys}
    problems: dict[str, list[str]] = {}
    try:
        for rep in range(args.reps):
            for peer, mode in keys:
                got, probs = benchlib.repeat(
                    label_of(peer, mode),
                    1,
                    lambda r, p=peer, m=mode: one_rep(args, m, r, p),
                    first_rep=rep,
                    of=args.reps,
                )
                results[peer, mode] += got
                if probs:
                    problems.setdefault(label_of(peer, mode), []).extend(probs)
        resync = None
        try:
            resync = resync_time(args)
        except Exception as exc:
            problems.setdefault("resync", []).append(repr(exc))
    finally:
        shutil.rmtree(args.root, ignore_errors=True)
    rows = [(label_of(*k), benchlib.medians(results[k], METRICS)) for k in keys]
    med = dict(zip(keys, (r for _, r in rows), strict=True))

    def sync_ratio(peer: str) -> float | None:
        return benchlib.ratio(med[peer, "sync"].get("tput"), med[peer, "none"].get("tput"))

    first = args.peers[0]
    ratio = sync_ratio(first)
    loads = [x for k in keys for r in results[k] for x in r.get("load", ())]
    per_rep = "; ".join(
        f"rep {i + 1}: none {fmt_us(n.get('p99'))}, sync {fmt_us(s.get('p99'))}"
        for i, (n, s) in enumerate(
            zip(results[first, "none"], results[first, "sync"], strict=False)
        )
    )
    same_run = "; ".join(
        f"{peer} {r * 100:.0f} %" if (r := sync_ratio(peer)) is not None else f"{peer} —"
        for peer in args.peers
    )
    builds = ""
    if len(args.peers) > 1:
        other = args.peers[1]
        builds = f"publish msg/s {first} ÷ {other}, mode by mode: " + ", ".join(
            f"{m} {a / b:.2f}×"
            if (a := med[first, m].get("tput")) and (b := med[other, m].get("tput"))
            else f"{m} —"
            for m in MODES
        )
    targets = benchlib.targets_table([
        ("sync-replicated publish ≥ 40% of unreplicated", "%", ratio and ratio * 100, 40, "min"),
        (f"p99 publish→persisted ack with a sync destination at {args.rate:,.0f} msg/s < 3 ms",
         "µs", med[first, "sync"].get("p99"), 3000, "max"),
        (f"resync of {args.resync:,} missed messages < 10 s", "s", resync, 10, "max"),
    ])  # fmt: skip
    notes = [
        f"two instances on this machine, tt-a -> tt-b straight (no proxy); {args.size} B bodies; "
        f"throughput: {args.count:,} publishes, window {args.window}; latency: paced "
        f"{args.rate:,.0f} msg/s for {args.seconds:g} s, first second not counted; lag: "
        "publish on tt-a -> delivery to a subscriber on tt-b",
        f"resync: {args.resync:,} messages published to tt-a while tt-b was down, time from "
        f"tt-b listening to caught up: {'—' if resync is None else f'{resync:.2f} s'}",
        "rows with (async) or (sync) are replicated modes; the targets are the first peer's; "
        f"sync ÷ unreplicated publish msg/s in the same run: {same_run}",
        *([builds] if builds else []),
        f"ack p99 per repetition (µs), unreplicated and sync side by side: {per_rep or '—'}",
        "shared machine: 1-minute load average around the repetitions "
        + (f"{min(loads):.1f}–{max(loads):.1f}" if loads else "—")
        + f" on {os.cpu_count()} cores (other work runs beside the three processes measured)",
    ]
    benchlib.report(
        "bench_replication",
        "Replication: publish cost of sync / async / no destination, lag, resync "
        "(bench_replication)",
        benchlib.Table(rows, problems, skipped),
        METRICS,
        notes,
        args.no_results,
        extra_text=targets,
    )


if __name__ == "__main__":
    main()
