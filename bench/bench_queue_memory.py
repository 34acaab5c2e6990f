"""Queue memory per waiting message and queue-state rebuild time, with 1M messages waiting.

    ./run bench bench_queue_memory [--count 1000000] [--reps 3]

Tickertape only. A journal of `count` messages of 100 B on topic bench.wq is built with the
journal API (bench/journaldata.py, cached) and copied into each server's data dir. Per
repetition, two fresh servers on that same journal, one after the other:
  no queue     the journal only (TransactionLog recording `.*`)
  queue        the same plus <SOW><Queue> benchq over bench.wq: every message is waiting
               (nothing was ever delivered or acked), so the queue state is rebuilt from the
               whole journal at start
then the queue server is restarted (a clean stop, then start on the same data) and its rebuild
time read again.

Figures:
  RSS MiB             server VmRSS --settle seconds after it reports it listens
  peak RSS MiB        VmHWM at that time (the rebuild's high-water mark)
  B/msg               (RSS with the queue - RSS without) / count; also from the peaks
  rebuild s           from the server log: `queues: recovery scanned N records in S s` (first
                      start on the journal, and after the restart); N and the recovered waiting
                      count are checked against `count`
  start s             from launching the process to `listening on` (includes the rebuild)
Targets (issue 4): < 200 B per waiting message; rebuild < 5 s with 1M waiting.
"""

from __future__ import annotations

import re
import statistics
import time

import benchlib
import journaldata
import peers
from bench_queue import QUEUE, QUEUE_XML  # the queue bench_queue consumes, the same config
from bench_queue import TT_TOPIC as TOPIC

_SCANNED = re.compile(r"queues: recovery scanned (\d+) records in ([0-9.]+)s")
_WAITING = re.compile(r"queue (\S+): recovered (\d+) waiting messages")


def _started(peer, args, out: dict, which: str) -> None:
    """Start peer; into out its start time, and its RSS and peak --settle seconds after."""
    t0 = time.monotonic()
    peer.start(timeout=args.timeout)
    out[f"start_{which}_s"] = time.monotonic() - t0
    time.sleep(args.settle)
    out[f"rss_{which}"] = peer.rss_bytes()
    out[f"hwm_{which}"] = peer.peak_rss_bytes()


def _recovery(text: str) -> tuple[int, float, int] | None:
    """(records scanned, seconds, waiting recovered) from the last rebuild in the log text."""
    m = _SCANNED.findall(text)
    w = [int(c) for name, c in _WAITING.findall(text) if name == QUEUE]
    if not m:
        return None
    return int(m[-1][0]), float(m[-1][1]), (w[-1] if w else -1)


def one_rep(args, jdir: str) -> dict:
    out = {}
    base = peers.make_peer("tickertape")
    base.extra["journal_copy_from"] = jdir
    try:
        _started(base, args, out, "noq")
    finally:
        base.cleanup()
    q = peers.make_peer("tickertape")
    q.extra["journal_copy_from"] = jdir
    q.extra["config_xml"] = QUEUE_XML
    try:
        _started(q, args, out, "q")
        rec = _recovery(q.log_text())
        if rec is None:
            raise RuntimeError("no `queues: recovery scanned` line in the server log")
        out["scanned"], out["rebuild_s"], out["waiting"] = rec
        t0 = time.monotonic()
        q.restart(timeout=args.timeout)
        out["restart_s"] = time.monotonic() - t0
        time.sleep(args.settle)
        out["rss_q2"] = q.rss_bytes()
        rec2 = _recovery(q.log_text())  # the last rebuild line: the restart's
        if rec2 is None:
            raise RuntimeError("no rebuild line after the restart")
        out["scanned2"], out["rebuild2_s"], out["waiting2"] = rec2
    finally:
        q.cleanup()
    n = args.count
    out["b_per_msg"] = (out["rss_q"] - out["rss_noq"]) / n
    out["b_per_msg_peak"] = (out["hwm_q"] - out["hwm_noq"]) / n
    out["b_per_msg_restart"] = (out["rss_q2"] - out["rss_noq"]) / n
    problems = [
        f"{k}: the queue recovered {out[k]} waiting messages, expected {n}"
        for k in ("waiting", "waiting2")
        if out[k] != n
    ]
    return benchlib.judged(out, problems, valid=True)  # counted in the figures all the same


def shown(m: dict) -> str:
    return (
        f"RSS no queue {m['rss_noq'] / 2**20:.1f} MiB, queue {m['rss_q'] / 2**20:.1f} MiB -> "
        f"{m['b_per_msg']:.1f} B/msg (peak {m['b_per_msg_peak']:.1f}); rebuild "
        f"{m['rebuild_s']:.2f}s, after restart {m['rebuild2_s']:.2f}s ({m['scanned2']} records)"
    )


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=1_000_000, help="messages waiting in the queue")
    p.add_argument("--settle", type=float, default=1.0, help="seconds after start before RSS")
    benchlib.run_args(p, quick="100k messages, 1 repetition")
    args = p.parse_args()
    if args.quick:
        args.count, args.reps = min(args.count, 100_000), 1
    benchlib.tickertape_only()
    jdir, _meta = journaldata.cached_journal(args.count, TOPIC, args.size)
    reps, problems = benchlib.repeat("", args.reps, lambda _r: one_rep(args, jdir), show=shown)

    med = benchlib.medians(reps).get

    def rng(k, f):
        v = [m[k] for m in reps if m.get(k) is not None]
        if not v:
            return "—"
        s = f.format(statistics.median(v))
        return s + (f" ({f.format(min(v))}–{f.format(max(v))})" if len(v) > 1 else "")

    mib = "{:.1f}"
    lines = [
        "| server | RSS MiB | peak RSS MiB | start s | queue rebuild s |",
        "|---|---:|---:|---:|---:|",
        (
            f"| journal, no queue | {_mib(med('rss_noq'))} | "
            f"{_mib(med('hwm_noq'))} | {rng('start_noq_s', '{:.2f}')} | — |"
        ),
        (
            f"| + queue, {args.count:,} waiting (first start) | {_mib(med('rss_q'))} | "
            f"{_mib(med('hwm_q'))} | {rng('start_q_s', '{:.2f}')} | {rng('rebuild_s', '{:.2f}')} |"
        ),
        (
            f"| + queue, after a restart | {_mib(med('rss_q2'))} | — | "
            f"{rng('restart_s', '{:.2f}')} | {rng('rebuild2_s', '{:.2f}')} |"
        ),
        "",
        "| per waiting message | bytes |",
        "|---|---:|",
        f"| (RSS with queue − RSS without) / {args.count:,} | {rng('b_per_msg', mib)} |",
        f"| same after the restart | {rng('b_per_msg_restart', mib)} |",
        f"| (peak with queue − peak without) / {args.count:,} | {rng('b_per_msg_peak', mib)} |",
    ]
    targets = [
        ("memory per waiting message < 200 B", "B", med("b_per_msg"), 200, "max"),
        (
            f"queue rebuild on restart with {args.count:,} waiting < 5 s",
            "s",
            med("rebuild2_s"),
            5.0,
            "max",
        ),
    ]
    notes = [
        (
            f"{args.count:,} messages of {args.size} B on {TOPIC}, journal built with the journal "
            "API and copied into each server; per repetition a server without the queue, one "
            "with it (all messages waiting), and a restart of the latter; median of "
            f"{len(reps)} repetitions; RSS read {args.settle:g} s after `listening on`"
        ),
        "rebuild time is the server's own log line `queues: recovery scanned N records in S s`",
    ]
    body = "\n".join(lines) + "\n\nTargets (issue 4):\n\n" + benchlib.targets_table(targets)
    benchlib.write_section(
        "bench_queue_memory",
        "Queue memory and rebuild with 1M waiting (bench_queue_memory)",
        notes,
        body,
        problems,
        args.no_results,
    )


def _mib(v) -> str:
    return "—" if v is None else f"{v / 2**20:.1f}"


if __name__ == "__main__":
    main()
