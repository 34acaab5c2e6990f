"""A Spark standalone cluster on loopback, started from the pyspark installation, for the
cluster tests and bench/bench_archive.py: one master, one worker, and a Python for the
executors that has the job's runtime needs (pyarrow, numpy, zstandard) but not Tickertape.

Every process runs in its own session and is stopped by its PID (SIGTERM, then SIGKILL after a
grace period). Start-up is bounded: a master or worker that is not up within `timeout` raises
with the tail of its log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from tests.support.cluster import free_port

LOOPBACK = "127.0.0.1"


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def make_executor_python(directory: str) -> str:
    """A venv with only the job's runtime needs: this environment's pyarrow, numpy and zstandard,
    their installed files linked into its site-packages (no pip: a venv with pip and a pip
    install of pyarrow took most of a minute on two loaded cores). Tickertape, lmdb and pyspark
    are not there."""
    from importlib.metadata import distribution

    venv = os.path.join(directory, "executor-venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        argv = [sys.executable, "-m", "venv", "--without-pip", venv]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise RuntimeError(f"{' '.join(argv)} failed:\n{r.stdout}{r.stderr}")
        site = os.path.join(venv, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
        site = os.path.join(site, "site-packages")
        for name in ("pyarrow", "numpy", "zstandard"):
            dist = distribution(name)
            # its top-level entries: the package, its .dist-info, its bundled libraries
            tops = {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}
            for top in sorted(tops):
                os.symlink(str(dist.locate_file(top)), os.path.join(site, top))
    return py


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of the cluster's processes and the commands that talk to it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP=LOOPBACK)
    env.update(extra)
    return env


@dataclass
class Cluster:
    directory: str
    port: int = 0
    webui: int = 0
    cores: int = 2
    java_options: str = ""  # the master's and the worker's JVM options (e.g. spark_fast's)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def status(self) -> dict:
        """The master's JSON status (its web UI's /json/)."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.webui}/json/", timeout=5) as r:
            return json.loads(r.read())

    def start(self, timeout: float = 90.0, worker_memory: str = "1g") -> Cluster:
        self.port, self.webui = free_port(), free_port()
        cls = os.path.join(spark_home(), "bin", "spark-class")
        # the master's REST submission server would take a fixed port (6066): off
        self._spawn(
            "master",
            [cls, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK]
            + ["--port", str(self.port), "--webui-port", str(self.webui)],
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_DAEMON_JAVA_OPTS=self.java_options,
        )
        self._spawn(
            "worker",
            [cls, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK, "--port", "0"]
            + ["--webui-port", "0", "--cores", str(self.cores), "--memory", worker_memory]
            + ["--work-dir", os.path.join(self.directory, "work"), self.url],
            SPARK_DAEMON_JAVA_OPTS=self.java_options,
        )
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited:\n{self.log(name)}")
            try:
                st = self.status()
                if st.get("status") == "ALIVE" and st.get("aliveworkers", 0) >= 1:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(
            f"no Spark master with a worker within {timeout:.0f}s:\n"
            f"{self.log('master')}\n{self.log('worker')}"
        )

    def _spawn(self, name: str, argv: list[str], **env: str) -> None:
        os.makedirs(self.directory, exist_ok=True)
        out = open(os.path.join(self.directory, f"{name}.log"), "ab")
        try:
            self.procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=spark_env(**env),
                cwd=self.directory,
                start_new_session=True,
            )
        finally:
            out.close()

    def log(self, name: str, tail: int = 40) -> str:
        try:
            with open(os.path.join(self.directory, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-tail:])
        except FileNotFoundError:
            return ""

    def stop(self, grace: float = 15.0) -> None:
        """Stop the worker, then the master, each by its PID (its process group: spark-class
        execs the JVM, which keeps the PID)."""
        for name in ("worker", "master"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
            except ProcessLookupError:
                pass


def java_available() -> bool:
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))
