"""One client connection: the TCP transport, its bytes in and out, heartbeats, close.

`ClientConnection` is the first collaborator a `Client` (client/client.py) makes; the others
(client_commands.py, client_subscribe.py, client_publish.py, client_sow.py) are handed it. It
owns:

- the transport and its state: `new | connected | logged_on | closed` (the diagram is in
  client/client.py), why it closed (`closed_exc`) and the future `wait_closed()` awaits;
- the outgoing bytes: every frame goes through `write`, which coalesces what one event-loop
  iteration writes into one `transport.write` (at once past 256 KiB); `write_paused` follows
  the transport's high-water mark (4 MiB) and `wait_writable()` waits for it to drain;
- the incoming bytes: a `FrameDecoder`; decoded frames go to `on_frames`, and a bad frame
  aborts the connection with reason `bad frame`; reading is paused by `pause_reading()` while
  a subscription's buffer is full;
- client-side heartbeats (`start_heartbeat`).

It is handed two callables: `on_frames(frames)` routes the frames decoded from one read, and
`on_closed(err)` fails whatever waits on the connection when it closes (called once, after the
outgoing bytes are dropped and before blocked writers wake up).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
from collections.abc import Callable
from typing import cast

from protocol.framing import FrameDecoder, FrameError, encode_frame
from protocol.headers import Header

from .address import parse_server
from .errors import ClientError, ConnectFailed, Disconnected

__all__ = ["ClientConnection"]

log = logging.getLogger("tickertape.client")

_OUT_LIMIT = 256 * 1024  # coalesced bytes written at once instead of at the end of the iteration
_WRITE_HIGH = 4 * 1024 * 1024  # transport buffer high-water mark: above it publish() waits
_TLS_PORT = (
    "before answering the logon, as a TLS port does with a plain connection: if this is a "
    "tcps transport, connect with tcps://HOST:PORT/"
)
BEAT = encode_frame(Header(c="heartbeat", o="beat"))
"""The `beat` frame: sent on a timer and in answer to each server heartbeat."""


Frames = list[tuple[Header, bytes]]


class ClientConnection:
    """The transport, the bytes in and out, heartbeats and close of one `Client` connection.
    See the module docstring for what it owns. It is its transport's protocol (the methods of
    asyncio.Protocol, by duck typing: a part inherits nothing): a Client connects once, so
    the transport events come here directly."""

    loop: asyncio.AbstractEventLoop
    """The running loop, set by connect(): every method that uses it runs after connect()."""

    def __init__(
        self,
        server: str | None,
        max_message_size: int,
        tls: ssl.SSLContext | None,
        on_frames: Callable[[Frames], None],
        on_closed: Callable[[Disconnected], None],
    ) -> None:
        self._on_frames = on_frames
        self._on_closed = on_closed
        self.server = server
        self.tls = tls  # for tcps:// addresses; None: client/tls.py's default context
        self._decoder = FrameDecoder(max_message_size)
        self.transport: asyncio.Transport | None = None
        self.state = "new"  # new | connected | logged_on | closed
        self._plain = True  # no TLS on this connection
        self._rx_any = False  # anything received yet
        self.closed_exc: Disconnected | None = None
        self._closing_reason: tuple[str, str] | None = None  # set when we close or abort
        self.server_failure: tuple[str, str] | None = None  # a failure the server closes after
        self.user_closed = False
        self._lost: asyncio.Future | None = None
        self.reading_paused = False
        self.write_paused = False
        self._drain_fut: asyncio.Future | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._hb_task: asyncio.Task | None = None
        self._last_rx = 0.0

    # ================================================================ connection

    async def connect(self, address: str | None = None, *, timeout: float = 10.0) -> None:
        """Client.connect() (client/client.py says what it takes and raises)."""
        if self.state != "new":
            raise ClientError(f"connect() on a {self.state} client; a Client is one connection")
        address = address or self.server
        if not address:
            raise ValueError("no server address: pass connect('host:port') or Client(server=...)")
        host, port, tls = parse_server(address)
        self.server = address
        loop = self.loop = asyncio.get_running_loop()
        self._lost = loop.create_future()
        ctx = None
        self._plain = not tls
        if tls:
            ctx = self.tls
            if ctx is None:
                from .tls import tls_context

                ctx = self.tls = tls_context()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: cast(asyncio.Protocol, self),
                    host,
                    port,
                    ssl=ctx,
                    server_hostname=host if ctx is not None else None,
                )
        except TimeoutError:
            raise ConnectFailed(address, f"no answer within {timeout:g}s") from None
        except OSError as exc:
            # several addresses (localhost: ::1 and 127.0.0.1) fail as one plain OSError
            refused = isinstance(exc, ConnectionRefusedError)
            refused = refused or f"[Errno {errno.ECONNREFUSED}]" in str(exc)
            reason = "connection refused" if refused else (exc.strerror or str(exc))
            if isinstance(exc, ssl.SSLError):
                reason = f"TLS handshake failed: {exc.reason or exc}"
                if isinstance(exc, ssl.SSLCertVerificationError):
                    reason += f" ({exc.verify_message}; give the server's CA file)"
            raise ConnectFailed(address, reason) from None

    async def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered, close the connection and wait until it is closed.

        Does not wait for persisted acks: call publish_flush() first for that. Subscriptions
        stop cleanly after their buffered messages; pending commands fail with Disconnected.
        """
        transport = self.transport
        if transport is None:
            if self.state != "closed":
                self._mark_closed(Disconnected("closed by client"))
            return
        self.user_closed = True
        if self._closing_reason is None:
            self._closing_reason = ("closed by client", "")
        self._flush_out()
        transport.close()
        lost = self._lost
        assert lost is not None, "connect() makes it before there is a transport"
        try:
            await asyncio.wait_for(asyncio.shield(lost), timeout)
        except TimeoutError:
            # the peer does not read what is buffered: drop it instead of waiting forever
            transport.abort()
            await lost

    def abort(self, reason: str, detail: str = "") -> None:
        """Drop the connection at once (nothing buffered is sent): pending commands and
        subscriptions fail with Disconnected(`reason`), as when the connection is lost (a bad
        frame from the server, a silent server, or the application's call)."""
        if self._closing_reason is None:
            self._closing_reason = (reason, detail)
        log.warning("closing connection to %s: %s (%s)", self.server, reason, detail)
        if self.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> Disconnected | None:
        """Wait until the connection ends; returns why (None if it never opened)."""
        if self._lost is not None:
            await asyncio.shield(self._lost)
        return self.closed_exc

    # ================================================================ heartbeats

    async def send_heartbeat(self) -> None:
        """Send one `beat` now."""
        if self.state != "logged_on":
            raise self.not_ready("heartbeat")
        self.write(BEAT)
        if self.write_paused:
            await self.wait_writable()

    def start_heartbeat(self, interval: float, timeout: float | None = None) -> None:
        """Ask the server for heartbeats every `interval` seconds, beat at that pace, and close
        with reason `heartbeat` when the server is silent for `timeout` seconds (default two
        intervals; the server closes a client silent for two intervals whatever this is)."""
        if self.state != "logged_on":
            raise self.not_ready("heartbeat")
        if not interval >= 0.01:
            raise ValueError(f"heartbeat interval must be >= 0.01 seconds, got {interval!r}")
        if timeout is None:
            timeout = 2 * interval
        elif not timeout > 0:
            raise ValueError(f"heartbeat timeout must be > 0 seconds, got {timeout!r}")
        text = f"{interval:.3f}".rstrip("0").rstrip(".")
        self.write(encode_frame(Header(c="heartbeat", o=f"start,{text}")))
        self._last_rx = self.loop.time()
        if self._hb_task is not None:
            self._hb_task.cancel()
        self._hb_task = self.loop.create_task(self._heartbeat_loop(interval, timeout))

    async def _heartbeat_loop(self, interval: float, timeout: float) -> None:
        loop = self.loop
        next_beat = loop.time() + interval
        tick = min(interval, timeout) / 2
        while self.transport is not None:
            await asyncio.sleep(tick)
            now = loop.time()
            if self.reading_paused:
                self._last_rx = now  # we stopped reading; the server is not the silent one
            elif now - self._last_rx > timeout:
                self.abort(
                    "heartbeat",
                    f"no bytes from the server for {now - self._last_rx:.1f}s "
                    f"(heartbeat interval {interval:g}s, timeout {timeout:g}s); check the "
                    "server and the network",
                )
                return
            if now >= next_beat and self.transport is not None:
                self.write(BEAT)
                next_beat = now + interval

    # ================================================================ flow control

    def pause_reading(self) -> bool:
        """Stop reading from the socket (a subscription's buffer is full); False if it was
        already stopped or there is no connection."""
        if self.reading_paused or self.transport is None:
            return False
        self.reading_paused = True
        self.transport.pause_reading()
        return True

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()
                self._last_rx = self.loop.time()  # silence while paused was ours

    # ================================================================ writing

    def not_ready(self, what: str) -> ClientError:
        if self.state == "closed":
            return self.closed_exc or Disconnected("closed by client")
        if self.state == "new":
            return ClientError(f"{what}: not connected; call await client.connect(address) first")
        return ClientError(f"{what}: not logged on; call await client.logon() first")

    def write(self, data: bytes) -> None:
        if self.transport is None:
            raise self.not_ready("write")
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _OUT_LIMIT:
            self._flush_out()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_out)

    def _flush_out(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_bytes = 0
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def wait_writable(self) -> None:
        while self.write_paused:
            if self.transport is None:
                raise self.not_ready("write")
            fut = self._drain_fut
            if fut is None or fut.done():
                fut = self._drain_fut = self.loop.create_future()
            await asyncio.shield(fut)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        fut, self._drain_fut = self._drain_fut, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ================================================================ internals: transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # a TCP transport
        self._rx_any = False
        self.state = "connected"
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        self._last_rx = self.loop.time()

    def data_received(self, data: bytes) -> None:
        self._last_rx = self.loop.time()
        if not self._rx_any:
            self._rx_any = True
            # a TLS record (alert 0x15, handshake 0x16; version 3.x) where a frame should be
            if self._plain and len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 3:
                self.abort("closed by server", _TLS_PORT)
                return
        # the client's decoder has neither refuse_fields nor group: every body is bytes
        try:
            frames = cast(Frames, self._decoder.feed(data))
        except FrameError as exc:
            self._on_frames(cast(Frames, exc.frames))
            self.abort("bad frame", f"from the server: {exc}")
            return
        self._on_frames(frames)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._closing_reason is not None:
            reason, detail = self._closing_reason
        elif self.server_failure is not None:
            # the server closes after a failure it could not attribute (`bad frame`,
            # `logon required`): that reason is the disconnect reason (docs/protocol.md §9)
            reason, detail = self.server_failure
        elif exc is None:
            reason, detail = "closed by server", ""
            if self.state == "connected" and self._plain and not self._rx_any:
                detail = _TLS_PORT  # closed before it said anything: as a tcps port does
        else:
            reason, detail = "connection lost", str(exc) or type(exc).__name__
        self._mark_closed(Disconnected(reason, detail))

    def _mark_closed(self, err: Disconnected) -> None:
        self.transport = None
        self.state = "closed"
        self.closed_exc = err
        self._out.clear()
        self._out_bytes = 0
        self._on_closed(err)
        self.resume_writing()  # blocked publishers wake up and see the closed state
        if self._hb_task is not None:
            self._hb_task.cancel()
            self._hb_task = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
