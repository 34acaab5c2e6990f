"""The admin endpoint answers only requests that name it (finding 7: DNS rebinding), against a
real server with real HTTP requests: Host must be an IP address, localhost, the listen host or a
name of `<AllowedHosts>` (else 421); the POST actions and `/events` refuse a foreign `Origin`
(403). Without `<Authentication>` these checks are all that stands between a web page and the
endpoint."""

from __future__ import annotations

import socket
import time

import pytest

from config.errors import ConfigError
from config.loader import load_config
from tests.e2e.test_console import Events
from tests.support.proc import ServerProcess, make_config
from tests.support.raw import Raw

ACTION = "X-Requested-By: tickertape-console\r\n"


def http(port: int, head: str) -> tuple[int, bytes]:
    """Send one request head (lines after the request line, each ending in CRLF) and read the
    whole answer: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n")
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
            if b"text/event-stream" in data and b"\r\n\r\n" in data:
                break  # a stream stays open: its head is the answer
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    d = tmp_path_factory.mktemp("admin")
    xml = make_config(str(d), admin=False).replace(
        "</TickertapeConfig>",
        "<Admin><InetAddr>127.0.0.1:0</InetAddr>"
        "<AllowedHosts>stats.example.com, Ops.Example.com</AllowedHosts></Admin>\n"
        "</TickertapeConfig>",
    )
    s = ServerProcess(d, config_xml=xml)
    s.start()
    yield s
    s.stop()


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "10.1.2.3:{port}"]
    + ["stats.example.com:{port}", "ops.example.com"],
)
def test_a_host_naming_this_endpoint_is_served(admin, host):
    status, body = http(
        admin.admin_port, f"GET /stats HTTP/1.1\r\nHost: {host.format(port=admin.admin_port)}\r\n"
    )
    assert status == 200 and b'"connections"' in body


def test_a_request_without_host_is_served(admin):
    # HTTP/1.0 tools may send none; a browser always does
    assert http(admin.admin_port, "GET /metrics HTTP/1.0\r\n")[0] == 200


@pytest.mark.parametrize("host", ["attacker.example:{port}", "evil.localhost", "127.0.0.1.nip.io"])
@pytest.mark.parametrize("path", ["/stats", "/", "/events", "/metrics"])
def test_a_rebinding_page_gets_nothing(admin, host, path):
    status, body = http(
        admin.admin_port,
        f"GET {path} HTTP/1.1\r\nHost: {host.format(port=admin.admin_port)}\r\n",
    )
    assert status == 421
    assert b"does not answer to Host" in body and b"<AllowedHosts>" in body
    assert b"connections" not in body


def test_a_rebinding_page_cannot_disconnect_a_client(admin):
    c = Raw(admin.port)
    c.logon("rebind-victim")
    try:
        ident = _client_id(admin, "rebind-victim")
        # the page of attacker.example, resolved to 127.0.0.1: same-origin in the browser, so
        # it may send any header; Host names the attacker's name
        status, body = http(
            admin.admin_port,
            f"POST /clients/{ident}/disconnect HTTP/1.1\r\n"
            f"Host: attacker.example:{admin.admin_port}\r\n"
            f"Origin: http://attacker.example:{admin.admin_port}\r\n{ACTION}Content-Length: 0\r\n",
        )
        assert status == 421, body
        assert not c.closed(timeout=0.3)
        admin.wait_for_log(r"admin: refused POST /clients/.* does not answer to Host")
    finally:
        c.close()


@pytest.mark.parametrize(
    "origin",
    [
        "http://attacker.example",
        "http://127.0.0.1:1",  # another port of this host: another origin
        "https://127.0.0.1:{port}",  # another scheme
        "null",
    ],
)
def test_a_foreign_origin_cannot_act_or_stream(admin, origin):
    port = admin.admin_port
    origin = origin.format(port=port)
    status, body = http(
        port,
        f"POST /clients/999999/disconnect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Origin: {origin}\r\n{ACTION}Content-Length: 0\r\n",
    )
    assert status == 403 and b"origin" in body
    status, body = http(
        port, f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\n"
    )
    assert status == 403 and b"origin" in body
    # reading the statistics is no state change: the Host check is what guards it
    assert (
        http(port, f"GET /stats HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}\r\n")[0]
        == 200
    )


def test_the_endpoints_own_origin_and_an_allowed_host_may_act(admin):
    port = admin.admin_port
    for host, origin in (
        (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"),
        (f"localhost:{port}", f"http://localhost:{port}"),
        (f"127.0.0.1:{port}", "https://stats.example.com"),  # behind a proxy
    ):
        status, body = http(
            port,
            f"POST /clients/999999/disconnect HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n"
            f"{ACTION}Content-Length: 0\r\n",
        )
        assert status == 404, (origin, body)  # past the checks: no such client
        status, _ = http(port, f"GET /events HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\n")
        assert status == 200


def test_allowed_hosts_must_be_host_names(tmp_path):
    xml = make_config(str(tmp_path), admin=False).replace(
        "</TickertapeConfig>",
        "<Admin><AllowedHosts>ok.example, http://bad/</AllowedHosts></Admin></TickertapeConfig>",
    )
    path = tmp_path / "tt.xml"
    path.write_text(xml)
    with pytest.raises(ConfigError, match="'http://bad/' is not a host name"):
        load_config(str(path))


def _client_id(admin: ServerProcess, name: str) -> int:
    """The console's id of the client logged on as `name` (from the `/events` details)."""
    ev = Events(admin.admin_port)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            event, data = ev.next()
            if event != "sample":
                continue
            mine = [cl for cl in data["clients"] if cl["name"] == name]  # type: ignore[index]
            if mine:
                return int(mine[0]["id"])
    finally:
        ev.close()
    raise AssertionError(f"client {name} never showed on the console")
