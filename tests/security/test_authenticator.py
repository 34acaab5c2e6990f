"""Authenticators, back-off and the logon check, with real password files and a real TLS
handshake for the client-certificate identity."""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import pytest

from config import Authentication
from protocol.security.passwords import (
    PasswordFileError,
    ScryptParams,
    set_password,
    set_token,
)
from protocol.security.tls import ServerTls, client_context, server_context
from server.security.authenticator import (
    ANONYMOUS,
    AuthFailure,
    Backoff,
    Identity,
    LogonChecker,
    OpenAuthenticator,
    PasswordAuthenticator,
    build_authenticator,
    certificate_identity,
    parse_authorization,
    peer_address,
)

FAST = ScryptParams(n=1 << 10)


@pytest.fixture
def users(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "alice", "alice-pw", FAST)
    set_password(path, "bob", "bob-pw", FAST)
    return path


def auth(users=None, anonymous=False) -> PasswordAuthenticator:
    return PasswordAuthenticator(
        Authentication(password_file=str(users) if users else None, allow_anonymous=anonymous)
    )


CERT_ALICE = {"subject": ((("countryName", "GB"),), (("commonName", "alice"),))}


# ---------------------------------------------------------------------------------------------
# The rules


def test_passwords(users):
    a = auth(users)
    assert a.authenticate("alice", "alice-pw", None) == Identity("alice", "password")
    assert a.authenticate("alice", "bob-pw", None) == AuthFailure("alice", "wrong password")
    assert a.authenticate("carol", "x", None) == AuthFailure("carol", "unknown user")
    assert a.authenticate("alice", None, None) == AuthFailure("alice", "no password (pw) given")
    failure = a.authenticate(None, "alice-pw", None)
    assert isinstance(failure, AuthFailure) and failure.reason == "auth failure"
    assert "anonymous logons are not allowed" in failure.detail


def test_anonymous(users):
    a = auth(users, anonymous=True)
    assert a.authenticate(None, None, None) == Identity(ANONYMOUS, "anonymous")
    # a claimed name is still checked when there is a password file
    assert isinstance(a.authenticate("alice", "wrong", None), AuthFailure)
    # without a password file, an open server takes every logon as anonymous
    open_server = auth(None, anonymous=True)
    assert open_server.authenticate("alice", None, None) == Identity(ANONYMOUS, "anonymous")
    closed = auth(None, anonymous=False)
    assert "no password file" in closed.authenticate("alice", "x", None).detail


def test_client_certificate_names_the_user(users):
    a = auth(users)
    assert a.authenticate(None, None, CERT_ALICE) == Identity("alice", "certificate")
    assert a.authenticate("alice", None, CERT_ALICE) == Identity("alice", "certificate")
    failure = a.authenticate("bob", "bob-pw", CERT_ALICE)
    assert isinstance(failure, AuthFailure) and "differs from the certificate" in failure.detail
    anon = {"subject": ((("commonName", "anonymous"),),)}
    assert isinstance(a.authenticate(None, None, anon), AuthFailure)


def test_certificate_identity():
    assert certificate_identity(CERT_ALICE) == "alice"
    san = {"subject": ((("organizationName", "x"),),), "subjectAltName": (
        ("DNS", "svc.example"), ("email", "ops@example.com"))}  # fmt: skip
    assert certificate_identity(san) == "ops@example.com"
    assert certificate_identity({"subjectAltName": (("DNS", "svc.example"),)}) == "svc.example"
    assert certificate_identity({}) is None and certificate_identity(None) is None


def test_open_authenticator_takes_the_claimed_name():
    a = build_authenticator(None)
    assert isinstance(a, OpenAuthenticator)
    assert a.authenticate("alice", None, None) == Identity("alice", "unverified")
    assert a.authenticate(None, None, None) == Identity(ANONYMOUS, "unverified")
    assert a.authenticate_http(None) == Identity(ANONYMOUS, "unverified")


def test_http_basic_and_bearer(users):
    token = set_token(users, "bob")
    a = auth(users)

    def basic(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert a.authenticate_http(None) is None
    assert a.authenticate_http(basic("alice", "alice-pw")) == Identity("alice", "password")
    assert isinstance(a.authenticate_http(basic("alice", "nope")), AuthFailure)
    assert a.authenticate_http(f"Bearer {token}") == Identity("bob", "token")
    assert isinstance(a.authenticate_http(f"Bearer {token}x"), AuthFailure)
    assert isinstance(a.authenticate_http("Digest abc"), AuthFailure)
    assert isinstance(a.authenticate_http("Basic !!!"), AuthFailure)
    assert parse_authorization(basic("a", "p:with:colons")) == ("basic", "a", "p:with:colons")


def test_reload(users):
    a = auth(users)
    set_password(users, "carol", "carol-pw", FAST)
    assert isinstance(a.authenticate("carol", "carol-pw", None), AuthFailure)
    a.reload()
    assert a.authenticate("carol", "carol-pw", None) == Identity("carol", "password")
    users.write_text("damaged\n")
    with pytest.raises(PasswordFileError):
        a.reload()
    assert a.authenticate("carol", "carol-pw", None) == Identity("carol", "password")  # kept


def test_missing_password_file_at_build(tmp_path):
    with pytest.raises(PasswordFileError):
        build_authenticator(Authentication(password_file=str(tmp_path / "none")))


async def test_identity_from_a_real_mutual_tls_handshake(pki, users):
    cert, key = pki.client_cert("alice")
    ctx = server_context(
        ServerTls(str(pki.server_cert), str(pki.server_key), str(pki.ca), verify_client=True)
    )
    seen: list = []

    async def handle(reader, writer):
        seen.append(writer.get_extra_info("peercert"))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    client = client_context(ca_file=str(pki.ca), certificate=str(cert), private_key=str(key))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client, server_hostname="localhost"
    )
    await reader.read()
    writer.close()
    server.close()
    await server.wait_closed()
    assert auth(users).authenticate(None, None, seen[0]) == Identity("alice", "certificate")


# ---------------------------------------------------------------------------------------------
# Back-off


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_grows_exponentially_and_is_capped():
    clock = Clock()
    b = Backoff(base=1.0, cap=8.0, clock=clock)
    assert b.reserve("p") == 0.0
    assert [b.failure("p") for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_backoff_spaces_attempts_and_refuses_a_long_queue():
    clock = Clock()
    b = Backoff(base=1.0, cap=4.0, clock=clock)
    b.failure("p")
    b.failure("p")  # interval 2s, next slot in 2s
    waits = [b.reserve("p") for _ in range(4)]
    assert waits == [2.0, 4.0, None, None]  # parallel attempts are serialized, then refused
    assert b.reserve("other") == 0.0
    clock.now += 10
    assert b.reserve("p") == 0.0


def test_backoff_success_and_quiet_time_forget():
    clock = Clock()
    b = Backoff(base=1.0, forget_after=60.0, clock=clock)
    b.failure("p")
    b.success("p")
    assert b.reserve("p") == 0.0 and len(b) == 0
    b.failure("q")
    b.failure("q")
    clock.now += 61
    assert b.failure("q") == 1.0  # starts again


def test_backoff_memory_is_bounded():
    b = Backoff(max_peers=100, clock=Clock())
    for i in range(1000):
        b.failure(f"10.0.{i // 256}.{i % 256}")
    assert len(b) == 100
    assert b.reserve("10.0.0.0") == 0.0  # the oldest were dropped
    assert b.reserve("10.0.3.231") > 0  # the latest kept


def test_peer_address():
    assert peer_address("10.1.2.3:5555") == "10.1.2.3"
    assert peer_address("[::1]:5555") == "::1"
    assert peer_address("::1") == "::1"
    assert peer_address("host") == "host"


# ---------------------------------------------------------------------------------------------
# The logon check


async def test_logon_checker_audits_and_backs_off(users, caplog):
    caplog.set_level(logging.INFO, logger="tickertape.audit")
    checker = LogonChecker(auth(users), Backoff(base=0.2, cap=1.0))
    try:
        ok = await checker.check("10.0.0.1:1000", "alice", "alice-pw", transport="tls")
        assert ok == Identity("alice", "password")
        bad = await checker.check("10.0.0.1:1001", "alice", "guess-1")
        assert isinstance(bad, AuthFailure)
        start = time.monotonic()
        await checker.check("10.0.0.1:1002", "alice", "guess-2")
        assert time.monotonic() - start >= 0.15  # waited for its slot
        start = time.monotonic()
        await checker.check("10.0.0.2:1000", "bob", "bob-pw")  # another address: no wait
        assert time.monotonic() - start < 0.15
    finally:
        checker.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "tickertape.audit"]
    assert lines[0] == "logon peer=10.0.0.1:1000 user=alice method=password transport=tls"
    assert lines[1] == 'logon_failure peer=10.0.0.1:1001 user=alice detail="wrong password"'
    assert all("guess" not in line and "pw" not in line.split("detail")[0] for line in lines)
    assert caplog.records[1].levelno == logging.WARNING
    assert caplog.records[1].audit["event"] == "logon_failure"


async def test_a_refused_queue_of_attempts_fails_without_a_check(users):
    checker = LogonChecker(auth(users), Backoff(base=0.1, cap=0.1))
    try:
        await checker.check("10.0.0.9:1", "alice", "wrong")
        first, second = await asyncio.gather(
            checker.check("10.0.0.9:2", "alice", "alice-pw"),
            checker.check("10.0.0.9:3", "alice", "alice-pw"),
        )
        assert first == Identity("alice", "password")  # waited its 0.1s slot
        assert isinstance(second, AuthFailure) and "backing off" in second.detail
    finally:
        checker.close()


async def test_a_password_check_does_not_block_the_event_loop(tmp_path):
    path = tmp_path / "users.db"
    set_password(path, "alice", "pw")  # the real cost
    checker = LogonChecker(auth(path))
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.002)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        start = time.monotonic()
        results = await asyncio.gather(*(checker.check(f"h{i}:1", "alice", "pw") for i in range(4)))
        took = time.monotonic() - start
    finally:
        task.cancel()
        checker.close()
    assert all(isinstance(r, Identity) for r in results)
    # the loop kept running meanwhile: a loop blocked by the checks ticks only between them
    # (about 4); a loaded 2-core machine stretches each 2 ms sleep, hence the low share
    assert ticks >= max(12, took / 0.002 * 0.1), (ticks, took)


async def test_check_http(users):
    checker = LogonChecker(auth(users))
    try:
        assert await checker.check_http("h:1", None) is None
        header = "Basic " + base64.b64encode(b"alice:alice-pw").decode()
        assert await checker.check_http("h:1", header) == Identity("alice", "password")
    finally:
        checker.close()
