"""Locating a bookmark and a timestamp in a journal of 10M messages: in-process and end to end.

    ./run bench bench_locate [--count 10000000] [--lookups 2000] [--e2e 200] [--reps 3]

Tickertape only (the journal index, journal/index.py + Journal.locate / locate_time). The
journal is built with the journal API (bench/journaldata.py: `count` messages of 100 B, 4
publishers taking turns, receive times 10 µs apart), once: it is cached under
bench/.data/journals/ and reused by later runs while its format is the same (--rebuild forces).

In-process (per repetition, `lookups` random ones of each kind, after 50 unmeasured warm-ups):
  Journal.locate(pub, seq)     a random stored message's bookmark; the position it returns is
                               checked against the one the builder wrote
  Journal.locate_time(ts)      a random microsecond within the journal's time span; the
                               position of the first record after it is checked the same way
End to end (one server started on a copy of the journal, `e2e` random lookups of each kind):
  a fresh connection and logon (not timed), then the time from writing
  `subscribe {bm: "<pub>|<seq>|"}` (or `bm: <timestamp>`) to the first delivered message,
  whose body `seq` is checked; the connection is then closed (ending the replay).
Figures: median, p99 and max in µs over all repetitions' lookups. Target (issue 3): < 1 ms.
The journal is in the page cache (it was just built or read): these are warm lookups.
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import sys
import time

import benchlib
import journaldata
import peers
from loadgen import _U32, tickertape_frame

from journal.journal import Journal
from protocol.bookmarks import format_timestamp

TOPIC = "bench.locate"


def pct(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * len(s)))]


def in_process(args, jdir: str, meta: dict, rng: random.Random) -> dict:
    n = meta["n"]
    rec = meta["end_position"] // n  # every record has the same size
    j = Journal(jdir)
    out = {"bm": [], "ts": [], "bad": 0}
    clock = time.perf_counter_ns
    try:
        ts0, step = meta["ts0"], meta["ts_step_us"]
        for k in range(args.lookups + 50):
            i = rng.randrange(n)
            pid, seq, _ = journaldata.message_at(i, meta)
            t = clock()
            pos = j.locate(pid, seq)
            dt = clock() - t
            if pos != i * rec:
                out["bad"] += 1
            if k >= 50:
                out["bm"].append(dt / 1000)
        for k in range(args.lookups + 50):
            ts = ts0 + rng.randrange(n * step)
            t = clock()
            pos = j.locate_time(ts)
            dt = clock() - t
            first = (ts - ts0) // step + 1  # index of the first record with time > ts
            if pos != (first * rec if first < n else meta["end_position"]):
                out["bad"] += 1
            if k >= 50:
                out["ts"].append(dt / 1000)
    finally:
        j.close()
    return out


def _read_frame(s: socket.socket, buf: bytearray) -> bytes:
    while True:
        if len(buf) >= 4:
            ln = _U32.unpack_from(buf, 0)[0]
            if len(buf) >= 4 + ln:
                f = bytes(buf[4 : 4 + ln])
                del buf[: 4 + ln]
                return f
        data = s.recv(1 << 16)
        if not data:
            raise RuntimeError("server closed the connection")
        buf += data


def _first_message(port: int, bm: str, k: int, timeout: float) -> tuple[float, bytes]:
    """(µs from subscribe to the first `p` frame, that frame)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        s.sendall(
            tickertape_frame(
                {"c": "logon", "cid": "l", "client_name": f"bench-loc-{k}", "a": "processed"}
            )
        )
        h = _read_frame(s, buf)
        if b'"status":"failure"' in h:
            raise RuntimeError(f"logon failed: {h[:200]!r}")
        sub = tickertape_frame({"c": "subscribe", "t": TOPIC, "sub_id": "l", "bm": bm})
        t = time.perf_counter_ns()
        s.sendall(sub)
        while True:
            f = _read_frame(s, buf)
            if f.startswith(b'{"c":"p"'):
                return (time.perf_counter_ns() - t) / 1000, f
            if b'"status":"failure"' in f:
                raise RuntimeError(f"subscribe {bm} failed: {f[:200]!r}")
    finally:
        s.close()


def _seq_of(frame: bytes) -> int:
    i = frame.find(b'"seq":', frame.find(b"}{") + 1)
    return int(frame[i + 6 : frame.find(b",", i)])


def end_to_end(args, jdir: str, meta: dict, rng: random.Random) -> dict:
    n = meta["n"]
    ts0, step = meta["ts0"], meta["ts_step_us"]
    peer = peers.make_peer("tickertape")
    peer.extra["journal_copy_from"] = jdir
    out = {"bm": [], "ts": [], "bad": 0, "errors": []}
    try:
        t0 = time.monotonic()
        peer.start(timeout=args.timeout)
        out["start_s"] = time.monotonic() - t0
        time.sleep(0.5)
        deadline = time.monotonic() + args.timeout
        for k in range(args.e2e):
            if time.monotonic() > deadline:
                out["errors"].append(f"cut off after {args.timeout}s")
                break
            i = rng.randrange(n - 1)
            pid, seq, _ = journaldata.message_at(i, meta)
            us, f = _first_message(peer.port, f"{pid}|{seq}|", k, 10)
            if _seq_of(f) != i + 2:  # replay starts after the bookmark: message i+1
                out["bad"] += 1
            out["bm"].append(us)
        for k in range(args.e2e):
            if time.monotonic() > deadline:
                out["errors"].append(f"cut off after {args.timeout}s")
                break
            off = rng.randrange((n - 2) * step)
            ts = ts0 + off
            us, f = _first_message(peer.port, format_timestamp(ts), args.e2e + k, 10)
            first = -(-off // step)  # first record with time >= ts (0-based)
            if abs(_seq_of(f) - (first + 1)) > 1:
                out["bad"] += 1
            out["ts"].append(us)
        out["rss_mib"] = peer.rss_bytes() / 2**20
    finally:
        peer.cleanup()
    return out


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=10_000_000, help="messages in the journal")
    p.add_argument("--pubs", type=int, default=4, help="publishers taking turns")
    p.add_argument("--lookups", type=int, default=2000, help="in-process lookups per kind per rep")
    p.add_argument("--e2e", type=int, default=200, help="end-to-end lookups per kind (one server)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0: time-based)")
    p.add_argument("--rebuild", action="store_true", help="build the journal even if cached")
    benchlib.run_args(p, quick="1M messages, fewer lookups, 1 repetition")
    args = p.parse_args()
    if args.quick:
        args.count, args.lookups, args.e2e, args.reps = min(args.count, 1_000_000), 500, 50, 1
    ok, why = peers.available("tickertape")
    rng = random.Random(args.seed or time.time_ns())
    jdir, meta = journaldata.cached_journal(
        args.count, TOPIC, args.size, pubs=args.pubs, rebuild=args.rebuild
    )
    if meta["end_position"] % meta["n"]:
        sys.exit("journal records are not all the same size: the position checks need that")
    bm, ts, bad, per_rep = [], [], 0, []
    for r in range(args.reps):
        m = in_process(args, jdir, meta, rng)
        bm += m["bm"]
        ts += m["ts"]
        bad += m["bad"]
        per_rep.append((statistics.median(m["bm"]), statistics.median(m["ts"])))
        print(
            f"  in-process rep {r + 1}/{args.reps}: locate median "
            f"{per_rep[-1][0]:.1f} µs p99 {pct(m['bm'], 0.99):.1f}; locate_time median "
            f"{per_rep[-1][1]:.1f} µs p99 {pct(m['ts'], 0.99):.1f}; wrong positions {m['bad']}",
            flush=True,
        )
    e2e = None
    problems = []
    if bad:
        problems.append(f"in-process: {bad} lookups returned a position other than the expected")
    if ok and args.e2e > 0:
        try:
            e2e = end_to_end(args, jdir, meta, rng)
            print(
                f"  end to end: server start {e2e['start_s']:.1f}s; bookmark median "
                f"{statistics.median(e2e['bm']):.0f} µs; timestamp median "
                f"{statistics.median(e2e['ts']):.0f} µs; wrong first messages {e2e['bad']}",
                flush=True,
            )
            if e2e["bad"]:
                problems.append(f"end to end: {e2e['bad']} first messages were not the expected")
            problems += [f"end to end: {x}" for x in e2e["errors"]]
        except Exception as e:
            problems.append(f"end to end failed: {type(e).__name__}: {e}"[:300])
            print(f"  end to end FAILED: {e}", flush=True)
    elif not ok:
        problems.append(f"end to end skipped: tickertape not runnable ({why})")

    def row(label, vals):
        if not vals:
            return f"| {label} | — | — | — | — | 0 |"
        return (
            f"| {label} | {statistics.median(vals):,.1f} | {pct(vals, 0.99):,.1f} | "
            f"{max(vals):,.1f} | {statistics.fmean(vals):,.1f} | {len(vals):,} |"
        )

    lines = [
        "| lookup | median µs | p99 µs | max µs | mean µs | lookups |",
        "|---|---:|---:|---:|---:|---:|",
        row("Journal.locate(pub, seq), in-process", bm),
        row("Journal.locate_time(ts), in-process", ts),
    ]
    if e2e:
        lines += [
            row("subscribe with a bookmark → first message, end to end", e2e["bm"]),
            row("subscribe with a timestamp → first message, end to end", e2e["ts"]),
        ]
    targets = [
        (f"Journal.{name} {stat} < 1 ms", "µs", figure(vals), 1000, "max")
        for name, vals in (("locate", bm), ("locate_time", ts))
        for stat, figure in (("median", statistics.median), ("p99", lambda v: pct(v, 0.99)))
    ]
    if e2e and e2e["bm"] and e2e["ts"]:
        targets += [
            (f"end to end, {kind}: median < 1 ms", "µs", statistics.median(e2e[k]), 1000, "max")
            for kind, k in (("bookmark", "bm"), ("timestamp", "ts"))
        ]
    size_gib = (
        sum(os.path.getsize(os.path.join(jdir, f)) for f in os.listdir(jdir) if f.endswith(".seg"))
        / 2**30
    )
    notes = [
        (
            f"journal of {meta['n']:,} messages of {meta['size']} B ({size_gib:.2f} GiB of "
            f"segments), {meta['pubs']} publishers taking turns, built with the journal API in "
            f"{meta['build_seconds']} s (cached); warm page cache"
        ),
        (
            f"in-process: {args.reps} repetitions × {args.lookups} random lookups of each kind "
            "(pooled; per-repetition medians "
            + ", ".join(f"{a:.1f}/{b:.1f}" for a, b in per_rep)
            + " µs locate/locate_time); every returned position checked"
        ),
    ]
    if e2e:
        notes.append(
            f"end to end: one server on a copy of the journal (started in {e2e['start_s']:.1f} s, "
            f"RSS {e2e.get('rss_mib', 0):.0f} MiB after), {args.e2e} lookups of each kind, a "
            "fresh connection each; time from writing the subscribe to reading the first "
            "delivered message (the server locates, reads a block, sends), first message checked"
        )
    body = "\n".join(lines) + "\n\nTargets (issue 3):\n\n" + benchlib.targets_table(targets)
    benchlib.write_section(
        "bench_locate",
        "Locate a bookmark / a timestamp in 10M messages (bench_locate)",
        notes,
        body,
        problems,
        args.no_results,
    )


if __name__ == "__main__":
    main()
