"""Journal archive and compaction on Spark (journal/spark/batch.py): throughput on a standalone cluster
against local[*] in the same run, and bytes on disk.

    ./run bench bench_archive                          # 5M records, local[*] and a standalone cluster
    ./run bench bench_archive --records 1000000 --reps 1
    ./run bench bench_archive --masters local[*]       # local mode only

A journal of N records is written through the journal's own writer (JSON bodies of 60-400 bytes
like order / market-data messages with random ids, prices and free-text notes drawn from 2,000
random words, 20 topics with '/' in the names, 50 publishers, receive times spread over 3 days,
segments of --segment-size), once, into bench/.data. Then, for each master, in a child process of
its own (so each has its own driver JVM):

- `local[*]`: the embedded default, the Python workers of this host;
- `standalone`: a Spark master and a worker on loopback started from the pyspark installation
  (tests/spark/standalone.py), one executor with every core of this machine, whose Python is a
  venv with only pyarrow, numpy and zstandard (no Tickertape: the job ships its code);

each runs the same jobs --reps times on fresh output:

- archive: every sealed record to Parquet (zstd), partitioned by topic and day, committed
  (catalog) - records/s and MB/s of journal bytes read;
- compress: compaction that drops nothing - compacted bytes / original bytes;
- compact: compaction with a 1-day retention over the 3 days, a queue over 2 topics, and each
  publisher's newest kept.

Fixed costs are reported apart and kept out of the rates: the driver JVM and session start, and
on the cluster the executors' start (the first job's executor launch, code shipping and the
probe of their Python). The local run also measures replay with Journal.read_raw from plain and
from compacted segments. The table shows medians (range over reps) and cluster / local ratios.
Results print only (bench/RESULTS.md is merged by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from journal import maintenance as jm
from journal import maintenance_apply as jma
from journal import manifest
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
JOBS = (
    ("archive", "archive (Parquet zstd)"),
    ("compress", "compress (nothing dropped)"),
    ("compact", "compact (1d retention, queue, newest)"),
)


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


def median_range(xs: list[float], fmt: str = "{:,.0f}") -> str:
    m = fmt.format(statistics.median(xs))
    return f"{m} ({fmt.format(min(xs))}-{fmt.format(max(xs))})" if len(xs) > 1 else m


# -- one master, in a child process -------------------------------------------------------------


def run_master(args: argparse.Namespace) -> dict:
    """Every job --reps times on one master; returns the measurements (JSON for the parent)."""
    from journal.spark.batch import _shipped, run_job
    from journal.spark.spark_env import build_session, check_executors, is_local

    src = args.src
    work = tempfile.mkdtemp(prefix="archive-work-", dir=args.data)
    conf = dict(kv.split("=", 1) for kv in args.conf)
    t = time.monotonic()
    spark = build_session(
        args.master,
        args.driver_memory,
        conf=conf,
        python=args.executor_python,
        quiet=True,
        log_path=os.path.join(work, "spark.log"),
    )
    out: dict = {"master": args.master, "jvm_s": time.monotonic() - t, "jobs": {}}
    sc = spark.sparkContext
    if not is_local(sc.master):
        t = time.monotonic()
        out["executors"] = check_executors(sc, _shipped(sc))
        out["executors_s"] = time.monotonic() - t
    j = Journal(src, segment_size=args.segment_size, exclusive=True)
    sealed = j.sealed_segments()
    out["segments"] = len(sealed)
    out["bytes_in"] = sum(s.file_bytes for s in sealed)
    try:
        for slug, _label in JOBS:
            runs = []
            for rep in range(args.reps):
                rid = f"bench-{slug}-{rep}-{os.getpid()}"
                if slug == "archive":
                    kw = {"archive_root": os.path.join(work, f"archive-{rep}")}
                    req = jm.make_request(j, "archive", req_id=rid, **kw)
                elif slug == "compress":
                    req = jm.make_request(j, "compact", req_id=rid)
                else:
                    req = jm.make_request(
                        j,
                        "compact",
                        req_id=rid,
                        retention_s=86_400.0,
                        queues=[("orders-q", "orders/(us|eu)", True)],
                    )
                jm.write_request(src, req)
                s = run_job(req, spark)
                assert s["status"] == "ok", s
                runs.append(
                    {
                        "s": s["work_s"],
                        "records": s["records_in"],
                        "kept": s["records_out"],
                        "bytes_out": s["bytes_out"],
                    }
                )
                print(
                    f"  {args.master} {slug} rep {rep + 1}: {s['work_s']:.1f}s, "
                    f"{s['records_in'] / s['work_s']:,.0f} rec/s, {s['bytes_out'] / 1e6:,.1f} MB out",
                    file=sys.stderr,
                    flush=True,
                )
                _clean(src, req)
            out["jobs"][slug] = runs
        if args.replay:
            out["replay"] = replay_compared(j, src, work, args.segment_size, spark)
    finally:
        spark.stop()
        j.close()
        shutil.rmtree(work, ignore_errors=True)
    return out


def _clean(src: str, req: dict) -> None:
    shutil.rmtree(manifest.staging_dir(src, req["id"]), ignore_errors=True)
    for p in (manifest.result_path(src, req["id"]), manifest.request_path(src, req["id"])):
        if os.path.exists(p):
            os.remove(p)


def _replay(jr: Journal) -> tuple[int, float]:
    t = time.monotonic()
    n = sum(len(b) for b in jr.raw_batches(max_bytes=256 * 1024))
    return n, time.monotonic() - t


def replay_compared(j: Journal, src: str, work: str, segment_size: int, spark) -> dict:
    """Replay rate from the plain segments, and from a copy of the journal compacted (nothing
    dropped) with the same session."""
    from journal.spark.batch import run_job

    n_plain, s_plain = _replay(j)
    copy = os.path.join(work, "journal-compacted")
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("_maint", "LOCK"))
    jc = Journal(copy, segment_size=segment_size, exclusive=True)
    try:
        req = jm.make_request(jc, "compact", req_id="bench-replay")
        jm.write_request(copy, req)
        assert run_job(req, spark)["status"] == "ok"
        ans = jma.apply_result(jc, req["id"])
        assert ans["status"] == "applied", ans
        n_comp, s_comp = _replay(jc)
    finally:
        jc.close()
    assert n_comp == n_plain
    return {"plain": n_plain / s_plain, "compacted": n_comp / s_comp}


# -- the parent: data, the cluster, one child per master, the table ------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--segment-size", type=int, default=128 << 20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--masters",
        default="local[*],standalone",
        help="comma-separated: local[*], local[N], standalone (a cluster started here), "
        "or a spark:// URL of a running one",
    )
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--executor-memory", default="2g")
    ap.add_argument("--data", default=os.path.join(HERE, ".data"))
    # the child's arguments
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--executor-python", help=argparse.SUPPRESS)
    ap.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--replay", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.master:  # a child: one master, JSON on stdout
        print(json.dumps(run_master(args)), flush=True)
        return 0

    os.makedirs(args.data, exist_ok=True)
    src = os.path.join(args.data, f"archive-{args.records}-{args.segment_size}")
    if not os.path.exists(os.path.join(src, "ready")):
        shutil.rmtree(src, ignore_errors=True)
        t = time.monotonic()
        generate(src, args.records, args.segment_size)
        open(os.path.join(src, "ready"), "w").close()
        print(f"generated {args.records:,} records in {time.monotonic() - t:.1f}s into {src}")
    results = []
    for m in [x.strip() for x in args.masters.split(",") if x.strip()]:
        results.append(_run_child(args, m, src, replay=not results))
    _table(args, results)
    return 0


def _run_child(args: argparse.Namespace, master: str, src: str, replay: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--src", src, "--data", args.data]
    cmd += ["--reps", str(args.reps), "--segment-size", str(args.segment_size)]
    cmd += ["--driver-memory", args.driver_memory]
    if replay:
        cmd.append("--replay")
    cluster = None
    env = dict(os.environ)
    label = master
    if master == "standalone":
        sys.path.insert(0, ROOT)
        from tests.spark.standalone import Cluster, make_executor_python, spark_env

        d = os.path.join(args.data, "spark-cluster")
        cluster = Cluster(d, cores=os.cpu_count() or 2)
        cluster.start(worker_memory=args.executor_memory)
        master = cluster.url
        label = f"standalone ({cluster.cores} cores)"
        cmd += ["--executor-python", make_executor_python(d)]
        cmd += ["--conf", f"spark.executor.memory={args.executor_memory}"]
        env = spark_env()
    try:
        r = subprocess.run(cmd + ["--master", master], stdout=subprocess.PIPE, env=env, text=True)
    finally:
        if cluster is not None:
            cluster.stop()
    if r.returncode != 0:
        raise SystemExit(f"the {master} run failed (status {r.returncode})")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["label"] = label
    return out


def _table(args: argparse.Namespace, results: list[dict]) -> None:
    base = results[0]
    bytes_in = base["bytes_in"]
    print()
    print(
        f"## Journal archive and compaction ({args.records:,} records, {bytes_in / 1e6:,.0f} MB in "
        f"{base['segments']} segments, {args.reps} rep(s), {os.cpu_count()} cores)"
    )
    print()
    head = (
        "| job | "
        + " | ".join(f"{r['label']}: s | rec/s | MB/s" for r in results)
        + (" | cluster / local |" if len(results) > 1 else " |")
    )
    print(head)
    print("|---|" + "---:|---:|---:|" * len(results) + ("---:|" if len(results) > 1 else ""))
    for slug, label in JOBS:
        cells = []
        medians = []
        for r in results:
            runs = r["jobs"][slug]
            secs = [x["s"] for x in runs]
            rates = [x["records"] / x["s"] for x in runs]
            mbs = [bytes_in / x["s"] / 1e6 for x in runs]
            cells.append(
                f"{median_range(secs, '{:.1f}')} | {median_range(rates)} | {median_range(mbs)}"
            )
            medians.append(statistics.median(secs))
        ratio = f" | {medians[1] / medians[0]:.2f}x time" if len(results) > 1 else ""
        print(f"| {label} | " + " | ".join(cells) + ratio + " |")
    print()
    for r in results:
        extra = ""
        if "executors_s" in r:
            accel = all(e["accelerated"] for e in r["executors"])
            extra = (
                f", executors' start and check {r['executors_s']:.1f}s "
                f"(record checks {'accelerated' if accel else 'in pure Python'})"
            )
        print(f"- {r['label']}: driver JVM and session start {r['jvm_s']:.1f}s{extra}")
    runs = base["jobs"]
    print(
        f"- output / input: archive {_pct(runs['archive'], bytes_in)}, compress "
        f"{_pct(runs['compress'], bytes_in)}, compact {_pct(runs['compact'], bytes_in)} "
        f"({int(statistics.median(x['kept'] for x in runs['compact'])):,} records kept)"
    )
    rp = base.get("replay")
    if rp:
        print(
            f"- replay with Journal.raw_batches, one thread: plain {rp['plain']:,.0f} rec/s, "
            f"compacted {rp['compacted']:,.0f} rec/s"
        )


def _pct(runs: list[dict], bytes_in: int) -> str:
    return f"{100 * statistics.median(x['bytes_out'] for x in runs) / bytes_in:.1f}%"


if __name__ == "__main__":
    sys.exit(main())
