"""The archive / compaction job on Spark: its driver. With spark_env.py, the only module that
imports pyspark.

    tickertape archive|compact --config F [--master spark://HOST:7077]    (server/maintenance_cli.py)
    python -m journal.spark.batch --request <JournalDirectory>/_maint/requests/<id>.json [--master M]
    spark-submit --master spark://HOST:7077 <this file> --request ...      (docs/batch.md)

The driver reads a request (maintenance.make_request), plans groups of consecutive segments
(about `group_bytes` each, at least one per core), and runs one Spark task per group with
`mapInArrow`: the task (jobs.archive_group / jobs.compact_group, entered through
job_code.spark_task) reads its segments through the journal's own readers, writes its outputs
under a staging directory and reads them back. Spark schedules and retries; the tasks do the
I/O with pyarrow and zstandard. On a master that is not local the driver first ships the job's
code to the executors and checks their Python (spark_env.ship_code / check_executors): the
executors need pyarrow, numpy and zstandard, not Tickertape.

Archive: the driver verifies the staged Parquet per source segment (job_commit.verify_archive;
with verify="spark" the staged files are also read with Spark SQL), then publishes: each file is
renamed into `<archive root>/topic=../date=../`, stale files of an earlier, interrupted run over
the same positions are deleted, and `<archive root>/_catalog/<id>.json` is written (temp + fsync
+ rename): **the catalog is the commit point** of the archive. Then the result file tells the
journal's owner to record the archived positions.

Compaction: the tasks' read-back verification (every block, every record crc, counts and crc
sums) is checked by the driver against the per-segment counts; the result file lists the staged
compacted segments, and the journal's owner applies them (maintenance_apply.apply_result).

A crash or kill at any point before the result file leaves the journal as it was; staging is
wiped when the same request runs again, and the owner forgets requests that never report.
Exit status: 0 done (or nothing to do), 1 error, 2 verification failed (nothing published),
3 a segment changed since the request (make a new one), 5 the executors cannot run the job.
"""

from __future__ import annotations

import os
import sys

if (
    __name__ == "__main__" and not __package__
):  # run as a file (spark-submit journal/spark/batch.py)
    _here = os.path.dirname(os.path.abspath(__file__))
    _root = os.path.dirname(os.path.dirname(_here))  # the directory that holds `journal`
    if sys.path and os.path.abspath(sys.path[0] or ".") == _here:
        sys.path[0] = _root  # this directory's modules must not shadow packages of that name
    else:
        sys.path.insert(0, _root)

import argparse
import atexit
import contextlib
import functools
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from journal.maintenance import plan_groups
from journal.manifest import maint_dir, read_json, result_path, staging_dir, write_json_atomic
from journal.spark import job_code, jobs
from journal.spark.job_commit import (
    VerificationFailed,
    existing_catalog,
    publish_archive,
    verify_archive,
    verify_compaction,
)
from journal.spark.job_progress import Progress
from journal.spark.spark_env import (
    ExecutorMismatch,
    build_session,
    check_executors,
    is_local,
    ship_code,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["VerificationFailed", "build_session", "main", "run_in_process", "run_job"]

EXIT_OK, EXIT_ERROR, EXIT_VERIFY, EXIT_STALE, EXIT_EXECUTORS = 0, 1, 2, 3, 5
Json = dict[str, Any]  # a request, a group's spec or metadata, a catalog, a summary
META_SCHEMA = "gid INT, meta STRING"
Runner = Callable[[list[Json], str], list[Json]]  # (group specs, label) -> one metadata per group


# -- the job -------------------------------------------------------------------------------------


def _group_specs(req: Json, parallelism: int) -> list[Json]:
    segs = req["segments"]
    groups = plan_groups(segs, int(req.get("group_bytes") or 512 << 20), parallelism)
    if req["kind"] == "archive":
        stage = os.path.join(req["archive_root"], "_staging", req["id"])
    else:
        stage = staging_dir(req["journal"], req["id"])
    return [
        {
            "kind": req["kind"],
            "segments": [segs[i] for i in g],
            "staging": stage,
            "tag": req["id"],
            "policy": req.get("policy") or {},
        }
        for g in groups
    ]


def _run_tasks(spark: SparkSession, specs: list[Json], label: str, progress: bool) -> list[Json]:
    sc = spark.sparkContext
    rows = [(i, json.dumps(s)) for i, s in enumerate(specs)]
    rdd = sc.parallelize(rows, len(rows))
    df = spark.createDataFrame(rdd, "gid INT, spec STRING")
    out = df.mapInArrow(job_code.spark_task, META_SCHEMA)
    total_bytes = sum(e["file_bytes"] for s in specs for e in s["segments"])
    with Progress(sc, len(specs), total_bytes, label) if progress else contextlib.nullcontext():
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
    conf: dict[str, str] | None = None,
    executor_python: str | None = None,
    progress: bool = False,
    verify: str = "files",
    quiet: bool = False,
    log_path: str | None = None,
) -> Json:
    """Run one request (a dict or the path of its file); write its result file; return a summary.

    spark: an existing session (tests, notebooks) that is used and never stopped; otherwise one
    is built (spark_env.build_session with master, driver_memory, conf, executor_python, quiet,
    log_path) and stopped at the end. verify (archive): "files" checks what each task read back
    from its Parquet files (pyarrow, in the tasks) against the segments; "spark" also reads the
    staged archive with Spark SQL. On a master that is not local, the job's code is shipped and
    the executors checked first; the summary then lists them ("executors").
    """
    req = read_json(request) if isinstance(request, str) else request
    started = time.monotonic()
    if spark is not None:
        return _run_on(spark, req, started, 0.0, progress, verify)
    t = time.monotonic()
    try:
        own = build_session(
            master,
            driver_memory,
            conf=conf,
            python=executor_python,
            quiet=quiet,
            log_path=log_path,
        )
    except Exception as exc:  # a setting Spark refuses, a master it cannot reach, no Java ...
        msg = f"Spark did not start: {_start_error(exc)}"
        return _failed(req, _summary(req, time.monotonic() - t), started, msg)
    try:
        return _run_on(own, req, started, time.monotonic() - t, progress, verify)
    finally:
        own.stop()


def run_in_process(request: Json | str, parallelism: int = 1) -> Json:
    """The same job with its tasks run one after the other in this process, without Spark
    (tests, tiny journals): the same task functions, verification, commit and result file.
    parallelism: the least number of groups to plan (as Spark's cores would)."""
    req = read_json(request) if isinstance(request, str) else request
    return _run(
        req,
        time.monotonic(),
        0.0,
        lambda specs, _label: [jobs.run_group(s) for s in specs],
        parallelism=parallelism,
    )


def _run_on(
    spark: SparkSession, req: Json, started: float, jvm_s: float, progress: bool, verify: str
) -> Json:
    sc = spark.sparkContext
    executors = None
    if not is_local(sc.master):
        t = time.monotonic()
        try:
            executors = check_executors(sc, _shipped(sc))
        except ExecutorMismatch as exc:
            return _failed(req, _summary(req, jvm_s), started, f"ExecutorMismatch: {exc}")
        probe_s = time.monotonic() - t
        jvm_s += probe_s  # starting the executors is a fixed cost too, reported with the JVM's

    summary = _run(
        req,
        started,
        jvm_s,
        functools.partial(_run_tasks, spark, progress=progress),
        parallelism=sc.defaultParallelism,
        spark_verify=spark if verify == "spark" else None,
    )
    if executors is not None:
        summary["master"] = sc.master
        summary["executors"] = executors
        summary["executors_start_s"] = round(probe_s, 2)
    return summary


def _shipped(sc: Any) -> Json:
    """Ship the job's code to this context's executors once; its build note."""
    note = getattr(sc, "_tickertape_job", None)
    if note is None:
        workdir = tempfile.mkdtemp(prefix="tickertape-job-")
        atexit.register(shutil.rmtree, workdir, True)
        note = ship_code(sc, workdir)
        sc._tickertape_job = note
    return note


def _since(started: float) -> float:
    return round(time.monotonic() - started, 2)


def _summary(req: Json, jvm_s: float, **kw: Any) -> Json:
    return {
        "id": req["id"],
        "kind": req["kind"],
        "segments": len(req["segments"]),
        "jvm_s": round(jvm_s, 2),
        **kw,
    }


def _run(
    req: Json,
    started: float,
    jvm_s: float,
    runner: Runner,
    parallelism: int = 2,
    spark_verify: SparkSession | None = None,
) -> Json:
    kind = req["kind"]
    rid = req["id"]
    jdir = req["journal"]
    summary = _summary(req, jvm_s)
    if kind == "archive":
        done = existing_catalog(req)
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
    specs = _group_specs(req, parallelism)
    stage = specs[0]["staging"]
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage, exist_ok=True)
    t0 = time.monotonic()
    try:
        metas = runner(specs, f"{kind} {rid}")
    except Exception as exc:
        return _failed(req, summary, started, _task_error(exc), stage=stage)
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
            expected = verify_archive(req, metas)
            if spark_verify is not None:
                files = [f for m in metas for f in m["files"]]
                _verify_with_spark_sql(spark_verify, stage, files, expected)
            extra = publish_archive(req, metas, stage, expected)
        else:
            extra = verify_compaction(req, metas)
    except VerificationFailed as exc:
        return _failed(req, summary, started, str(exc), "verification failed", stage)
    work_s = time.monotonic() - t0
    summary.update(extra["summary"])
    summary.update(
        status="ok",
        seconds=_since(started),
        work_s=round(work_s, 2),
        tasks_s=round(tasks_s, 2),
        groups=len(specs),
    )
    _write_result(jdir, rid, {"status": "ok", "kind": kind, **extra["result"], "summary": summary})
    return summary


def _task_error(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if "SegmentChanged" in line or ("journal.spark.jobs." in line and "Error" in line):
            return line.strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return (tail[-1] if tail else (lines[-1] if lines else repr(exc))).strip()[:2000]


def _start_error(exc: BaseException) -> str:
    """The line of a failed start that says why (a Java exception's message, not py4j's frame)."""
    lines = [ln.strip().lstrip(": ") for ln in str(exc).splitlines() if ln.strip()]
    why = [
        ln
        for ln in lines
        if ("Exception" in ln or "Error" in ln) and not ln.startswith(("An error occurred", "at "))
    ]
    return (why[0] if why else lines[0] if lines else repr(exc))[:1000]


def _write_result(jdir: str, rid: str, obj: Json) -> None:
    write_json_atomic(result_path(jdir, rid), {"id": rid, **obj})


def _failed(
    req: Json, summary: Json, started: float, error: str, status: str = "failed", stage: str = ""
) -> Json:
    """Write the request's failed result, wipe `stage` (what the tasks wrote, if they ran);
    the summary, with `status` and why (the result says "verification: ..." for a failed
    verification)."""
    why = f"verification: {error}" if status == "verification failed" else error
    _write_result(
        req["journal"], req["id"], {"status": "failed", "kind": req["kind"], "error": why}
    )
    if stage:
        shutil.rmtree(stage, ignore_errors=True)
    summary.update(status=status, error=error, seconds=_since(started))
    return summary


# -- archive: the same check with Spark SQL -------------------------------------------------------


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
    err = summary.get("error") or ""
    if st == "ok":
        return EXIT_OK
    if st == "verification failed":
        return EXIT_VERIFY
    if "SegmentChanged" in err or "changed since the request" in err:
        return EXIT_STALE
    if err.startswith("ExecutorMismatch"):
        return EXIT_EXECUTORS
    return EXIT_ERROR


def add_spark_arguments(p: argparse.ArgumentParser, driver_memory: str = "2g") -> None:
    """The Spark options `python -m journal.spark.batch` and `tickertape archive|compact` share."""
    p.add_argument(
        "--master",
        default=None,
        help="Spark master, passed to Spark as is: local[*] (default), spark://HOST:7077, yarn, "
        "k8s://https://HOST:PORT (ignored under spark-submit, which has its own)",
    )
    p.add_argument(
        "--driver-memory",
        default=driver_memory,
        help=f"Spark driver heap (default {driver_memory}; in local mode the executors' too)",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit --conf takes it (repeat it); applied last",
    )
    p.add_argument(
        "--executor-python",
        metavar="PATH",
        help="the executors' Python (default: PYSPARK_PYTHON; in local mode this Python). It "
        "needs pyarrow, numpy and zstandard; the job ships its own code",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="let Spark's own log through to stderr (default: kept in a log file, shown on failure)",
    )


def spark_log_path(journal_dir: str, req_id: str) -> str:
    """Where a quiet job's Spark log goes (kept on failure, removed after success)."""
    return maint_dir(journal_dir, "logs", req_id + ".spark.log")


def main(argv: list[str] | None = None) -> int:
    """`python -m journal.spark.batch` (also the spark-submit entry point): run one request, print its
    summary, and apply its result when no process holds the journal (else its owner, the
    server, applies it within a second)."""
    from journal.maintenance_apply import apply_if_free
    from journal.spark.spark_env import parse_conf

    p = argparse.ArgumentParser(
        prog="python -m journal.spark.batch",
        description="Run one journal archive / compaction request",
    )
    p.add_argument(
        "--request",
        required=True,
        help="the request file (<JournalDirectory>/_maint/requests/<id>.json)",
    )
    add_spark_arguments(p)
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument(
        "--verify",
        choices=("files", "spark"),
        default="files",
        help="archive: check the tasks' read-back (files, default) or also read it with Spark SQL (spark)",
    )
    p.add_argument(
        "--no-apply",
        action="store_true",
        help="only write the result file; leave applying it to the journal's owner",
    )
    args = p.parse_args(argv)
    try:
        conf = parse_conf(args.conf)
        req = read_json(args.request)
    except (ValueError, OSError) as exc:
        print(f"journal.spark.batch: {exc}", file=sys.stderr)
        return EXIT_ERROR
    log_path = None if args.verbose else spark_log_path(req["journal"], req["id"])
    summary = run_job(
        req,
        master=args.master,
        driver_memory=args.driver_memory,
        conf=conf,
        executor_python=args.executor_python,
        progress=args.progress,
        verify=args.verify,
        quiet=not args.verbose,
        log_path=log_path,
    )
    answer = None if args.no_apply else apply_if_free(req["journal"], req["id"])
    if args.json:
        print(json.dumps({**summary, "applied": answer}), flush=True)
    else:
        print(format_summary(summary), flush=True)
        if answer is not None:
            print(f"journal: {answer.get('status')}: {answer.get('reason', '')}", flush=True)
    if summary.get("status") != "ok" and log_path and os.path.exists(log_path):
        print(f"Spark's log: {log_path}", file=sys.stderr)
    elif log_path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(log_path)
    code = exit_code(summary)
    if code == EXIT_OK and answer is not None and answer.get("status") not in ("applied", "noop"):
        return EXIT_VERIFY
    return code


if __name__ == "__main__":
    sys.exit(main())
