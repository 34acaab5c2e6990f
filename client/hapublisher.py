"""The publishing half of an HAClient: the publish store, steps 6-7 of the connect sequence,
and the send loop that keeps sequence numbers in order on the wire.

States:

```
offline    no connection: publish() stores the message and returns
resyncing  a new connection logged on: the store dropped what the server has (the logon ack's
           `s`) and everything left is being sent again, oldest first; publish() stores and
           returns (the same loop sends it, after the older ones)
live       publish() stores and sends at once when nothing is queued before it and the
           connection can take it; else it wakes the send loop and waits for it to catch up
offline    the connection was lost (or the client closed / failed: waiters fail)
```

Why one send loop: the server treats a publish whose `s` is not above the highest it stored
for the client name as a duplicate. If a later sequence number overtook an earlier one on the
wire, the earlier one would be dropped as a duplicate and lost. So every publish goes out
either on the fast path (it is the next sequence number and nothing waits) or through the
loop, which sends `store.first_after(sent_seq)` until the store has nothing newer.

Persisted acks (`on_persisted`) discard from the store, wake publishers waiting for room and
settle `publish_flush()` waiters. A failure ack (`journal unavailable`, `on_failure`) fails the
waiting flushes (or the next one); the messages stay stored and, after RESEND_DELAY, go out again
on the same connection from the first one not persisted: the server refuses everything after a
sequence that failed to commit until that sequence is sent again (the gap rule), so waiting for
the next logon would stall the publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import ClientError, Disconnected, PublishFailed, StoreFull
from .publish import Flushes
from .pubstore import PublishStore, record_size

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Publisher"]

RESEND_DELAY = 0.5  # s after a `journal unavailable` failure; the server probes its disk every 1 s


class Publisher:
    """See the module docstring. `check()` raises when publishing is not allowed at all
    (before the first logon, after close, after the HAClient failed)."""

    def __init__(self, store: PublishStore, check: Callable[[], None]):
        self.store = store
        self.client: Client | None = None  # the current connection (None: offline)
        # the same connection once it is live (module docstring), else None: one attribute
        # says both that publish() may send at once and where
        self.live: Client | None = None
        self.sent_seq = 0  # highest sequence written on the current connection
        self._check = check
        self._pump_task: asyncio.Task | None = None
        self._room = asyncio.Event()
        self._flushes = Flushes()  # publish_flush() calls, settled at the store's acked_seq
        self._resend: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ connection events

    async def resync(self, client: Client, server_seq: int) -> int:
        """Steps 6-7 on a logged-on `client`; returns how many messages were sent again."""
        self.client = client
        self.live = None
        store = self.store
        store.resync(server_seq)
        self._flushes.settle(store.acked_seq)
        self._room.set()
        self.sent_seq = max(server_seq, store.acked_seq)
        before = self.sent_seq
        await self._pump(client)  # returns with nothing left to send
        self.live = client
        return self.sent_seq - before

    def offline(self) -> None:
        """The connection was lost: publishes are only stored until the next resync."""
        self.live = None
        self.client = None

    def fail(self, exc: BaseException) -> None:
        """The HAClient closed or failed: every waiter fails with `exc`."""
        self.offline()
        self._flushes.fail(exc)
        self._room.set()
        if self._pump_task is not None:
            self._pump_task.cancel()

    def on_persisted(self, seq: int) -> None:
        if self.store.discard_up_to(seq):
            self._room.set()
        self._flushes.settle(self.store.acked_seq)

    def on_failure(self, exc: PublishFailed) -> None:
        self._flushes.fail(exc, keep=True)  # none waiting: the next publish_flush() raises it
        if self.live is not None and self._resend is None:
            loop = asyncio.get_running_loop()
            self._resend = loop.call_later(RESEND_DELAY, self._resend_unpersisted, self.live)

    def _resend_unpersisted(self, client: Client) -> None:
        """Send again from the first unpersisted message (see the module doc)."""
        self._resend = None
        if client is not self.live:
            return  # a new connection resends everything anyway (resync)
        self.sent_seq = min(self.sent_seq, self.store.acked_seq)
        self._kick(client)

    # ------------------------------------------------------------------ publishing

    async def publish(
        self, topic: str, body: bytes, expiration: float | None, correlation_id: str | None
    ) -> int:
        client = self.live
        if client is None:
            return await self._publish_slow(topic, body, expiration, correlation_id)
        try:
            seq = self.store.store(topic, body, expiration, correlation_id)
        except StoreFull:
            return await self._publish_slow(topic, body, expiration, correlation_id)
        # the fast path: nothing queued before it and the connection takes it now
        if self.sent_seq == seq - 1 and client.try_publish(
            topic, body, seq, expiration, correlation_id
        ):
            self.sent_seq = seq
            return seq
        await asyncio.shield(self._kick(client))
        return seq

    async def _publish_slow(
        self, topic: str, body: bytes, expiration: float | None, correlation_id: str | None
    ) -> int:
        """publish() while not live, or with a full store."""
        self._check()
        store = self.store
        size = record_size(topic, body, correlation_id)
        while True:
            while not store.fits(size):
                if store.unpersisted_count() == 0:
                    raise StoreFull(store.path, size, "the store's max_bytes")
                self._room.clear()
                if self.live is not None:
                    self._kick(self.live)
                await self._room.wait()
                self._check()
            try:
                seq = store.store(topic, body, expiration, correlation_id)
                break
            except StoreFull:
                if store.unpersisted_count() == 0:
                    raise  # it can never fit
        if self.live is not None:
            await asyncio.shield(self._kick(self.live))
        return seq

    def _kick(self, client: Client) -> asyncio.Task:
        task = self._pump_task
        if task is None or task.done():
            task = self._pump_task = asyncio.get_running_loop().create_task(self._run(client))
        return task

    async def _run(self, client: Client) -> None:
        with contextlib.suppress(ClientError):  # connection ended: the next resync sends the rest
            await self._pump(client)

    async def _pump(self, client: Client) -> None:
        """Send every stored message after `sent_seq`, in order, on `client`."""
        store = self.store
        while self.client is client:
            entry = store.first_after(self.sent_seq)
            if entry is None:
                return
            if not client.can_publish():
                await client.wait_publishable()
                continue
            client.publish_nowait(entry.topic, entry.body, entry.seq, entry.expiration,
                                  entry.correlation_id)  # fmt: skip
            self.sent_seq = entry.seq
        raise Disconnected("connection replaced")

    async def flush(self, timeout: float | None = None) -> None:
        """HAClient.publish_flush(): wait until every message stored so far is persisted by a
        server (across reconnects). Raises PublishFailed if publishes were refused since the
        last call (they stay stored and go out again after the next logon), CommandTimeout
        after `timeout`."""
        self._flushes.raise_unreported()
        store = self.store
        target = store.last_seq
        if store.acked_seq >= target:
            return
        self._check()
        if self.live is not None:
            self._kick(self.live)
        await self._flushes.wait(
            target, timeout, lambda: f"publish_flush ({store.unpersisted_count()} unpersisted)"
        )
