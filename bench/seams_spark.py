"""The Spark of the seams campaign's `maint` rounds: the same journal job, started for less.

A `maint` round's instance runs archive -> compact -> remove on a short schedule, and each
archive or compaction step is a child process with a JVM of its own (server/maintenance.py,
journal/spark/batch.py). On two shared cores that JVM was most of a round: measured here at
load 4-6, a trivial job took 25 s of CPU in local[*] with the JVM's defaults, 17 s with the
settings below, 11 s with them and a class-data archive. What this changes is how the JVM and
the session start, not what the job does (the same requests, tasks, verification and apply):

- `JAVA_OPTIONS` (through TICKERTAPE_SPARK_JAVA_OPTIONS, the hook journal/spark/spark_env.py
  reads; the Spark tests use the same): the client compiler only and the serial collector, the
  right choice for a JVM that lives seconds on a small heap;
- a class-data sharing archive (`-XX:SharedArchiveFile`), dumped once per campaign by a warm-up
  session with the same class path (`prepare`): the classes a session loads are mapped instead
  of parsed and verified again in every job;
- `SPARK_DEFAULTS` (a properties file of the campaign's own, given to the spark-submit that
  pyspark starts the JVM with through PYSPARK_SUBMIT_ARGS; not a SPARK_CONF_DIR, which would
  put a non-empty directory on the class path, and the class-data archive refuses that): one task per
  job (`spark.default.parallelism` 1: one Python worker instead of one per core; the journals
  of a round are a few 64 KB segments), no whole-stage code generation and no adaptive
  planning (compiling and re-planning a two-operator plan cost more than running it).

`prepare(root)` returns the environment for the servers of maint rounds ({} leaves them as
they are: the job then runs with its own defaults, only slower). A failed warm-up (no Java)
falls back to the options without the archive and says so once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_DEFAULTS = {
    "spark.default.parallelism": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
}
WARMUP_S = 300.0

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


def prepare(root: str) -> dict[str, str]:
    """Write the Spark configuration under `root` and dump the class-data archive; the
    environment the maint rounds' servers get."""
    props = os.path.join(root, "spark-defaults.conf")
    with open(props, "w") as f:
        f.writelines(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items())
    env = {
        "PYSPARK_SUBMIT_ARGS": f"--properties-file {props} pyspark-shell",
        "TICKERTAPE_SPARK_JAVA_OPTIONS": JAVA_OPTIONS,
    }
    jsa = os.path.join(root, "spark-classes.jsa")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.monotonic()
    try:
        r = subprocess.run(
            [sys.executable, "-c", _WARMUP, os.path.join(root, "spark-warmup.log")],
            env={**os.environ, **env, "PYTHONPATH": here,
                 "TICKERTAPE_SPARK_JAVA_OPTIONS": f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={jsa}"},
            cwd=root, capture_output=True, text=True, timeout=WARMUP_S,
        )  # fmt: skip
        ok = r.returncode == 0 and os.path.exists(jsa)
        why = r.stderr.strip().splitlines()[-1:] if not ok else []
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, [str(exc)]
    if ok:
        env["TICKERTAPE_SPARK_JAVA_OPTIONS"] += f" -XX:SharedArchiveFile={jsa}"
        print(f"maint: Spark class-data archive dumped in {time.monotonic() - t0:.0f}s", flush=True)
    else:
        print(f"maint: no class-data archive ({why}); jobs start without it", flush=True)
    return env
