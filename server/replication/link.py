"""One replication link's connection, as both ends hold it: frames in (protocol/replication.py's
LinkDecoder), bytes out, heartbeats after 1 s idle, and death after 5 s of silence.

    open -> end(reason) -> closed

A link is ended once, with a reason that is logged by its owner (sender or receiver); every
await on a closed link raises LinkClosed with that reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from protocol.replication import LinkDecoder, LinkError, LinkFrame, encode_heartbeat

HEARTBEAT_IDLE = 1.0  # seconds without sending before a heartbeat
DEAD_AFTER = 5.0  # seconds without receiving anything before the link is dead
KEEPALIVE_TICK = 0.25  # how often the keepalive looks; nothing on the data path waits for it
READ_SIZE = 256 * 1024
_HEARTBEAT = encode_heartbeat()

__all__ = ["DEAD_AFTER", "HEARTBEAT_IDLE", "Link", "LinkClosed"]


class LinkClosed(Exception):
    """The link is closed; `reason` says why (peer closed, silent, bad frame, refused...)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Link:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.peer = peer
        self.decoder = LinkDecoder()
        now = time.monotonic()
        self.last_recv = now
        self.last_send = now
        self.reason: str | None = None  # set when closed
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def closed(self) -> bool:
        return self.reason is not None

    def start_keepalive(self) -> None:
        """Heartbeats and the silence timer from now on: each end starts them once the logon
        is answered (a heartbeat before the answer would reach the source in its place), and
        silence counts from here (the other end waited for that answer, sending nothing)."""
        self.last_recv = max(self.last_recv, time.monotonic())
        self._keepalive = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        while self.reason is None:
            await asyncio.sleep(KEEPALIVE_TICK)
            now = time.monotonic()
            if now - self.last_recv > DEAD_AFTER:
                self.end(f"silent for {DEAD_AFTER:.0f}s")
            elif now - self.last_send >= HEARTBEAT_IDLE:
                self.heartbeat()

    def heartbeat(self) -> None:
        self.send(_HEARTBEAT)

    def send(self, data: bytes) -> None:
        """LinkClosed on a link already ended. A transport that closed under the link (the
        peer went, and the loop refuses writes to a closed handle) ends it without raising:
        a send from a commit's callback (the receiver's ack) must not break the commit's other
        callbacks; the link's owner sees it closed at its next step."""
        if self.reason is not None:
            raise LinkClosed(self.reason)
        try:
            self.writer.write(data)
        except (RuntimeError, ConnectionError, OSError) as exc:
            self.end(f"write failed: {exc}")
            return
        self.last_send = time.monotonic()

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            self.end(f"write failed: {exc}")
        if self.reason is not None:
            raise LinkClosed(self.reason)

    async def read_frames(self) -> list[LinkFrame]:
        """The next frames that arrived (never an empty list); LinkClosed at the end."""
        while True:
            if self.reason is not None:
                raise LinkClosed(self.reason)
            try:
                data = await self.reader.read(READ_SIZE)
            except (ConnectionError, OSError) as exc:
                self.end(f"read failed: {exc}")
                continue
            if self.reason is not None:
                # ended while this read was being woken (a failed commit's callback): what it
                # read must not be handed on (the loop's top says why)
                continue
            if not data:
                self.end(self.reason or "closed by the peer")
                continue
            self.last_recv = time.monotonic()
            try:
                frames = self.decoder.feed(data)
            except LinkError as exc:
                self.end(f"bad frame: {exc}")
                raise LinkClosed(f"bad frame: {exc}") from None
            if frames:
                return frames

    def end(self, reason: str) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        if self._keepalive is not None and self._keepalive is not asyncio.current_task():
            self._keepalive.cancel()
        with contextlib.suppress(Exception):
            self.writer.close()
        self.reader.feed_eof()  # a read waiting now returns, and sees the reason

    async def wait_closed(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)
