"""Fan-out: 1 publisher (persisted, window-bounded), 10 subscribers each receiving every message.

    ./run bench bench_fanout [--count 50000] [--subs 10] [--reps 3] [--peers ...] [--nats-sub push,core]

Subscribers by peer:
  tickertape        10 connections, each `subscribe` to the topic (delivery after the fsync'd
                    group commit)
  jetstream (push)  10 durable push consumers (ack none) on the stored subject: delivery from
                    the stream, after it is stored
  jetstream (core)  10 plain SUBs on the same stored subject: delivered at publish time, beside
                    the store (not from it)
  redis-*           10 connections looping XREAD COUNT 1000 BLOCK 2000 STREAMS key last-id

Per peer (median of repetitions, fresh server each; rep 1 of every peer, then rep 2, ...):
  deliveries/s      messages received by all subscribers / seconds from the first publish to
                    the last delivery
  pub msgs/s        publisher acks / seconds to the last ack
  srv CPU µs/deliv  server CPU over the run / deliveries
  srv CPU %, peak RSS MiB, client CPU % as in bench_publish. The client parses every delivery in
  one Python process: when client CPU % nears 100 the figure is a floor for the server.
"""

from __future__ import annotations

from functools import partial

import benchlib
from benchlib import Metric

DEST = {"tickertape": "bench.fan", "nats": "bench.fan", "redis": "bench:fan"}

METRICS = [
    Metric("deliv_s", "deliveries/s", spread=True),
    Metric("pub_s", "pub msgs/s"),
    Metric("cpu_us", "srv CPU µs/deliv", "{:.2f}", "lower"),
    Metric("cpu_pct", "srv CPU %", "{:.0f}", "lower"),
    Metric("peak_rss_mib", "peak RSS MiB", "{:.1f}", "lower"),
    Metric("client_pct", "client CPU %", "{:.0f}", "lower", ratio=False),
]


def one_rep(args, peer, v, rep) -> dict:
    subs = benchlib.subscriber_dests(peer, v, DEST[peer.kind], args.subs, "fan")
    r, cpu = benchlib.timed_load(
        peer, args, n=args.count, pub_dest=DEST[peer.kind], sub_dests=subs, tag=f"f{rep}"
    )
    peak = peer.peak_rss_bytes()
    want = args.count * args.subs
    got = r["received"] or 1
    out = {
        "deliv_s": r["received"] / r["seconds"] if r["seconds"] else None,
        "pub_s": r["acked"] / r["pub_seconds"] if r["pub_seconds"] else None,
        "cpu_us": cpu / got * 1e6,
        "cpu_pct": cpu / r["seconds"] * 100 if r["seconds"] else None,
        "peak_rss_mib": peak / 2**20,
        "client_pct": r["client_cpu"] / r["seconds"] * 100 if r["seconds"] else None,
        "received": r["received"],
    }
    return benchlib.judged(out, benchlib.load_problems(r, args.timeout, r["received"], want))


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=50_000, help="messages published per repetition")
    p.add_argument("--subs", type=int, default=10, help="subscribers")
    benchlib.common_args(p)
    benchlib.nats_sub_arg(p)
    args = p.parse_args()
    if args.quick:
        args.count, args.reps = min(args.count, 5_000), 1
    names, skipped = benchlib.peers_to_run(args.peers)
    variants = benchlib.variants_for(names, args.nats_sub)
    print(
        f"fan-out: {args.count} msgs x {args.subs} subscribers, {args.reps} reps, peers: "
        f"{', '.join(v.label for v in variants)}"
    )
    # repetition-major (rep 1 of every peer, then rep 2, ...): a rep takes well under a second,
    # so a noisy spell on a shared machine would otherwise land on one peer's reps alone
    run = benchlib.run_rows(variants, args.reps, partial(one_rep, args), METRICS, skipped=skipped)
    notes = [
        (
            f"1 publisher ({args.count} messages of {args.size} B, persisted acks, window "
            f"{args.window}) and {args.subs} subscribers receiving all of them; all clients in "
            f"one load-generator process; median of {args.reps} repetitions (fresh server each), "
            "interleaved across peers"
        ),
        (
            "jetstream (push) delivers from the stream after storing; jetstream (core) delivers "
            "at publish time beside the store; tickertape delivers after the fsync'd commit; "
            "redis readers are woken after the command (and, with appendfsync always, after "
            "the fsync)"
        ),
    ]
    title = f"Fan-out 1 → {args.subs} (bench_fanout)"
    benchlib.report("bench_fanout", title, run, METRICS, notes, args.no_results)


if __name__ == "__main__":
    main()
