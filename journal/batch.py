"""The archive / compaction job on Spark: the only module that imports pyspark.

    python -m journal.batch --request <JournalDirectory>/_maint/requests/<id>.json [--master local[*]]
    spark-submit --master spark://HOST:7077 --py-files tickertape.zip journal/batch.py --request ...

The driver reads a request (maintenance.make_request), plans groups of consecutive segments
(about `group_bytes` each, at least one per core), and runs one Spark task per group with
`mapInArrow`: the task (jobs.archive_group / jobs.compact_group) reads its segments through the
journal's own readers, writes its outputs under a staging directory and reads them back. Spark
schedules and retries; the tasks do the I/O with pyarrow and zstandard.

Archive: the driver verifies the staged Parquet per source segment (row count, sum of record
crc32s, first and last position as the tasks read them back from the files they wrote, equal to
what they counted while reading the segments; with verify="spark" the staged files are also read
with Spark SQL), then publishes: each file is renamed into `<archive root>/topic=../date=../`, stale
files of an earlier, interrupted run over the same positions are deleted, and
`<archive root>/_catalog/<id>.json` is written (temp + fsync + rename): **the catalog is the
commit point** of the archive. Then the result file tells the journal's owner to record the
segments as archived.

Compaction: the tasks' read-back verification (every block, every record crc, counts and crc
sums) is checked by the driver against the per-segment counts; the result file lists the staged
compacted segments, and the journal's owner applies them (maintenance.apply_result).

A crash or kill at any point before the result file leaves the journal as it was; staging is
wiped when the same request runs again, and the owner forgets requests that never report.
Exit status: 0 done (or nothing to do), 1 error, 2 verification failed (nothing published),
3 a segment changed since the request (make a new one).

Spark settings (local mode, the embedded default): local[*], UI and console progress off,
driver bound to 127.0.0.1, UTC session time zone, shuffle partitions 4, PYSPARK_PYTHON = this
interpreter. Under spark-submit (PYSPARK_GATEWAY_PORT set) the master and memory come from the
command line, never from here.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # run as a file (spark-submit journal/batch.py)
    _here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == _here:
        sys.path[0] = os.path.dirname(_here)  # journal/journal.py must not shadow the package
    else:
        sys.path.insert(0, os.path.dirname(_here))

import argparse
import json
import shutil
import time
from typing import TYPE_CHECKING, Any

from journal import jobs
from journal.job_progress import Progress
from journal.maintenance import plan_groups
from journal.manifest import read_json, result_path, staging_dir, write_json_atomic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_OK, EXIT_ERROR, EXIT_VERIFY, EXIT_STALE = 0, 1, 2, 3
Json = dict[str, Any]  # a request, a group's spec or metadata, a catalog, a summary
META_SCHEMA = "gid INT, meta STRING"


class VerificationFailed(RuntimeError):
    pass


def _under_spark_submit() -> bool:
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


def build_session(
    master: str | None = None,
    driver_memory: str | None = None,
    app_name: str = "tickertape-journal",
) -> SparkSession:
    """A SparkSession for the job. Locally: `master` (default local[*]) with the settings above;
    under spark-submit: whatever spark-submit configured."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    root = os.path.dirname(os.path.dirname(os.path.abspath(jobs.__file__)))
    pp = os.environ.get("PYTHONPATH", "")
    if root not in pp.split(os.pathsep):  # Python workers import journal.jobs from here
        os.environ["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app_name)
    if not _under_spark_submit():
        b = b.master(master or "local[*]")
        if driver_memory:
            b = b.config("spark.driver.memory", driver_memory)
        java_opts = os.environ.get(
            "TICKERTAPE_SPARK_JAVA_OPTIONS"
        )  # e.g. -XX:TieredStopAtLevel=1 (tests)
        if java_opts:
            b = b.config("spark.driver.extraJavaOptions", java_opts)
        if (master or "local").startswith("local"):
            b = b.config("spark.driver.bindAddress", "127.0.0.1").config(
                "spark.driver.host", "127.0.0.1"
            )
    b = (
        b.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.python.worker.reuse", "true")
    )
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# -- the job -------------------------------------------------------------------------------------


def _group_specs(req: Json, parallelism: int) -> list[Json]:
    segs = req["segments"]
    groups = plan_groups(segs, int(req.get("group_bytes") or 512 << 20), parallelism)
    specs = []
    if req["kind"] == "archive":
        stage = os.path.join(req["archive_root"], "_staging", req["id"])
    else:
        stage = staging_dir(req["journal"], req["id"])
    for g in groups:
        specs.append(
            {
                "kind": req["kind"],
                "segments": [segs[i] for i in g],
                "staging": stage,
                "tag": req["id"],
                "policy": req.get("policy") or {},
            }
        )
    return specs


def _run_tasks(spark: SparkSession, specs: list[Json], label: str, progress: bool) -> list[Json]:
    sc = spark.sparkContext
    rows = [(i, json.dumps(s)) for i, s in enumerate(specs)]
    rdd = sc.parallelize(rows, len(rows))
    df = spark.createDataFrame(rdd, "gid INT, spec STRING")
    out = df.mapInArrow(jobs.spark_task, META_SCHEMA)
    total_bytes = sum(e["file_bytes"] for s in specs for e in s["segments"])
    if progress:
        with Progress(sc, len(specs), total_bytes, label):
            got = out.collect()
    else:
        got = out.collect()
    metas: list[Json | None] = [None] * len(specs)
    for r in got:
        metas[r["gid"]] = json.loads(r["meta"])
    done = [m for m in metas if m is not None]
    if len(done) != len(metas):
        raise VerificationFailed("a task reported nothing")
    return done


def run_job(
    request: Json | str,
    spark: SparkSession | None = None,
    *,
    master: str | None = None,
    driver_memory: str | None = None,
    progress: bool = False,
    verify: str = "files",
) -> Json:
    """Run one request (a dict or the path of its file); write its result file; return a summary.

    spark: an existing session (tests, notebooks) that is used and never stopped; otherwise one
    is built (build_session) and stopped at the end. verify (archive): "files" checks what each
    task read back from its Parquet files (pyarrow, in the tasks) against the segments; "spark"
    also reads the staged archive with Spark SQL.
    """
    req = read_json(request) if isinstance(request, str) else request
    started = time.monotonic()
    if spark is not None:
        return _run(spark, req, started, 0.0, progress, verify)
    t = time.monotonic()
    own = build_session(master, driver_memory)
    try:
        return _run(own, req, started, time.monotonic() - t, progress, verify)
    finally:
        own.stop()


def _run(
    spark: SparkSession, req: Json, started: float, jvm_s: float, progress: bool, verify: str
) -> Json:
    kind = req["kind"]
    rid = req["id"]
    jdir = req["journal"]
    summary = {"id": rid, "kind": kind, "segments": len(req["segments"]), "jvm_s": round(jvm_s, 2)}
    if kind == "archive":
        done = _existing_catalog(req)
        if done is not None:  # the same request ran to its commit point already: report it again
            _write_result(
                jdir, rid, {"status": "ok", "kind": kind, "catalog": done["path"], "noop": True}
            )
            summary.update(
                status="ok",
                noop=True,
                records_in=done["cat"]["records"],
                records_out=done["cat"]["records"],
                bytes_in=done["cat"]["bytes_in"],
                bytes_out=done["cat"]["bytes_out"],
                seconds=0.0,
            )
            return summary
    specs = _group_specs(req, spark.sparkContext.defaultParallelism)
    stage = specs[0]["staging"]
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage, exist_ok=True)
    t0 = time.monotonic()
    try:
        metas = _run_tasks(spark, specs, f"{kind} {rid}", progress)
    except Exception as exc:
        msg = _task_error(exc)
        _write_result(jdir, rid, {"status": "failed", "kind": kind, "error": msg})
        shutil.rmtree(stage, ignore_errors=True)
        summary.update(status="failed", error=msg, seconds=round(time.monotonic() - started, 2))
        return summary
    tasks_s = time.monotonic() - t0
    damaged = [
        (s["path"], off, size)
        for m in metas
        for s in m.get("segments", ())
        for off, size in s.get("damaged", ())
    ]
    if damaged:  # skipped by the tasks (jobs.read_segment): reported, never archived as data
        summary["damaged"] = [{"file": p, "offset": o, "bytes": n} for p, o, n in damaged[:100]]
        summary["damaged_bytes"] = sum(n for _, _, n in damaged)
    try:
        if kind == "archive":
            extra = _verify_and_publish_archive(spark, req, metas, stage, verify)
        else:
            extra = _verify_compaction(req, metas)
    except VerificationFailed as exc:
        _write_result(
            jdir, rid, {"status": "failed", "kind": kind, "error": f"verification: {exc}"}
        )
        shutil.rmtree(stage, ignore_errors=True)
        summary.update(
            status="verification failed",
            error=str(exc),
            seconds=round(time.monotonic() - started, 2),
        )
        return summary
    work_s = time.monotonic() - t0
    summary.update(extra["summary"])
    summary.update(
        status="ok",
        seconds=round(time.monotonic() - started, 2),
        work_s=round(work_s, 2),
        tasks_s=round(tasks_s, 2),
        groups=len(specs),
    )
    _write_result(jdir, rid, {"status": "ok", "kind": kind, **extra["result"], "summary": summary})
    return summary


def _task_error(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "SegmentChanged" in line or ("journal.jobs." in line and "Error" in line):
            return line.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return (tail[-1] if tail else (lines[-1] if lines else repr(exc))).strip()[:2000]


def _write_result(jdir: str, rid: str, obj: Json) -> None:
    write_json_atomic(result_path(jdir, rid), {"id": rid, **obj})


# -- archive: verify with Spark SQL, then publish ------------------------------------------------


def _existing_catalog(req: Json) -> Json | None:
    path = os.path.join(req["archive_root"], "_catalog", req["id"] + ".json")
    try:
        return {"path": path, "cat": read_json(path)}
    except FileNotFoundError:
        return None


def _verify_and_publish_archive(
    spark: SparkSession, req: Json, metas: list[Json], stage: str, verify: str
) -> Json:
    expected = {}
    readback: dict = {}
    for m in metas:
        for s in m["segments"]:
            expected[s["base"]] = s
        for seg, r in m["readback"].items():
            readback[int(seg)] = r
    for e in req["segments"]:
        s = expected.get(e["base"])
        if s is None or s["end"] != e["end"]:
            raise VerificationFailed(f"segment {e['path']} was not archived by any task")
    # the files as read back by the tasks, per source segment, against the segments as read
    for base, s in expected.items():
        n, crc, lo, hi = readback.get(base, (0, 0, None, None))
        if (n, crc) != (s["records"], s["crc_sum"]) or (n and (lo, hi) != (s["first"], s["last"])):
            raise VerificationFailed(
                f"segment {s['path']}: the archive reads back {n} records (crc sum {crc}, positions "
                f"[{lo}, {hi}]), the segment holds {s['records']} ({s['crc_sum']}, [{s['first']}, {s['last']}])"
            )
    files = [f for m in metas for f in m["files"]]
    if verify == "spark":
        _verify_with_spark_sql(spark, stage, files, expected)
    return _publish_archive(req, metas, stage, files, expected)


def _verify_with_spark_sql(
    spark: SparkSession, stage: str, files: list[Json], expected: dict[int, Json]
) -> None:
    """The same check through Spark's own Parquet reader (--verify spark; slower)."""
    from pyspark.sql import functions as F

    if files:
        df = (
            spark.read.schema(jobs.SPARK_SCHEMA)
            .option("basePath", stage)
            .parquet(*[os.path.join(stage, f["path"]) for f in files])
        )
        got = {
            r["segment"]: r
            for r in df.groupBy("segment")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum("record_crc").alias("crc"),
                F.min("position").alias("lo"),
                F.max("position").alias("hi"),
            )
            .collect()
        }
    else:
        got = {}
    for base, s in expected.items():
        r = got.get(base)
        n, crc = (r["n"], int(r["crc"])) if r is not None else (0, 0)
        if n != s["records"] or crc != s["crc_sum"]:
            raise VerificationFailed(
                f"segment {s['path']}: archive holds {n} records (crc sum {crc}), the segment {s['records']} ({s['crc_sum']})"
            )
        if r is not None and n and (r["lo"], r["hi"]) != (s["first"], s["last"]):
            raise VerificationFailed(
                f"segment {s['path']}: archive positions [{r['lo']}, {r['hi']}] "
                f"differ from the segment's [{s['first']}, {s['last']}]"
            )


def _publish_archive(
    req: Json, metas: list[Json], stage: str, files: list[Json], expected: dict[int, Json]
) -> dict:
    root = req["archive_root"]
    # publish: rename each file into place (deterministic names: a re-run rewrites the same ones)
    new_rel = set()
    for f in files:
        dst = os.path.join(root, f["path"])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(os.path.join(stage, f["path"]), dst)
        new_rel.add(f["path"])
    ranges = [(e["base"], e["end"]) for e in req["segments"]]
    _drop_stale_files(root, ranges, new_rel, req["id"])
    records = sum(s["records"] for s in expected.values())
    cat = {
        "id": req["id"],
        "created_us": int(time.time() * 1e6),
        "root": root,
        "records": records,
        "bytes_in": sum(m["bytes_in"] for m in metas),
        "bytes_out": sum(m["bytes_out"] for m in metas),
        "schema": jobs.SPARK_SCHEMA,
        "segments": sorted(expected.values(), key=lambda s: s["base"]),
        "files": sorted(files, key=lambda f: f["path"]),
    }
    cat_path = os.path.join(root, "_catalog", req["id"] + ".json")
    write_json_atomic(cat_path, cat)  # the commit point
    shutil.rmtree(stage, ignore_errors=True)
    return {
        "result": {"catalog": cat_path},
        "summary": {
            "records_in": records,
            "records_out": records,
            "bytes_in": cat["bytes_in"],
            "bytes_out": cat["bytes_out"],
            "files": len(files),
            "catalog": cat_path,
        },
    }


def _drop_stale_files(root: str, ranges: list[tuple[int, int]], keep: set[str], rid: str) -> None:
    """Delete archive files over the same positions that this run did not write (left by an
    interrupted run grouped differently), and take them out of older catalogs."""
    stale = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        for fn in filenames:
            if not fn.endswith(".parquet") or fn.startswith(("_", ".")):
                continue
            try:
                lo, hi = (int(x) for x in fn[: -len(".parquet")].split("-"))
            except ValueError:
                continue
            rel = os.path.relpath(os.path.join(dirpath, fn), root)
            if rel in keep:
                continue
            if any(lo < e and b < hi for b, e in ranges):
                stale.append(rel)
    if not stale:
        return
    for rel in stale:
        os.unlink(os.path.join(root, rel))
    gone = set(stale)
    cdir = os.path.join(root, "_catalog")
    for name in sorted(os.listdir(cdir)) if os.path.isdir(cdir) else ():
        if not name.endswith(".json") or name == rid + ".json":
            continue
        path = os.path.join(cdir, name)
        cat = read_json(path)
        if any(f["path"] in gone for f in cat.get("files", ())):
            cat["files"] = [f for f in cat["files"] if f["path"] not in gone]
            cat["segments"] = [
                s
                for s in cat["segments"]
                if not any(s["base"] < e and b < s["end"] for b, e in ranges)
            ]
            cat["superseded_by"] = rid
            write_json_atomic(path, cat)


# -- compaction ---------------------------------------------------------------------------------


def _verify_compaction(req: Json, metas: list[Json]) -> Json:
    seen = {}
    for m in metas:
        for s in m["segments"]:
            seen[s["base"]] = s
        if sum(s["kept"] for s in m["segments"]) != m["records_out"]:
            raise VerificationFailed(
                f"{m['file']}: {m['records_out']} records written, {sum(s['kept'] for s in m['segments'])} kept"
            )
    for e in req["segments"]:
        if e["base"] not in seen:
            raise VerificationFailed(f"segment {e['path']} was not compacted by any task")
    summary = {
        "records_in": sum(m["records_in"] for m in metas),
        "records_out": sum(m["records_out"] for m in metas),
        "bytes_in": sum(m["bytes_in"] for m in metas),
        "bytes_out": sum(m["bytes_out"] for m in metas),
        "files": len(metas),
    }
    return {"result": {"outputs": metas}, "summary": summary}


# -- command line ------------------------------------------------------------------------------


def format_summary(s: Json) -> str:
    if s.get("status") != "ok":
        return f"{s['kind']} {s['id']}: {s.get('status')}: {s.get('error', '')}"
    secs = s.get("work_s") or s.get("seconds") or 0.0
    rin, rout = s.get("records_in", 0), s.get("records_out", 0)
    bin_, bout = s.get("bytes_in", 0), s.get("bytes_out", 0)
    rate = f"{rin / secs:,.0f} rec/s, {bin_ / secs / 1e6:,.1f} MB/s" if secs else "-"
    pct = f" ({100.0 * bout / bin_:.1f}%)" if bin_ else ""
    kept = f"{rin:,} records" if rin == rout else f"{rin:,} -> {rout:,} records"
    noop = " (already committed: nothing done)" if s.get("noop") else ""
    return (
        f"{s['kind']} {s['id']}{noop}: {s['segments']} segments, {kept}, "
        f"{bin_ / 1e6:,.1f} MB in -> {bout / 1e6:,.1f} MB out{pct}, {secs:.1f}s ({rate}); "
        f"JVM start {s.get('jvm_s', 0):.1f}s, total {s.get('seconds', 0):.1f}s"
    )


def exit_code(summary: Json) -> int:
    st = summary.get("status")
    if st == "ok":
        return EXIT_OK
    if st == "verification failed":
        return EXIT_VERIFY
    if "SegmentChanged" in (summary.get("error") or "") or "changed since the request" in (
        summary.get("error") or ""
    ):
        return EXIT_STALE
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m journal.batch", description="Run one journal archive / compaction request"
    )
    p.add_argument(
        "--request",
        required=True,
        help="the request file (<JournalDirectory>/_maint/requests/<id>.json)",
    )
    p.add_argument(
        "--master", default=None, help="Spark master when not under spark-submit (default local[*])"
    )
    p.add_argument("--driver-memory", default="2g", help="driver heap in local mode (default 2g)")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument(
        "--verify",
        choices=("files", "spark"),
        default="files",
        help="archive: check the tasks' read-back (files, default) or also read it with Spark SQL (spark)",
    )
    args = p.parse_args(argv)
    summary = run_job(
        args.request,
        master=args.master,
        driver_memory=args.driver_memory,
        progress=args.progress,
        verify=args.verify,
    )
    print(json.dumps(summary) if args.json else format_summary(summary), flush=True)
    return exit_code(summary)


if __name__ == "__main__":
    sys.exit(main())
