"""Publish sequence numbers, the in-flight window and persisted acks of one connection.

A `PublishTracker` owns no socket: the client tells it what was sent and which acks arrived,
and it resolves the futures of callers waiting for window space or for a flush.

State:

- `last_seq`: the highest sequence handed out on this connection (starts at the logon's `s`).
- `persisted_seq`: the highest `s` of a successful persisted ack (starts at the logon's `s`:
  the server has those stored already).
- in flight: sequences sent and not yet settled, in the order they were sent.
- `published` / `settled`: how many publishes were sent / have been settled (by success or
  failure). A flush waits for `settled` to reach the `published` count at the time it was asked.

Events and what they do:

- `sent(seq)`: appends to in flight.
- `persisted(s)` (docs/protocol.md §3: conflated, covers every sequence <= s): settles entries from
  the front of in flight while they are <= s. Sequences normally increase, so that is exactly
  "everything <= s". A sequence published out of order (an explicit lower `seq`) waits behind
  the earlier, higher one; the server's acks only grow, so it is settled when that one is.
- `failed(reason, s)` (`journal unavailable`): settles the same entries as failures, without
  moving `persisted_seq`, and returns a `PublishFailed`. Every flush waiting at that moment
  fails with it; if nobody was waiting, the next `flush()` raises it (an error is never lost).
  An ack without `s` settles everything in flight (the server did not say which).
- `close(exc)`: fails every waiter; later waits fail at once with `exc`.

The window (`max_inflight`) is the only back-pressure on publishers besides the socket's write
buffer: `wait_window()` returns at once while fewer than `max_inflight` are in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from .errors import CommandTimeout, PublishFailed

__all__ = ["Flushes", "PublishTracker"]


class Flushes:
    """The flush() calls waiting until a count (sequence) is settled, in the order they came
    (their targets ascend), and a failure no flush was waiting for: the next flush raises it,
    so an error is never lost. A connection's PublishTracker and the HAClient's Publisher
    (client/hapublisher.py) each have one."""

    __slots__ = ("_unreported", "_waiters")

    def __init__(self) -> None:
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()
        self._unreported: BaseException | None = None

    def settle(self, upto: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= upto:
            f = waiters.popleft()[1]
            if not f.done():
                f.set_result(None)

    def fail(self, exc: BaseException, keep: bool = False) -> None:
        """Every waiting flush raises `exc`; with `keep` and none waiting, the next one does."""
        waiters = self._waiters
        if keep and not waiters:
            self._unreported = exc
        while waiters:
            f = waiters.popleft()[1]
            if not f.done():
                f.set_exception(exc)

    def raise_unreported(self) -> None:
        if self._unreported is not None:
            exc, self._unreported = self._unreported, None
            raise exc

    async def wait(self, target: int, timeout: float | None, what: Callable[[], str]) -> None:
        """Until settle() reaches `target` (or fail()); CommandTimeout naming `what()` after
        `timeout` seconds."""
        entry = (target, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            if timeout is None:
                await entry[1]
                return
            try:
                async with asyncio.timeout(timeout):
                    await entry[1]
            except TimeoutError:
                raise CommandTimeout(what(), timeout, "persisted ack") from None
        finally:
            if not entry[1].done():
                entry[1].cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)


class PublishTracker:
    __slots__ = (
        "_closed",
        "_flushes",
        "_inflight",
        "_window_waiter",
        "failed_count",
        "last_seq",
        "max_inflight",
        "persisted_seq",
        "published",
        "settled",
    )

    def __init__(self, max_inflight: int = 10_000, start_seq: int = 0):
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self.max_inflight = max_inflight
        self.last_seq = start_seq
        self.persisted_seq = start_seq
        self.published = 0
        self.settled = 0
        self.failed_count = 0
        self._inflight: deque[int] = deque()
        self._flushes = Flushes()
        self._window_waiter: asyncio.Future | None = None
        self._closed: BaseException | None = None

    # ---------------------------------------------------------------- publishing side

    def reset(self, start_seq: int) -> None:
        """Start numbering after `start_seq` (the logon's `s`)."""
        self.last_seq = max(self.last_seq, start_seq)
        self.persisted_seq = max(self.persisted_seq, start_seq)

    async def wait_window(self) -> None:
        """Wait until fewer than `max_inflight` publishes are in flight."""
        while len(self._inflight) >= self.max_inflight:
            if self._closed is not None:
                raise self._closed
            fut = self._window_waiter
            if fut is None or fut.done():
                fut = self._window_waiter = asyncio.get_running_loop().create_future()
            # shield: one waiter future is shared by every blocked publisher, and one caller's
            # cancellation must not cancel it for the others
            await asyncio.shield(fut)
        if self._closed is not None:
            raise self._closed

    def sent(self, seq: int) -> None:
        self._inflight.append(seq)
        self.published += 1
        self.last_seq = max(self.last_seq, seq)

    # ---------------------------------------------------------------- ack side

    def _settle(self, s: int | None) -> int:
        inflight = self._inflight
        n = 0
        if s is None:
            n = len(inflight)
            inflight.clear()
        else:
            popleft = inflight.popleft
            while inflight and inflight[0] <= s:
                popleft()
                n += 1
        self.settled += n
        return n

    def _wake(self) -> None:
        fut = self._window_waiter
        if fut is not None and len(self._inflight) < self.max_inflight:
            self._window_waiter = None
            if not fut.done():
                fut.set_result(None)
        self._flushes.settle(self.settled)

    def persisted(self, s: int) -> None:
        """A successful persisted ack: everything <= s is durable."""
        self.persisted_seq = max(self.persisted_seq, s)
        if self._settle(s):
            self._wake()

    def failed(self, reason: str, s: int | None) -> PublishFailed:
        """A failure ack for publishes (e.g. `journal unavailable`); see the module docstring."""
        n = self._settle(s)
        self.failed_count += n
        exc = PublishFailed(reason, s, n)
        self._flushes.fail(exc, keep=True)
        self._wake()
        return exc

    # ---------------------------------------------------------------- waiting side

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish sent so far is settled (Client.publish_flush).

        Raises PublishFailed if any of it was refused (`journal unavailable`) — or if a refusal
        arrived since the last flush and nobody was told yet — CommandTimeout after `timeout`,
        Disconnected if the connection ends first.
        """
        self._flushes.raise_unreported()
        target = self.published
        if self.settled >= target:
            return
        if self._closed is not None:
            raise self._closed
        await self._flushes.wait(
            target, timeout, lambda: f"publish_flush ({len(self._inflight)} unpersisted)"
        )

    def close(self, exc: BaseException) -> None:
        """The connection ended: fail every waiter with `exc`; later waits fail at once."""
        self._closed = exc
        self._flushes.fail(exc)
        fut, self._window_waiter = self._window_waiter, None
        if fut is not None and not fut.done():
            # a result, not the exception: blocked publishers re-check `_closed` and raise it,
            # and a shielded future whose waiter was cancelled never logs an unretrieved error
            fut.set_result(None)
