"""The web console is behind the admin endpoint's check (docs/console.md, docs/security.md):
with <Authentication>, its page, its files and its event stream need a user with `admin`."""

from __future__ import annotations

import base64
import http.client

import pytest

from tests.security.servers import admin_get, secure_config, start, users_file

USERS = {"root": "root-pw-1", "alice": "alice-pw-2"}
ROLES = """<Entitlement>
  <Role><Name>ops</Name><Users>root</Users><Admin>true</Admin></Role>
  <Role><Name>desk</Name><Users>alice</Users><Subscribe>.*</Subscribe></Role>
</Entitlement>"""


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("console-auth")
    users_file(d / "users.db", USERS)
    auth = f"<Authentication><PasswordFile>{d}/users.db</PasswordFile></Authentication>"
    s = start(d, secure_config(d, pki, authentication=auth, entitlement=ROLES))
    yield s
    s.stop()


@pytest.mark.parametrize("path", ["/", "/console.js", "/console.css", "/events"])
def test_the_console_needs_an_admin_user(auth_server, path):
    status, headers, _ = admin_get(auth_server, path)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert admin_get(auth_server, path, "root", "wrong")[0] == 401
    assert admin_get(auth_server, path, "alice", USERS["alice"])[0] == 403


def test_an_admin_user_gets_the_page_and_the_stream(auth_server):
    status, headers, body = admin_get(auth_server, "/", "root", USERS["root"])
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"console.js" in body
    conn = http.client.HTTPConnection("127.0.0.1", auth_server.admin_port, timeout=10)
    pair = base64.b64encode(f"root:{USERS['root']}".encode()).decode()
    conn.request("GET", "/events", headers={"Authorization": f"Basic {pair}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    assert resp.readline() == b"retry: 2000\n"
    assert resp.readline() == b"\n"
    assert resp.readline() == b"event: history\n"
    conn.close()


def _post(server, path: str, user: str | None, password: str | None) -> int:
    headers = {"X-Requested-By": "tickertape-console"}
    if user is not None:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    conn = http.client.HTTPConnection("127.0.0.1", server.admin_port, timeout=10)
    try:
        conn.request("POST", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_disconnect_action_needs_an_admin_user(auth_server):
    path = "/clients/1/disconnect"
    assert _post(auth_server, path, None, None) == 401
    assert _post(auth_server, path, "alice", USERS["alice"]) == 403
    assert (
        _post(auth_server, path, "root", USERS["root"]) == 404
    )  # no client 1: checked, then looked up
    auth_server.wait_for_log(
        r"audit: admin_request peer=127\.0\.0\.1:\d+ user=alice method=POST "
        r"path=/clients/1/disconnect status=403"
    )


def test_the_run_action_needs_an_admin_user(auth_server):
    path = "/actions/nightly/run"
    assert _post(auth_server, path, None, None) == 401
    assert _post(auth_server, path, "alice", USERS["alice"]) == 403
    assert _post(auth_server, path, "root", USERS["root"]) == 404  # no such action configured
