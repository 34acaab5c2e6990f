"""Authentication at logon on a real server process (docs/security.md, "How a logon is
decided"): passwords checked against the password file, `auth failure` and a closed connection
for anything else, an audit line either way (never the password), the frames sent behind a
logon handled after it, anonymous logons only when allowed, mutual TLS naming the user, the
`name in use` rule on authenticated users, the logon timeout, back-off for repeated failures,
and SIGHUP re-reading the password file."""

from __future__ import annotations

import json
import re
import signal
import struct
import time

import pytest

from tests.security.servers import (
    TlsRaw,
    ports,
    secure_config,
    start,
    trusting,
    users_file,
)
from tests.support.raw import Raw

PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-2"}


def auth_xml(directory, anonymous: bool = False, timeout: str = "2s") -> str:
    return (
        f"<Authentication><PasswordFile>{directory}/users.db</PasswordFile>"
        f"<LogonTimeout>{timeout}</LogonTimeout>"
        f"<AllowAnonymous>{'true' if anonymous else 'false'}</AllowAnonymous></Authentication>"
    )


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def auth_server(request, tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("auth")
    users_file(d / "users.db", PASSWORDS)
    s = start(d, secure_config(d, pki, authentication=auth_xml(d)), request.param)
    yield s
    s.stop()


def tls(server, pki, cert=None) -> TlsRaw:
    return TlsRaw(server.port, trusting(pki, cert))


def logon(conn, name: str, **fields) -> dict:
    conn.send({"c": "logon", "cid": "l", "client_name": name, "a": "processed", **fields})
    return conn.ack("processed", "l")


def test_a_right_password_logs_on_with_an_audit_line(auth_server, pki):
    c = tls(auth_server, pki)
    ack = logon(c, "alice-app", user_id="alice", pw=PASSWORDS["alice"])
    assert ack["status"] == "success" and ack["client_name"] == "alice-app"
    line = auth_server.wait_for_log(r"tickertape\.audit: logon peer=127\.0\.0\.1:\d+ user=alice")
    assert "method=password transport=tls" in line
    auth_server.wait_for_log(r"logon: connection \d+ client=alice-app .* user=alice ")
    c.close()


@pytest.mark.parametrize(
    "fields, detail",
    [
        ({"user_id": "alice", "pw": "wrong-password-x"}, "wrong password"),
        ({"user_id": "mallory", "pw": "anything-at-all"}, "unknown user"),
        ({"user_id": "alice"}, "no password (pw) given"),
        ({}, "no user_id, and anonymous logons are not allowed"),
    ],
    ids=["wrong-password", "unknown-user", "no-password", "no-user"],
)
def test_a_refused_logon_gets_auth_failure_and_is_closed(auth_server, pki, fields, detail):
    c = tls(auth_server, pki)
    ack = logon(c, "refused-app", **fields)
    assert (ack["status"], ack["reason"]) == ("failure", "auth failure")
    assert c.closed()
    line = auth_server.wait_for_log(
        r"logon_failure peer=127\.0\.0\.1:\d+ .*detail=" + re.escape(f'"{detail}"')
    )
    if "user_id" in fields:
        assert f"user={fields['user_id']}" in line
    auth_server.wait_for_log(r"disconnect: .* reason=auth failure")
    assert "wrong-password-x" not in auth_server.output()
    assert "anything-at-all" not in auth_server.output()
    ok = tls(auth_server, pki)  # a success clears the back-off this test built up
    assert logon(ok, "after", user_id="bob", pw=PASSWORDS["bob"])["status"] == "success"
    ok.close()


def test_frames_sent_behind_the_logon_wait_for_its_check(auth_server, pki):
    c = tls(auth_server, pki)
    frames = [
        {"c": "logon", "cid": "1", "client_name": "pipelined", "user_id": "bob",
         "pw": PASSWORDS["bob"], "a": "processed"},
        {"c": "subscribe", "cid": "2", "t": "pipe.t", "a": "processed"},
        {"c": "publish", "t": "pipe.t", "s": 1},
        {"c": "flush", "cid": "3", "a": "persisted"},
    ]  # fmt: skip
    data = b""
    for f in frames:
        h = json.dumps(f).encode()
        body = b'{"k":1}' if f["c"] == "publish" else b""
        data += struct.pack(">I", len(h) + len(body)) + h + body
    c.send_raw(data)
    got = c.recv_until(lambda h, b: h.get("cid") == "3")
    acks = [(h.get("c"), h.get("cid")) for h, _ in got]
    assert acks[:2] == [("ack", "1"), ("ack", "2")]
    assert ("p", None) in acks  # the publish came back to the subscription
    c.close()


def test_the_plain_loopback_transport_authenticates_too(auth_server, pki):
    p = Raw(ports(auth_server)["plain"])
    assert logon(p, "plain-bob", user_id="bob", pw=PASSWORDS["bob"])["status"] == "success"
    p.close()
    p = Raw(ports(auth_server)["plain"])
    assert logon(p, "plain-x", user_id="bob", pw="nope-nope")["reason"] == "auth failure"
    p.close()
    p = Raw(ports(auth_server)["plain"])
    assert logon(p, "plain-bob", user_id="bob", pw=PASSWORDS["bob"])["status"] == "success"
    p.close()


def test_name_in_use_compares_authenticated_users(auth_server, pki):
    first = tls(auth_server, pki)
    assert logon(first, "desk-app", user_id="alice", pw=PASSWORDS["alice"])["status"] == "success"
    other = tls(auth_server, pki)
    ack = logon(other, "desk-app", user_id="bob", pw=PASSWORDS["bob"])
    assert (ack["status"], ack["reason"]) == ("failure", "name in use")
    assert other.closed()
    again = tls(auth_server, pki)  # the same user takes the name over
    assert logon(again, "desk-app", user_id="alice", pw=PASSWORDS["alice"])["status"] == "success"
    assert first.closed()
    again.close()


def test_no_logon_within_the_timeout_is_closed(auth_server, pki):
    c = tls(auth_server, pki)
    started = time.monotonic()
    assert c.closed(timeout=10)
    assert 1.5 < time.monotonic() - started < 8
    auth_server.wait_for_log(r"closed \(logon timeout\): no logon within <LogonTimeout> 2s")


def test_sighup_rereads_the_password_file(tmp_path, pki):
    users_file(tmp_path / "users.db", PASSWORDS)
    server = start(tmp_path, secure_config(tmp_path, pki, authentication=auth_xml(tmp_path)))
    try:
        c = tls(server, pki)
        assert logon(c, "carol-1", user_id="carol", pw="carol-pw-123")["reason"] == "auth failure"
        users_file(tmp_path / "users.db", {"carol": "carol-pw-123"})
        server.proc.send_signal(signal.SIGHUP)
        server.wait_for_log("reload: password file, roles and certificates re-read")
        time.sleep(0.3)  # the one failure above spaced this address's next attempt
        c = tls(server, pki)
        assert logon(c, "carol-2", user_id="carol", pw="carol-pw-123")["status"] == "success"
        c.close()
    finally:
        server.stop()


def test_repeated_failures_from_one_address_back_off(tmp_path, pki):
    users_file(tmp_path / "users.db", PASSWORDS)
    xml = auth_xml(tmp_path, timeout="10s")
    server = start(tmp_path, secure_config(tmp_path, pki, authentication=xml))
    try:
        took = []
        for _ in range(5):
            c = Raw(ports(server)["plain"])
            started = time.monotonic()
            assert logon(c, "guess", user_id="alice", pw="guess-guess")["reason"] == "auth failure"
            took.append(time.monotonic() - started)
            c.close()
        # spaced 0.25 s, 0.5 s, 1 s, 2 s after the 1st, 2nd, 3rd, 4th failure
        assert took[0] < 0.25
        assert took[2] > 0.4 and took[3] > 0.9 and took[4] > 1.8, took
        # the right password waits its turn too, then clears the address
        c = Raw(ports(server)["plain"])
        started = time.monotonic()
        assert logon(c, "right", user_id="alice", pw=PASSWORDS["alice"])["status"] == "success"
        assert time.monotonic() - started > 3.0
        c.close()
        c = Raw(ports(server)["plain"])
        started = time.monotonic()
        assert logon(c, "fast", user_id="alice", pw=PASSWORDS["alice"])["status"] == "success"
        assert time.monotonic() - started < 0.5
        c.close()
    finally:
        server.stop()


def test_anonymous_logons_when_allowed(tmp_path, pki):
    users_file(tmp_path / "users.db", PASSWORDS)
    xml = auth_xml(tmp_path, anonymous=True)
    server = start(tmp_path, secure_config(tmp_path, pki, authentication=xml))
    try:
        c = tls(server, pki)
        assert logon(c, "anon-app")["status"] == "success"
        server.wait_for_log(r"audit: logon .* user=anonymous method=anonymous")
        c.close()
        c = tls(server, pki)  # a claimed user still needs its password
        assert logon(c, "claim", user_id="alice", pw="wrong-one")["reason"] == "auth failure"
        c.close()
    finally:
        server.stop()


def test_mutual_tls_names_the_user(tmp_path, pki):
    users_file(tmp_path / "users.db", PASSWORDS)
    xml = auth_xml(tmp_path)
    server = start(tmp_path, secure_config(tmp_path, pki, verify_client=True, authentication=xml))
    try:
        alice = pki.client_cert("alice")
        c = tls(server, pki, alice)
        assert logon(c, "cert-app")["status"] == "success"  # no user_id, no password
        server.wait_for_log(r"audit: logon .* user=alice method=certificate transport=tls")
        c.close()
        c = tls(server, pki, alice)
        ack = logon(c, "cert-app-2", user_id="bob", pw=PASSWORDS["bob"])
        assert ack["reason"] == "auth failure"  # the certificate says alice
        server.wait_for_log(re.escape("user_id differs from the certificate's user 'alice'"))
        c.close()
    finally:
        server.stop()
