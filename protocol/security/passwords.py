"""The password file: users, their memory-hard password hashes, and admin bearer tokens.

This module owns the format; nothing else reads or writes these files. `tickertape passwd`
(`server.security.passwd_cli`) edits them; the password-file authenticator reads them.

Format (UTF-8 text, one line per user, `#` comment lines and blank lines ignored)::

    # tickertape password file: written by `tickertape passwd`, mode 0600
    alice:scrypt$32768$8$1$SALT$DIGEST
    root:scrypt$32768$8$1$SALT$DIGEST:token=scrypt$32768$8$1$SALT$DIGEST
    monitor:!:token=scrypt$32768$8$1$SALT$DIGEST

    line    = USER ":" PASSWORD { ":" FIELD }
    USER    = 1..1024 bytes of UTF-8, no ":", no whitespace, no control character, not
              starting with "#", not "anonymous" (the name anonymous logons get)
    PASSWORD = HASH | "!"                "!" = no password: password logons always fail
    FIELD   = "token=" HASH              the admin bearer token's hash (`passwd --token`)
    HASH    = "scrypt$" N "$" r "$" p "$" SALT "$" DIGEST
              N, r, p: scrypt's cost, block size and parallelism, decimal; N a power of two
              SALT: 16 random bytes, DIGEST: 32 bytes, both base64 without padding

Hashes are `hashlib.scrypt` (RFC 7914, memory-hard: 128 * N * r bytes per check, 32 MiB with
the defaults), each with its own random salt and its parameters stored beside it, so the
defaults can be raised later without invalidating existing lines. The defaults (N=2**15, r=8,
p=1) cost about 50 ms per check on a small server core. Digests are compared with
`hmac.compare_digest`; checking an unknown user costs the same as a known one.

Bearer tokens are `tt1.<user, base64url>.<32 random bytes, base64url>`: the user part finds the
line, the secret is checked against its scrypt hash like a password. The file never holds a
password or a token in the clear; a lost token is replaced by issuing a new one.

Writes are atomic: the new content goes to a temporary file in the same directory, is fsync'd,
given mode 0600 and renamed over the old file (then the directory is fsync'd); a writer holds an
exclusive `flock` on the directory meanwhile, so two `tickertape passwd` runs cannot lose each
other's change. A damaged line is reported as `PasswordFileError(path, line, reason)`.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import hmac
import os
import secrets
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace

__all__ = [
    "ANONYMOUS",
    "DEFAULT_PARAMS",
    "MAX_PASSWORD_BYTES",
    "MAX_USER_BYTES",
    "PasswordFile",
    "PasswordFileError",
    "ScryptParams",
    "UserEntry",
    "check_user_name",
    "delete_user",
    "hash_secret",
    "issue_token",
    "load_password_file",
    "parse_token",
    "set_password",
    "set_token",
    "verify_secret",
]

ANONYMOUS = "anonymous"
MAX_USER_BYTES = 1024  # the protocol's limit on user_id (docs/protocol.md, protocol/headers.py)
MAX_PASSWORD_BYTES = 4096
MAX_FILE_BYTES = 64 << 20
TOKEN_PREFIX = "tt1"
_SALT_BYTES = 16
_DIGEST_BYTES = 32
_NO_PASSWORD = "!"
_HEADER = "# tickertape password file: written by `tickertape passwd`; keep it mode 0600\n"


@dataclass(frozen=True)
class ScryptParams:
    """scrypt's cost parameters. Bounded when read from a file, so a damaged or hostile line
    cannot make one check take gigabytes."""

    n: int = 1 << 15
    r: int = 8
    p: int = 1

    @property
    def memory(self) -> int:
        return 128 * self.n * self.r * self.p

    def check(self) -> None:
        if self.n < 2 or self.n & (self.n - 1):
            raise ValueError(f"scrypt N={self.n} is not a power of two above 1")
        if not 1 <= self.r <= 64 or not 1 <= self.p <= 16:
            raise ValueError(f"scrypt r={self.r} p={self.p} out of range (r 1..64, p 1..16)")
        if self.memory > 1 << 30:
            raise ValueError(f"scrypt parameters need {self.memory >> 20} MiB; at most 1024")


DEFAULT_PARAMS = ScryptParams()


class PasswordFileError(Exception):
    """A password file that cannot be read, or a damaged line in it (`line` 0: the whole file)."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line else path
        super().__init__(f"password file {where}: {reason}")


@dataclass(frozen=True)
class UserEntry:
    """One user's line: the password hash (None = no password) and the token hash, if any."""

    user: str
    password: str | None
    token: str | None = None

    def format(self) -> str:
        fields = [self.user, self.password or _NO_PASSWORD]
        if self.token is not None:
            fields.append(f"token={self.token}")
        return ":".join(fields)


class PasswordFile:
    """The users of one file, as loaded (immutable: reload builds a new one)."""

    def __init__(self, path: str, users: Mapping[str, UserEntry]) -> None:
        self.path = path
        self.users = dict(users)

    def __len__(self) -> int:
        return len(self.users)

    def __contains__(self, user: object) -> bool:
        return user in self.users

    def verify_password(self, user: str, password: str) -> bool:
        """Whether `password` is `user`'s. Costs one scrypt whether or not the user exists."""
        entry = self.users.get(user)
        if entry is None or entry.password is None:
            _dummy_check(password)
            return False
        return verify_secret(entry.password, password)

    def verify_token(self, token: str) -> str | None:
        """The user a bearer token belongs to, or None (malformed, unknown, wrong)."""
        parsed = parse_token(token)
        if parsed is None:
            _dummy_check(token)
            return None
        user, secret = parsed
        entry = self.users.get(user)
        if entry is None or entry.token is None:
            _dummy_check(secret)
            return None
        return user if verify_secret(entry.token, secret) else None


# ----------------------------------------------------------------------------------------------
# Hashes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_secret(secret: str, params: ScryptParams = DEFAULT_PARAMS) -> str:
    """`scrypt$N$r$p$SALT$DIGEST` for `secret`, with a fresh random salt."""
    params.check()
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(secret.encode("utf-8"), salt, params)
    return f"scrypt${params.n}${params.r}${params.p}${_b64(salt)}${_b64(digest)}"


def _scrypt(secret: bytes, salt: bytes, params: ScryptParams) -> bytes:
    return hashlib.scrypt(
        secret,
        salt=salt,
        n=params.n,
        r=params.r,
        p=params.p,
        maxmem=params.memory + (1 << 20),
        dklen=_DIGEST_BYTES,
    )


def _parse_hash(text: str) -> tuple[ScryptParams, bytes, bytes]:
    parts = text.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("a hash is scrypt$N$r$p$SALT$DIGEST")
    try:
        params = ScryptParams(int(parts[1]), int(parts[2]), int(parts[3]))
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except (ValueError, binascii.Error):
        raise ValueError("a hash has a number or base64 field that does not parse") from None
    params.check()
    if len(salt) < 8 or len(digest) != _DIGEST_BYTES:
        raise ValueError(f"a hash needs a salt of 8+ bytes and a {_DIGEST_BYTES}-byte digest")
    return params, salt, digest


def verify_secret(stored: str, secret: str) -> bool:
    """Whether `secret` hashes to `stored` (a HASH of the format), in constant time."""
    params, salt, digest = _parse_hash(stored)
    data = secret.encode("utf-8", "surrogatepass")
    fits = len(data) <= MAX_PASSWORD_BYTES  # longer than any stored secret: hash a prefix, fail
    same = hmac.compare_digest(_scrypt(data[:MAX_PASSWORD_BYTES], salt, params), digest)
    return same and fits


# a hash no secret matches in practice, at the default cost
_DUMMY = "scrypt${}${}${}${}${}".format(
    DEFAULT_PARAMS.n, DEFAULT_PARAMS.r, DEFAULT_PARAMS.p, _b64(b"\0" * 16), _b64(b"\0" * 32)
)


def _dummy_check(secret: str) -> None:
    """Spend what checking a real user costs, so a response time does not tell whether a user
    exists."""
    verify_secret(_DUMMY, secret)


# ----------------------------------------------------------------------------------------------
# Tokens


def issue_token(user: str) -> tuple[str, str]:
    """A new bearer token for `user` and the hash to store: (token, hash)."""
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    name = base64.urlsafe_b64encode(user.encode("utf-8")).decode("ascii").rstrip("=")
    return f"{TOKEN_PREFIX}.{name}.{secret}", hash_secret(secret)


def parse_token(token: str) -> tuple[str, str] | None:
    """(user, secret) from a token, None when it does not have the token's shape."""
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[2]:
        return None
    try:
        user = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)).decode("utf-8")
    except (ValueError, binascii.Error):
        return None
    return (user, parts[2]) if user else None


# ----------------------------------------------------------------------------------------------
# Reading


def check_user_name(user: str) -> str:
    """`user` if it can be a line's USER; ValueError saying why not."""
    if not user:
        raise ValueError("a user name is empty")
    if len(user.encode("utf-8", "surrogatepass")) > MAX_USER_BYTES:
        raise ValueError(f"a user name is at most {MAX_USER_BYTES} bytes")
    if ":" in user or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in user):
        raise ValueError(f"user name {user!r} has ':', whitespace or a control character")
    if user.startswith("#"):
        raise ValueError(f"user name {user!r} starts with '#'")
    if user == ANONYMOUS:
        raise ValueError(f"{ANONYMOUS!r} is the name anonymous logons get; choose another")
    return user


def _parse_line(text: str) -> UserEntry:
    fields = text.split(":")
    if len(fields) < 2:
        raise ValueError("expected USER:HASH")
    user = check_user_name(fields[0])
    password = None if fields[1] == _NO_PASSWORD else fields[1]
    if password is not None:
        _parse_hash(password)
    token = None
    for field in fields[2:]:
        key, sep, value = field.partition("=")
        if key != "token" or not sep:
            raise ValueError(f"unknown field {field[:40]!r}; only token=HASH may follow the hash")
        if token is not None:
            raise ValueError("token= is given twice")
        _parse_hash(value)
        token = value
    return UserEntry(user, password, token)


def load_password_file(path: str | os.PathLike[str]) -> PasswordFile:
    """Read and check a whole file. Raises `PasswordFileError` naming the first damaged line,
    or the file when it cannot be read. An empty file is valid (no user can log on)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise PasswordFileError(
            source, 0, "not found; create it with `tickertape passwd FILE USER`"
        ) from None
    except OSError as e:
        raise PasswordFileError(
            source, 0, f"cannot be read ({e.strerror or e}); make it readable by the server"
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise PasswordFileError(source, 0, f"is larger than {MAX_FILE_BYTES >> 20}MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_line = data[: e.start].count(b"\n") + 1
        raise PasswordFileError(source, bad_line, "is not UTF-8") from None
    users: dict[str, UserEntry] = {}
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        try:
            entry = _parse_line(line)
        except ValueError as e:
            raise PasswordFileError(
                source, number, f"{e}; fix or delete the line (`tickertape passwd --delete`)"
            ) from None
        if entry.user in users:
            raise PasswordFileError(source, number, f"user {entry.user!r} is given twice")
        users[entry.user] = entry
    return PasswordFile(source, users)


# ----------------------------------------------------------------------------------------------
# Writing


def set_password(
    path: str | os.PathLike[str], user: str, password: str, params: ScryptParams = DEFAULT_PARAMS
) -> bool:
    """Add `user` or change its password (keeping its token). True when the user was added."""
    check_user_name(user)
    _check_password(password)
    hashed = hash_secret(password, params)
    with _locked(path) as users:
        old = users.get(user)
        users[user] = replace(old, password=hashed) if old else UserEntry(user, hashed)
    return old is None


def set_token(path: str | os.PathLike[str], user: str) -> str:
    """Issue a new bearer token for `user` (created without a password if absent); returns it.
    The token replaces any earlier one of that user."""
    check_user_name(user)
    token, hashed = issue_token(user)
    with _locked(path) as users:
        old = users.get(user)
        users[user] = replace(old, token=hashed) if old else UserEntry(user, None, hashed)
    return token


def delete_user(path: str | os.PathLike[str], user: str) -> bool:
    """Remove `user`; False when there was no such user (the file is then left as it was)."""
    with _locked(path, create=False) as users:
        return users.pop(user, None) is not None


def _check_password(password: str) -> None:
    if not password:
        raise ValueError("the password is empty")
    if len(password.encode("utf-8", "surrogatepass")) > MAX_PASSWORD_BYTES:
        raise ValueError(f"the password is longer than {MAX_PASSWORD_BYTES} bytes")


@contextmanager
def _locked(path: str | os.PathLike[str], create: bool = True) -> Iterator[dict[str, UserEntry]]:
    """The file's users to change in place, written back atomically when the block ends
    without an exception (and only if they changed)."""
    source = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(source))
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        exists = os.path.exists(source)
        if not exists and not create:
            raise PasswordFileError(source, 0, "not found")
        users = load_password_file(source).users if exists else {}
        before = dict(users)
        yield users
        if users != before or not exists:
            _write(source, directory, users.values())
            os.fsync(dfd)  # the rename is durable before the lock goes
    finally:
        os.close(dfd)  # releases the lock


def _write(source: str, directory: str, entries: Iterable[UserEntry]) -> None:
    text = _HEADER + "".join(f"{e.format()}\n" for e in entries)
    fd, tmp = tempfile.mkstemp(prefix=".passwd-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, source)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
