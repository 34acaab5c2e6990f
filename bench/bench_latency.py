"""Publish-to-delivery latency at a paced rate (default 5,000 msg/s), one subscriber.

    ./run bench bench_latency [--rate 5000] [--seconds 10] [--warmup 1] [--reps 3] [--peers ...]

The publisher sends on a 1 ms tick whatever is due (window-bounded, persisted acks as in
bench_publish) and stamps each message's send time (perf_counter_ns) by its sequence; the
subscriber, in the same process, reads the sequence from the body (body[7:17]) and records
receive - send. The first `--warmup` seconds of messages are not counted.

What "delivery" is by peer:
  tickertape        a `subscribe` connection; the server delivers after the fsync'd group commit
  jetstream (push)  a durable push consumer: delivered from the stream once stored (2.9: not
                    fsync'd); jetstream-sync (push): stored and fsync'd per write
  jetstream (core)  a plain SUB on the stored subject: delivered at publish time
  redis-*           XREAD BLOCK loop; with appendfsync always the reply follows the AOF fsync

Per peer: p50 / p99 / p99.9 / max in µs (median over repetitions), the rate actually achieved
(a peer that cannot sustain the rate queues behind the window, and its latencies show that),
server CPU % at that rate.
"""

from __future__ import annotations

from functools import partial

import benchlib
from benchlib import Metric, pct

DEST = {"tickertape": "bench.lat", "nats": "bench.lat", "redis": "bench:lat"}

METRICS = [
    Metric("p50", "p50 µs", "{:,.0f}", "lower"),
    Metric("p99", "p99 µs", "{:,.0f}", "lower", spread=True),
    Metric("p999", "p99.9 µs", "{:,.0f}", "lower"),
    Metric("max", "max µs", "{:,.0f}", "lower"),
    Metric("rate", "achieved msg/s", "{:,.0f}"),
    Metric("cpu_pct", "srv CPU %", "{:.0f}", "lower"),
    Metric("client_pct", "client CPU %", "{:.0f}", "lower", ratio=False),
]


def figures(r: dict, lat_ns, cpu: float) -> dict:
    """Percentiles (µs) of the latencies, the achieved rate and the CPU shares of one run."""
    lat = sorted(lat_ns)
    out = {"samples": len(lat)}
    if lat:
        out.update(p50=pct(lat, 0.50), p99=pct(lat, 0.99), p999=pct(lat, 0.999), max=lat[-1] / 1e3)
    out["rate"] = r["acked"] / r["pub_seconds"] if r["pub_seconds"] else None
    out["cpu_pct"] = cpu / r["seconds"] * 100 if r["seconds"] else None
    out["client_pct"] = r["client_cpu"] / r["seconds"] * 100 if r["seconds"] else None
    return out


def roundtrip_rep(args, peer, v, rep) -> dict:
    """--roundtrip: one message in flight; latency = send -> the ack that covers it."""
    n = args.count
    r, cpu = benchlib.timed_load(
        peer,
        args,
        n=n,
        pub_dest=DEST[peer.kind],
        window=1,
        timeout=args.timeout or 120,
        tag=f"r{rep}",
        ack_latency=True,
    )
    out = figures(r, r.get("ack_latency_ns", [])[args.skip :], cpu)
    return benchlib.judged(out, benchlib.load_problems(r, args.timeout or 120, r["acked"], n))


def one_rep(args, peer, v, rep) -> dict:
    proto = peer.kind
    dest = DEST[proto]
    subs = benchlib.subscriber_dests(peer, v, dest, 1, "lat")
    n = int(args.rate * args.seconds)
    r, cpu = benchlib.timed_load(
        peer,
        args,
        n=n,
        pub_dest=dest,
        sub_dests=subs,
        rate=args.rate,
        warmup_msgs=int(args.rate * args.warmup),
        timeout=args.timeout or args.seconds + 60,
        tag=f"l{rep}",
        redis_count=1000,
    )
    out = figures(r, r["latency_ns"], cpu)
    broken = benchlib.load_problems(r, args.timeout or args.seconds + 60, r["received"], n)
    slow = []
    if out["rate"] and out["rate"] < 0.95 * args.rate:
        slow.append(f"could not sustain {args.rate:.0f} msg/s (achieved {out['rate']:.0f})")
    # an unsustained rate is a result (latencies show the queueing); a broken run is not
    return benchlib.judged(out, broken + slow, valid=not broken)


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--rate", type=float, default=5000.0, help="messages per second, paced")
    p.add_argument("--seconds", type=float, default=10.0, help="publishing time per repetition")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of messages not counted")
    p.add_argument(
        "--roundtrip",
        action="store_true",
        help="single-message round trip instead: one publish in flight, time from its send "
        "to its persisted ack (Redis: the XADD reply; JetStream: the PubAck); no subscriber",
    )
    p.add_argument("--count", type=int, default=3000, help="--roundtrip: messages per rep")
    p.add_argument("--skip", type=int, default=200, help="--roundtrip: first N not counted")
    benchlib.common_args(p)
    benchlib.nats_sub_arg(p)
    p.set_defaults(timeout=0.0)
    args = p.parse_args()
    if args.quick:
        args.seconds, args.warmup, args.reps = min(args.seconds, 3.0), 0.5, 1
        args.count = min(args.count, 1000)
    if args.roundtrip:
        roundtrip_main(args)
        return
    names, skipped = benchlib.peers_to_run(args.peers)
    variants = benchlib.variants_for(names, args.nats_sub)
    print(
        f"latency: {args.rate:.0f} msg/s for {args.seconds}s ({args.warmup}s warm-up), "
        f"{args.reps} reps, peers: {', '.join(v.label for v in variants)}"
    )
    run = benchlib.run_rows(variants, args.reps, partial(one_rep, args), METRICS, False, skipped)
    notes = [
        (
            f"paced publisher at {args.rate:.0f} msg/s ({args.size} B bodies, 1 ms send tick, "
            f"persisted acks, window {args.window}) for {args.seconds:g} s, first "
            f"{args.warmup:g} s not counted; 1 subscriber in the same process; latency = "
            f"receive - send (perf_counter_ns); median of {args.reps} repetitions' percentiles"
        ),
        (
            "tickertape delivers after the fsync'd commit; jetstream (push) after storing "
            "(2.9: no fsync), jetstream-sync after an fsync per write; jetstream (core) at "
            "publish time; redis-always after the AOF fsync, redis-everysec after the write"
        ),
    ]
    title = f"Publish-to-delivery latency at {args.rate:.0f} msg/s (bench_latency)"
    benchlib.report("bench_latency", title, run, METRICS, notes, args.no_results)


def roundtrip_main(args) -> None:
    names, skipped = benchlib.peers_to_run(args.peers)
    variants = benchlib.variants_for(names)
    print(
        f"round trip: {args.count} publishes one at a time ({args.skip} not counted), "
        f"{args.reps} reps, peers: {', '.join(v.label for v in variants)}"
    )
    run = benchlib.run_rows(variants, args.reps, partial(roundtrip_rep, args), METRICS)
    run.skipped = skipped
    vs_redis = run.ratio("tickertape", "redis-always", "p50")
    extra = benchlib.targets_table([("p50 ÷ redis-always p50 ≤ 1", "×", vs_redis, 1 + 1e-9, "max")])
    benchlib.report(
        "bench_latency_roundtrip",
        "Single-message round trip, publish to persisted ack (bench_latency --roundtrip)",
        run,
        METRICS,
        [
            (
                f"one publisher, one message in flight ({args.size} B bodies), {args.count} "
                f"messages per repetition, first {args.skip} not counted; latency = ack "
                f"received - publish sent (perf_counter_ns); repetitions interleaved; median "
                f"of {args.reps} repetitions' percentiles"
            ),
            (
                "ack: tickertape `persisted` (fdatasync'd); redis-always the XADD reply after the "
                "AOF fsync; redis-everysec after the write; jetstream the PubAck (2.9: not "
                "fsync'd); jetstream-sync after an fsync"
            ),
        ],
        args.no_results,
        extra,
    )


if __name__ == "__main__":
    main()
