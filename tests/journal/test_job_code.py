"""The job's code as executors get it (job_code.py) and the driver's check of their Python
(spark_env.check_executors), without Spark: the zip imported by a Python that has no
Tickertape, and the check fed with what executors could answer."""

import json
import os
import subprocess
import sys
import threading
import zipfile

import pytest

from journal.spark import job_code
from journal.spark.spark_env import (
    ExecutorMismatch,
    check_executors,
    executor_python,
    is_local,
    parse_conf,
)


def test_the_zip_is_the_same_bytes_for_the_same_code(tmp_path):
    a, note = job_code.build_zip(str(tmp_path))
    again = tmp_path / "again"
    again.mkdir()
    b, note2 = job_code.build_zip(str(again))
    assert note == note2 and open(a, "rb").read() == open(b, "rb").read()
    names = zipfile.ZipFile(a).namelist()
    assert "journal/spark/jobs.py" in names and "journal/spark/job_code.py" in names
    assert f"journal/{job_code.BUILD_FILE}" in names
    assert not [n for n in names if n.endswith((".so", ".pyc"))]
    assert note["fingerprint"] in os.path.basename(a)


def test_a_python_without_tickertape_imports_the_job_from_the_zip(tmp_path):
    """-S: no site-packages (no Tickertape, numpy, pyarrow): the probe still answers, naming
    the zip as the code's source and what is missing."""
    path, note = job_code.build_zip(str(tmp_path))
    code = (
        "import json, sys; sys.path.insert(1, sys.argv[1]);"
        "import journal.spark.job_code as c; print(json.dumps(c.probe()))"
    )
    r = subprocess.run(
        [sys.executable, "-S", "-c", code, path],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["fingerprint"] == note["fingerprint"] and p["code_from"].startswith(path)
    assert p["needs"]["pyarrow"].startswith("missing") and p["accelerated"] is False


class FakeContext:
    """What check_executors uses of a SparkContext: parallelize(...).map(f).collect()."""

    defaultParallelism = 2
    master = "spark://fake:7077"

    def __init__(self, answers=None, error=None, hang=False):
        self.answers, self.error = answers, error
        self.hang = threading.Event() if hang else None
        self.cancelled = []

    def setJobGroup(self, group, description, interruptOnCancel=False):
        self.group = group

    def cancelJobGroup(self, group):
        self.cancelled.append(group)
        self.hang.set()

    def parallelize(self, data, n):
        return self

    def map(self, f):
        return self

    def collect(self):
        if self.hang is not None:
            self.hang.wait(30)
            raise RuntimeError("cancelled")
        if self.error:
            raise RuntimeError(self.error)
        return self.answers


def _answer(note, **kw):
    p = {
        "host": "worker-1",
        "python": "/opt/exec/bin/python",
        "python_version": "3.11",
        "fingerprint": note["fingerprint"],
        "code_from": "/var/spark/app-1/tickertape-job.zip/journal",
        "accelerated": True,
        "needs": {"pyarrow": "26.0.1", "numpy": "2.4.6", "zstandard": "0.25.0"},
    }
    p.update(kw)
    return p


def test_check_executors_names_what_to_fix():
    note = {"fingerprint": "abc", "tickertape": "0.1.0"}
    ok = _answer(note)
    assert check_executors(FakeContext([ok, ok]), note) == [
        {"host": "worker-1", "python": "/opt/exec/bin/python", "accelerated": True}
    ]
    other = _answer(note, fingerprint="zzz", code_from="/usr/lib/python3/site-packages/journal")
    with pytest.raises(ExecutorMismatch, match="runs the job's code from /usr/lib/python3"):
        check_executors(FakeContext([ok, other]), note)
    old = _answer(note, needs={"pyarrow": "12.0.0", "numpy": "2.0", "zstandard": "missing: x"})
    with pytest.raises(ExecutorMismatch, match=r"lacks pyarrow>=18 \(12.0.0\), zstandard"):
        check_executors(FakeContext([old]), note)
    with pytest.raises(ExecutorMismatch, match="is Python 3.9"):
        check_executors(FakeContext([_answer(note, python_version="3.9")]), note)
    with pytest.raises(ExecutorMismatch, match="cannot start Python '/nope/python'"):
        check_executors(
            FakeContext(error='Cannot run program "/nope/python": error=2, No such file'), note
        )


def test_a_cluster_that_starts_no_executor_is_given_up_on():
    sc = FakeContext(hang=True)
    with pytest.raises(ExecutorMismatch, match="no executor of spark://fake:7077 started"):
        check_executors(sc, {"fingerprint": "abc", "tickertape": "0.1.0"}, wait_s=0.3)
    assert sc.cancelled == [sc.group]


def test_masters_conf_and_the_executors_python(monkeypatch):
    assert is_local(None) and is_local("local[*]") and is_local("local[2]") and is_local("local")
    assert not is_local("spark://h:7077") and not is_local("yarn")
    assert not is_local("local-cluster[2,1,1024]") and not is_local("k8s://https://h:6443")
    assert parse_conf(["a=b", "spark.x=1=2"]) == {"a": "b", "spark.x": "1=2"}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_conf(["nonsense"])
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert executor_python("local[*]", None, {}) == sys.executable
    assert executor_python("spark://h:7077", None, {}) is None  # Spark's default: python3
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/python")
    assert executor_python("spark://h:7077", None, {}) == "/env/python"
    assert executor_python("yarn", None, {"spark.pyspark.python": "/c/python"}) == "/c/python"
    assert executor_python("yarn", "/x/python", {"spark.pyspark.python": "/c"}) == "/x/python"
