"""TLS on a `tcps` transport: accept plain TCP, then upgrade with `loop.start_tls`.

Why not `create_server(ssl=...)`: asyncio then runs the handshake inside the transport, and a
handshake that fails (a plaintext client, a certificate from an untrusted CA, an expired one, no
client certificate under `<VerifyClient>true`) is dropped silently, logged only in debug mode,
and the protocol never hears of it. Upgrading ourselves, the failure is an exception here: it is
logged with the peer and the reason (`describe_handshake_error`), counted (`tls_refused` in
/stats), and the server goes on serving. Works the same on uvloop.

A connection on a `tcps` transport:

    accepted (raw TCP, not read) --admitted--> handshaking --done--> Connection (connection.py)
        |                            |
        +--a limit refuses: closed   +--fails or takes longer than <LogonTimeout>: logged, closed

The `Connection` gets the TLS transport as if it had been accepted with it, and its session the
verified client certificate (`peercert`), which is how mutual TLS names the user.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

from protocol.security.tls import describe_handshake_error

from .connection import Connection, ConnectionEnv, peer_of
from .security.authenticator import peer_address

__all__ = ["TlsAcceptor"]

log = logging.getLogger("tickertape.connection")


@dataclass(eq=False)
class TlsAcceptor:
    """The TLS side of one `tcps` listener: its context and the handshakes in progress."""

    env: ConnectionEnv
    transport_name: str
    max_frame: int
    context: ssl.SSLContext
    handshake_timeout: float
    handshakes: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def protocol(self) -> asyncio.Protocol:
        """The protocol factory for `loop.create_server`."""
        return _Handshake(self)

    def cancel(self) -> None:
        """Shutdown: drop the handshakes in progress."""
        for task in list(self.handshakes):
            task.cancel()

    async def upgrade(self, hs: _Handshake) -> None:
        env = self.env
        raw, peer, address = hs.transport, hs.peer, hs.address
        if hs.gone:  # the peer left before its handshake began
            env.admission.release(address, False)
            return
        conn = Connection(env, self.transport_name, self.max_frame, admitted=address)
        loop = asyncio.get_running_loop()
        if hs.early:
            # start_tls sets its protocol now and schedules its connection_made: bytes read
            # before (see _Handshake) go into it first, in this order
            loop.call_soon(_feed, raw, b"".join(hs.early))
        try:
            transport = await loop.start_tls(
                raw,
                conn,
                self.context,
                server_side=True,
                ssl_handshake_timeout=self.handshake_timeout,
            )
        except asyncio.CancelledError:
            raw.abort()
            env.admission.release(address, False)
            raise
        except Exception as exc:  # ssl.SSLError, a reset, the handshake timeout...
            env.counters.tls_refused += 1
            log.warning(
                "tls: handshake with %s on transport %s refused: %s",
                peer,
                self.transport_name,
                describe_handshake_error(exc),
            )
            raw.abort()
            env.admission.release(address, False)
            return
        if conn.lost:  # the peer went away as the handshake completed
            env.admission.release(address, False)
            return
        conn.connection_made(transport)


def _feed(raw: Any, data: bytes) -> None:
    """Hand bytes read before `start_tls` took over to its protocol, which keeps what arrives
    before its connection_made for the handshake (asyncio's and uvloop's alike)."""
    protocol = raw.get_protocol()
    view = memoryview(data)
    while view:
        buf = protocol.get_buffer(len(view))
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]


class _Handshake(asyncio.Protocol):
    """A raw connection of a `tcps` transport until `start_tls` takes it over: admitted (or
    refused by a limit), its handshake started as a task.

    uvloop starts reading after `connection_made` returns, whatever it paused, so the first
    bytes (the ClientHello) may arrive here before the task runs: they are kept (`early`), and
    reading stops until the TLS protocol takes them.
    """

    def __init__(self, acceptor: TlsAcceptor) -> None:
        self.acceptor = acceptor
        self.transport: Any = None
        self.peer = "?"
        self.address = "?"
        self.early: list[bytes] = []
        self.gone = False

    def connection_made(self, transport: Any) -> None:
        acceptor = self.acceptor
        self.transport = transport
        self.peer = peer_of(transport)
        self.address = peer_address(self.peer)
        if not acceptor.env.admission.admit(self.address, self.peer, acceptor.transport_name):
            self.gone = True
            transport.abort()
            return
        transport.pause_reading()  # effective on asyncio; uvloop reads anyway (see above)
        task = asyncio.get_running_loop().create_task(acceptor.upgrade(self))
        acceptor.handshakes.add(task)
        task.add_done_callback(acceptor.handshakes.discard)

    def data_received(self, data: bytes) -> None:
        self.early.append(data)
        self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close; the task sees `gone`

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
