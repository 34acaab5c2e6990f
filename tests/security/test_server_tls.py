"""TLS on a real server process: a `tcps` transport accepts a client that trusts its CA, and
refuses, each with a log line and the server unharmed: a client that does not trust it, a
plaintext client, an expired client certificate and a missing one under mutual TLS, a client
that never finishes its handshake. SIGHUP rotates the certificate. On uvloop and asyncio."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import struct

import pytest

from protocol.security.tls import client_context
from tests.security.servers import (
    TlsRaw,
    admin_get,
    ports,
    secure_config,
    start,
    trusting,
    wait_until,
)
from tests.support.raw import Raw


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def tls_server(request, tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("tls")
    s = start(d, secure_config(d, pki, extra="<LogonTimeout>2s</LogonTimeout>"), request.param)
    yield s
    s.stop()


def refused_lines(server) -> list[str]:
    return [line for line in server.lines if "tls: handshake with" in line]


def test_a_client_that_trusts_the_ca_publishes_and_subscribes(tls_server, pki):
    sub = TlsRaw(tls_server.port, trusting(pki))
    sub.logon("tls-sub")
    sub.subscribe("tls.orders")
    pub = TlsRaw(tls_server.port, trusting(pki))
    pub.logon("tls-pub")
    cid = pub.next_cid()
    pub.send({"c": "publish", "t": "tls.orders", "s": 1, "a": "persisted", "cid": cid}, b'{"n":1}')
    assert pub.ack("persisted")["status"] == "success"
    [(header, body)] = sub.messages(1)
    assert header["t"] == "tls.orders" and body == b'{"n":1}'
    assert tls_server.wait_for_log(
        r"listening on 127\.0\.0\.1:\d+ \(transport tls, amps/json, TLS\)"
    )
    pub.close()
    sub.close()


def check_refused(server, pki, attempt, reason: str) -> None:
    """`attempt()` fails; the server logs one refusal with `reason`, and serves on."""
    before = len(refused_lines(server))
    attempt()
    wait_until(lambda: len(refused_lines(server)) > before)
    line = refused_lines(server)[before]
    assert "on transport tls refused: " + reason in line, line
    assert "127.0.0.1:" in line
    ok = TlsRaw(server.port, trusting(pki))
    assert ok.logon("after-refusal")["status"] == "success"
    ok.close()


def test_a_client_that_does_not_trust_the_server_is_refused(tls_server, pki):
    untrusting = client_context(ca_file=str(pki.other_ca))

    def attempt():
        with pytest.raises(ssl.SSLCertVerificationError):
            TlsRaw(tls_server.port, untrusting)

    check_refused(tls_server, pki, attempt, "a certificate is not signed by a trusted CA")


def test_a_plaintext_client_on_the_tls_port_is_refused(tls_server, pki):
    def attempt():
        raw = Raw(tls_server.port)
        header = json.dumps({"c": "logon", "client_name": "plain", "a": "processed"}).encode()
        raw.send_raw(struct.pack(">I", len(header)) + header)
        assert raw.closed()  # no ack: the server speaks only TLS here
        raw.close()

    check_refused(tls_server, pki, attempt, "not TLS: a plaintext client on a TLS port?")


def test_an_expired_client_certificate_is_refused(tls_server, pki):
    expired = pki.client_cert("old-alice", expired=True)

    def attempt():
        try:
            c = TlsRaw(tls_server.port, trusting(pki, expired))
            assert c.closed()
        except (ssl.SSLError, ConnectionError):
            pass

    check_refused(tls_server, pki, attempt, "a certificate has expired")


def test_a_handshake_that_never_comes_is_cut_at_the_logon_timeout(tls_server, pki):
    def attempt():
        s = socket.create_connection(("127.0.0.1", tls_server.port))
        s.settimeout(10)
        assert s.recv(100) == b""  # closed by the server after <LogonTimeout> 2s
        s.close()

    check_refused(tls_server, pki, attempt, "TLS handshake failed")


def test_refusals_are_counted_in_stats_and_metrics(tls_server, pki):
    with pytest.raises(ssl.SSLError):
        TlsRaw(tls_server.port, client_context(ca_file=str(pki.other_ca)))
    wait_until(lambda: refused_lines(tls_server))
    status, _, body = admin_get(tls_server, "/stats")
    assert status == 200
    assert json.loads(body)["security"]["tls_handshakes_refused"] >= 1
    _, _, text = admin_get(tls_server, "/metrics")
    assert b"tickertape_tls_handshakes_refused_total " in text


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path, pki, loop):
    alice = pki.client_cert("alice")
    server = start(tmp_path, secure_config(tmp_path, pki, verify_client=True), loop)
    try:

        def no_certificate():
            try:
                c = TlsRaw(server.port, trusting(pki))
                c.send({"c": "logon", "client_name": "x", "a": "processed"})
                assert c.closed()
            except (ssl.SSLError, ConnectionError):
                pass

        before = len(refused_lines(server))
        no_certificate()
        wait_until(lambda: len(refused_lines(server)) > before)
        assert (
            "the client sent no certificate and this transport requires one"
            in (refused_lines(server)[before])
        )
        c = TlsRaw(server.port, trusting(pki, alice))
        assert c.logon("with-cert", user_id="bob")["status"] == "success"
        # no <Authentication>, but the verified certificate names the user, not the claim
        server.wait_for_log(r"logon: connection \d+ client=with-cert .* user=alice ")
        c.close()
        # the plain transport on loopback is unaffected
        p = Raw(ports(server)["plain"])
        assert p.logon("plain")["status"] == "success"
        p.close()
    finally:
        server.stop()


def test_sighup_rotates_the_certificate(tmp_path, pki):
    server = start(tmp_path, secure_config(tmp_path, pki))
    try:

        def serial() -> str:
            c = TlsRaw(server.port, trusting(pki))
            found = c.sock.getpeercert()["serialNumber"]
            c.close()
            return found

        old = serial()
        held = TlsRaw(server.port, trusting(pki))  # an established connection keeps working
        held.logon("held")
        new_cert, new_key = pki.issue("server-2", "/CN=localhost", san="DNS:localhost")
        shutil.copy(new_key, tmp_path / "server.key.new")
        shutil.copy(new_cert, tmp_path / "server.pem.new")
        (tmp_path / "server.key.new").replace(tmp_path / "server.key")
        (tmp_path / "server.pem.new").replace(tmp_path / "server.pem")
        server.proc.send_signal(signal.SIGHUP)
        server.wait_for_log("reload: password file, roles and certificates re-read")
        assert serial() != old
        cid = held.next_cid()
        held.send({"c": "flush", "cid": cid, "a": "completed"})
        assert held.ack("completed", cid)["status"] == "success"
        # a bad file is reported and the running certificate stays
        (tmp_path / "server.key").write_text("not a key\n")
        server.proc.send_signal(signal.SIGHUP)
        server.wait_for_log(r"reload: .*no longer loads; nothing changed")
        assert serial() != old
        held.close()
    finally:
        server.stop()
