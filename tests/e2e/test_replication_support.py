"""The test harness for replication: the link proxy's three modes, and the configs a Cluster
writes (loaded by the server's own config loader, so they match the contract)."""

import socket
import threading
import time

import pytest

from tests.support.cluster import Cluster, LinkProxy, wait_until


@pytest.fixture
def echo():
    """A loopback echo server; yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.1)
    stop = threading.Event()

    def serve(conn):
        with conn:
            conn.settimeout(0.1)
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    srv.close()


def roundtrip(sock, data=b"ping", timeout=2.0):
    sock.settimeout(timeout)
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    return got


def test_proxy_passes_stalls_and_drops(echo):
    p = LinkProxy(("127.0.0.1", echo), "t")
    try:
        c = socket.create_connection(("127.0.0.1", p.port), timeout=2)
        assert roundtrip(c) == b"ping"
        p.stall()
        with pytest.raises(TimeoutError):
            roundtrip(c, b"held", timeout=0.3)
        p.pass_()
        # the held bytes go through once the link flows again
        c.settimeout(2)
        assert c.recv(100) == b"held"
        assert roundtrip(c) == b"ping"
        p.drop()
        c.settimeout(2)
        assert c.recv(100) == b""  # closed by the proxy
        c.close()
        # a new connection is accepted and closed at once while dropped
        d = socket.create_connection(("127.0.0.1", p.port), timeout=2)
        d.settimeout(2)
        assert d.recv(100) == b""
        d.close()
        p.pass_()
        e = socket.create_connection(("127.0.0.1", p.port), timeout=2)
        assert roundtrip(e) == b"ping"
        e.close()
        assert p.connections == 2
    finally:
        p.close()


def test_proxy_to_a_dead_target_closes_the_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    p = LinkProxy(("127.0.0.1", dead), "dead")
    try:
        c = socket.create_connection(("127.0.0.1", p.port), timeout=2)
        c.settimeout(3)
        assert c.recv(10) == b""
        c.close()
    finally:
        p.close()


def test_wait_until_is_bounded():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="never"):
        wait_until(lambda: False, timeout=0.2, what="never")
    assert time.monotonic() - start < 2


def test_cluster_configs_load(tmp_path):
    """Every config a Cluster writes passes the server's loader (needs the replication
    loader), with a destination per other instance through its proxy."""
    from config.loader import load_config

    cl = Cluster(tmp_path, ["tt-a", "tt-b", "tt-c"], sync={("tt-a", "tt-b"): True},
                 downgrade_after="2s")  # fmt: skip
    try:
        cfg = load_config(cl["tt-a"].config_path)
        dests = {d.name: d for d in cfg.replication.destinations}
        assert set(dests) == {"tt-b", "tt-c"}
        assert dests["tt-b"].sync and not dests["tt-c"].sync
        assert dests["tt-b"].downgrade_after == 2.0
        assert dests["tt-b"].addresses[0].port == cl.link("tt-a", "tt-b").port
    finally:
        cl.close()


def test_proxy_delay_holds_each_read_then_passes_it(echo):
    p = LinkProxy(("127.0.0.1", echo), "slow")
    try:
        c = socket.create_connection(("127.0.0.1", p.port), timeout=2)
        assert roundtrip(c) == b"ping"
        p.delay(0.3)  # each direction's read waits 0.3 s: a round trip takes at least 0.6 s
        start = time.monotonic()
        assert roundtrip(c, timeout=5) == b"ping"
        assert time.monotonic() - start >= 0.55
        p.delay(60)
        assert p.delay_s == 5.0  # bounded: a delay is not a stall
        p.pass_()
        start = time.monotonic()
        assert roundtrip(c) == b"ping"
        assert time.monotonic() - start < 0.5
        c.close()
    finally:
        p.close()


def test_cluster_journal_extra_and_link_user_load(tmp_path):
    """journal_extra lands in each <TransactionLog> with {dir} as the instance's directory, and
    every destination logs on as link_user."""
    from config.loader import load_config

    pw = tmp_path / "link.pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], link_user=("repl", str(pw)),
                 journal_extra="<JournalSize>64KB</JournalSize>"
                 "<JournalArchiveDirectory>{dir}/archive</JournalArchiveDirectory>")  # fmt: skip
    try:
        cfg = load_config(cl["tt-a"].config_path)
        assert cfg.transaction_log.archive_directory == f"{tmp_path}/tt-a/archive"
        assert cfg.transaction_log.journal_size == 64 * 1024
        (dest,) = cfg.replication.destinations
        assert dest.user == "repl"
    finally:
        cl.close()
