"""`tickertape archive` and `tickertape compact`: run the journal job (journal/spark/batch.py) by hand.

    tickertape archive --config FILE [--older-than 1d] [--archive-dir DIR] [--master local[*]]
    tickertape compact --config FILE [--retention 7d] [--older-than 1h] [--recompact]
      Spark: [--master spark://HOST:7077 | yarn | k8s://...] [--conf K=V ...]
             [--executor-python PATH] [--driver-memory 2g] [--verbose]
      [--dry-run] [--write-request] [--json] [--quiet]

Who does what (journal/maintenance.py has the protocol):

1. The request. If no server has the journal open, this command opens it exclusively and
   writes the request itself. If a server runs (the journal's lock is held), it drops an
   *order* in `_maint/orders/` and the server answers with the request within a second or two.
2. The job runs here, in this process (a local Spark session, or --master: the job's code is
   shipped to the executors and their Python checked first), with a progress bar on stderr;
   Spark's own log goes to `_maint/logs/<id>.spark.log` (shown on failure, removed after
   success) unless --verbose. It writes the result file. With --write-request the command
   stops after the request and prints its path (and, on stderr, the spark-submit line that
   runs it).
3. The apply step runs on the journal's owner: this command if it can take the journal
   exclusively, otherwise the server, which picks the result up at its next maintenance tick and
   swaps its manifest without a restart. This command waits for the answer and prints a summary.

Defaults come from the configuration's <Actions>: the first archive-journal step's <Age> for
--older-than, the first compact-journal step's <Retention> for --retention (no retention: the
segments are only compressed, nothing is dropped).

Exit status: 0 done or nothing to do; 1 error; 2 verification failed or the result was rejected
(nothing changed); 3 a segment changed under the job (run again); 4 Spark or Java missing;
5 the executors cannot run the job (their Python lacks a runtime need, or runs other code);
141 stdout was closed early (`--dry-run | head`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - imported where used
    from config.model import Config, TransactionLog

ORDER_WAIT_S = 30.0
APPLY_WAIT_S = 120.0


def add_maintenance_commands(sub: argparse._SubParsersAction) -> None:
    from journal.spark.batch import add_spark_arguments

    for kind, helptext in (
        ("archive", "archive sealed journal segments to Parquet (Spark job)"),
        (
            "compact",
            "rewrite sealed journal segments compressed, dropping what retention allows (Spark job)",
        ),
    ):
        p = sub.add_parser(kind, help=helptext)
        p.add_argument(
            "--config",
            metavar="FILE",
            help="the server's XML configuration (default: the embedded one)",
        )
        p.add_argument(
            "--older-than",
            metavar="INTERVAL",
            help="only segments whose newest record is older than this (e.g. 1d)",
        )
        if kind == "archive":
            p.add_argument(
                "--archive-dir", metavar="DIR", help="override <JournalArchiveDirectory>"
            )
            p.add_argument(
                "--verify",
                choices=("files", "spark"),
                default="files",
                help="check the tasks' read-back of every Parquet file against the segments "
                "(files, default), or also read the archive with Spark SQL (spark)",
            )
        else:
            p.add_argument(
                "--retention",
                metavar="INTERVAL",
                help="keep everything newer than this (e.g. 7d); records older may be dropped",
            )
            p.add_argument(
                "--recompact", action="store_true", help="also rewrite segments compacted before"
            )
        add_spark_arguments(p)
        p.add_argument(
            "--dry-run", action="store_true", help="show the segments the job would take, and stop"
        )
        p.add_argument(
            "--write-request",
            action="store_true",
            help="write the request, print its path and stop (run it with spark-submit, "
            "docs/batch.md); nothing to do: nothing printed",
        )
        p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument(
            "--wait",
            type=float,
            default=APPLY_WAIT_S,
            metavar="SECONDS",
            help="how long to wait for a running server to apply the result",
        )
        p.set_defaults(run=lambda args, kind=kind: run(args, kind))


def _defaults(cfg: Config, kind: str) -> tuple[float | None, float | None]:
    age = retention = None
    for action in cfg.actions:
        for step in action.do:
            if kind == "archive" and step.name == "archive-journal" and age is None:
                age = step.age
            if kind == "compact" and step.name == "compact-journal" and retention is None:
                retention = step.retention
    return age, retention


def _err(msg: str) -> None:
    print(f"tickertape: {msg}", file=sys.stderr)


def run(args: argparse.Namespace, kind: str, spark: Any = None) -> int:
    """The command; `spark`: an existing SparkSession to run the job in (tests), else one is built.
    A reader that goes away (`--dry-run | head`) ends it quietly, with status 141 (SIGPIPE's)."""
    try:
        return _run(args, kind, spark)
    except BrokenPipeError:
        # later writes (and the flush at exit) go nowhere instead of raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _run(args: argparse.Namespace, kind: str, spark: Any) -> int:
    from config.errors import ConfigError
    from config.loader import default_config, load_config
    from journal.journal import Journal, JournalError, JournalLocked
    from journal.maintenance import MaintenanceError, make_request, write_request
    from journal.maintenance_apply import apply_result, pending_results
    from journal.spark.spark_env import parse_conf
    from protocol.patterns import is_pattern
    from protocol.units import parse_interval

    try:
        cfg = load_config(args.config) if args.config else default_config()
    except ConfigError as exc:
        _err(str(exc))
        return 2
    tl = cfg.transaction_log
    if tl is None:
        _err("the configuration has no <TransactionLog>: there is no journal to work on")
        return 2
    age, retention = _defaults(cfg, kind)
    try:
        if args.older_than:
            age = parse_interval(args.older_than)
        if kind == "compact" and args.retention:
            retention = parse_interval(args.retention)
        spark_conf = parse_conf(getattr(args, "conf", None))
    except ValueError as exc:
        _err(str(exc))
        return 2
    archive_root = getattr(args, "archive_dir", None) or tl.archive_directory
    if kind == "archive" and not archive_root:
        _err("archive needs <JournalArchiveDirectory> in <TransactionLog> (or --archive-dir DIR)")
        return 2
    jdir = tl.journal_directory
    queues = [(q.name, q.underlying_topic, is_pattern(q.underlying_topic)) for q in cfg.queues]
    opts: dict[str, Any] = {
        "older_than_s": age,
        "retention_s": retention,
        "archive_root": archive_root,
        "recompact": bool(getattr(args, "recompact", False)),
        # as the server decides it (server/maintenance.archive_scheduled): with an archive step
        # configured, compaction drops only what the archive holds
        "archive_scheduled": any(s.name == "archive-journal" for a in cfg.actions for s in a.do),
    }

    # 1. the request: ours if we can own the journal, else the server's
    req = None
    try:
        j = Journal(jdir, tl.journal_size, tl.durability, exclusive=True)
    except JournalLocked:
        j = None
    except JournalError as exc:
        _err(f"cannot open the journal: {exc}")
        return 1
    try:
        if j is not None:
            try:
                for rid in pending_results(jdir):  # e.g. a spark-submit run's, never applied
                    applied = apply_result(j, rid)
                    print(f"journal: {rid}: {applied.get('status')}: {applied.get('reason', '')}")
                req = make_request(
                    j,
                    kind,
                    queues=queues,
                    destinations=[d.name for d in cfg.replication.destinations],
                    **opts,
                )
            finally:
                j.close()
            if req is not None and not args.dry_run:
                write_request(jdir, req)
        else:
            ans = _order(jdir, kind, opts, args.dry_run)
            if ans is None:
                _err(
                    f"a server holds {jdir} but did not answer within {ORDER_WAIT_S:.0f}s; "
                    "is it a Tickertape version with journal maintenance?"
                )
                return 1
            if ans.get("request"):
                from journal.manifest import read_json

                req = read_json(ans["request"])
            else:
                req = ans.get("preview")
                if req is None:
                    print(f"{kind}: {ans.get('reason') or 'nothing to do'}")
                    return 0
    except MaintenanceError as exc:
        _err(str(exc))
        return 2
    if req is None:
        if not getattr(args, "write_request", False):
            print(f"{kind}: nothing to do: no sealed segment qualifies")
        return 0
    if getattr(args, "write_request", False) and not args.dry_run:
        from journal.manifest import request_path

        path = request_path(jdir, req["id"])
        print(path, flush=True)
        print(_submit_hint(args, path), file=sys.stderr)
        return 0
    if args.dry_run:
        total = sum(s["file_bytes"] for s in req["segments"])
        print(f"{kind}: would take {len(req['segments'])} segments ({total / 1e6:,.1f} MB):")
        for s in req["segments"]:
            print(
                f"  {s['path']}  [{s['base']}, {s['end']})  {s['kind']}  {s['file_bytes']:,} bytes"
            )
        policy = req.get("policy", {})
        if policy.get("cutoff_us"):
            print(
                f"  drop cutoff: records received before {_iso(policy['cutoff_us'])}, "
                f"queues {[(q['name'], q['floor']) for q in policy['queues']]}"
            )
            if policy.get("archived") is not None:
                held = ", ".join(f"[{lo}, {hi})" for lo, hi in policy["archived"]) or "nothing"
                print(f"  drops only what the archive holds: {held}")
        return 0

    # 2. the job, here
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        _err(
            "the Spark job needs Java 17 or newer: apt-get install -y openjdk-17-jre-headless "
            "(./run installs it in CI), or set JAVA_HOME"
        )
        return 4
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401

        from journal.spark import batch
    except ImportError as exc:
        _err(
            f"the Spark job needs the 'spark' extra ({exc}): pip install 'tickertape[spark]' (./run test installs it)"
        )
        return 4
    verbose = bool(getattr(args, "verbose", False))
    log_path = None if verbose or spark is not None else batch.spark_log_path(jdir, req["id"])
    summary = batch.run_job(
        req,
        spark,
        master=args.master,
        driver_memory=args.driver_memory,
        conf=spark_conf,
        executor_python=getattr(args, "executor_python", None),
        progress=not args.quiet,
        verify=getattr(args, "verify", "files") or "files",
        quiet=not verbose,
        log_path=log_path,
    )
    if log_path is not None:
        if summary.get("status") == "ok":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)
        elif os.path.exists(log_path):
            summary["spark_log"] = log_path
    if summary.get("status") != "ok":
        _report(args, summary, None, batch)
        if summary.get("spark_log") and not args.json:
            _err(f"Spark's log: {summary['spark_log']}")
        # the owner still answers the failed result so the request is closed
        _apply_or_wait(jdir, tl, req["id"], args.wait)
        return batch.exit_code(summary)

    # 3. apply: by us if we can own the journal, else by the server
    answer = _apply_or_wait(jdir, tl, req["id"], args.wait)
    _report(args, summary, answer, batch)
    if answer is None:
        return 1
    return 0 if answer.get("status") in ("applied", "noop") else 2


def _apply_or_wait(
    jdir: str, tl: TransactionLog, req_id: str, wait_s: float
) -> dict[str, Any] | None:
    from journal.journal import Journal, JournalLocked
    from journal.maintenance_apply import apply_result
    from journal.manifest import applied_path, read_json

    try:
        j = Journal(jdir, tl.journal_size, tl.durability, exclusive=True)
    except JournalLocked:
        j = None
    if j is not None:
        try:
            return apply_result(j, req_id)
        finally:
            j.close()
    path = applied_path(jdir, req_id)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            return read_json(path)
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.1)
    _err(
        f"the server did not apply the result within {wait_s:.0f}s; it will when it next can "
        f"(see {path})"
    )
    return None


def _order(jdir: str, kind: str, opts: dict[str, Any], dry_run: bool) -> dict[str, Any] | None:
    from journal.manifest import maint_dir, new_request_id, read_json, write_json_atomic

    oid = new_request_id(kind)
    write_json_atomic(
        maint_dir(jdir, "orders", oid + ".json"), {"kind": kind, "dry_run": dry_run, **opts}
    )
    answer = maint_dir(jdir, "orders", oid + ".answer")
    deadline = time.monotonic() + ORDER_WAIT_S
    while time.monotonic() < deadline:
        try:
            ans = read_json(answer)
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.05)
            continue
        os.unlink(answer)
        return ans
    with contextlib.suppress(FileNotFoundError):
        os.unlink(maint_dir(jdir, "orders", oid + ".json"))
    return None


def _report(
    args: argparse.Namespace, summary: dict[str, Any], answer: dict[str, Any] | None, batch: Any
) -> None:
    if args.json:
        print(json.dumps({**summary, "applied": answer}), flush=True)
        return
    print(batch.format_summary(summary))
    if answer is not None:
        print(f"journal: {answer.get('status')}: {answer.get('reason', '')}")


def _submit_hint(args: argparse.Namespace, req_path: str) -> str:
    """How to run a written request with spark-submit, with this installation's paths."""
    import shlex

    from journal.spark import batch

    try:
        import pyspark

        spark_home = os.path.dirname(os.path.abspath(pyspark.__file__))
    except ImportError:
        spark_home = "$SPARK_HOME"
    exe = (
        getattr(args, "executor_python", None)
        or os.environ.get("PYSPARK_PYTHON")
        or "/path/to/executors/python"
    )
    master = args.master or "spark://HOST:7077"
    env = [
        f"SPARK_HOME={shlex.quote(spark_home)}",
        f"PYSPARK_DRIVER_PYTHON={shlex.quote(sys.executable)}",
        f"PYSPARK_PYTHON={shlex.quote(exe)}",
    ]
    if os.environ.get("SPARK_LOCAL_IP"):
        env.append(f"SPARK_LOCAL_IP={shlex.quote(os.environ['SPARK_LOCAL_IP'])}")
    cmd = [
        os.path.join(spark_home, "bin", "spark-submit"),
        "--master",
        master,
        "--driver-memory",
        args.driver_memory,
        *[a for kv in getattr(args, "conf", None) or () for a in ("--conf", kv)],
        os.path.abspath(batch.__file__),
        "--request",
        req_path,
        "--progress",
    ]
    return (
        "request written; run it with spark-submit (the result is applied by the server, or by "
        "the job itself when no server holds the journal):\n  "
        + " ".join(env)
        + " \\\n  "
        + " ".join(shlex.quote(c) for c in cmd)
    )


def _iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us / 1e6))
