"""Who a logon is: authenticators, the back-off for repeated failures, and the logon check the
connection layer calls.

    build_authenticator(config.Authentication | None) -> Authenticator
    Authenticator.authenticate(user, password, peer_cert) -> Identity | AuthFailure
    Authenticator.authenticate_http(authorization header) -> Identity | AuthFailure | None
    Backoff                                   per peer address, exponential, bounded (LRU)
    LogonChecker.check(peer, user, password, peer_cert)   async: back-off, a worker thread,
                                              the audit line; what a connection awaits

The rules of `PasswordAuthenticator` (an `<Authentication>` section), in order:

1. A client certificate that the TLS handshake verified (against the transport's `<CAFile>`)
   names the user: its subject CN, else its first subjectAltName of type email, DNS or URI. A
   logon `user_id` that differs from it is a failure; a password is not needed.
2. A logon without `user_id` is user "anonymous" when `<AllowAnonymous>` is true, else a failure.
3. A logon with `user_id` is checked against the password file; a wrong or missing password, an
   unknown user, or no password file at all is a failure (a claimed name that cannot be checked
   is never taken on trust), except that with `<AllowAnonymous>true` and no password file the
   logon is accepted as "anonymous": the server was declared open.

Without `<Authentication>`, `OpenAuthenticator` accepts every logon under the `user_id` it
claims ("anonymous" without one), as the server always has; the safe-defaults rule
(config.security) keeps such a server on loopback.

A password check costs one scrypt (~50 ms, see passwords.py), so it must not run on the event
loop: `LogonChecker` runs it on a small thread pool (hashlib.scrypt releases the GIL), which also
bounds the memory concurrent checks take (32 MiB each). `AuthFailure.reason` is the stable reason
of docs/protocol.md (`auth failure`); `detail` is for the server's log only and never holds a password.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from config.model import Authentication
from protocol.security.passwords import ANONYMOUS, PasswordFile, load_password_file

from . import audit

__all__ = [
    "ANONYMOUS",
    "AuthFailure",
    "Authenticator",
    "Backoff",
    "Identity",
    "LogonChecker",
    "OpenAuthenticator",
    "PasswordAuthenticator",
    "build_authenticator",
    "certificate_identity",
]

Method = Literal["password", "certificate", "token", "anonymous", "unverified"]
PeerCert = Mapping[str, Any]
"""A verified peer certificate as `ssl.SSLObject.getpeercert()` returns it."""


@dataclass(frozen=True)
class Identity:
    """A logged-on user. `method`: how it was established ("unverified" = no authentication
    configured: the name is what the client claimed)."""

    user: str
    method: Method


@dataclass(frozen=True)
class AuthFailure:
    """A refused logon. `reason` goes to the client; `detail` to the log only."""

    user: str | None
    detail: str
    reason: str = "auth failure"


class Authenticator(Protocol):
    """What the server asks about a logon. Implementations must be thread-safe for
    `authenticate` (it runs on worker threads) and must never log or keep a password."""

    def authenticate(
        self, user: str | None, password: str | None, peer_cert: PeerCert | None
    ) -> Identity | AuthFailure: ...

    def authenticate_http(self, authorization: str | None) -> Identity | AuthFailure | None:
        """An HTTP `Authorization` header (Basic or Bearer); None = no credentials given."""
        ...

    def reload(self) -> None:
        """Re-read what it depends on (SIGHUP). Raises and keeps the old state on a problem."""
        ...


def certificate_identity(peer_cert: PeerCert | None) -> str | None:
    """The user a verified client certificate names: the subject's commonName, else the first
    subjectAltName of type email, DNS or URI; None when it names nobody."""
    if not peer_cert:
        return None
    for rdn in peer_cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    for kind in ("email", "DNS", "URI"):
        for key, value in peer_cert.get("subjectAltName", ()):
            if key == kind and value:
                return str(value)
    return None


def parse_authorization(header: str) -> tuple[str, str, str] | None:
    """("basic", user, password) or ("bearer", "", token) from an Authorization header."""
    scheme, _, rest = header.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer" and rest:
        return ("bearer", "", rest)
    if scheme.lower() == "basic" and rest:
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        return ("basic", user, password) if sep and user else None
    return None


class OpenAuthenticator:
    """No `<Authentication>`: every logon is accepted as the user it claims."""

    def authenticate(
        self, user: str | None, password: str | None, peer_cert: PeerCert | None
    ) -> Identity | AuthFailure:
        return Identity(user or ANONYMOUS, "unverified")

    def authenticate_http(self, authorization: str | None) -> Identity | AuthFailure | None:
        return Identity(ANONYMOUS, "unverified")

    def reload(self) -> None:
        pass


class PasswordAuthenticator:
    """`<Authentication>`: the rules in the module docstring."""

    def __init__(self, settings: Authentication) -> None:
        self.settings = settings
        self.users: PasswordFile | None = None
        if settings.password_file is not None:
            self.users = load_password_file(settings.password_file)

    def reload(self) -> None:
        if self.settings.password_file is not None:
            self.users = load_password_file(self.settings.password_file)  # one atomic swap

    def authenticate(
        self, user: str | None, password: str | None, peer_cert: PeerCert | None
    ) -> Identity | AuthFailure:
        named = certificate_identity(peer_cert)
        if named is not None:
            if named == ANONYMOUS:
                return AuthFailure(user, f"the client certificate names {ANONYMOUS!r}")
            if user is not None and user != named:
                return AuthFailure(user, f"user_id differs from the certificate's user {named!r}")
            return Identity(named, "certificate")
        if user is None:
            if self.settings.allow_anonymous:
                return Identity(ANONYMOUS, "anonymous")
            return AuthFailure(None, "no user_id, and anonymous logons are not allowed")
        users = self.users
        if users is None:
            if self.settings.allow_anonymous:
                return Identity(ANONYMOUS, "anonymous")
            return AuthFailure(user, "no password file to check a user_id against")
        if password is None:
            return AuthFailure(user, "no password (pw) given")
        if users.verify_password(user, password):
            return Identity(user, "password")
        return AuthFailure(user, "wrong password" if user in users else "unknown user")

    def authenticate_http(self, authorization: str | None) -> Identity | AuthFailure | None:
        if not authorization:
            return None
        parsed = parse_authorization(authorization)
        if parsed is None:
            return AuthFailure(None, "malformed Authorization header")
        scheme, user, secret = parsed
        if scheme == "basic":
            return self.authenticate(user, secret, None)
        if self.users is None:
            return AuthFailure(None, "a bearer token, but no password file to check it")
        owner = self.users.verify_token(secret)
        if owner is None:
            return AuthFailure(None, "unknown or wrong bearer token")
        return Identity(owner, "token")


def build_authenticator(settings: Authentication | None) -> Authenticator:
    """The authenticator for a configuration's `<Authentication>` (None: none configured).
    Raises `PasswordFileError` when the password file does not load."""
    if settings is None:
        return OpenAuthenticator()
    return PasswordAuthenticator(settings)


# ----------------------------------------------------------------------------------------------
# Back-off


@dataclass
class _Peer:
    failures: int
    next_slot: float
    last_failure: float


@dataclass(eq=False)
class Backoff:
    """Slows down repeated logon failures from one peer address.

    After `k` failures in a row, the peer's attempts are checked no more often than one per
    `min(cap, base * 2**(k-1))` seconds: `reserve` hands each attempt the next free slot and
    says how long to wait for it, so parallel connections from one address are serialized, not
    multiplied. An attempt whose slot is more than `cap` seconds away is refused outright. A
    success forgets the peer; so does `forget_after` seconds without a failure. Memory is bounded:
    at most `max_peers` addresses are remembered, the least recently failed dropped first (a
    dropped peer starts again from no failures: the price of the bound).

    State of one peer: unknown (no entry) -> failing (k >= 1, slots spaced) -> unknown (success,
    quiet for `forget_after`, or evicted).
    """

    base: float = 0.25
    cap: float = 30.0
    forget_after: float = 600.0
    max_peers: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _peers: OrderedDict[str, _Peer] = field(default_factory=OrderedDict, init=False)

    def __len__(self) -> int:
        return len(self._peers)

    def interval(self, failures: int) -> float:
        return min(self.cap, self.base * 2 ** min(failures - 1, 64)) if failures > 0 else 0.0

    def _get(self, peer: str, now: float) -> _Peer | None:
        entry = self._peers.get(peer)
        if entry is not None and now - entry.last_failure > self.forget_after:
            del self._peers[peer]
            return None
        return entry

    def reserve(self, peer: str) -> float | None:
        """Seconds the attempt from `peer` must wait before it is checked; None = refuse it now
        (the peer's queue of attempts is already `cap` seconds long)."""
        now = self.clock()
        entry = self._get(peer, now)
        if entry is None:
            return 0.0
        slot = max(now, entry.next_slot)
        wait = slot - now
        if wait > self.cap:
            return None
        entry.next_slot = slot + self.interval(entry.failures)
        return wait

    def failure(self, peer: str) -> float:
        """Record a failed logon; returns the interval now applied to the peer."""
        now = self.clock()
        entry = self._get(peer, now)
        if entry is None:
            entry = self._peers[peer] = _Peer(0, now, now)
        entry.failures += 1
        entry.last_failure = now
        interval = self.interval(entry.failures)
        entry.next_slot = max(entry.next_slot, now + interval)
        self._peers.move_to_end(peer)
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
        return interval

    def success(self, peer: str) -> None:
        self._peers.pop(peer, None)


# ----------------------------------------------------------------------------------------------
# The check a connection awaits


def peer_address(peer: str) -> str:
    """The address part of `host:port` / `[v6]:port`, which is what back-off is keyed by."""
    if peer.startswith("["):
        return peer[1:].partition("]")[0]
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else peer


class LogonChecker:
    """Checks logons off the event loop, with back-off and an audit line for each outcome.

    `peer` is the connection's `host:port`; back-off applies to its address. `close()` stops the
    worker threads (at shutdown).
    """

    def __init__(
        self,
        authenticator: Authenticator,
        backoff: Backoff | None = None,
        workers: int = 2,
    ) -> None:
        self.authenticator = authenticator
        self.backoff = backoff if backoff is not None else Backoff()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tt-auth")

    async def check(
        self,
        peer: str,
        user: str | None,
        password: str | None,
        peer_cert: PeerCert | None = None,
        transport: str | None = None,
    ) -> Identity | AuthFailure:
        """The identity of a logon, or why it is refused (logged to the audit trail either way)."""
        result = await self._guarded(
            peer, user, lambda: self.authenticator.authenticate(user, password, peer_cert)
        )
        if isinstance(result, Identity):
            audit.logon(peer, result.user, result.method, transport)
        else:
            audit.logon_failure(peer, result.user, result.detail, transport)
        return result

    async def check_http(
        self, peer: str, authorization: str | None
    ) -> Identity | AuthFailure | None:
        """As `check`, for an admin endpoint request; None = no credentials (answer 401)."""
        if not authorization:
            return None
        result = await self._guarded(
            peer, None, lambda: self.authenticator.authenticate_http(authorization)
        )
        if isinstance(result, AuthFailure):
            audit.logon_failure(peer, result.user, result.detail, "admin")
        return result

    async def _guarded(self, peer: str, user: str | None, work: Callable[[], Any]) -> Any:
        address = peer_address(peer)
        wait = self.backoff.reserve(address)
        if wait is None:
            return AuthFailure(user, "too many failed logons from this address; backing off")
        if wait > 0:
            await asyncio.sleep(wait)
        result = await asyncio.get_running_loop().run_in_executor(self._pool, work)
        if isinstance(result, AuthFailure):
            self.backoff.failure(address)
        elif isinstance(result, Identity):
            self.backoff.success(address)
        return result

    def reload(self) -> None:
        self.authenticator.reload()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
