"""Replay of stored messages from the start to one subscriber, and a slow reader's memory cost.

    ./run bench bench_replay [--count 1000000] [--reps 3] [--peers tickertape,jetstream,redis-everysec]

Per peer, `count` messages of 100 B JSON are stored first (not measured), the server is started
afresh on them, then one subscriber reads them all from the beginning:
  tickertape            journal built with the journal API (bench/journaldata.py, cached under
                        bench/.data/journals), copied into the server's data dir; subscribe
                        {bm: "0", a: completed}, counted to the `completed` ack
  tickertape (filter)   the same with the content filter `f: /qty > 50` (half of the messages)
  jetstream (ordered)   stream loaded by loadgen's pipelined publisher, server restarted; an
                        ordered push consumer as NATS clients make one (deliver all, ack none,
                        flow control answered, idle heartbeat)
  redis-*               stream loaded by pipelined XADD, server restarted (AOF reload); XREAD
                        COUNT 1000 STREAMS key last-id in a loop (--redis-count)

Per peer (median of repetitions, fresh server each):
  msgs/s            messages received / seconds from the subscribe (consumer create, first
                    XREAD) to the last message (tickertape: to the `completed` ack)
  stored msgs/s     stored messages gone through / the same seconds (differs from msgs/s only
                    with a filter: the filtered row delivers half of what it reads)
  srv CPU µs/msg    server CPU over the replay / messages delivered; srv CPU % over the wall time
  RSS start MiB     server VmRSS just before the replay (after the restart)
  peak RSS MiB      server VmHWM at the end (the restart reset it: load not included)
  client CPU %      the reader's own CPU over the replay (near 100 %: client-bound, a floor)

Slow reader (tickertape only): a subscriber replays the same journal from EPOCH but reads 16 KiB
every 50 ms through a 64 KiB receive buffer for --slow-seconds; the server's VmRSS is sampled
each time; growth = highest sample - VmRSS before the subscribe (target < 50 MB).
"""

from __future__ import annotations

import socket
import statistics
import time
from functools import partial

import benchlib
import consumers
import journaldata
import loadgen
import peers
from benchlib import Metric, Variant

TOPIC = "bench.replay"  # tickertape topic and JetStream subject (in stream BENCH, bench.>)
REDIS_KEY = "bench:replay"
FILTER = "/qty > 50"
DEFAULT_PEERS = "tickertape,jetstream,redis-everysec"

METRICS = [
    Metric("msgs_s", "msgs/s", spread=True),
    Metric("scan_s", "stored msgs/s", ratio=False),
    Metric("cpu_us", "srv CPU µs/msg", "{:.2f}", "lower"),
    Metric("cpu_pct", "srv CPU %", "{:.0f}", "lower"),
    Metric("rss0_mib", "RSS start MiB", "{:.1f}", "lower"),
    Metric("peak_rss_mib", "peak RSS MiB", "{:.1f}", "lower"),
    Metric("client_pct", "client CPU %", "{:.0f}", "lower", ratio=False),
]


def expected(n: int, filt: str | None) -> int:
    if not filt:
        return n
    return sum(1 for s in range(1, n + 1) if journaldata.qty_of(s) > 50)


def one_rep(args, peer, v, rep) -> dict:
    n = args.count
    filt = v.opts.get("filter")
    want = expected(n, filt)
    load_s = None
    if peer.kind != "tickertape":  # loaded by publishing, then restarted: the load not counted
        dest = TOPIC if peer.kind == "nats" else REDIS_KEY
        load_s = consumers.preload(
            peer, dest, n, args.size, args.load_window, args.timeout, f"l{rep}"
        )
        peer.restart()
    if peer.kind == "tickertape":
        factory = lambda: consumers.TtReplay(f"bench-replay-{rep}", TOPIC, filt)
    elif peer.kind == "nats":
        stored = peer.stream_info().get("state", {}).get("messages")
        if stored != n:
            raise RuntimeError(f"stream holds {stored} messages after the restart, expected {n}")
        factory = lambda: consumers.NatsOrdered(peers.STREAM, TOPIC, f"r{rep}")
    else:
        if peer.xlen(REDIS_KEY) != n:
            raise RuntimeError(f"XLEN {peer.xlen(REDIS_KEY)} after the restart, expected {n}")
        factory = lambda: consumers.RedisReplay(REDIS_KEY, args.redis_count)
    time.sleep(0.5)
    rss0 = peer.rss_bytes()
    conn, out, problems = consumers.measured(peer, factory, want, args.timeout)
    secs = out["seconds"]
    out["scan_s"] = n / secs if secs > 0 else None
    out["rss0_mib"] = rss0 / 2**20
    if load_s is not None:
        out["load_s"] = load_s
    if getattr(conn, "fc_replies", None) is not None:
        out["fc_replies"] = conn.fc_replies
    return benchlib.judged(out, problems)


def slow_reader(args, jdir: str) -> dict:
    """One slow replay: RSS growth of the server while a reader trickles through 1M messages."""
    peer = peers.make_peer("tickertape")
    peer.extra["journal_copy_from"] = jdir
    try:
        peer.start()
        time.sleep(0.5)
        base = peer.rss_bytes()
        s = socket.create_connection((peer.host, peer.port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.sendall(
            loadgen.tickertape_frame(
                {"c": "logon", "cid": "l", "client_name": "bench-slow", "a": "processed"}
            )
            + loadgen.tickertape_frame(
                {"c": "subscribe", "cid": "s", "t": TOPIC, "sub_id": "slow", "bm": "0"}
            )
        )
        peak = base
        got = 0
        t_end = time.monotonic() + args.slow_seconds
        while time.monotonic() < t_end:
            data = s.recv(16 * 1024)
            if not data:
                raise RuntimeError("server closed the slow reader's connection")
            got += len(data)
            time.sleep(0.05)
            peak = max(peak, peer.rss_bytes())
        s.close()
        return {
            "growth_mb": (peak - base) / 1e6,
            "base_mib": base / 2**20,
            "read_mb": got / 1e6,
            "hwm_growth_mb": (peer.peak_rss_bytes() - base) / 1e6,
        }
    finally:
        peer.cleanup()


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=1_000_000, help="messages stored and replayed")
    p.add_argument("--redis-count", type=int, default=1000, help="XREAD COUNT")
    p.add_argument(
        "--load-window", type=int, default=5000, help="unacked publishes while loading the peers"
    )
    p.add_argument("--slow-seconds", type=float, default=10.0, help="slow reader run (0: skip it)")
    benchlib.common_args(p)
    p.set_defaults(peers=DEFAULT_PEERS)
    args = p.parse_args()
    if args.quick:
        args.count, args.reps = min(args.count, 100_000), 1
        args.slow_seconds = min(args.slow_seconds, 3.0)
    names, skipped = benchlib.peers_to_run(
        args.peers,
        drop={
            "jetstream-sync": "loading it takes an fsync per message (~6k msgs/s); its replay "
            "reads the same store as jetstream"
        },
    )
    jdir = None
    variants = []
    for n in names:
        if peers.is_tickertape(n):
            jdir, _meta = journaldata.cached_journal(args.count, TOPIC, args.size)
            extra = {"journal_copy_from": jdir}
            variants.append(Variant(n, n, {"peer_extra": extra}))
            variants.append(
                Variant(f"{n} (filter {FILTER})", n, {"peer_extra": extra, "filter": FILTER})
            )
        elif n == "jetstream":
            variants.append(Variant("jetstream (ordered consumer)", n))
        else:
            variants.append(Variant(f"{n} (XREAD COUNT {args.redis_count})", n))
    print(
        f"replay: {args.count} stored msgs of {args.size} B from the start, {args.reps} reps, "
        f"peers: {', '.join(v.label for v in variants)}"
    )
    run = benchlib.run_rows(variants, args.reps, partial(one_rep, args), METRICS, skipped=skipped)
    slow = []
    if jdir and args.slow_seconds > 0:
        slow, probs = benchlib.repeat("slow reader", args.reps, lambda _r: slow_reader(args, jdir))
        if probs:
            run.problems["slow reader"] = probs
    tt = run.get("tickertape", "msgs_s")
    ttf = run.get(f"tickertape (filter {FILTER})", "msgs_s")
    js = run.get("jetstream (ordered consumer)", "msgs_s")
    growth = statistics.median([m["growth_mb"] for m in slow]) if slow else None
    targets = [
        ("tickertape ÷ jetstream ≥ 2×", "×", tt / js if tt and js else None, 2.0, "min"),
        ("tickertape unfiltered ≥ 500,000 msgs/s", "msgs/s", tt, 500_000, "min"),
        (f"tickertape filtered ({FILTER}) ≥ 200,000 msgs/s", "msgs/s", ttf, 200_000, "min"),
        ("slow reader: server RSS growth < 50 MB", "MB", growth, 50, "max"),
    ]
    scan = run.get(f"tickertape (filter {FILTER})", "scan_s")
    filter_targets = [
        (f"filtered ({FILTER}) ≥ 1,000,000 stored msgs/s scanned", "msgs/s", scan, 1e6, "min"),
        (
            "unfiltered msgs/s ÷ filtered stored msgs/s: within 3×",
            "×",
            tt / scan if tt and scan else None,
            3.0,
            "max",
        ),
    ]
    extra = "Targets (issue 3):\n\n" + benchlib.targets_table(targets)
    extra += "\n\nTargets (issue 15):\n\n" + benchlib.targets_table(filter_targets)
    if slow:
        extra += (
            f"\n\nSlow reader ({args.slow_seconds:.0f} s, 16 KiB per 50 ms, 64 KiB receive "
            f"buffer, {len(slow)} reps): server RSS growth median {growth:.1f} MB (max "
            f"{max(m['growth_mb'] for m in slow):.1f}); RSS before {slow[0]['base_mib']:.1f} "
            f"MiB; read {statistics.median([m['read_mb'] for m in slow]):.1f} MB of the replay"
        )
    notes = [
        (
            f"{args.count} stored messages of {args.size} B JSON, replayed from the start by one "
            f"subscriber; median of {args.reps} repetitions (interleaved: rep 1 of every peer, "
            "then rep 2, ...), each on a freshly started server (peers restarted after loading, "
            "so neither the load nor its memory is counted)"
        ),
        (
            "tickertape: journal built with the journal API and copied in before the start; "
            f"filtered row: `f: {FILTER}` matches half; jetstream: ordered push consumer (ack "
            "none, flow control, heartbeats); redis: XREAD COUNT "
            f"{args.redis_count} in a loop; the data is in the page cache for every peer"
        ),
    ]
    benchlib.report(
        "bench_replay",
        "Replay of stored messages from the start (bench_replay)",
        run,
        METRICS,
        notes,
        args.no_results,
        extra_text=extra,
    )


if __name__ == "__main__":
    main()
