"""Sync replication between two real server processes: a sync destination that is down holds the
publishers' `persisted` acks; a downgrade (by the admin, or by <DowngradeAfter>) releases them;
the destination's return upgrades it; `fully_durable` delivers only what both instances have."""

import json
import subprocess
import time

from tests.e2e.test_repl_core import free_ports
from tests.support.proc import TICKERTAPE, ServerProcess
from tests.support.raw import Raw


def config(d, name, repl_port, dest, dest_port, sync=True, downgrade_after=None):
    extra = f"<DowngradeAfter>{downgrade_after}</DowngradeAfter>" if downgrade_after else ""
    return f"""<TickertapeConfig>
  <Name>{name}</Name>
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
      <MessageType>json</MessageType><Protocol>amps</Protocol></Transport>
    <Transport><Name>repl-in</Name><Type>replication</Type><InetAddr>127.0.0.1:{repl_port}</InetAddr></Transport>
  </Transports>
  <Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
  <Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>
  <TransactionLog><JournalDirectory>{d}/journal</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  <Replication><Destination><Name>{dest}</Name><Group>{dest}</Group>
    <SyncType>{"sync" if sync else "async"}</SyncType>{extra}
    <Transport><InetAddr>127.0.0.1:{dest_port}</InetAddr><Type>replication</Type></Transport>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></Destination></Replication>
</TickertapeConfig>
"""


def pair(tmp_path, downgrade_after=None):
    """A sends to B in sync (B to A async, so B is a full instance too)."""
    pa, pb = free_ports(2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = ServerProcess(
        tmp_path / "a",
        config_xml=config(tmp_path / "a", "tt-a", pa, "tt-b", pb, True, downgrade_after),
    )
    b = ServerProcess(
        tmp_path / "b", config_xml=config(tmp_path / "b", "tt-b", pb, "tt-a", pa, False)
    )
    return a, b


def publish(c: Raw, first: int, last: int) -> None:
    for i in range(first, last + 1):
        c.send({"c": "publish", "t": "orders", "s": i}, json.dumps({"i": i}))


def flushed(c: Raw, wait: float) -> bool:
    """Flush with a `persisted` ack: True when it comes within `wait` seconds."""
    cid = c.next_cid()
    c.send({"c": "flush", "cid": cid, "a": "persisted"})
    c.sock.settimeout(wait)
    try:
        c.ack("persisted", cid, timeout=wait)
        return True
    except TimeoutError:
        return False
    finally:
        c.sock.settimeout(10.0)


def stats(server: ServerProcess) -> dict:
    import urllib.request

    url = f"http://127.0.0.1:{server.admin_port}/stats"
    return json.loads(urllib.request.urlopen(url, timeout=5).read())["replication"]


def cli(server: ServerProcess, action: str, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            TICKERTAPE,
            "replication",
            action,
            name,
            "--admin",
            f"http://127.0.0.1:{server.admin_port}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("not reached in time")
        time.sleep(0.1)


def test_a_down_sync_destination_holds_acks_until_the_admin_downgrades_it(tmp_path):
    a, b = pair(tmp_path)
    a.start()
    b.start()
    pub = None
    try:
        wait_for(lambda: stats(a)["destinations"]["tt-b"]["connected"])
        pub = Raw(a.port)
        pub.logon("pub")
        publish(pub, 1, 100)
        assert flushed(pub, 10)  # B is up: acked by both
        b.kill()
        wait_for(lambda: not stats(a)["destinations"]["tt-b"]["connected"])
        publish(pub, 101, 200)
        assert not flushed(pub, 1.5)  # durable at A, but B is down
        assert stats(a)["held_batches"] >= 1
        done = cli(a, "downgrade", "tt-b")
        assert done.returncode == 0, done.stderr
        assert "destination tt-b is async (downgraded) now" in done.stdout
        assert pub.ack("persisted", timeout=10)  # the held flush goes out
        assert a.wait_for_log("replication destination tt-b downgraded to async")
        assert stats(a)["destinations"]["tt-b"]["mode"] == "downgraded"
        # B returns and catches up: upgraded, and holds acks again
        b.start()
        assert a.wait_for_log("replication destination tt-b upgraded to sync again", 30)
        publish(pub, 201, 250)
        assert flushed(pub, 10)
        b.kill()
        wait_for(lambda: not stats(a)["destinations"]["tt-b"]["connected"])
        publish(pub, 251, 260)
        assert not flushed(pub, 1.5)
    finally:
        if pub is not None:
            pub.close()
        a.stop()
        b.stop()


def test_downgrade_after_releases_the_acks_by_itself(tmp_path):
    a, b = pair(tmp_path, downgrade_after="1s")
    a.start()  # B never starts: down from the start
    try:
        pub = Raw(a.port)
        pub.logon("pub")
        publish(pub, 1, 10)
        started = time.monotonic()
        assert flushed(pub, 10)
        assert time.monotonic() - started > 0.3  # held until the timer ran out
        assert a.wait_for_log(r"downgraded to async \(silent for .*s \(down; <DowngradeAfter> 1s")
        snap = stats(a)["destinations"]["tt-b"]
        assert snap["mode"] == "downgraded" and snap["downgrades"] == 1
        pub.close()
    finally:
        a.stop()


def test_fully_durable_delivers_only_what_both_have(tmp_path):
    a, b = pair(tmp_path)
    a.start()
    b.start()
    try:
        wait_for(lambda: stats(a)["destinations"]["tt-b"]["connected"])
        pub = Raw(a.port)
        pub.logon("pub")
        publish(pub, 1, 20)
        assert flushed(pub, 10)
        b.kill()
        wait_for(lambda: not stats(a)["destinations"]["tt-b"]["connected"])
        publish(pub, 21, 40)
        assert not flushed(pub, 1.0)
        sub = Raw(a.port)
        sub.logon("sub")
        sub.send({"c": "subscribe", "t": "orders", "bm": "0", "o": "fully_durable", "sub_id": "d"})
        plain = Raw(a.port)
        plain.logon("plain")
        plain.send({"c": "subscribe", "t": "orders", "bm": "0", "sub_id": "p"})
        assert [json.loads(body)["i"] for _, body in plain.messages(40)] == list(range(1, 41))
        got = [json.loads(body)["i"] for _, body in sub.messages(20)]
        assert got == list(range(1, 21))
        sub.sock.settimeout(1.0)
        try:
            extra = sub.recv()
        except TimeoutError:
            extra = None
        assert extra is None  # 21..40 are not at B
        sub.sock.settimeout(10.0)
        b.start()  # B resyncs: the rest comes
        got = [json.loads(body)["i"] for _, body in sub.messages(20, timeout=30)]
        assert got == list(range(21, 41))
        for c in (pub, sub, plain):
            c.close()
    finally:
        a.stop()
        b.stop()
