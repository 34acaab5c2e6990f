"""Bounds on what one client can make the server hold or do (server/intake.py,
config/limits.py, protocol/patterns.py), against real server processes. Each failed before:
memory pinned before logon, slow and idle connections kept forever, unbounded subscriptions,
and catastrophic regexes that stalled every client."""

import json
import socket
import struct
import time
import urllib.request

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

LIMITS = """<LogonTimeout>1s</LogonTimeout><PartialMessageTimeout>1s</PartialMessageTimeout>
<IdleTimeout>3s</IdleTimeout><ClientMessageAgeLimit>2s</ClientMessageAgeLimit>
<ClientMaxSubscriptions>5</ClientMaxSubscriptions><InputMemoryLimit>24MB</InputMemoryLimit>"""


def stats(srv) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats", timeout=10) as r:
        return json.loads(r.read())


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_large_frames_before_logon_are_refused_at_their_length(tmp_path):
    srv = ServerProcess(tmp_path / "srv")
    srv.start()
    try:
        rss0 = stats(srv)["rss_bytes"]
        socks = []
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(struct.pack(">I", 15 * 1024 * 1024) + b'{"c":"logon"' + b" " * 60000)
            socks.append(s)
        assert all(closed_within(s, 5) for s in socks)
        st = stats(srv)
        assert st["limits"]["logon_frame_too_large"] >= 50
        assert st["rss_bytes"] - rss0 < 40 * 1024 * 1024
    finally:
        srv.kill()


def test_partial_input_over_all_connections_is_capped(tmp_path):
    srv = ServerProcess(tmp_path / "srv", extra=LIMITS)
    srv.start()
    try:
        conns = []
        for k in range(6):  # 6 x 8 MB of partial frames against a 24 MB limit
            c = Raw(srv.port)
            c.logon(f"big-{k}")
            c.sock.sendall(
                struct.pack(">I", 15 * 1024 * 1024)
                + b'{"c":"publish","t":"x","s":1}'
                + b"z" * (8 << 20)
            )
            conns.append(c)
        time.sleep(0.5)
        st = stats(srv)
        assert st["limits"]["input_memory_limit"] >= 3
        assert st["limits"]["input_buffered_bytes"] <= 24 * 1024 * 1024
    finally:
        srv.kill()


def test_no_logon_and_slow_frames_and_idle_connections_are_closed(tmp_path):
    srv = ServerProcess(tmp_path / "srv", extra=LIMITS)
    srv.start()
    try:
        # the three connections wait out their timers together, not one after another
        silent = socket.create_connection(("127.0.0.1", srv.port))
        idle = Raw(srv.port)
        idle.logon("idle")
        assert closed_within(silent, 4), "a connection that never logs on stays open"
        dribbler = Raw(srv.port)
        dribbler.logon("dribbler")
        frame = struct.pack(">I", 40) + b'{"c":"publish","t":"x","s":1}' + b"0" * 11
        started = time.monotonic()
        closed = False
        for b in frame:  # one byte every 0.3 s: never whole within 1 s
            try:
                dribbler.sock.sendall(bytes([b]))
            except OSError:
                closed = True
                break
            time.sleep(0.3)
            if time.monotonic() - started > 6:
                break
        assert closed or closed_within(dribbler.sock, 3)
        assert closed_within(idle.sock, 6), "an idle connection stays open past IdleTimeout"
        lim = stats(srv)["limits"]
        assert (
            lim["logon_timeout"] >= 1 and lim["partial_message_timeout"] >= 1 and lim["idle"] >= 1
        )
        srv.wait_for_log(r"WARNING .*closed \(logon timeout\)")
    finally:
        srv.kill()


def test_a_connection_whose_output_does_not_drain_is_closed(tmp_path):
    srv = ServerProcess(tmp_path / "srv", extra=LIMITS.replace("<IdleTimeout>3s</IdleTimeout>", ""))
    srv.start()
    try:
        stuck = Raw(srv.port)
        stuck.logon("stuck")
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.subscribe("flood")
        publish_many(srv.port, "flood", [b'{"p":"' + b"x" * 4000 + b'"}'] * 3000, name="flooder")
        srv.wait_for_log(r"closed \(slow client\): its queued output did not drain", timeout=10)
        assert stats(srv)["limits"]["slow_client_age"] >= 1
    finally:
        srv.kill()


def test_subscriptions_per_connection_are_capped(tmp_path):
    srv = ServerProcess(tmp_path / "srv", extra=LIMITS)
    srv.start()
    try:
        c = Raw(srv.port)
        c.logon("many-subs")
        for k in range(5):
            assert c.subscribe(f"t{k}", sub_id=f"s{k}")["status"] == "success"
        a = c.subscribe("t5", sub_id="s5")
        assert (
            a["status"] == "failure"
            and a["reason"] == "not entitled"
            and "ClientMaxSubscriptions" in a["detail"]
        )
        a = c.subscribe("t6", sub_id="x" * 300)
        assert a["status"] == "failure" and "at most 256 bytes" in a["detail"]
        assert stats(srv)["limits"]["subscriptions_refused"] == 1
    finally:
        srv.kill()


def test_catastrophic_patterns_do_not_stall_other_clients(tmp_path):
    srv = ServerProcess(tmp_path / "srv")
    srv.start()
    try:
        evil = Raw(srv.port)
        evil.logon("evil")
        assert evil.subscribe("(a+)+$")["status"] == "success"
        assert evil.subscribe("s", f="/s LIKE '^(a+)+$'")["status"] == "success"
        bad = evil.subscribe("s", sub_id="br", f="/s LIKE '(?=a)a'")
        assert (
            bad["status"] == "failure"
            and bad["reason"] == "bad filter"
            and "no backreferences or lookaround" in bad["detail"]
        )
        pub = Raw(srv.port)
        pub.logon("aaa-pub")
        subject = "a" * 40 + "b"  # Python's re needs about 2^40 steps for each of these
        for s in range(1, 6):
            pub.send({"c": "publish", "t": subject, "s": 2 * s - 1}, b"{}")
            pub.send({"c": "publish", "t": "s", "s": 2 * s}, json.dumps({"s": subject}).encode())
        other = Raw(srv.port)
        other.logon("bystander")
        started = time.monotonic()
        other.send({"c": "flush", "cid": "f", "a": "completed"})
        other.ack("completed", "f", timeout=30)
        assert time.monotonic() - started < 2.0, "another client waited on the patterns"
    finally:
        srv.kill()
