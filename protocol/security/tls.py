"""TLS contexts: the server side of a `tcps` transport or the admin endpoint, and our client side.

    server_context(ServerTls) -> ssl.SSLContext       build, checking every file
    reload_server_context(ctx, ServerTls)              re-read the files INTO ctx (SIGHUP)
    client_context(ca_file=, certificate=, ...)        for client/ and tests
    describe_handshake_error(exc) -> str               one log line for a refused handshake

Every problem raises `TlsError`, which names the configuration element, the file, what is wrong
and what to do; the configuration loader reports the same errors with the element's line.

Why reload into the same object: an asyncio server (`loop.create_server(ssl=ctx)`) keeps the
context it was created with and wraps each accepted socket with it; there is no supported way
to hand a running server a new context. OpenSSL copies the certificate and key from the context
into each connection when the connection is created, so loading a new chain into the same
context changes what every *later* handshake presents, while connections already established
keep theirs. The new files are first loaded into a scratch context, so a bad file (a key that
does not match, a truncated PEM) leaves the live context untouched. One limit: CA certificates
loaded into a context cannot be removed from it, so a reload can add trust (a new `<CAFile>`
content) but only a restart removes a CA that was dropped from the file.

Server defaults: TLS 1.2 or 1.3 only (`<MinimumVersion>`), no compression, no renegotiation,
the server's cipher preference, OpenSSL's default cipher list unless `<Ciphers>` gives one (an
OpenSSL cipher string; it governs TLS 1.2, while TLS 1.3 suites are OpenSSL's fixed secure set).
With `<CAFile>`, client certificates are requested and checked against it: required with
`<VerifyClient>true`, optional otherwise (a client that presents one is identified by it).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "MINIMUM_VERSIONS",
    "ServerTls",
    "TlsError",
    "check",
    "client_context",
    "describe_handshake_error",
    "reload_server_context",
    "server_context",
]

MINIMUM_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsError(Exception):
    """A TLS setting or file that cannot be used. `element` is the configuration element it came
    from (`Certificate`, `PrivateKey`, `CAFile`, `Ciphers`, `MinimumVersion`), `path` the file."""

    def __init__(self, element: str, path: str | None, reason: str) -> None:
        self.element = element
        self.path = path
        self.reason = reason
        where = f"{element} {path}" if path else element
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class ServerTls:
    """The TLS settings of one listening socket, as plain values (from `config.model.Transport`
    or `config.model.Admin`). Relative paths are relative to the working directory."""

    certificate: str
    private_key: str
    ca_file: str | None = None
    verify_client: bool = False
    minimum_version: str = "TLSv1.2"
    ciphers: str | None = None

    @classmethod
    def of(cls, section: Any) -> ServerTls:
        """From a config Transport or Admin that has a certificate and a key."""
        return cls(
            certificate=section.certificate,
            private_key=section.private_key,
            ca_file=getattr(section, "ca_file", None),
            verify_client=getattr(section, "verify_client", False),
            minimum_version=getattr(section, "minimum_version", "TLSv1.2"),
            ciphers=getattr(section, "ciphers", None),
        )


def server_context(tls: ServerTls) -> ssl.SSLContext:
    """A server context for `tls`. Raises `TlsError` for the first problem found."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    _apply_settings(ctx, tls)
    _load_chain(ctx, tls.certificate, tls.private_key)
    _load_trust(ctx, tls)
    return ctx


def check(tls: ServerTls) -> list[TlsError]:
    """Every problem of `tls`, not only the first: the settings, the certificate and key, the
    CA file (each checked on its own, as the configuration loader reports them)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    errors: list[TlsError] = []

    def attempt(step: Callable[[], None]) -> None:
        try:
            step()
        except TlsError as e:
            errors.append(e)

    attempt(lambda: _apply_settings(ctx, tls))
    attempt(lambda: _readable("Certificate", tls.certificate))
    attempt(lambda: _readable("PrivateKey", tls.private_key))
    if not errors or all(e.element not in ("Certificate", "PrivateKey") for e in errors):
        attempt(lambda: _load_chain(ctx, tls.certificate, tls.private_key))
    attempt(lambda: _load_trust(ctx, tls))
    return errors


def reload_server_context(ctx: ssl.SSLContext, tls: ServerTls) -> None:
    """Re-read `tls`'s files into the live `ctx` (see the module docstring for why the same
    object). Raises `TlsError` and leaves `ctx` as it was when a file is bad."""
    server_context(tls)  # everything checked on a scratch context first
    _apply_settings(ctx, tls)
    _load_chain(ctx, tls.certificate, tls.private_key)
    _load_trust(ctx, tls)


def client_context(
    ca_file: str | None = None,
    certificate: str | None = None,
    private_key: str | None = None,
    minimum_version: str = "TLSv1.2",
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context: the server's certificate is verified against `ca_file` (the system's
    trust store without one) and, with `check_hostname`, against the name connected to.
    `certificate`/`private_key`: the client certificate for mutual TLS."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = _version(minimum_version)
    ctx.check_hostname = check_hostname
    if ca_file is not None:
        _readable("CAFile", ca_file)
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except ssl.SSLError as e:
            raise TlsError("CAFile", ca_file, f"holds no PEM certificate ({_why(e)})") from None
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if certificate is not None:
        if private_key is None:
            raise TlsError("PrivateKey", None, "a client certificate needs its private key")
        _load_chain(ctx, certificate, private_key)
    return ctx


def describe_handshake_error(exc: BaseException) -> str:
    """What a failed server-side handshake means, for the log line the connection writes."""
    text = _why(exc) if isinstance(exc, ssl.SSLError) else str(exc) or type(exc).__name__
    lowered = text.lower()
    if "http request" in lowered or "wrong version number" in lowered:
        return f"not TLS: a plaintext client on a TLS port? ({text})"
    if "peer did not return a certificate" in lowered:
        return f"the client sent no certificate and this transport requires one ({text})"
    if "expired" in lowered:
        return f"a certificate has expired ({text})"
    if "unknown ca" in lowered or "certificate verify failed" in lowered:
        return f"a certificate is not signed by a trusted CA ({text})"
    if "unsupported protocol" in lowered or "protocol version" in lowered:
        return f"the client's TLS version is below <MinimumVersion> ({text})"
    return f"TLS handshake failed ({text})"


# ----------------------------------------------------------------------------------------------


def _version(name: str) -> ssl.TLSVersion:
    version = MINIMUM_VERSIONS.get(name)
    if version is None:
        raise TlsError("MinimumVersion", None, f"{name!r} is not allowed; use TLSv1.2 or TLSv1.3")
    return version


def _apply_settings(ctx: ssl.SSLContext, tls: ServerTls) -> None:
    ctx.minimum_version = _version(tls.minimum_version)
    if tls.ciphers is not None:
        try:
            ctx.set_ciphers(tls.ciphers)
        except ssl.SSLError:
            raise TlsError(
                "Ciphers",
                None,
                f"OpenSSL selects no cipher from {tls.ciphers!r}; give an OpenSSL cipher "
                "string such as ECDHE+AESGCM:ECDHE+CHACHA20, or remove <Ciphers>",
            ) from None


def _readable(element: str, path: str) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except FileNotFoundError:
        raise TlsError(
            element,
            path,
            f"not found (looked in {os.path.abspath(path)}; relative paths are relative to "
            "the server's working directory: use ${TICKERTAPE_CONFIG_DIRECTORY})",
        ) from None
    except IsADirectoryError:
        raise TlsError(element, path, "is a directory; give the PEM file") from None
    except OSError as e:
        raise TlsError(
            element, path, f"cannot be read ({e.strerror or e}); make it readable by the server"
        ) from None


def _pem_has(path: str, marker: bytes) -> bool:
    with open(path, "rb") as f:
        return marker in f.read(1 << 20)


class _Encrypted(Exception):
    pass


def _no_passphrase() -> NoReturn:
    raise _Encrypted


def _load_chain(ctx: ssl.SSLContext, certificate: str, private_key: str) -> None:
    _readable("Certificate", certificate)
    _readable("PrivateKey", private_key)
    if not _pem_has(certificate, b"-----BEGIN CERTIFICATE-----"):
        raise TlsError(
            "Certificate", certificate, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )
    if not _pem_has(private_key, b"PRIVATE KEY-----"):
        raise TlsError(
            "PrivateKey", private_key, "holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
        )
    try:
        ctx.load_cert_chain(certificate, private_key, password=_no_passphrase)
    except _Encrypted:
        raise TlsError(
            "PrivateKey",
            private_key,
            "is encrypted with a passphrase, which the server cannot ask for; write it "
            "decrypted (openssl pkey -in KEY -out KEY.plain) and keep it mode 0600",
        ) from None
    except ssl.SSLError as e:
        why = _why(e)
        if "key values mismatch" in why.lower():
            raise TlsError(
                "PrivateKey",
                private_key,
                f"does not belong to the certificate {certificate}; give the key the "
                "certificate was issued for",
            ) from None
        raise TlsError(
            "Certificate", certificate, f"does not load with its key {private_key} ({why})"
        ) from None


def _load_trust(ctx: ssl.SSLContext, tls: ServerTls) -> None:
    if tls.ca_file is None:
        if tls.verify_client:
            raise TlsError(
                "CAFile", None, "<VerifyClient>true needs <CAFile>, the CA that signs clients"
            )
        ctx.verify_mode = ssl.CERT_NONE
        return
    _readable("CAFile", tls.ca_file)
    try:
        ctx.load_verify_locations(cafile=tls.ca_file)
    except ssl.SSLError as e:
        raise TlsError("CAFile", tls.ca_file, f"holds no PEM certificate ({_why(e)})") from None
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.verify_client else ssl.CERT_OPTIONAL


def _why(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        reason = getattr(e, "reason", None)
        if reason:
            detail = getattr(e, "verify_message", None)  # set on SSLCertVerificationError
            return str(reason).replace("_", " ").lower() + (f": {detail}" if detail else "")
        if len(e.args) > 1 and isinstance(e.args[1], str):
            return e.args[1]
    return str(e)
