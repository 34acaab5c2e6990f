"""Restart, crash (kill -9), and a full disk: no acknowledged message is ever lost."""

import json
import os
import resource
import signal
import struct
import subprocess
import threading
import time

import pytest

from tests.support.proc import TICKERTAPE, ServerProcess
from tests.support.raw import Raw


def replay_all(port, topic="orders", name="replayer"):
    c = Raw(port)
    c.logon(name)
    c.send({"c": "subscribe", "t": topic, "bm": "0", "cid": "r", "a": "processed,completed"})
    frames = c.recv_until(lambda h, b: h.get("a") == "completed", timeout=60)
    c.close()
    return [(h, b) for h, b in frames if h["c"] == "p"]


def test_graceful_restart_keeps_everything_and_logon_returns_last_seq(tmp_path):
    srv = ServerProcess(tmp_path / "s").start()
    p = Raw(srv.port)
    p.logon("restart-pub")
    for i in range(1, 501):
        p.send({"c": "publish", "t": "orders", "s": i, "a": "persisted"}, json.dumps({"i": i}))
    while p.ack("persisted")["s"] < 500:
        pass
    assert srv.stop() == 0
    assert any("stopped in" in line for line in srv.lines)
    srv.start()
    p = Raw(srv.port)
    ack = p.logon("restart-pub")
    assert ack["s"] == 500 and ack["bm"].endswith("|500|")
    got = [json.loads(b)["i"] for _, b in replay_all(srv.port)]
    assert got == list(range(1, 501))
    # dedup state survives the restart too
    p.send({"c": "publish", "t": "orders", "s": 500, "cid": "d", "a": "processed"}, "{}")
    assert p.ack("processed", "d")["reason"] == "duplicate"
    srv.stop()


def test_sigterm_drains_in_flight_publishes(tmp_path):
    """SIGTERM while a publisher's frames are still arriving: the server stops reading, commits
    what it read, and acks it before it exits. So what is stored is exactly 1..k, and the last
    persisted ack says k: nothing stored goes unacknowledged (with the drain switched off, the
    batches in flight are written by the journal's close but never acked, and this fails)."""
    srv = ServerProcess(tmp_path / "s").start()
    p = Raw(srv.port)
    p.logon("drain-pub")
    body = b'{"pad":"' + b"d" * 500 + b'"}'
    frames = [
        struct.pack(">I", len(h) + len(body)) + h + body
        for h in (
            json.dumps({"c": "publish", "t": "orders", "s": i, "a": "persisted"}).encode()
            for i in range(1, N_DRAIN + 1)
        )
    ]
    writer = threading.Thread(target=lambda: _send_quietly(p, frames), daemon=True)
    writer.start()
    highest = 0
    while (
        highest == 0
    ):  # the first commit is acked: batches are being committed as the signal comes
        f = p.recv()
        if f is not None and f[0].get("a") == "persisted":
            highest = f[0]["s"]
    srv.proc.send_signal(signal.SIGTERM)
    before = highest
    while True:
        try:
            f = p.recv()
        except OSError:  # reset: the server closed with our unread frames in its buffer
            break
        if f is None:
            break
        if f[0].get("a") == "persisted" and f[0].get("status") == "success":
            highest = max(highest, f[0]["s"])
    assert srv.proc.wait(20) == 0
    writer.join(10)
    srv.start()
    stored = [int(h["bm"].split("|")[1]) for h, _ in replay_all(srv.port)]
    srv.stop()
    assert before < highest, "nothing was in flight when the signal came: the test proves nothing"
    assert stored == list(range(1, len(stored) + 1)), "stored sequences are not 1..k"
    assert len(stored) == highest, f"stored {len(stored)} but the last persisted ack said {highest}"


N_DRAIN = 40000


def _send_quietly(conn, frames) -> None:
    try:
        for k in range(0, len(frames), 200):
            conn.sock.sendall(b"".join(frames[k : k + 200]))
    except OSError:
        pass  # the server closed the connection: expected once it shuts down


@pytest.mark.slow
def test_kill9_mid_stream_loses_no_acknowledged_message(tmp_path):
    """Publish with persisted acks, kill -9 the server mid-stream, restart: every acked message is
    present, the stored messages are a gapless prefix of what was sent, nothing is duplicated."""
    srv = ServerProcess(tmp_path / "s").start()
    p = Raw(srv.port)
    p.logon("crash-pub")
    acked = 0
    sent = 0
    killed = threading.Event()

    def killer():
        time.sleep(1.0)
        os.kill(srv.proc.pid, signal.SIGKILL)
        killed.set()

    threading.Thread(target=killer, daemon=True).start()
    import struct

    try:
        while True:
            if sent - acked < 2000:
                batch = []
                for _ in range(200):
                    sent += 1
                    h = json.dumps(
                        {"c": "publish", "t": "orders", "s": sent, "a": "persisted"}
                    ).encode()
                    b = json.dumps({"i": sent}).encode()
                    batch.append(struct.pack(">I", len(h) + len(b)) + h + b)
                p.send_raw(b"".join(batch))
            p.sock.settimeout(0.001 if sent - acked < 2000 else 5)
            try:
                f = p.recv()
            except (TimeoutError, OSError):
                continue
            if f is None:
                break
            if f[0].get("a") == "persisted":
                acked = max(acked, f[0]["s"])
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert killed.wait(10)
    srv.proc.wait(10)
    assert acked > 100, "the crash came before anything was acknowledged; the test proved nothing"
    srv.start()
    stored = [json.loads(b)["i"] for _, b in replay_all(srv.port)]
    assert stored == list(range(1, len(stored) + 1)), "stored messages are not a gapless prefix"
    assert len(stored) >= acked, f"acked {acked} but only {len(stored)} stored"
    q = Raw(srv.port)
    assert q.logon("crash-pub")["s"] == len(stored)
    srv.stop()


def _limit_file_size():
    # files the server writes may not grow past 300 KB: writes fail with EFBIG like a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))


def test_full_disk_fails_publishes_and_keeps_serving(tmp_path):
    srv = ServerProcess(tmp_path / "s", preexec_fn=_limit_file_size).start()
    p = Raw(srv.port)
    p.logon("full-pub")
    body = json.dumps({"pad": "x" * 1000})
    failure = None
    acked = 0
    for i in range(1, 1001):
        p.send({"c": "publish", "t": "orders", "s": i, "a": "persisted"}, body)
        if i % 20 == 0:
            p.send({"c": "flush", "cid": str(i), "a": "persisted"})
            frames = p.recv_until(lambda h, b, i=i: h.get("cid") == str(i))
            for h, _ in frames:
                if h.get("a") == "persisted" and h["status"] == "success" and "cid" not in h:
                    acked = max(acked, h["s"])
                if h.get("status") == "failure":
                    failure = h
            if failure:
                break
    assert failure is not None, "the file-size limit never made a write fail"
    assert failure["reason"] == "journal unavailable"
    srv.wait_for_log("journal write failed")
    # reads keep working while writes fail; exactly the acknowledged sequences are stored
    stored = [int(h["bm"].split("|")[1]) for h, _ in replay_all(srv.port)]
    assert stored == list(range(1, acked + 1))
    # and the server is alive for other clients
    c = Raw(srv.port)
    assert c.logon("after-full")["status"] == "success"
    srv.stop()
    # with space again, everything acknowledged is there and the publisher resumes from it
    srv.preexec_fn = None
    srv.start()
    q = Raw(srv.port)
    assert q.logon("full-pub")["s"] == acked
    assert [int(h["bm"].split("|")[1]) for h, _ in replay_all(srv.port)] == list(
        range(1, acked + 1)
    )
    srv.stop()


def test_corrupted_tail_is_truncated_at_start(tmp_path):
    srv = ServerProcess(tmp_path / "s").start()
    p = Raw(srv.port)
    p.logon("tail-pub")
    for i in range(1, 51):
        p.send({"c": "publish", "t": "orders", "s": i, "a": "persisted"}, json.dumps({"i": i}))
    while p.ack("persisted")["s"] < 50:
        pass
    srv.stop()
    seg = os.path.join(srv.directory, "journal", "00000000000000000000.seg")
    good = os.path.getsize(seg)
    with open(seg, "ab") as f:
        f.write(b"\x40\x00\x00\x00garbage-that-was-being-written")
    srv.start()
    srv.wait_for_log("truncating the tail")
    with open(seg, "rb") as f:  # a running server keeps zeros past its records (its runway)
        f.seek(good)
        assert b"garbage" not in f.read(64), "the torn bytes are still in the segment"
    assert [json.loads(b)["i"] for _, b in replay_all(srv.port)] == list(range(1, 51))
    # new records follow the last good one directly: no damage between them, now or after a restart
    p = Raw(srv.port)
    p.logon("tail-pub")
    for i in range(51, 61):
        p.send({"c": "publish", "t": "orders", "s": i, "a": "persisted"}, json.dumps({"i": i}))
    while p.ack("persisted")["s"] < 60:
        pass
    srv.stop()
    srv.start()
    assert [json.loads(b)["i"] for _, b in replay_all(srv.port)] == list(range(1, 61))
    assert not any("damaged data" in line for line in srv.lines)
    srv.stop()


def test_bad_config_is_reported_and_server_does_not_start(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text(
        "<TickertapeConfig>\n  <Transports><Transport><InetAddr>nope</InetAddr></Transport></Transports>\n  <Bogus/>\n</TickertapeConfig>\n"
    )
    r = subprocess.run(
        [TICKERTAPE, "serve", "--config", str(bad)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert "Name" in r.stderr and "Bogus" in r.stderr and "InetAddr" in r.stderr
    r = subprocess.run(
        [TICKERTAPE, "serve", "--verify-config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "Bogus" in r.stderr
    broken = tmp_path / "broken.xml"
    broken.write_text("<TickertapeConfig><Name>x</Name>\n<Transports>\n</TickertapeConfig>")
    r = subprocess.run(
        [TICKERTAPE, "serve", "--verify-config", str(broken)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and ":3" in r.stderr
    good = os.path.join(os.path.dirname(__file__), "..", "..", "config", "examples", "minimal.xml")
    r = subprocess.run(
        [TICKERTAPE, "serve", "--verify-config", good], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr


def test_address_in_use_is_a_clear_error(tmp_path):
    a = ServerProcess(tmp_path / "a").start()
    try:
        cfg = open(a.config_path).read().replace("127.0.0.1:0", f"127.0.0.1:{a.port}", 1)
        b = ServerProcess(
            tmp_path / "b", config_xml=cfg.replace(str(tmp_path / "a"), str(tmp_path / "b"))
        )
        with pytest.raises(RuntimeError) as info:
            b.start(timeout=15)
        assert "cannot start" in str(info.value) and "another process listens" in str(info.value)
    finally:
        a.stop()
