"""The Spark session of the journal job: settings, where its logs go, the code it ships to
executors and the check of the executors' Python. With batch.py, the only module that imports
pyspark.

Masters: `local[*]` (the default; also `local[N]`) runs the tasks in Python workers of this host,
which import the job from this installation. Any other master (`spark://HOST:7077`, `yarn`,
`k8s://https://HOST:PORT`, `local-cluster[...]`, passed to Spark as is) has executors that may
not have Tickertape at all: the session ships the job's code to them (job_code.build_zip, added
with addPyFile) and, before any work, checks their Python (check_executors).

Settings, in the order they are applied (a later one wins): the job's defaults (UI and console
progress off, UTC session time zone, TIMESTAMP_MICROS, shuffle partitions 4, Python worker
reuse; for local masters the driver bound to 127.0.0.1), then `conf` (the command's `--conf K=V`,
Spark's own names). The executors' Python: `executor_python`, else `spark.pyspark.python` from
`conf`, else PYSPARK_PYTHON, else this interpreter for local masters and Spark's default
(`python3` on the executors' PATH) for the others.

Logs: with quiet=True (the commands' default) the JVM's stdout and stderr go to `log_path`
(Spark's INFO lines, its warnings, the JVM's own notes), and the log level is ERROR; the
command prints the path if the job fails. Under spark-submit (PYSPARK_GATEWAY_PORT set) the JVM
is spark-submit's: its master, memory, conf and logs are whatever spark-submit was given.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from typing import IO, TYPE_CHECKING, Any

from . import job_code

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

APP_NAME = "tickertape-journal"
JOB_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.python.worker.reuse": "true",
}
_LOCAL = re.compile(r"local(\[[^\]]*\])?$")
EXECUTOR_WAIT_S = 300.0  # how long the executors may take to come up (YARN, k8s: containers)
NOTICE_S = 10.0  # then the command says it is waiting


class ExecutorMismatch(RuntimeError):
    """The executors cannot run the job as shipped (their Python, its packages, or other code)."""

    retriable = False


def is_local(master: str | None) -> bool:
    """Whether `master` runs the Python workers on this host from this installation."""
    return master is None or bool(_LOCAL.match(master))


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """`K=V` strings (the commands' --conf) as a dict; ValueError names a malformed one."""
    out: dict[str, str] = {}
    for p in pairs or ():
        k, sep, v = p.partition("=")
        if not sep or not k.strip():
            raise ValueError(f"--conf {p!r}: expected KEY=VALUE (a Spark setting)")
        out[k.strip()] = v
    return out


def executor_python(master: str | None, explicit: str | None, conf: dict[str, str]) -> str | None:
    """The executors' Python as the module's docstring orders it; None: Spark's default."""
    chosen = explicit or conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    if chosen:
        return chosen
    return sys.executable if is_local(master) else None


def build_session(
    master: str | None = None,
    driver_memory: str | None = None,
    app_name: str = APP_NAME,
    *,
    conf: dict[str, str] | None = None,
    python: str | None = None,
    quiet: bool = False,
    log_path: str | None = None,
) -> SparkSession:
    """A SparkSession for the job (see the module's docstring). master None: local[*]."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    conf = dict(conf or {})
    master = conf.get("spark.master", master) or "local[*]"
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # run by spark-submit: its session is ours
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        for k, v in JOB_DEFAULTS.items():
            if k.startswith("spark.sql."):
                spark.conf.set(k, v)
        if quiet:  # what spark-submit logged while starting is its own; the rest is quiet
            spark.sparkContext.setLogLevel("ERROR")
        return spark
    exe = executor_python(master, python, conf)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if exe:
        os.environ["PYSPARK_PYTHON"] = exe
    if is_local(master):  # the Python workers are this host's: import the job from here
        root = os.path.dirname(job_code.package_dir())
        pp = os.environ.get("PYTHONPATH", "")
        if root not in pp.split(os.pathsep):
            os.environ["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    sc_conf = SparkConf().setAppName(app_name).setMaster(master)
    settings: dict[str, str] = dict(JOB_DEFAULTS)
    if driver_memory:
        settings["spark.driver.memory"] = driver_memory
    java_opts = os.environ.get("TICKERTAPE_SPARK_JAVA_OPTIONS")  # e.g. -XX:TieredStopAtLevel=1
    if java_opts:
        settings["spark.driver.extraJavaOptions"] = java_opts
    if is_local(master):
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
    if exe:
        settings["spark.pyspark.python"] = exe
    settings.update(conf)
    for k, v in settings.items():
        sc_conf.set(k, v)
    gateway = None
    if SparkContext._gateway is None and quiet:
        from pyspark.java_gateway import launch_gateway

        out = _log_stream(log_path)
        gateway = launch_gateway(sc_conf, popen_kwargs={"stdout": out, "stderr": out})
    sc = SparkContext(conf=sc_conf, gateway=gateway)
    if quiet:
        sc.setLogLevel("ERROR")
    return SparkSession(sc)


def _log_stream(path: str | None) -> IO[bytes] | int:
    import subprocess

    if not path:
        return subprocess.DEVNULL
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "ab")  # the JVM writes to it for the life of this process


def ship_code(sc: SparkContext, workdir: str) -> dict[str, Any]:
    """Build the job's zip in workdir and add it (and the C accelerator, if this installation
    has one) to the session's files; returns the zip's build note (job_code.BUILD_FILE)."""
    path, note = job_code.build_zip(workdir)
    sc.addPyFile(path)
    acc = job_code.accelerator_path()
    if acc:
        sc.addFile(acc)
    note["zip"] = path
    return note


def check_executors(
    sc: SparkContext,
    note: dict[str, Any],
    wait_s: float = EXECUTOR_WAIT_S,
    stream: IO[str] | None = None,
) -> list[dict[str, Any]]:
    """Run job_code.probe on every executor core; raise ExecutorMismatch, saying what to
    install or set, if one cannot run the shipped job, or if no executor takes the probe within
    wait_s (a cluster with no free cores, or less memory than spark.executor.memory: Spark
    would wait for ever). Returns what each distinct Python said."""
    n = max(1, sc.defaultParallelism)
    exe = os.environ.get("PYSPARK_PYTHON") or "python3"
    got: list[dict[str, Any]] = []
    failure: list[BaseException] = []
    group = f"tickertape-probe-{os.getpid()}"

    def probe() -> None:
        try:
            sc.setJobGroup(group, "the executors' Python", interruptOnCancel=True)
            got.extend(sc.parallelize(range(n), n).map(job_code.probe).collect())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    t = threading.Thread(target=probe, name="executor-probe", daemon=True)
    t.start()
    t.join(min(NOTICE_S, wait_s))
    if t.is_alive() and wait_s > NOTICE_S:
        print(
            f"waiting for executors on {sc.master} (for up to {wait_s:.0f}s) ...",
            file=stream or sys.stderr,
            flush=True,
        )
        t.join(max(0.0, wait_s - NOTICE_S))
    if t.is_alive():
        sc.cancelJobGroup(group)
        t.join(10)
        raise ExecutorMismatch(
            f"no executor of {sc.master} started within {wait_s:.0f}s: the cluster has no free "
            "cores, or less memory per worker than spark.executor.memory (see the master's web UI)"
        )
    if failure:
        raise ExecutorMismatch(_probe_failure(str(failure[0]), exe)) from None
    seen: dict[str, dict[str, Any]] = {}
    for p in got:  # one per distinct answer (usually one per executor host)
        seen.setdefault(json.dumps(p, sort_keys=True), p)
    problems = []
    for p in seen.values():
        where = f"executor Python {p['python']} on {p['host']}"
        if p["fingerprint"] != note["fingerprint"]:
            problems.append(
                f"{where} runs the job's code from {p['code_from']} (fingerprint "
                f"{p['fingerprint']}), not the code this command shipped ({note['fingerprint']}, "
                f"Tickertape {note['tickertape']}); remove that copy from the executors' Python"
            )
        if tuple(int(x) for x in p["python_version"].split(".")) < (3, 11):
            problems.append(f"{where} is Python {p['python_version']}; the job needs 3.11 or newer")
        missing = []
        for mod, lowest in job_code.EXECUTOR_NEEDS:
            v = p["needs"].get(mod, "missing")
            if v.startswith("missing") or _older(v, lowest):
                missing.append(f"{mod}>={lowest} ({v})")
        if missing:
            problems.append(
                f"{where} lacks {', '.join(missing)}: install them into that Python "
                f"(pip install {' '.join(repr(m.split(' ')[0]) for m in missing)}), or point "
                "--executor-python at one that has them"
            )
    if problems:
        raise ExecutorMismatch("; ".join(problems))
    out: list[dict[str, Any]] = []
    for p in seen.values():
        e = {"host": p["host"], "python": p["python"], "accelerated": p["accelerated"]}
        if e not in out:
            out.append(e)
    return out


def _older(version: str, lowest: str) -> bool:
    def parts(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])

    return parts(version) < parts(lowest)


def _probe_failure(text: str, exe: str) -> str:
    """The probe job's failure as one sentence that says what to do."""
    m = re.search(r"Cannot run program \"([^\"]+)\"[^\n]*", text)
    if m:
        return (
            f"the executors cannot start Python {m.group(1)!r} ({m.group(0).strip()}); "
            "give --executor-python a Python that exists on every executor host"
        )
    m = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
    if m:
        return (
            f"the executors' Python ({exe}) cannot import {m.group(1)!r}; the job ships its own "
            "code, so this is a runtime need: install pyarrow, numpy and zstandard there"
        )
    m = re.search(r"(Python in worker has different version[^\n]*)", text)
    if m:
        return f"{m.group(1).strip()}; use an executor Python of the driver's version"
    lines = [ln.strip() for ln in text.splitlines() if "Error" in ln or "Exception" in ln]
    return "the executors could not run the job's probe: " + (
        lines[-1] if lines else text.strip()[:500]
    )
