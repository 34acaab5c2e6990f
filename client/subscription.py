"""A subscription's incoming messages: a bounded buffer read as an async iterator.

States (moves only go down):

```
active    the subscribe ack arrived (or is awaited); deliveries are buffered, iteration
          yields them in arrival order and waits when the buffer is empty
ended     unsubscribe() (buffer dropped: the application said it is done), a range bookmark
          completed, or the client was closed (buffer kept): iteration yields what is left,
          then stops (StopAsyncIteration / next() returns None)
failed    the connection was lost: iteration yields what is left, then raises Disconnected
```

Flow control: the buffer is bounded by `max_messages` and `max_bytes` (body bytes). When either
bound is reached the client pauses reading from its socket (the server's queue then backs up,
and a slow consumer only slows itself); when the application has drained the buffer to half of
both bounds, reading resumes. The bound is soft by at most one socket read's worth of frames:
frames already decoded are never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Literal, Protocol, Self

from .errors import ClientError, Disconnected

if TYPE_CHECKING:  # pragma: no cover
    from .message import Message, PersistedBookmark

__all__ = ["MessageStream", "Subscription", "Unsubscriber"]


class Unsubscriber(Protocol):
    """What a subscription sees of its owner (the client's or the HA client's subscriptions,
    which import this module): the one call `unsubscribe()` makes."""

    async def unsubscribe(self, sub_id: str, *, timeout: float | None = ...) -> None: ...


class _End(enum.Enum):
    """The end marker of an iteration that stops cleanly: an enum member, so that the type
    checker tells it from the exception a failed subscription ends with."""

    STOP = "stop"


_STOP: Final = _End.STOP
_Ending = BaseException | Literal[_End.STOP] | None
"""None while active, _STOP once ended, the exception once failed."""


class MessageStream(ABC):
    """What a subscription is to the application, here and through an HAClient (client/hasub.py):
    `async for` over next() until it ends, and `async with`, which unsubscribes at its end unless
    the subscription has ended already (an unsubscribe that fails with `_quiet` is let go)."""

    __slots__ = ("_end", "_waiter")  # _waiter: a next() waiting for a message or the end
    _end: _Ending
    _waiter: asyncio.Future | None
    _quiet: type[ClientError] = Disconnected

    @abstractmethod
    async def next(self, timeout: float | None = None) -> Message | None: ...

    @abstractmethod
    async def unsubscribe(self, timeout: float | None = 10.0) -> None: ...

    @property
    def active(self) -> bool:
        return self._end is None

    def _wake(self) -> None:
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self, timeout: float | None) -> bool:
        """With nothing to hand out: False once ended, the failure raised once failed, else
        True after the next _wake() (TimeoutError after `timeout` seconds). The wait is
        shielded, so a cancelled or timed-out next() loses no message."""
        end = self._end
        if end is not None:
            if end is _STOP:
                return False
            raise end
        w = self._waiter
        if w is None or w.done():
            w = self._waiter = asyncio.get_running_loop().create_future()
        async with asyncio.timeout(timeout):
            await asyncio.shield(w)
        return True

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        msg = await self.next()
        if msg is None:
            raise StopAsyncIteration
        return msg

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._end is None:
            with contextlib.suppress(self._quiet):
                await self.unsubscribe()


class Subscription(MessageStream):
    """Returned by `Client.subscribe`. Iterate with `async for msg in sub`, or `await sub.next()`.

    `completed` is set when the server sends the `completed` ack (a bookmark replay caught up
    with the live stream, or a range reached its end; after a range the subscription ends).
    """

    __slots__ = (
        "_buf",
        "_bytes",
        "_client",
        "_full",
        "_is_range",
        "_marks",
        "_on_drained",
        "_on_full",
        "bookmark",
        "completed",
        "max_bytes",
        "max_messages",
        "sub_id",
        "topic",
    )

    def __init__(
        self,
        client: Unsubscriber,
        sub_id: str,
        topic: str,
        bookmark: str | None,
        *,
        max_messages: int,
        max_bytes: int,
        on_full: Callable[[Subscription], None],
        on_drained: Callable[[Subscription], None],
        marks: bool = False,
    ):
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("subscription buffer bounds must be >= 1")
        self.sub_id = sub_id
        self.topic = topic
        self.bookmark = bookmark
        self.completed = asyncio.Event()
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._client = client
        self._buf: deque[Message] = deque()
        self._bytes = 0
        self._full = False
        self._waiter: asyncio.Future | None = None
        self._end: _Ending = None
        self._is_range = bookmark is not None and bookmark.lstrip()[:1] in ("[", "(")
        self._on_full = on_full
        self._on_drained = on_drained
        self._marks = marks  # next() also returns PersistedBookmark items (bookmark stores)

    def __repr__(self) -> str:
        state = "active" if self._end is None else "ended" if self._end is _STOP else "failed"
        return f"<Subscription {self.sub_id} {self.topic!r} {state} buffered={len(self._buf)}>"

    @property
    def buffered(self) -> int:
        """Messages received and not yet taken by the application."""
        return len(self._buf)

    # ---------------------------------------------------------------- client side

    def _push(self, msg: Message) -> None:
        """A delivery for this subscription (called from the protocol's data_received)."""
        if self._end is not None:
            return  # ended locally; the server may still send a few in-flight messages
        buf = self._buf
        buf.append(msg)
        self._bytes += len(msg.body)
        if self._waiter is not None:
            self._wake()
        if not self._full and (len(buf) >= self.max_messages or self._bytes >= self.max_bytes):
            self._full = True
            self._on_full(self)

    def _push_mark(self, mark: PersistedBookmark) -> None:
        """A periodic persisted ack: queued in order with the messages when asked for."""
        if self._marks:
            self._push(mark)  # type: ignore[arg-type]

    def _complete(self) -> bool:
        """The `completed` ack. Returns True when this ends the subscription (a range)."""
        self.completed.set()
        if self._is_range:
            self._finish(_STOP, drop=False)
            return True
        return False

    def _finish(self, end: BaseException | Literal[_End.STOP], *, drop: bool) -> None:
        """Move to ended (`end` is _STOP) or failed (`end` is an exception)."""
        if self._end is not None:
            return
        self._end = end
        if drop:
            self._buf.clear()
            self._bytes = 0
        if self._full:
            self._full = False
            self._on_drained(self)
        self._wake()

    # ---------------------------------------------------------------- application side

    async def next(self, timeout: float | None = None) -> Message | None:
        """The next message; None once the subscription has ended and its buffer is empty.

        With `marks=True` (Client.subscribe) a PersistedBookmark may come instead of a message.

        Raises `Disconnected` (after the buffer is drained) if the connection was lost, and
        `TimeoutError` if `timeout` seconds pass without a message. Cancelling a waiting call
        loses no message.
        """
        while True:
            buf = self._buf
            if buf:
                msg = buf.popleft()
                self._bytes -= len(msg.body)
                if (
                    self._full
                    and len(buf) <= self.max_messages // 2
                    and self._bytes <= self.max_bytes // 2
                ):
                    self._full = False
                    self._on_drained(self)
                return msg
            if not await self._wait(timeout):
                return None

    async def unsubscribe(self, timeout: float | None = 10.0) -> None:
        """Unsubscribe; iteration stops at once (buffered messages are dropped).

        On a closed or lost connection this only ends the subscription locally; on an ended
        subscription it does nothing.
        """
        if self._end is not None:
            return
        await self._client.unsubscribe(self.sub_id, timeout=timeout)
