"""TLS contexts with real certificates and a real in-process server on 127.0.0.1, port 0.

The test server accepts plain TCP and upgrades with `StreamWriter.start_tls`, the way the
connection layer should (docs/security.md): a handshake that fails then raises where the server
can log it, instead of vanishing inside asyncio. Each refusal must leave the server serving.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl

import pytest

from protocol.security.tls import (
    ServerTls,
    TlsError,
    client_context,
    describe_handshake_error,
    reload_server_context,
    server_context,
)


class EchoServer:
    """Answers `echo:<data>` over TLS and records each handshake's outcome."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        self.accepted: list[dict | None] = []
        self.refused: list[str] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> EchoServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.start_tls(self.ctx, ssl_handshake_timeout=5)
        except (ssl.SSLError, ConnectionError, TimeoutError) as e:
            self.refused.append(describe_handshake_error(e))
            writer.transport.abort()
            return
        self.accepted.append(writer.get_extra_info("peercert"))
        try:
            data = await reader.read(100)
            writer.write(b"echo:" + data)
            await writer.drain()
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    async def talk(self, ctx: ssl.SSLContext | None, hostname: str = "localhost") -> bytes:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=ctx, server_hostname=hostname if ctx else None
        )
        try:
            writer.write(b"hello")
            await writer.drain()
            return await asyncio.wait_for(reader.read(100), 5)
        finally:
            writer.close()

    async def peer_serial(self, ctx: ssl.SSLContext) -> str:
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=ctx, server_hostname="localhost"
        )
        serial = writer.get_extra_info("peercert")["serialNumber"]
        writer.close()
        return serial


def settings(pki, **kw) -> ServerTls:
    return ServerTls(certificate=str(pki.server_cert), private_key=str(pki.server_key), **kw)


async def test_a_client_trusting_the_ca_connects(pki):
    async with EchoServer(server_context(settings(pki))) as srv:
        assert await srv.talk(client_context(ca_file=str(pki.ca))) == b"echo:hello"
        assert srv.accepted == [None] and srv.refused == []


async def test_minimum_version_defaults_to_tls_1_2(pki):
    ctx = server_context(settings(pki))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    client = client_context(ca_file=str(pki.ca))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    async with EchoServer(ctx) as srv:
        assert await srv.talk(client) == b"echo:hello"


async def test_a_client_that_does_not_trust_the_ca_is_refused(pki):
    async with EchoServer(server_context(settings(pki))) as srv:
        with pytest.raises(ssl.SSLCertVerificationError):
            await srv.talk(client_context(ca_file=str(pki.other_ca)))
        with pytest.raises(ssl.SSLCertVerificationError):
            await srv.talk(client_context(ca_file=str(pki.ca)), hostname="elsewhere.example")
        await asyncio.sleep(0.05)
        assert srv.accepted == []
        assert await srv.talk(client_context(ca_file=str(pki.ca))) == b"echo:hello"


async def test_a_plaintext_client_on_the_tls_port_is_refused(pki):
    async with EchoServer(server_context(settings(pki))) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b'\x00\x00\x00\x20{"c":"logon","client_name":"x"}')
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(100), 5)
        except ConnectionResetError:
            answer = b""
        writer.close()
        assert b"echo" not in answer  # at most a TLS alert
        for _ in range(50):
            if srv.refused:
                break
            await asyncio.sleep(0.02)
        assert srv.accepted == []
        assert srv.refused and srv.refused[0].startswith("not TLS")
        assert await srv.talk(client_context(ca_file=str(pki.ca))) == b"echo:hello"


async def test_an_expired_server_certificate_is_refused_by_the_client(pki):
    cert, key = pki.issue("expired-server", "/CN=localhost", san="DNS:localhost", expired=True)
    ctx = server_context(ServerTls(certificate=str(cert), private_key=str(key)))
    async with EchoServer(ctx) as srv:
        with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
            await srv.talk(client_context(ca_file=str(pki.ca)))


async def mutual(pki, srv: EchoServer, cert=None, key=None) -> bytes:
    client = client_context(
        ca_file=str(pki.ca),
        certificate=str(cert) if cert else None,
        private_key=str(key) if key else None,
    )
    try:
        return await srv.talk(client)
    except (ssl.SSLError, ConnectionError):
        return b""


async def test_mutual_tls_identifies_the_client(pki):
    cert, key = pki.client_cert("alice")
    ctx = server_context(settings(pki, ca_file=str(pki.ca), verify_client=True))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    async with EchoServer(ctx) as srv:
        assert await mutual(pki, srv, cert, key) == b"echo:hello"
        [peer] = srv.accepted
        assert dict(x[0] for x in peer["subject"])["commonName"] == "alice"


@pytest.mark.parametrize("case", ["no certificate", "expired", "untrusted CA"])
async def test_mutual_tls_refusals(pki, case):
    if case == "no certificate":
        cert = key = None
        expect = "sent no certificate"
    elif case == "expired":
        cert, key = pki.client_cert("old", expired=True)
        expect = "expired"
    else:
        cert, key = pki.client_cert("mallory", signer="other_ca")
        expect = "not signed by a trusted CA"
    ctx = server_context(settings(pki, ca_file=str(pki.ca), verify_client=True))
    async with EchoServer(ctx) as srv:
        assert await mutual(pki, srv, cert, key) == b""
        for _ in range(50):
            if srv.refused:
                break
            await asyncio.sleep(0.02)
        assert srv.accepted == []
        assert len(srv.refused) == 1 and expect in srv.refused[0], srv.refused
        good_cert, good_key = pki.client_cert("alice")
        assert await mutual(pki, srv, good_cert, good_key) == b"echo:hello"


async def test_ca_without_verify_client_makes_the_certificate_optional(pki):
    cert, key = pki.client_cert("alice")
    ctx = server_context(settings(pki, ca_file=str(pki.ca)))
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    async with EchoServer(ctx) as srv:
        assert await mutual(pki, srv) == b"echo:hello"
        assert await mutual(pki, srv, cert, key) == b"echo:hello"
        assert srv.accepted[0] in (None, {}) and srv.accepted[1]["subject"]


async def test_minimum_version_tls_1_3_refuses_a_tls_1_2_client(pki):
    ctx = server_context(settings(pki, minimum_version="TLSv1.3"))
    client = client_context(ca_file=str(pki.ca))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    async with EchoServer(ctx) as srv:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await srv.talk(client)
        for _ in range(50):
            if srv.refused:
                break
            await asyncio.sleep(0.02)
        assert srv.accepted == []
        assert srv.refused and "below <MinimumVersion>" in srv.refused[0], srv.refused


async def test_reload_rotates_the_certificate_in_the_same_context(pki, tmp_path):
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    tls = ServerTls(certificate=str(cert), private_key=str(key))
    ctx = server_context(tls)
    client = client_context(ca_file=str(pki.ca))
    async with EchoServer(ctx) as srv:
        first = await srv.peer_serial(client)
        # an established connection keeps its certificate across the reload
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", srv.port, ssl=client, server_hostname="localhost"
        )
        new_cert, new_key = pki.issue("rotated", "/CN=localhost", san="DNS:localhost")
        shutil.copy(new_cert, cert)
        shutil.copy(new_key, key)
        reload_server_context(ctx, tls)
        second = await srv.peer_serial(client)
        assert second != first
        writer.write(b"still")
        assert await asyncio.wait_for(reader.read(100), 5) == b"echo:still"
        writer.close()
        # a bad file leaves the live context as it was
        other_cert, _other_key = pki.issue("mismatch", "/CN=localhost", san="DNS:localhost")
        shutil.copy(other_cert, cert)
        with pytest.raises(TlsError, match="does not belong to the certificate"):
            reload_server_context(ctx, tls)
        assert await srv.peer_serial(client) == second


def test_errors_name_the_element_the_file_and_what_to_do(pki, tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a pem\n")
    cases = [
        (settings(pki, ca_file=None, verify_client=True), "CAFile", "needs <CAFile>"),
        (
            ServerTls(certificate=str(tmp_path / "nope.pem"), private_key=str(pki.server_key)),
            "Certificate",
            "not found (looked in",
        ),
        (
            ServerTls(certificate=str(pki.server_cert), private_key=str(tmp_path)),
            "PrivateKey",
            "is a directory",
        ),
        (
            ServerTls(certificate=str(garbage), private_key=str(pki.server_key)),
            "Certificate",
            "holds no PEM certificate",
        ),
        (
            ServerTls(certificate=str(pki.server_cert), private_key=str(garbage)),
            "PrivateKey",
            "holds no PEM private key",
        ),
        (
            ServerTls(certificate=str(pki.server_cert), private_key=str(pki.ca_key)),
            "PrivateKey",
            "does not belong to the certificate",
        ),
        (settings(pki, ca_file=str(garbage)), "CAFile", "holds no PEM certificate"),
        (settings(pki, ciphers="NO-SUCH-CIPHER"), "Ciphers", "selects no cipher"),
        (settings(pki, minimum_version="TLSv1.1"), "MinimumVersion", "use TLSv1.2 or TLSv1.3"),
    ]
    for tls, element, fragment in cases:
        with pytest.raises(TlsError) as info:
            server_context(tls)
        assert info.value.element == element, (tls, info.value)
        assert fragment in str(info.value), str(info.value)


def test_an_encrypted_key_is_refused_without_prompting(pki, tmp_path):
    import subprocess

    locked = tmp_path / "locked.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(pki.server_key), "-aes256", "-passout", "pass:pw",
         "-out", str(locked)],
        check=True,
    )  # fmt: skip
    with pytest.raises(TlsError, match="encrypted with a passphrase"):
        server_context(ServerTls(certificate=str(pki.server_cert), private_key=str(locked)))


def test_ciphers_are_applied(pki):
    ctx = server_context(settings(pki, ciphers="ECDHE+AESGCM"))
    names = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert names and all("GCM" in n for n in names)


def test_client_certificate_needs_its_key(pki):
    with pytest.raises(TlsError, match="needs its private key"):
        client_context(ca_file=str(pki.ca), certificate=str(pki.server_cert))
