"""Spark that starts for less: the settings the Spark tests and the benchmarks give the journal
job's JVMs (the one owner of them; bench/seams_spark.py and the Spark tests use this module).

On two shared cores a local Spark JVM's start-up was most of a short job: measured at load 4-6,
a trivial job took 25 s of CPU in local[*] with the JVM's defaults, 17 s with the settings
below, 11 s with them and a class-data archive. What this changes is how the JVM and the
session start, not what the job does (the same requests, tasks, verification and apply):

- `JAVA_OPTIONS` (through TICKERTAPE_SPARK_JAVA_OPTIONS, the hook journal/spark/spark_env.py
  reads): the client compiler only and the serial collector, the right choice for a JVM that
  lives seconds on a small heap;
- a class-data sharing archive (`-XX:SharedArchiveFile`), dumped once by a warm-up session with
  the same class path (`prepare`): the classes a session loads are mapped instead of parsed and
  verified again in every job. A JVM whose class path does not match the archive's ignores it
  (and runs as without it);
- `SPARK_DEFAULTS` (a properties file of our own, given to the spark-submit that pyspark starts
  the JVM with through PYSPARK_SUBMIT_ARGS; not a SPARK_CONF_DIR, which would put a non-empty
  directory on the class path, and the class-data archive refuses that): one task per job
  (`spark.default.parallelism` 1: one Python worker instead of one per core; test journals are
  a few 64 KB segments), no whole-stage code generation and no adaptive planning (compiling and
  re-planning a two-operator plan cost more than running it). A job's own `--conf` still wins.

`prepare(root)` writes the files under `root` and returns the environment for the processes
that start jobs ({} would leave them as they are: the job then runs with its own defaults, only
slower). A failed warm-up (no Java) falls back to the options without the archive and says so.
`shared_env()` is `prepare` done once for all the pytest workers of a run and the runs after
it, in a cache of the temp dir keyed by what the archive depends on (the first dumps it, the
others wait for it and read its answer): a run on a machine without that cache pays one warm-up
(about a minute on two loaded cores, two at load 8), later runs none.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_DEFAULTS = {
    "spark.default.parallelism": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
}
WARMUP_S = 300.0
ENV_FILE = "spark-fast-env.json"

# a session as the job builds it (spark_env.build_session, quiet), and one mapInArrow job over a
# parallelized RDD, as batch._run_tasks runs the tasks: the classes the job's JVM loads
_WARMUP = """
import sys
from journal.spark.spark_env import build_session
spark = build_session("local[*]", "1g", quiet=True, log_path=sys.argv[1])
rdd = spark.sparkContext.parallelize([(0, "x")], 1)
df = spark.createDataFrame(rdd, "gid INT, spec STRING")
def task(batches):
    yield from batches
assert len(df.mapInArrow(task, "gid INT, spec STRING").collect()) == 1
jvm = spark.sparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the JVM exits on it, and dumps its classes on the way out: wait for that
jvm.wait(240)
"""

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prepare(root: str, say: Callable[[str], None] = print) -> dict[str, str]:
    """Write the Spark configuration under `root` and dump the class-data archive there; the
    environment for the processes that start the journal job's JVMs."""
    os.makedirs(root, exist_ok=True)
    props = os.path.join(root, "spark-defaults.conf")
    with open(props, "w") as f:
        f.writelines(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items())
    env = {
        "PYSPARK_SUBMIT_ARGS": f"--properties-file {props} pyspark-shell",
        "TICKERTAPE_SPARK_JAVA_OPTIONS": JAVA_OPTIONS,
    }
    jsa = os.path.join(root, "spark-classes.jsa")
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            [sys.executable, "-c", _WARMUP, os.path.join(root, "spark-warmup.log")],
            env={**os.environ, **env, "PYTHONPATH": _ROOT,
                 "TICKERTAPE_SPARK_JAVA_OPTIONS": f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={jsa}"},
            cwd=root, capture_output=True, text=True, timeout=WARMUP_S,
        )  # fmt: skip
        ok = r.returncode == 0 and os.path.exists(jsa)
        why = r.stderr.strip().splitlines()[-1:] if not ok else []
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, [str(exc)]
    if ok:
        env["TICKERTAPE_SPARK_JAVA_OPTIONS"] += f" -XX:SharedArchiveFile={jsa}"
        say(f"Spark class-data archive dumped in {time.monotonic() - t0:.0f}s")
    else:
        say(f"no Spark class-data archive ({why}); jobs start without it")
    return env


def shared_env(say: Callable[[str], None] = print) -> dict[str, str]:
    """`prepare` once for every process that asks (the pytest workers of a run, and the runs
    after it): in cache_dir(), under a lock. The first dumps the archive while holding it; the
    others wait on it and read the environment it wrote. A warm-up that dumped no archive is
    not kept (the next asker tries again)."""
    root = cache_dir()
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # bounded by the holder's warm-up (WARMUP_S)
        try:
            path = os.path.join(root, ENV_FILE)
            if os.path.exists(path):
                with open(path) as f:
                    env: dict[str, str] = json.load(f)
                return env
            env = prepare(root, say)
            if "-XX:SharedArchiveFile=" in env["TICKERTAPE_SPARK_JAVA_OPTIONS"]:
                with open(path + ".tmp", "w") as f:
                    json.dump(env, f)
                os.replace(path + ".tmp", path)
            return env
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cache_dir() -> str:
    """Where shared_env keeps the archive between runs, as tests/support/proc.py keeps the
    servers' bytecode: a directory of the temp dir per user, and in it one per key, a digest of
    what the archive depends on (the Java binary, Spark's jars, this Python, the settings and
    the warm-up). A JVM also checks an archive against its class path and ignores one that does
    not match, so a stale archive costs only time."""
    h = hashlib.sha256()
    java = shutil.which("java") or os.path.join(os.environ.get("JAVA_HOME", ""), "bin", "java")
    spec = importlib.util.find_spec("pyspark")
    jars = os.path.join(os.path.dirname(spec.origin), "jars") if spec and spec.origin else ""
    files = [os.path.realpath(java)] + (
        [os.path.join(jars, n) for n in sorted(os.listdir(jars))] if os.path.isdir(jars) else []
    )
    for p in files:
        try:
            st = os.stat(p)
            h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}:missing\n".encode())
    h.update(json.dumps([sys.executable, JAVA_OPTIONS, SPARK_DEFAULTS, _WARMUP]).encode())
    user_dir = os.path.join(tempfile.gettempdir(), f"tickertape-spark-fast-{os.getuid()}")
    return os.path.join(user_dir, h.hexdigest()[:16])
