"""Journal archive and compaction on Spark (journal/batch.py): throughput and bytes on disk.

    ./run bench bench_archive                 # 5M records (generated once into bench/.data/archive-5000000)
    ./run bench bench_archive --records 500000 --reps 1

A journal of N records is written through the journal's own writer (JSON bodies of 60-400 bytes
like order / market-data messages with random ids, prices and free-text notes drawn from 2,000
random words, 20 topics with '/' in the names, 50 publishers, receive times spread over 3 days,
segments of --segment-size). Then, in one local Spark session (local[*], the
embedded default; JVM start measured apart and excluded from the rates):

- archive: every sealed record to Parquet (zstd), partitioned by topic and day, verified with
  Spark SQL and committed (catalog) - records/s and MB/s of journal bytes read;
- compress: compaction that drops nothing - records/s, MB/s, and compacted bytes / original bytes;
- compact: compaction with a 1-day retention over the 3 days, a queue over 2 topics with its
  floor at the middle of the journal, and each publisher's newest kept;
- replay: one thread reading every record back with Journal.read_raw (what the server's replay
  does), from the plain segments and from the compacted ones.

Each job is repeated --reps times on fresh output; the table shows the median and the range.
Results print only (bench/RESULTS.md is merged by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from journal import maintenance as jm
from journal.journal import Journal
from journal.record import KIND_MESSAGE, encode_record

DAY_US = 86_400_000_000
SYMS = [
    "ACME",
    "GLOBEX",
    "INITECH",
    "UMBRELLA",
    "HOOLI",
    "STARK",
    "WAYNE",
    "TYRELL",
    "CYBERDYNE",
    "SOYLENT",
]


def generate(directory: str, n: int, segment_size: int) -> None:
    rnd = random.Random(42)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rnd.choices(letters, k=rnd.randrange(2, 10))) for _ in range(2000)]
    topics = (
        [f"orders/{r}" for r in ("us", "eu", "ap", "latam")]
        + [f"md/{s.lower()}" for s in SYMS]
        + [f"fills/desk{i}" for i in range(6)]
    )
    pubs = [int.from_bytes(os.urandom(8), "big") | 1 for _ in range(50)]
    t0 = int(time.time() * 1e6) - 3 * DAY_US
    step = 3 * DAY_US // n
    j = Journal(directory, segment_size=segment_size, durability="write")
    done = threading.Semaphore(0)
    batches = 0
    seqs = [0] * len(pubs)
    batch = 20_000
    for start in range(0, n, batch):
        data = bytearray()
        entries = []
        for k in range(start, min(n, start + batch)):
            p = rnd.randrange(len(pubs))
            seqs[p] += 1
            topic = topics[rnd.randrange(len(topics))]
            ts = t0 + k * step
            if topic.startswith("md/"):
                body = {
                    "sym": topic[3:].upper(),
                    "bid": round(100 + rnd.random() * 50, 2),
                    "ask": round(100.1 + rnd.random() * 50, 2),
                    "size": rnd.randrange(1, 5000),
                    "ts": ts,
                }
            else:
                body = {
                    "order_id": f"O-{k:09d}",
                    "sym": rnd.choice(SYMS),
                    "side": rnd.choice(("buy", "sell")),
                    "qty": rnd.randrange(1, 10_000),
                    "px": round(10 + rnd.random() * 990, 2),
                    "account": f"ACC{rnd.randrange(1000):04d}",
                    "tif": rnd.choice(("day", "gtc", "ioc")),
                    "tags": [rnd.choice(("algo", "dma", "care", "block"))] * rnd.randrange(0, 4),
                    "note": " ".join(rnd.choices(words, k=rnd.randrange(0, 25))),
                }
            b = json.dumps(body, separators=(",", ":")).encode()
            entries.append((pubs[p], seqs[p], ts, len(data)))
            data += encode_record(KIND_MESSAGE, pubs[p], seqs[p], ts, topic.encode(), b)
        j.submit(bytes(data), entries, lambda pos, err: done.release())
        batches += 1
    for _ in range(batches):
        done.acquire()
    # seal everything written: one more record opens a new segment
    j.segment_size = 1
    tail = encode_record(KIND_MESSAGE, pubs[0], seqs[0] + 1, t0 + n * step, b"orders/us", b"{}")
    j.submit(tail, [(pubs[0], seqs[0] + 1, t0 + n * step, 0)], lambda pos, err: done.release())
    done.acquire()
    j.close()


def median_range(xs):
    return (
        f"{statistics.median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"
        if len(xs) > 1
        else f"{xs[0]:,.0f}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--segment-size", type=int, default=128 << 20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--data", default=os.path.join(HERE, ".data"))
    args = ap.parse_args()

    src = os.path.join(args.data, f"archive-{args.records}-{args.segment_size}")
    if not os.path.exists(os.path.join(src, "ready")):
        shutil.rmtree(src, ignore_errors=True)
        t = time.monotonic()
        generate(src, args.records, args.segment_size)
        open(os.path.join(src, "ready"), "w").close()
        print(f"generated {args.records:,} records in {time.monotonic() - t:.1f}s into {src}")
    work = os.path.join(args.data, "archive-work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    from journal.batch import build_session, run_job

    t = time.monotonic()
    spark = build_session(args.master, args.driver_memory)
    jvm_s = time.monotonic() - t
    rows = []
    j = Journal(src, segment_size=args.segment_size, exclusive=True)
    sealed = j.sealed_segments()
    bytes_in = sum(s.file_bytes for s in sealed)
    nrec = args.records
    print(
        f"journal: {len(sealed)} sealed segments, {bytes_in / 1e6:,.1f} MB, {nrec:,} records; "
        f"Spark {spark.version}, {args.master}, JVM + session start {jvm_s:.1f}s (not in the rates)"
    )

    def job(kind, label, slug, **kw):
        rates, mbs, outs, kept, secs = [], [], [], [], []
        for rep in range(args.reps):
            req = jm.make_request(j, kind, req_id=f"bench-{slug}-{rep}", **kw)
            jm.write_request(src, req)
            s = run_job(req, spark)
            assert s["status"] == "ok", s
            secs.append(s["work_s"])
            rates.append(s["records_in"] / s["work_s"])
            mbs.append(s["bytes_in"] / s["work_s"] / 1e6)
            outs.append(s["bytes_out"])
            kept.append(s["records_out"])
            print(
                f"  {label} rep {rep + 1}: {s['work_s']:.1f}s, {rates[-1]:,.0f} rec/s, {mbs[-1]:,.1f} MB/s, "
                f"{s['bytes_out'] / 1e6:,.1f} MB out, {s['records_out']:,} records kept"
            )
            if kind == "compact":
                for o in json.load(open(jm.result_path(src, req["id"])))["outputs"]:
                    keep_path = os.path.join(work, f"{slug}-{o['file']}")
                    os.replace(o["staged"], keep_path) if rep == args.reps - 1 else os.remove(
                        o["staged"]
                    )
                shutil.rmtree(jm.staging_dir(src, req["id"]), ignore_errors=True)
            for p in (jm.result_path(src, req["id"]), jm.request_path(src, req["id"])):
                os.remove(p)
        rows.append(
            (
                label,
                median_range(secs),
                median_range(rates),
                median_range(mbs),
                f"{statistics.median(outs) / 1e6:,.1f}",
                f"{100 * statistics.median(outs) / bytes_in:.1f}%",
                f"{int(statistics.median(kept)):,}",
            )
        )

    try:
        # archive: a fresh archive root per repetition
        arates, amb, aout, asecs = [], [], [], []
        for rep in range(args.reps):
            root = os.path.join(work, f"archive-{rep}")
            req = jm.make_request(j, "archive", archive_root=root, req_id=f"bench-archive-{rep}")
            jm.write_request(src, req)
            s = run_job(req, spark)
            assert s["status"] == "ok", s
            asecs.append(s["work_s"])
            arates.append(s["records_in"] / s["work_s"])
            amb.append(s["bytes_in"] / s["work_s"] / 1e6)
            aout.append(s["bytes_out"])
            print(
                f"  archive rep {rep + 1}: {s['work_s']:.1f}s, {arates[-1]:,.0f} rec/s, {amb[-1]:,.1f} MB/s, "
                f"{s['bytes_out'] / 1e6:,.1f} MB of Parquet in {s['files']} files"
            )
            os.remove(jm.result_path(src, req["id"]))
            os.remove(jm.request_path(src, req["id"]))
        rows.append(
            (
                "archive (Parquet zstd)",
                median_range(asecs),
                median_range(arates),
                median_range(amb),
                f"{statistics.median(aout) / 1e6:,.1f}",
                f"{100 * statistics.median(aout) / bytes_in:.1f}%",
                f"{nrec:,}",
            )
        )
        job("compact", "compress (nothing dropped)", "compress")
        job(
            "compact",
            "compact (1d retention, queue, newest)",
            "compact",
            retention_s=86_400.0,
            queues=[("orders-q", "orders/(us|eu)", True)],
        )
    finally:
        spark.stop()

    # replay: plain vs compacted (the compress-only output, swapped into a copy of the journal)
    def replay(jr):
        t = time.monotonic()
        n = 0
        pos = jr.start_position
        while True:
            recs, nxt = jr.read_raw(pos, 256 * 1024)
            if not recs:
                nxt2 = jr.next_position(nxt)
                if nxt2 == pos or pos >= jr.end_position:
                    break
                pos = nxt2
                continue
            n += len(recs)
            pos = jr.next_position(nxt)
        return n, time.monotonic() - t

    n_plain, s_plain = replay(j)
    j.close()
    copy = os.path.join(work, "journal-compacted")
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("_maint", "LOCK"))
    jc = Journal(copy, segment_size=args.segment_size, exclusive=True)
    req = jm.make_request(jc, "compact", req_id="bench-replay")
    jm.write_request(copy, req)
    from journal.batch import run_job as rj

    spark2 = build_session(args.master, args.driver_memory)
    try:
        rj(req, spark2)
    finally:
        spark2.stop()
    ans = jm.apply_result(jc, req["id"])
    assert ans["status"] == "applied", ans
    n_comp, s_comp = replay(jc)
    disk_c = jc.disk_bytes()
    jc.close()
    assert n_comp == n_plain

    print()
    print(
        f"## Journal archive and compaction ({nrec:,} records, {bytes_in / 1e6:,.0f} MB in {len(sealed)} segments, "
        f"{args.master}, 2 cores)"
    )
    print()
    print("| job | seconds | records/s | MB/s (journal bytes) | MB out | out / in | records kept |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print(
        f"JVM and session start: {jvm_s:.1f}s (excluded above). Bytes on disk: journal {bytes_in / 1e6:,.1f} MB "
        f"-> compacted journal {disk_c / 1e6:,.1f} MB ({100 * disk_c / bytes_in:.1f}%, nothing dropped)."
    )
    print(
        f"Replay with Journal.read_raw, one thread: plain {n_plain / s_plain:,.0f} rec/s ({s_plain:.1f}s), "
        f"compacted {n_comp / s_comp:,.0f} rec/s ({s_comp:.1f}s)."
    )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
