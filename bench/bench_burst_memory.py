"""What a fast publisher's burst costs the server in memory (issue 23, finding 11).

    ./run bench bench_burst_memory [--count 20000] [--size 4096] [--window 20000] [--reps 3]
                                   [--limit 4MB ...] [--record]

Tickertape only. Per repetition and per `<ClientPublishMemoryLimit>` given (default: the
built-in default and 64MB, about what the server held before the bound), a fresh server with
a journal and no subscriber; one connection publishes `count` messages of `size` bytes with
`persisted` acks, keeping at most `window` unacknowledged (the default: all of them, sent as
fast as the socket takes them). A warm-up burst of 200 goes first.

Figures (medians):
  RssAnon before / after MiB   the server's private memory (/proc/PID/status) before the burst
                               and right after its last ack (not given back: glibc keeps it)
  grown MiB                    after - before
  MB/s                         payload rate of the burst
With --record the table replaces the bench_burst_memory section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import benchlib
import peers
from consumers import preload

TOPIC = "burst"


def one(limit: str | None, args: argparse.Namespace) -> dict:
    peer = peers.make_peer("tickertape")
    if limit:
        peer.extra["config_xml"] = f"<ClientPublishMemoryLimit>{limit}</ClientPublishMemoryLimit>\n"
    try:
        peer.start()
        preload(peer, TOPIC, 200, args.size, 200, args.timeout, "warm")
        time.sleep(0.5)
        before = peers.proc_status_kb(peer.pid, "RssAnon") * 1024
        seconds = preload(peer, TOPIC, args.count, args.size, args.window, args.timeout, "fast")
        after = peers.proc_status_kb(peer.pid, "RssAnon") * 1024
    finally:
        peer.cleanup()
    return {
        "before": before / 2**20,
        "after": after / 2**20,
        "grown": (after - before) / 2**20,
        "mbps": args.count * args.size / seconds / 1e6,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--window", type=int, default=None, help="default: --count (no window)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120.0, help="longest burst")
    p.add_argument("--limit", action="append", help="<ClientPublishMemoryLimit> values")
    p.add_argument("--record", action="store_true", help="write the table into RESULTS.md")
    args = p.parse_args()
    args.window = args.window or args.count
    limits: list[str | None] = list(args.limit or [None, "64MB"])
    rows = []
    for limit in limits:
        runs = [one(limit, args) for _ in range(args.reps)]
        med = benchlib.medians(runs)
        rows.append((limit or "4MB (default)", med, [r["grown"] for r in runs]))
    lines = [
        "## Memory a publish burst costs (bench_burst_memory)",
        "",
        f"One connection publishes {args.count:,} x {args.size} B (`persisted`, window "
        f"{args.window:,}), no subscriber; the server's RssAnon before and right after. Medians "
        f"of {args.reps}; {benchlib.machine().get('cpu', '')}.",
        "",
        "| `<ClientPublishMemoryLimit>` | RssAnon before MiB | after MiB | grown MiB (each run) | MB/s |",
        "|---|---|---|---|---|",
    ]
    for name, med, grown in rows:
        each = ", ".join(f"{g:.1f}" for g in grown)
        lines.append(
            f"| {name} | {med['before']:.1f} | {med['after']:.1f} | {med['grown']:.1f} ({each}) "
            f"| {med['mbps']:.0f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.record:
        benchlib.update_results("bench_burst_memory", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
