"""The journal writer's failures seen from outside, against real server processes: a full disk
at a segment roll (finding: the writer kept a closed descriptor and wrote journal records into
the next client's socket), injected I/O errors (TICKERTAPE_FAULTS), SIGTERM on a broken device,
and a second server on the same journal directory."""

import json
import os
import signal
import struct
import subprocess
import time
import urllib.request

from journal.record import KIND_MESSAGE, encode_record
from tests.support.disk import fill
from tests.support.proc import FAST_PROBE, TICKERTAPE, ServerProcess
from tests.support.raw import Raw


def stats(srv) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats", timeout=10) as r:
        return json.loads(r.read())


def record_len(body: bytes) -> int:
    return len(encode_record(KIND_MESSAGE, 1, 1, 0, b"orders", body))


def publish(c: Raw, seq: int, body: bytes) -> dict:
    c.send({"c": "publish", "t": "orders", "s": seq, "a": "persisted"}, body)
    return c.ack("persisted")


def well_formed_frames(data: bytes) -> list[dict]:
    """Every frame a client received, parsed; AssertionError on any byte that is not one."""
    out = []
    off = 0
    while off < len(data):
        assert len(data) - off >= 4, f"trailing bytes at {off}: {data[off : off + 40]!r}"
        (n,) = struct.unpack_from(">I", data, off)
        assert 2 <= n <= 1 << 20, f"no frame length at {off}: {data[off : off + 40]!r}"
        frame = data[off + 4 : off + 4 + n]
        assert len(frame) == n, f"truncated frame at {off}"
        head = frame[: frame.index(b"}") + 1] if b"}" in frame else frame
        out.append(json.loads(head))  # a journal record here would not parse
        off += 4 + n
    return out


def drain(c: Raw, seconds: float) -> bytes:
    c.sock.settimeout(0.2)
    got = bytearray(c.buf)
    c.buf = bytearray()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = c.sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        got += chunk
    return bytes(got)


def test_disk_full_at_a_segment_roll_leaks_nothing_and_recovers(small_disk):
    srv = ServerProcess(small_disk / "srv", journal_size="64KB", env=FAST_PROBE)
    srv.start()
    try:
        pub = Raw(srv.port)
        pub.logon("roll-pub")
        seg_bytes = 64 * 1024
        body = next(
            b
            for b in (b'{"v":"' + b"r" * k + b'"}' for k in range(900, 1000))
            if seg_bytes % record_len(b) >= 300
        )  # room left for small records, not a big one
        acked = []
        for s in range(1, seg_bytes // record_len(body) + 1):  # the first segment, nearly full
            assert publish(pub, s, body)["status"] == "success"
            acked.append(s)
        assert stats(srv)["journal"]["segments"] == 1
        fill(small_disk / "filler")
        seq = acked[-1] + 1
        a = publish(pub, seq, body)  # needs a new segment: the roll fails
        assert a["status"] == "failure" and a["reason"] == "journal unavailable", a
        # a client that connects now must get only its own frames: the writer's old descriptor
        # number, if kept after a failed roll, would be this socket's
        watcher = Raw(srv.port)
        watcher.logon("watcher")
        watcher.subscribe("orders")
        for _ in range(5):  # small enough to fit the segment's last bytes: no roll needed
            publish(pub, seq, b'{"v":1}')
        frames = well_formed_frames(drain(watcher, 1.5))
        assert all(f.get("c") in ("ack", "p") for f in frames), frames[:5]
        assert stats(srv)["journal"]["available"] is False
        # space comes back: the journal recovers by itself and the publisher resends from the gap
        os.unlink(small_disk / "filler")
        deadline = time.monotonic() + 20
        while not stats(srv)["journal"]["available"]:
            assert time.monotonic() < deadline, "the journal did not recover after space came back"
            time.sleep(0.2)
        for s in range(seq, seq + 60):
            assert publish(pub, s, body)["status"] == "success"
            acked.append(s)
        assert stats(srv)["journal"]["segments"] >= 2
        assert srv.stop() == 0
        srv.start()
        r = Raw(srv.port)
        r.logon("reader")
        r.subscribe("orders", bm="0")
        got = r.messages(len(acked), timeout=30)
        assert [int(h["bm"].split("|")[1]) for h, _ in got] == acked
        assert all(f.get("c") in ("ack", "p") for f in well_formed_frames(drain(r, 0.5)))
    finally:
        srv.kill()


def test_injected_io_errors_fail_publishes_then_the_server_recovers(tmp_path):
    srv = ServerProcess(
        tmp_path / "srv",
        env={
            "TICKERTAPE_FAULTS": "seed=3;p=1;ops=write+fsync;errno=EIO;after=20;count=6",
            **FAST_PROBE,
        },
    )
    srv.start()
    try:
        assert any("fault injection enabled" in line for line in srv.lines)
        pub = Raw(srv.port)
        pub.logon("io-pub")
        acked, seq, failures = [], 1, 0
        deadline = time.monotonic() + 60
        while len(acked) < 60:
            assert time.monotonic() < deadline
            a = publish(pub, seq, b'{"n":%d}' % seq)
            if a["status"] == "success":
                acked.append(seq)
                seq += 1
            else:
                failures += 1
                time.sleep(0.2)  # resend the same sequence: nothing above the gap was stored
        assert failures >= 1
        assert stats(srv)["journal"]["write_failures"] >= 1
        # the probe interval of the environment (FAST_PROBE) reached the server's journal
        assert any("probe write succeeds (every 0.05s)" in ln for ln in srv.lines), srv.output()
        assert srv.stop() == 0
        srv.env = {}
        srv.start()
        r = Raw(srv.port)
        r.logon("reader")
        r.subscribe("orders", bm="0")
        got = r.messages(len(acked), timeout=30)
        assert [int(h["bm"].split("|")[1]) for h, _ in got] == acked
    finally:
        srv.kill()


def test_sigterm_exits_while_the_journal_is_broken(tmp_path):
    srv = ServerProcess(
        tmp_path / "srv",
        env={
            "TICKERTAPE_FAULTS": "p=1;ops=write+fsync+open+close+truncate;errno=EIO;after=10;count=0"
        },
    )
    srv.start()
    try:
        pub = Raw(srv.port)
        pub.logon("broken-pub")
        statuses = [publish(pub, s, b'{"n":1}')["status"] for s in range(1, 12)]
        assert "failure" in statuses
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=20)  # raises if shutdown hangs
    finally:
        srv.kill()


def test_a_second_server_on_the_same_journal_refuses_naming_the_first(tmp_path):
    first = ServerProcess(tmp_path / "a")
    first.start()
    try:
        cfg = open(first.config_path).read()
        second_dir = tmp_path / "b"
        second_dir.mkdir()
        (second_dir / "tickertape.xml").write_text(cfg)
        proc = subprocess.run(
            [TICKERTAPE, "serve", "--config", str(second_dir / "tickertape.xml")],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=second_dir,
        )
        proc.stdout += proc.stderr
        assert proc.returncode != 0
        assert f"locked by process {first.proc.pid}" in proc.stdout, proc.stdout[-2000:]
        # the first server goes on as before
        c = Raw(first.port)
        c.logon("still-here")
        assert publish(c, 1, b'{"ok":1}')["status"] == "success"
    finally:
        first.kill()
