"""The journal job on a real Spark standalone cluster (a master and a worker on loopback, started
from the pyspark installation), as the README's "On a cluster" section runs it, command for
command: `tickertape archive` and `tickertape compact` with `--master spark://...`, then a
request run with `spark-submit`. The executors' Python is a venv without Tickertape (only
pyarrow, numpy, zstandard); no server runs, so the commands apply their own results.

One cluster for the module (about 20 s to start, with the executors' venv); each command starts
its own driver JVM. Every JVM (master, worker, drivers, executors) starts with
tests/support/spark_fast.py's options and class-data archive, as the other Spark tests' do."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pyarrow.dataset as ds
import pytest

from journal import maintenance as jm
from journal.journal import Journal
from journal.manifest import read_json
from tests.spark.standalone import Cluster, java_available, make_executor_python, spark_env
from tests.support import spark_fast
from tests.support.journal_data import build, mixed_records, submit
from tests.support.proc import TICKERTAPE, make_config

pytestmark = [pytest.mark.slow, pytest.mark.spark]

CMD_TIMEOUT = 240


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not java_available():
        why = "Spark needs Java 17+ (./run test installs openjdk-17-jre-headless)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    pytest.importorskip("pyspark")
    fast = spark_fast.shared_env()
    d = str(tmp_path_factory.mktemp("spark-cluster"))
    c = Cluster(d, java_options=fast["TICKERTAPE_SPARK_JAVA_OPTIONS"])
    c.fast_env = fast
    try:
        c.start()
        c.python = make_executor_python(d)
        # the executors' Python really has no Tickertape
        probe = subprocess.run(
            [c.python, "-c", "import journal"], cwd=d, capture_output=True, env=spark_env()
        )
        assert probe.returncode != 0 and b"No module named 'journal'" in probe.stderr
        yield c
    finally:
        c.stop()


def _journal(tmp_path, batches=40):
    """A journal written through the journal's API, and a config naming it (and an archive)."""
    data = tmp_path / "data"
    j = build(str(data / "journal"), batches=batches, per_batch=60)
    j.close()
    xml = make_config(str(data), journal_size="64KB").replace(
        "</JournalDirectory>",
        f"</JournalDirectory><JournalArchiveDirectory>{data}/archive</JournalArchiveDirectory>",
    )
    cfg = tmp_path / "tickertape.xml"
    cfg.write_text(xml)
    return str(data / "journal"), str(data / "archive"), str(cfg)


def _tickertape(cluster, *args):
    return subprocess.run(
        [TICKERTAPE, *args],
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
        env=spark_env(**cluster.fast_env),
        stdin=subprocess.DEVNULL,
    )


def _event_log_tasks(events_dir):
    """(stage, executor id, host, reason) of every finished task in the apps' event logs."""
    out = []
    for name in sorted(os.listdir(events_dir)):
        with open(os.path.join(events_dir, name)) as f:
            for line in f:
                e = json.loads(line)
                if e["Event"] == "SparkListenerTaskEnd":
                    ti = e["Task Info"]
                    out.append(
                        (
                            e["Stage ID"],
                            ti["Executor ID"],
                            ti["Host"],
                            e["Task End Reason"]["Reason"],
                        )
                    )
    return out


def test_archive_compact_and_spark_submit_on_a_standalone_cluster(cluster, tmp_path):
    jdir, root, cfg = _journal(tmp_path)
    j = Journal(jdir, segment_size=64 * 1024)
    before = list(j.records())
    sealed_end = j.sealed_segments()[-1].end
    disk_before = j.disk_bytes()
    j.close()
    events = str(tmp_path / "events")
    os.makedirs(events)
    spark_opts = [
        "--master",
        cluster.url,
        "--executor-python",
        cluster.python,
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        f"spark.executor.extraJavaOptions={cluster.java_options}",
        "--conf",
        "spark.eventLog.enabled=true",
        "--conf",
        f"spark.eventLog.dir=file://{events}",
        "--conf",
        "spark.eventLog.compress=false",
        "--conf",
        "spark.eventLog.rolling.enabled=false",
    ]

    # 1. archive: the progress bar and the summary as in local mode, none of Spark's log lines
    r = _tickertape(cluster, "archive", "--config", cfg, *spark_opts)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"archive archive-\S+: \d+ segments, [\d,]+ records", r.stdout), r.stdout
    assert "journal: applied" in r.stdout
    assert re.search(r"\[#+\] \d+/\d+ groups", r.stderr), r.stderr
    assert not re.search(r"\b(INFO|WARN)\b", r.stderr), r.stderr
    positions = ds.dataset(root, format="parquet", partitioning="hive").to_table(
        columns=["position"]
    )
    assert sorted(positions["position"].to_pylist()) == [
        x.position for x in before if x.position < sealed_end
    ]
    # every task ran on the cluster's executor (the probe's and the job's), none in the driver
    tasks = _event_log_tasks(events)
    assert len({t[0] for t in tasks}) >= 2 and all(
        t[1] != "driver" and t[3] == "Success" for t in tasks
    ), tasks
    apps = cluster.status()["completedapps"]
    assert any(a["name"] == "tickertape-journal" and a["state"] == "FINISHED" for a in apps), apps

    # 2. compact, dropping everything the retention allows (the records are from 2023)
    r = _tickertape(cluster, "compact", "--config", cfg, "--retention", "1h", "--json", *spark_opts)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["applied"]["status"] == "applied", summary
    assert summary["master"] == cluster.url
    assert {e["python"] for e in summary["executors"]} == {cluster.python}
    req = read_json(jm.request_path(jdir, summary["id"]))
    keep = set(req["policy"]["keep_positions"])
    retained = [x for x in before if x.position >= sealed_end or x.position in keep]
    j = Journal(jdir, segment_size=64 * 1024)
    assert all(s.kind == "compacted" for s in j.sealed_segments())
    assert list(j.records()) == retained  # replay from EPOCH: exactly the retained records
    j.close()

    # the compacted positions are still archived: nothing to do (no Spark started)
    r = _tickertape(cluster, "archive", "--config", cfg, *spark_opts)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr

    # 3. more records, sealed; a request written for spark-submit, and the line that runs it
    j = Journal(jdir, segment_size=64 * 1024)
    for k in range(20):
        submit(j, mixed_records(60, start_seq=100_000 + 60 * k))
    before2 = list(j.records())
    j.close()
    write = ["--write-request", *spark_opts[:4], "--driver-memory", "1g"]
    r = _tickertape(cluster, "compact", "--config", cfg, *write)
    assert r.returncode == 0, r.stdout + r.stderr
    req_path = r.stdout.strip()
    assert os.path.exists(req_path) and req_path.endswith(".json"), r.stdout
    submit_line = r.stderr.split("\n", 1)[1]  # the hint: env, then the spark-submit command
    assert "spark-submit" in submit_line and shlex.quote(req_path) in submit_line, r.stderr
    # run it as a user would, in a shell without the venv on PATH
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    env.update(
        {k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "TMPDIR", "LANG", "LC_ALL")}
    )
    env["SPARK_SUBMIT_OPTS"] = cluster.java_options
    s = subprocess.run(
        ["bash", "-c", submit_line],
        capture_output=True,
        text=True,
        timeout=CMD_TIMEOUT,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert s.returncode == 0, s.stdout + s.stderr[-3000:]
    assert "journal: applied" in s.stdout, s.stdout
    j = Journal(jdir, segment_size=64 * 1024)
    assert list(j.records()) == before2  # compressed, nothing dropped
    assert sum(1 for s in j.sealed_segments() if s.kind == "compacted") >= 2

    # 4. remove-journal: the archived, compacted prefix goes; fewer bytes; replay has no gap
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] >= 1 and j.start_position == sealed_end, res
    j.collect_garbage(grace_s=0)
    assert j.disk_bytes() < disk_before
    assert list(j.records()) == [x for x in before2 if x.position >= sealed_end]
    j.close()
