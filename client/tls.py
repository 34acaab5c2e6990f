"""The client's TLS context for `tcps://` servers.

    tls_context(ca_file=None, certificate=None, private_key=None) -> ssl.SSLContext

The server's certificate is checked against `ca_file` (the system's trust store without one)
and against the host name connected to; TLS 1.2 at least. `certificate` and `private_key` are
the client certificate for a server that asks for one (mutual TLS: the certificate names the
user). Pass the context to `Client(tls=...)` or `HAClient(tls=...)`; it is used for `tcps://`
addresses only.
"""

from __future__ import annotations

import ssl

__all__ = ["tls_context"]


def tls_context(
    ca_file: str | None = None,
    certificate: str | None = None,
    private_key: str | None = None,
) -> ssl.SSLContext:
    """Raises OSError / ssl.SSLError for a file that does not load, ValueError for a client
    certificate without its key."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certificate is not None:
        if private_key is None:
            raise ValueError("a client certificate needs its private key")
        ctx.load_cert_chain(certificate, private_key)
    elif private_key is not None:
        raise ValueError("a private key without its client certificate")
    return ctx
