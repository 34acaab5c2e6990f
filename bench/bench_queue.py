"""Queue consume-and-ack throughput: one consumer, at most `backlog` unacked, n messages waiting.

    ./run bench bench_queue [--count 100000] [--backlogs 1,10,100] [--reps 3] [--peers ...]

Per repetition a fresh server gets `count` messages of 100 B JSON (loadgen's pipelined
publisher, not measured), then one consumer takes and acks all of them (--consume fewer):
  tickertape          queue `benchq` over topic bench.wq (<SOW><Queue>, at-least-once,
                      MaxPerSubscriptionBacklog 1000); subscribe o=max_backlog=N; ONE sow_delete
                      with every bookmark of a read; the last asks for a `processed` ack (sent
                      once the ack events are durable: fdatasync'd group commit)
  jetstream (push)    work-queue stream WQ (wq.>), durable push consumer, ack explicit,
                      max_ack_pending = N; one +ACK per message (a work-queue stream requires
                      AckExplicit: no ack-all), all acks of a read in one write
  jetstream (pull)    same stream, durable pull consumer, max_ack_pending = N: pull N, ack the
                      N, pull again, acks and the next pull in one write
  redis-*             XGROUP on the stream; XREADGROUP COUNT N; one XACK with the batch's ids
                      pipelined with the next XREADGROUP
The clock runs from the subscribe (consumer create, first pull, first XREADGROUP) to the reply
to the last ack (Tickertape processed ack, JetStream AckSync reply, last XACK reply).

Per peer and backlog (median of repetitions, fresh server each):
  msgs/s, srv CPU µs/msg, srv CPU %, peak RSS MiB, client CPU % as in bench_publish;
  msgs/ack write = messages per write of acks (the batching the consumer got).
What an ack costs differs: tickertape writes queue events to its journal in the fsync'd group
commit; jetstream 2.9 removes the message from the work-queue stream (no fsync); redis-always
fsyncs the AOF (XREADGROUP and XACK are both logged) before replying, redis-everysec does not.
"""

from __future__ import annotations

import time
from functools import partial

import benchlib
import consumers
import peers
import queue_consumers
from benchlib import Metric, Variant

QUEUE = "benchq"
TT_TOPIC = "bench.wq"
NATS_STREAM = "WQ"
NATS_SUBJECT = "wq.jobs"
REDIS_KEY = "bench:wq"
REDIS_GROUP = "bench"
DEFAULT_PEERS = "tickertape,jetstream,redis-always,redis-everysec"

QUEUE_XML = f"""  <SOW>
    <Queue>
      <Name>{QUEUE}</Name>
      <UnderlyingTopic>{TT_TOPIC}</UnderlyingTopic>
      <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog>
    </Queue>
  </SOW>
"""

METRICS = [
    Metric("msgs_s", "msgs/s", spread=True),
    Metric("cpu_us", "srv CPU µs/msg", "{:.2f}", "lower"),
    Metric("cpu_pct", "srv CPU %", "{:.0f}", "lower"),
    Metric("peak_rss_mib", "peak RSS MiB", "{:.1f}", "lower"),
    Metric("per_write", "msgs/ack write", "{:.1f}", ratio=False),
    Metric("client_pct", "client CPU %", "{:.0f}", "lower", ratio=False),
]


def one_rep(args, peer, v, rep) -> dict:
    backlog = v.opts["backlog"]
    n = args.count
    want = min(args.consume or n, n)
    tag = f"q{rep}b{backlog}"
    if peer.kind == "nats":  # the work-queue stream, before the messages it takes
        peer.create_stream(NATS_STREAM, ["wq.>"], retention="workqueue")
    dest = {"tickertape": TT_TOPIC, "nats": NATS_SUBJECT, "redis": REDIS_KEY}[peer.kind]
    consumers.preload(peer, dest, n, args.size, args.load_window, args.timeout, tag)
    if peer.kind == "tickertape":
        factory = lambda: queue_consumers.TtQueue(f"bench-q-{tag}", QUEUE, backlog)
    elif peer.kind == "nats":
        pull = v.opts["nats"] == "pull"
        if pull:
            peer.create_durable(
                NATS_STREAM,
                "work",
                {
                    "deliver_policy": "all",
                    "ack_policy": "explicit",
                    "ack_wait": 30_000_000_000,
                    "max_ack_pending": backlog,
                    "max_waiting": 16,
                },
            )
        cls = queue_consumers.NatsQueuePull if pull else queue_consumers.NatsQueuePush
        factory = lambda: cls(NATS_STREAM, "work", NATS_SUBJECT, backlog, tag)
    else:
        r = peers.redis_command(
            peer.host, peer.port, "XGROUP", "CREATE", REDIS_KEY, REDIS_GROUP, "0"
        )
        if r != b"+OK":
            raise RuntimeError(f"XGROUP CREATE: {r!r}")
        factory = lambda: queue_consumers.RedisQueue(REDIS_KEY, REDIS_GROUP, backlog)
    time.sleep(0.3)
    conn, out, problem = consumers.measured(peer, factory, want, args.timeout)
    writes = conn.ack_writes  # every consumer counts its writes of acks
    out["per_write"] = out["received"] / writes if writes else None
    broken = bool(problem)
    if not broken and peer.kind == "nats":
        # acked messages leave a work-queue stream; acks are applied asynchronously
        left = None
        for _ in range(40):
            left = peer.stream_info(NATS_STREAM).get("state", {}).get("messages")
            if left == n - want:
                break
            time.sleep(0.05)
        if left != n - want:
            problem.append(f"stream still holds {left} messages, expected {n - want}")
    if not broken and peer.kind == "redis" and conn.acked_total != want:
        problem.append(f"XACK acknowledged {conn.acked_total} of {want}")
    return benchlib.judged(out, problem)


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=100_000, help="messages waiting at the start")
    p.add_argument(
        "--consume", type=int, default=0, help="messages to take and ack (default: all waiting)"
    )
    p.add_argument("--backlogs", default="1,10,100", help="consumer backlogs (max unacked)")
    p.add_argument(
        "--nats-consumer", default="push,pull", help="JetStream consumer kinds: push and/or pull"
    )
    p.add_argument("--load-window", type=int, default=5000, help="unacked publishes while loading")
    benchlib.common_args(p)
    p.set_defaults(peers=DEFAULT_PEERS)
    args = p.parse_args()
    if args.quick:
        args.count, args.reps = min(args.count, 10_000), 1
    backlogs = [int(x) for x in args.backlogs.split(",") if x.strip()]
    names, skipped = benchlib.peers_to_run(args.peers)
    kinds = [k.strip() for k in args.nats_consumer.split(",") if k.strip()]
    want = min(args.consume or args.count, args.count)
    print(
        f"queue: {args.count} waiting msgs of {args.size} B, {want} consumed and acked, backlogs "
        f"{backlogs}, {args.reps} reps, peers: {', '.join(names)}"
    )
    sections = []
    problems_all: dict[str, list[str]] = {}
    by_backlog: dict[int, dict] = {}
    for b in backlogs:
        variants = []
        for n in names:
            if peers.is_tickertape(n):
                variants.append(
                    Variant(n, n, {"backlog": b, "peer_extra": {"config_xml": QUEUE_XML}})
                )
            elif n.startswith("jetstream"):
                for k in kinds:
                    variants.append(Variant(f"{n} ({k})", n, {"backlog": b, "nats": k}))
            else:
                variants.append(Variant(n, n, {"backlog": b}))
        print(f"backlog {b}:", flush=True)
        run = benchlib.run_rows(variants, args.reps, partial(one_rep, args), METRICS)
        problems_all.update({f"backlog {b}, {label}": ps for label, ps in run.problems.items()})
        by_backlog[b] = dict(run.rows)
        figures, ratios = benchlib.table(run.rows, METRICS)
        sections.append(f"### backlog {b}\n\n{figures}\n\n{ratios}")

    def ms(b, label):
        return (by_backlog.get(b, {}).get(label) or {}).get("msgs_s")

    def best_js(b):
        vals = [
            m.get("msgs_s")
            for label, m in by_backlog.get(b, {}).items()
            if label.startswith("jetstream (") and m.get("msgs_s")
        ]
        return max(vals) if vals else None

    ratio = benchlib.ratio
    targets = [
        (
            f"backlog {b}: tickertape ÷ best jetstream ≥ {w:g}×",
            "×",
            ratio(ms(b, "tickertape"), best_js(b)),
            w,
            "min",
        )
        for b, w in ((100, 2.0), (1, 1.0))
    ]
    targets.insert(
        1,
        (
            "backlog 100: tickertape ≥ 100,000 msgs/s",
            "msgs/s",
            ms(100, "tickertape"),
            100_000,
            "min",
        ),
    )
    notes = [
        (
            f"{args.count} messages of {args.size} B waiting (loaded by pipelined publish, not "
            f"measured), one consumer takes and acks {want}; median of {args.reps} repetitions "
            "(interleaved across peers), fresh server each; the clock stops at the reply to the "
            "last ack"
        ),
        (
            "acks: tickertape one sow_delete per read (bookmark list), queue events in the "
            "fdatasync'd group commit; jetstream one +ACK per message (work-queue streams "
            "require explicit acks), all of a read in one write, no fsync (2.9); redis one XACK "
            "per batch, pipelined with the next XREADGROUP (AOF: always = fsync'd, everysec = not)"
        ),
        (
            "the targets compare tickertape with the best jetstream variant; peak RSS includes "
            "the loading of the waiting messages on the same server (for every peer)"
        ),
    ]
    extra = [f"skipped {s}" for s in skipped]
    extra += [f"{label}: {p}" for label, ps in problems_all.items() for p in ps]
    body = "\n\n".join(sections) + "\n\nTargets (issue 4):\n\n" + benchlib.targets_table(targets)
    benchlib.write_section(
        "bench_queue",
        "Queue consume-and-ack, one consumer (bench_queue)",
        notes,
        body,
        extra,
        args.no_results,
    )


if __name__ == "__main__":
    main()
