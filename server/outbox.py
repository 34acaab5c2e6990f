"""The outgoing bytes of one client: the only way anything is sent to it.

Writers (the session's acks, live fan-out, replay, queues, the heartbeat tick) append whole
frames to `buf` (server/frames.py builds them) and add the deliveries they queued to `sent`;
on a hot path that is `buf.append(frame)` or `buf += parts`, nothing more. `flush()` writes
everything queued with one `transport.write`, once per batch of input or committed batch.

Bounds (CONVENTIONS 8): past `<ClientOfflineThreshold>` bytes in the transport's buffer a
flush calls `on_lag` (the session moves its live subscriptions that the journal can feed to
journal reads, server/subscription_table.py: they stop queueing here); past
`<ClientMaxBufferSize>` it closes the connection with reason `slow client` (what the journal
cannot feed must not grow the server's memory). Replay and queue runs are paced instead: they
wait on `writable`, which follows the transport's high-water mark.

States:

    detached --attach(transport)--> open --close(reason)--> closing
    open: writable <--pause/resume_writing--> not writable

`close` runs once: it reports the reason (`on_close`: the log line and the count), writes what
is queued (or drops it with `abort=True`) and closes the transport. After it, appends are
dropped at the next flush and `closing` is True, which every writer checks before work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import frames
from .reasons import Disconnect

__all__ = ["Gate", "Outbox", "Transport"]


class Gate:
    """`asyncio.Event`'s `is_set` / `set` / `clear` / `wait` for `Outbox.writable`, with the
    Event made only when someone waits while it is closed: an idle connection never waits,
    and an Event (with its waiter deque) is most of what an idle connection costs."""

    __slots__ = ("_event", "_open")

    def __init__(self) -> None:
        self._open = True
        self._event: asyncio.Event | None = None

    def is_set(self) -> bool:
        return self._open

    def set(self) -> None:
        self._open = True
        if self._event is not None:
            self._event.set()

    def clear(self) -> None:
        self._open = False
        if self._event is not None:
            self._event.clear()

    async def wait(self) -> bool:
        if self._open:
            return True
        if self._event is None:
            self._event = asyncio.Event()  # made clear, as the gate is
        return await self._event.wait()


class Transport(Protocol):
    """What an Outbox uses of an asyncio transport."""

    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...
    def get_write_buffer_size(self) -> int: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


@dataclass(eq=False, repr=False, slots=True)
class Outbox:
    _max_buffer: int
    _on_close: Callable[[str], None]
    _offline_at: int = 0  # <ClientOfflineThreshold> in bytes, 0 = never call `on_lag`
    buf: list[bytes] = field(init=False, default_factory=list)
    sent: int = field(init=False, default=0)  # deliveries queued (messages, not acks)
    bytes_written: int = field(init=False, default=0)
    last_send: float = field(init=False, default_factory=time.monotonic)
    writable: Gate = field(init=False, default_factory=Gate)
    closing: bool = field(init=False, default=False)
    close_reason: str | None = field(init=False, default=None)
    _transport: Transport | None = field(init=False, default=None)
    on_lag: Callable[[], None] | None = field(init=False, default=None)

    def attach(self, transport: Transport) -> None:
        self._transport = transport

    # -- writing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Write everything queued; past <ClientOfflineThreshold> call `on_lag`, past
        <ClientMaxBufferSize> close with `slow client`."""
        buf = self.buf
        t = self._transport
        if not buf or t is None:
            buf.clear()
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        if t.is_closing():
            return
        t.write(data)
        self.bytes_written += len(data)
        self.last_send = time.monotonic()
        queued = t.get_write_buffer_size()
        if self._offline_at and queued > self._offline_at and self.on_lag is not None:
            self.on_lag()
        if queued > self._max_buffer:
            self.close(Disconnect.SLOW_CLIENT, abort=True)

    def send_ack(
        self, kind: str, cid: Any, status: str = "success", reason: str | None = None, **fields: Any
    ) -> None:
        """Queue one ack (frames.ack); the caller flushes."""
        self.buf.append(frames.ack(kind, cid, status, reason, **fields))

    @property
    def offline_at(self) -> int:
        """<ClientOfflineThreshold> in bytes (0: none)."""
        return self._offline_at

    def queued(self) -> int:
        """Bytes written but still in the transport's buffer (0 once closed)."""
        t = self._transport
        if t is None or t.is_closing():
            return 0
        return t.get_write_buffer_size()

    # -- flow control (from the transport) -------------------------------------------------

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def lost(self) -> None:
        """The transport is gone: nothing more is sent; waiting writers wake and see `closing`."""
        self.closing = True
        self.writable.set()

    # -- closing ---------------------------------------------------------------------------

    def close(self, reason: str, abort: bool = False) -> None:
        if self.closing:
            return
        self.closing = True
        self.close_reason = reason
        self._on_close(reason)
        t = self._transport
        if t is None:
            return
        if abort:
            self.buf.clear()
            t.abort()
        else:
            if self.buf:
                data = b"".join(self.buf)
                self.buf.clear()
                t.write(data)
            t.close()
