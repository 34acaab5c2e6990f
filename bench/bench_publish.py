"""Persisted publish: one publisher, window-bounded, 100-byte JSON bodies, no subscribers.

    ./run bench bench_publish [--count 200000] [--reps 3] [--peers tickertape,jetstream,...]
                              [--per-send 1] [--sender c|python]

Per peer (each repetition on a freshly started server, median of the repetitions):
  msgs/s            acked messages / seconds from the first send to the last ack
  srv CPU µs/msg    server utime+stime over the run / messages (every thread of the server)
  srv CPU %         the same over the wall time (100 % = one core busy)
  peak RSS MiB      VmHWM of the server process at the end of the run
  disk B/msg        bytes allocated under the server's data dir after a clean stop / messages
                    (journal and its index / stream store / AOF; fixed overheads included: a
                    size at start would count space a server reserves ahead, e.g. Tickertape's
                    pre-zeroed runway, which a clean stop gives back)
  client CPU %      the load generator's own CPU over the wall time (near 100 %: client-bound)
  client CPU µs/msg the same per acked message
  frames/send       frames sent / send(2) calls (the C sender counts them; 1.0 at 1/send)
Tickertape peers are published to by bench/pubsend.c (--sender c, the default; compiled with
the machine's cc) so that writing one frame per send(2) measures the server, not a Python
sender's per-syscall cost; --sender python uses bench/loadgen.py as the other peers do.
After each run (outside the measures) the count the server stored is checked against the count
sent: Redis XLEN, JetStream stream info, Tickertape a bookmark replay from EPOCH to `completed`.
What "acked" means differs, and the table says so: Tickertape `persisted` = fdatasync'd;
JetStream (2.9, default) = written to the OS, fsync every 2 min; jetstream-sync = fsync'd;
Redis always = fsync'd before the reply; Redis everysec = written, fsync once a second.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from functools import partial

import benchlib
import loadgen
import pubsend
from benchlib import Metric
from nullsink import NullSink

DEST = {"tickertape": "bench.pub", "nats": "bench.pub", "redis": "bench:pub"}

METRICS = [
    Metric("msgs_s", "msgs/s", spread=True),
    Metric("cpu_us", "srv CPU µs/msg", "{:.2f}", "lower"),
    Metric("cpu_pct", "srv CPU %", "{:.0f}", "lower"),
    Metric("peak_rss_mib", "peak RSS MiB", "{:.1f}", "lower"),
    Metric("disk_b", "disk B/msg", "{:.1f}", "lower"),
    Metric("client_pct", "client CPU %", "{:.0f}", "lower", ratio=False),
    Metric("client_us", "client CPU µs/msg", "{:.2f}", "lower", ratio=False),
    Metric("frames_per_send", "frames/send", "{:.1f}", "lower", ratio=False),
]

ACK_MEANING = [
    (
        "ack meaning: tickertape `persisted` = fdatasync'd group commit; jetstream = nats-server 2.9 "
        "default, stored in the OS page cache (fsync every 2 min); jetstream-sync = "
        "`sync_interval: always` (fsync per write); redis-always = fsync before the reply; "
        "redis-everysec = written, fsync once a second"
    ),
]


def one_rep(args, peer, v, rep) -> dict:
    proto = peer.kind
    dest = DEST[proto]
    sender = pubsend.run if proto == "tickertape" and args.sender == "c" else None
    per_send = v.opts.get("per_send", 0)
    r, cpu = benchlib.timed_load(
        peer, args, sender, n=args.count, pub_dest=dest, per_send=per_send, tag=f"p{rep}"
    )
    peak = peer.peak_rss_bytes()
    if args.no_verify:
        stored = None
    elif proto == "tickertape":
        stored = peer.stored_count(dest, timeout=max(60.0, args.timeout))
    elif proto == "nats":
        stored = peer.stream_info().get("state", {}).get("messages")
    else:  # redis
        stored = peer.xlen(dest)
    peer.stop()
    disk = peer.data_bytes()
    n = r["acked"] or 1
    out = {
        "msgs_s": r["acked"] / r["pub_seconds"] if r["pub_seconds"] else None,
        "cpu_us": cpu / n * 1e6,
        "cpu_pct": cpu / r["pub_seconds"] * 100 if r["pub_seconds"] else None,
        "peak_rss_mib": peak / 2**20,
        "disk_b": disk / n,
        "client_pct": r["client_cpu"] / r["pub_seconds"] * 100 if r["pub_seconds"] else None,
        "client_us": r["client_cpu"] / n * 1e6,
        "frames_per_send": r["sent"] / r["sends"] if r.get("sends") else None,
        "acked": r["acked"],
    }
    problem = benchlib.load_problems(r, args.timeout, r["acked"], args.count)
    if stored is not None and stored != args.count:
        problem.append(f"server holds {stored} messages, expected {args.count}")
    return benchlib.judged(out, problem)


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=200_000, help="messages per repetition")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip counting what each server stored after the run (XLEN, stream "
        "info, Tickertape bookmark replay from EPOCH)",
    )
    p.add_argument(
        "--per-send",
        type=int,
        default=1,
        help="also run each Tickertape peer with at most this many frames per write (the main "
        "rows write the whole window at once); 0 skips those rows",
    )
    p.add_argument(
        "--sender",
        choices=("c", "python"),
        default="c",
        help="what publishes to the Tickertape peers: c = bench/pubsend.c, compiled with the "
        "machine's cc (falls back to python without a compiler); python = the asyncio load "
        "generator (bench/loadgen.py) that the other peers always use",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="repetition-major order (rep 1 of every peer, then rep 2, ...)",
    )
    benchlib.common_args(p)
    args = p.parse_args()
    if args.quick:
        args.count, args.reps = min(args.count, 20_000), 1
    names, skipped = benchlib.peers_to_run(args.peers)
    if args.sender == "c" and (why := pubsend.available()):
        print(f"C sender unavailable, Tickertape rows use the Python load generator: {why}")
        args.sender = "python"
    variants = benchlib.variants_for(names)
    if args.per_send:
        k = args.per_send
        variants += [
            benchlib.Variant(f"{v.label} ({k}/send)", v.peer, {"per_send": k})
            for v in list(variants)
            if v.peer in ("tickertape", "tickertape-base")
        ]
    print(
        f"persisted publish: {args.count} msgs of {args.size} B, window {args.window}, "
        f"{args.reps} reps, peers: {', '.join(v.label for v in variants)}"
    )
    run = benchlib.run_rows(variants, args.reps, partial(one_rep, args), METRICS, args.interleave)
    run.skipped = skipped
    notes = [
        (
            f"{args.count} messages of {args.size} B JSON per repetition, one publisher, "
            f"window {args.window} unacked, median of {args.reps} repetitions (fresh server each)"
        )
    ]
    if args.sender == "c":
        notes.append(
            "Tickertape rows: published by bench/pubsend.c (one C process, blocking socket, "
            "TCP_NODELAY; it reads the conflated persisted acks between sends without blocking "
            "every 64 sends, and blocks when the window is full); the other peers by the Python "
            "load generator (bench/loadgen.py), whose client CPU % shows it is not their limit "
            "at a window per send. `frames/send` = frames sent / send(2) calls the sender made"
        )
    ceiling = None
    if args.per_send:
        notes.append(
            f"`(N/send)` rows: the same run with at most {args.per_send} frames per write "
            "(the main rows write all the window allows at once, up to 1000 frames)"
        )
    floor = None
    if args.per_send and args.sender == "c":
        floor = null_floor(args)
        notes.append(
            "a reference for the (N/send) rows, measured after the run: the same C sender "
            "against bench/nullsink.py, a receiver that stores nothing (counts frames, one "
            "conflated persisted ack per read; no journal, no fsync), median of "
            f"{args.reps}: {floor[0]:,.0f} msgs/s at a window per send, {floor[1]:,.0f} at "
            f"{args.per_send} frame(s) per send, ratio {floor[1] / floor[0]:.2f}: what a "
            "receiver without storage work shows for this split; it acks every read, where the "
            "server acks per commit, so at one frame per send it can be slower than the server"
        )
    if args.per_send and args.sender == "python":
        frame = len(
            loadgen.build_publish_frames("tickertape", DEST["tickertape"], 1, args.size).buf
        )
        rate, cpu = ceiling = send_ceiling(frame, args.per_send)
        notes.append(
            f"the load generator's ceiling at {args.per_send} frame(s) per send, measured "
            f"after the run: a bare Python `sock.send` loop of {frame} B frames over loopback "
            f"into a process that drains in large reads, no server: {rate:,.0f} frames/s, "
            f"{cpu:.2f} µs of the sender's CPU per frame. Against a server that reads each "
            "frame as it comes, every send also pays the receiver's wake-up, so the (1/send) "
            "rows' client CPU is higher than this"
        )
    benchlib.report(
        "bench_publish",
        "Persisted publish (bench_publish)",
        run,
        METRICS,
        notes + ACK_MEANING,
        args.no_results,
        benchlib.targets_table(
            targets(dict(run.rows), args.per_send, ceiling and ceiling[0], floor)
        ),
    )


def null_floor(args) -> tuple[float, float]:
    """(msgs/s at a window per send, msgs/s at args.per_send frames per send): medians of the
    C sender against a receiver that stores nothing (bench/nullsink.py), alternating."""
    whole, split = [], []
    for _ in range(args.reps):
        for per_send, into in ((0, whole), (args.per_send, split)):
            sink = NullSink.start()
            try:
                r = pubsend.run(
                    "127.0.0.1",
                    sink.port,
                    n=args.count,
                    pub_dest=DEST["tickertape"],
                    body_size=args.size,
                    window=args.window,
                    per_send=per_send,
                    timeout=args.timeout,
                    tag="null",
                )
            finally:
                sink.stop()
            into.append(r["acked"] / r["pub_seconds"] if r["pub_seconds"] else 0.0)
    return statistics.median(whole), statistics.median(split)


def send_ceiling(frame_size: int, k: int, n: int = 200_000) -> tuple[float, float]:
    """The load generator's own limit at k frames per send: a bare Python loop of sock.send
    over loopback TCP into a child process that only drains, in large reads (no server, no
    protocol; a process, not a thread, so the two do not trade the GIL). Returns (frames/s,
    the sender's CPU µs per frame): the most a one-connection Python publisher making one
    syscall per k frames can send on this machine when the receiver is never the limit."""
    a = socket.socket()
    a.bind(("127.0.0.1", 0))
    a.listen(1)
    c = socket.create_connection(a.getsockname())
    s, _ = a.accept()
    chunk = b"x" * (frame_size * k)
    sends = n // k
    total = sends * len(chunk)
    pid = os.fork()
    if pid == 0:  # the drain: read until everything arrived, then say so with one byte
        try:
            c.close()
            got = 0
            while got < total:
                got += len(s.recv(1 << 18))
            s.send(b"!")
        finally:
            os._exit(0)
    s.close()
    cpu0, t0 = time.process_time(), time.perf_counter()
    send = c.send
    for _ in range(sends):
        send(chunk)
    cpu = time.process_time() - cpu0
    c.recv(1)
    wall = time.perf_counter() - t0
    os.waitpid(pid, 0)
    c.close()
    a.close()
    return sends * k / wall, cpu / (sends * k) * 1e6


def targets(
    by: dict[str, dict],
    per_send: int,
    ceiling: float | None = None,
    floor: tuple[float, float] | None = None,
) -> list:
    """Issue 15's publish targets, measured from this run's medians."""
    tt, js = by.get("tickertape") or {}, by.get("jetstream") or {}
    ratio = benchlib.ratio
    out = [
        (
            "throughput ÷ jetstream ≥ 1.2",
            "×",
            ratio(tt.get("msgs_s"), js.get("msgs_s")),
            1.2,
            "min",
        ),
        (
            "server CPU/msg ÷ jetstream < 0.6",
            "×",
            ratio(tt.get("cpu_us"), js.get("cpu_us")),
            0.6,
            "max",
        ),
    ]
    if per_send:
        one = (by.get(f"tickertape ({per_send}/send)") or {}).get("msgs_s")
        r = ratio(one, tt.get("msgs_s"))
        out.append(
            (
                f"{per_send} frame(s) per send ÷ whole window per send ≥ 0.9",
                "×",
                None if r is None else min(r, 1 / r),
                0.9,
                "min",
            )
        )
    if per_send and floor and floor[0]:
        out.append(
            (
                "the same ratio against a receiver that stores nothing (information)",
                "×",
                floor[1] / floor[0],
                0.0,
                "min",
            )
        )
    if per_send and ceiling:
        # what the server can be asked for when the sender, not the server, sets the pace
        out.append(
            (
                f"{per_send} frame(s) per send ÷ the load generator's send ceiling (information)",
                "×",
                ratio(one, ceiling),
                0.0,
                "min",
            )
        )
    return out


if __name__ == "__main__":
    main()
