"""The client library and CLI against a real server with TLS, users and roles: `tcps://`
addresses (Client, HAClient and its server chooser, `tickertape pub/sub`), a CA file and a
client certificate, `user_id`/`pw` at logon, and a subscription the server ends after a
reload of its roles."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from client import Client
from client.address import ServerAddress, parse_server
from client.chooser import DefaultServerChooser
from client.errors import CommandError, ConnectFailed, Disconnected
from client.ha import HAClient
from client.tls import tls_context
from tests.security.certs import make_pki
from tests.security.servers import ports, secure_config, start, users_file

ROOT = Path(__file__).resolve().parents[2]
USERS = {"alice": "alice-pw-1", "feeder": "feeder-pw-2"}
ROLES = r"""<Entitlement>
  <Role><Name>a</Name><Users>alice</Users><Subscribe>orders\..*</Subscribe><Publish>orders\..*</Publish></Role>
  <Role><Name>f</Name><Users>feeder</Users><Publish>.*</Publish></Role>
</Entitlement>"""


def test_addresses():
    assert parse_server("tcps://tt.example.com:9443/amps/json") == ServerAddress(
        "tt.example.com", 9443, True
    )
    assert parse_server("tcp://h:1") == ("h", 1, False)
    assert parse_server("h:2") == ("h", 2, False)
    assert parse_server("tcps://[::1]:9443") == ("::1", 9443, True)
    with pytest.raises(ValueError, match="tcps://host:port/"):
        parse_server("ws://h:1")
    DefaultServerChooser(["tcps://a:1", "tcp://b:2"])  # the chooser takes both


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("client-tls")
    users_file(d / "users.db", USERS)
    auth = f"<Authentication><PasswordFile>{d}/users.db</PasswordFile></Authentication>"
    s = start(d, secure_config(d, pki, authentication=auth, entitlement=ROLES))
    s.dir = d
    yield s
    s.stop()


def uri(server) -> str:
    return f"tcps://localhost:{server.port}"


async def test_client_over_tls_with_a_ca_file(server, pki):
    ctx = tls_context(ca_file=str(pki.ca))
    async with Client("c-sub", server=uri(server), tls=ctx, user_id="alice",
                      password=USERS["alice"]) as sub:  # fmt: skip
        s = await sub.subscribe("orders.c")
        async with Client("c-pub", server=uri(server), tls=ctx, user_id="feeder",
                          password=USERS["feeder"]) as pub:  # fmt: skip
            await pub.publish("orders.c", b'{"n":1}')
            await pub.publish_flush()
        msg = await s.next(timeout=10)
        assert msg is not None and msg.body == b'{"n":1}'


async def test_a_server_the_client_does_not_trust_fails_to_connect(server, pki):
    ctx = tls_context(ca_file=str(pki.other_ca))
    c = Client("c-x", tls=ctx)
    with pytest.raises(ConnectFailed, match="TLS handshake failed.*give the server's CA file"):
        await c.connect(uri(server))
    c = Client("c-y")  # no context: the system's trust store, which does not know our CA
    with pytest.raises(ConnectFailed, match="TLS handshake failed"):
        await c.connect(uri(server))


async def test_wrong_credentials_are_an_auth_failure(server, pki):
    c = Client("c-z", tls=tls_context(ca_file=str(pki.ca)), user_id="alice", password="nope")
    await c.connect(uri(server))
    with pytest.raises(CommandError) as info:
        await c.logon()
    assert info.value.reason == "auth failure"
    await c.close()


async def test_a_client_certificate(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    auth = f"<Authentication><PasswordFile>{tmp_path}/users.db</PasswordFile></Authentication>"
    s = start(tmp_path, secure_config(tmp_path, pki, verify_client=True, authentication=auth))
    try:
        cert, key = pki.client_cert("alice")
        ctx = tls_context(ca_file=str(pki.ca), certificate=str(cert), private_key=str(key))
        async with Client("cert-c", server=f"tcps://localhost:{s.port}", tls=ctx) as c:
            assert c.logon_result is not None
        s.wait_for_log(r"audit: logon .* user=alice method=certificate")
    finally:
        s.stop()


async def test_ha_client_fails_over_to_a_tcps_server(server, pki):
    ha = HAClient(
        "ha-tls",
        servers=[f"tcp://127.0.0.1:{_free_port()}", uri(server)],
        user_id="feeder",
        password=USERS["feeder"],
        tls=tls_context(ca_file=str(pki.ca)),
    )
    await ha.connect_and_logon(timeout=10)
    assert ha.current_uri == uri(server)
    await ha.close()


async def test_a_subscription_ended_by_a_reload_raises(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    auth = f"<Authentication><PasswordFile>{tmp_path}/users.db</PasswordFile></Authentication>"
    config = secure_config(tmp_path, pki, authentication=auth, entitlement=ROLES)
    s = start(tmp_path, config)
    try:
        ctx = tls_context(ca_file=str(pki.ca))
        async with Client("rev", server=f"tcps://localhost:{s.port}", tls=ctx, user_id="alice",
                          password=USERS["alice"]) as c:  # fmt: skip
            sub = await c.subscribe("orders.r")
            (tmp_path / "tickertape.xml").write_text(
                config.replace(r"<Subscribe>orders\..*</Subscribe>", "")
            )
            s.proc.send_signal(signal.SIGHUP)
            with pytest.raises(CommandError) as info:
                await sub.next(timeout=10)
            assert info.value.reason == "not entitled"
    finally:
        s.stop()


async def test_the_cli_publishes_and_subscribes_over_tls(server, pki, tmp_path):
    pw = tmp_path / "pw"
    pw.write_text(USERS["alice"] + "\n")
    common = ["--server", uri(server), "--ca-file", str(pki.ca), "--user", "alice"]
    sub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", "sub", "orders.cli", *common,
        "--password-file", str(pw), "--count", "1", "--timeout", "20",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    await asyncio.sleep(1.0)  # the subscription is placed
    env = dict(os.environ, TICKERTAPE_PASSWORD=USERS["alice"])
    pub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", "pub", "orders.cli", *common,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=env,
    )  # fmt: skip
    _, err = await asyncio.wait_for(pub.communicate(b'{"via":"cli"}\n'), 30)
    assert pub.returncode == 0, err
    out, err = await asyncio.wait_for(sub.communicate(), 30)
    assert sub.returncode == 0, err
    assert json.loads(out.decode().splitlines()[0]) == {"via": "cli"}
    # a plain address to a TLS port is refused by the server, and said so
    bad = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", "pub", "orders.cli",
        "--server", f"127.0.0.1:{ports(server)['tls']}", "--connect-timeout", "0",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    _, err = await asyncio.wait_for(bad.communicate(b"{}\n"), 60)
    assert bad.returncode != 0
    assert b"connect with tcps://HOST:PORT/" in err, err  # not just "closed by server"
    # --user without a password: said so, with where to give it
    nopw = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", "pub", "orders.cli",
        "--server", f"127.0.0.1:{ports(server)['plain']}", "--user", "alice",
        "--connect-timeout", "0",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "TICKERTAPE_PASSWORD"},
    )  # fmt: skip
    _, err = await asyncio.wait_for(nopw.communicate(b"{}\n"), 60)
    assert nopw.returncode != 0
    assert b"no password was given" in err and b"--password-file" in err, err
    assert b"TICKERTAPE_PASSWORD" in err, err


async def test_a_plain_client_on_a_tls_port_is_told_it_may_be_one(server):
    c = Client("plain-on-tls")
    await c.connect(f"127.0.0.1:{ports(server)['tls']}")
    with pytest.raises(Disconnected, match="if this is a tcps transport, connect with tcps://"):
        await c.logon()
    await c.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
