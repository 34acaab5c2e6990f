"""Safe defaults and limits on a real server process: protected mode (a non-loopback address
without <Authentication> does not start unless the file says <AllowAnonymous>true), the
connection limits (in all, per address, not logged on yet: each refusal logged and counted),
and a user made by `tickertape passwd` logging on."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request

from tests.security.servers import TlsRaw, secure_config, start, trusting, wait_until
from tests.support.proc import TICKERTAPE, ServerProcess, make_config
from tests.support.raw import Raw


def stats(server) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/stats", timeout=10) as r:
        return json.loads(r.read())


def test_protected_mode_refuses_a_public_address_without_authentication(tmp_path):
    public = make_config(str(tmp_path)).replace(
        "127.0.0.1:0</InetAddr>\n    <MessageType>", "0.0.0.0:0</InetAddr>\n    <MessageType>", 1
    )
    assert "0.0.0.0:0" in public
    (tmp_path / "public.xml").write_text(public)
    done = subprocess.run(
        [TICKERTAPE, "serve", "--config", str(tmp_path / "public.xml")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "which is not loopback, and there is no <Authentication>" in done.stderr
    assert "listening" not in done.stdout
    declared = public.replace(
        "</TickertapeConfig>",
        "<Authentication><AllowAnonymous>true</AllowAnonymous></Authentication></TickertapeConfig>",
    )
    server = ServerProcess(tmp_path / "open", config_xml=declared).start()
    try:
        c = Raw(server.port)
        assert c.logon("open-app")["status"] == "success"
        c.close()
    finally:
        server.stop()


def limited(tmp_path, **limits) -> ServerProcess:
    extra = "".join(f"<{k}>{v}</{k}>" for k, v in limits.items())
    return ServerProcess(tmp_path, extra=extra).start()


def refused(conn: Raw) -> bool:
    """Closed by the server before anything was sent to it."""
    return conn.closed(timeout=5)


def test_connections_per_address(tmp_path):
    server = limited(tmp_path, MaxConnectionsPerAddress=3)
    try:
        held = [Raw(server.port) for _ in range(3)]
        held[0].logon("a")
        extra = Raw(server.port)
        assert refused(extra)
        server.wait_for_log(
            r"connection from 127\.0\.0\.1:\d+ on json-tcp refused: "
            r"<MaxConnectionsPerAddress> 3 from 127\.0\.0\.1 reached"
        )
        held.pop().close()
        wait_until(lambda: stats(server)["connections"] == 2)
        again = Raw(server.port)
        assert again.logon("again")["status"] == "success"
        snap = stats(server)
        assert snap["limits"]["address_connections_refused"] == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{server.admin_port}/metrics") as r:
            assert b"tickertape_limit_address_connections_refused_total 1" in r.read()
        for c in [*held, again]:
            c.close()
    finally:
        server.stop()


def test_connections_not_logged_on(tmp_path):
    server = limited(tmp_path, MaxUnauthenticatedConnections=2)
    try:
        waiting = [Raw(server.port) for _ in range(2)]
        assert refused(Raw(server.port))
        server.wait_for_log(r"<MaxUnauthenticatedConnections> 2 not logged on yet reached")
        waiting[0].logon("now-in")  # a logged-on connection no longer counts
        c = Raw(server.port)
        assert c.logon("next")["status"] == "success"
        assert stats(server)["limits"]["unauthenticated_refused"] == 1
        for x in [*waiting, c]:
            x.close()
    finally:
        server.stop()


def test_connections_in_all(tmp_path):
    server = limited(tmp_path, MaxConnections=2)
    try:
        a, b = Raw(server.port), Raw(server.port)
        a.logon("a")
        b.logon("b")
        assert refused(Raw(server.port))
        server.wait_for_log(r"refused: <MaxConnections> 2 reached")
        assert stats(server)["limits"]["connections_refused"] == 1
        a.close()
        wait_until(lambda: stats(server)["connections"] == 1)
        c = Raw(server.port)
        assert c.logon("c")["status"] == "success"
        b.close()
        c.close()
    finally:
        server.stop()


def test_a_tls_handshake_counts_as_not_logged_on(tmp_path, pki):
    config = secure_config(
        tmp_path, pki, extra="<MaxUnauthenticatedConnections>1</MaxUnauthenticatedConnections>"
    )
    server = start(tmp_path, config)
    try:
        first = TlsRaw(server.port, trusting(pki))
        second = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        assert second.recv(10) == b""  # refused before its handshake
        server.wait_for_log(r"on tls refused: <MaxUnauthenticatedConnections> 1")
        first.logon("first")
        second.close()
        first.close()
    finally:
        server.stop()


def test_a_user_made_by_tickertape_passwd_logs_on(tmp_path, pki):
    users = tmp_path / "users.db"
    done = subprocess.run(
        [TICKERTAPE, "passwd", str(users), "dave"],
        input="dave-made-this-pw\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "dave-made-this-pw" not in users.read_text()
    xml = f"<Authentication><PasswordFile>{users}</PasswordFile></Authentication>"
    server = start(tmp_path, secure_config(tmp_path, pki, authentication=xml))
    try:
        c = TlsRaw(server.port, trusting(pki))
        ack = c.logon("dave-app", user_id="dave", pw="dave-made-this-pw")
        assert ack["status"] == "success"
        c.close()
    finally:
        server.stop()
