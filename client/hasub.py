"""A subscription placed through an HAClient: one async iterator across reconnects and failover.

States (a subscription only moves down, except attached <-> detached):

```
attached   a Subscription on the current connection feeds it
detached   that connection was lost: iteration yields what the old connection had buffered,
           then waits until the HAClient re-enters the subscription on the next connection
           (bookmark subscriptions at MOST_RECENT, others as first placed)
ended      unsubscribe(), a bookmark range completed, or the HAClient was closed:
           iteration stops (next() returns None, `async for` ends)
failed     re-entering it was refused (CommandError), or the HAClient gave up reconnecting:
           iteration raises that error
```

A `sow_and_subscribe` hands out its answer's records (`header.c == "sow"`) as they come; the
answer's point, right after them, starts the subscription in the bookmark store, and the
changes after it are tracked as those of a bookmark subscription (client/haplace.py).

For a bookmark subscription with a bookmark store, every message goes through the store before
the application sees it: `store.log(message)` drops duplicates after a resubscribe or failover
and out-of-order messages per publisher, and the subscription's periodic persisted acks reach
`store.persisted()` in order with the messages. Bound: while the store holds `max_window`
entries for this subscription (messages not discarded, and what arrived after the oldest of
them; looked at every 64 messages), next() waits for the application to discard (a warning
names the subscription once), so the subscription's buffer fills and the client stops reading.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Literal

from .errors import ClientError, Disconnected
from .message import Message, PersistedBookmark
from .subscription import _STOP, MessageStream, Unsubscriber, _End, _Ending

if TYPE_CHECKING:  # pragma: no cover
    from .bookmarks import BookmarkStore
    from .submanager import SubscriptionSpec
    from .subscription import Subscription

__all__ = ["HASubscription"]

log = logging.getLogger("tickertape.client.ha")
_FULL_POLL = 0.02
_CHECK_EVERY = 64  # messages between two looks at the store's window size
_MAX_PLACEMENTS = 4  # queued placements (one per reconnect) the application has not reached


class HASubscription(MessageStream):
    """Returned by HAClient.subscribe(). Iterate with `async for msg in sub` or `next()`;
    call `discard(msg)` once a message of a bookmark subscription is processed."""

    _quiet = ClientError  # `async with` ends it whatever its unsubscribe meets

    def __init__(
        self,
        ha: Unsubscriber,  # the HAClient
        spec: SubscriptionSpec,
        store: BookmarkStore | None,
        max_window: int,
    ):
        self.spec = spec
        self.sub_id = spec.sub_id
        self.topic = spec.topic
        self.duplicates = 0  # messages the bookmark store dropped
        self.max_window = max_window
        self._ha = ha
        self._store = store
        self._current: Subscription | None = None
        self._queue: deque[Subscription] = deque()
        self._end: _Ending = None
        self._waiter: asyncio.Future | None = None
        self._full_warned = False
        self._count = 0
        self._placed_once = False  # the first placement succeeded (re-entries are the HAClient's)
        self._placed_uri: str | None = None  # the server of the newest placement
        # a sow_and_subscribe: the bookmark of its answer's point, once the answer is all in
        self._sow_point: str | None = None

    def __repr__(self) -> str:
        return f"<HASubscription {self.sub_id} {self.topic!r} {self.state}>"

    @property
    def state(self) -> str:
        if self._end is _STOP:
            return "ended"
        if self._end is not None:
            return "failed"
        return "attached" if self._current is not None or self._queue else "detached"

    @property
    def buffered(self) -> int:
        """Messages received and not yet taken by the application (all placements)."""
        subs = [self._current, *self._queue]
        return sum(s.buffered for s in subs if s is not None)

    @property
    def completed(self) -> asyncio.Event:
        """Set when the current placement's replay caught up (the `completed` ack)."""
        sub = self._queue[-1] if self._queue else self._current
        return sub.completed if sub is not None else asyncio.Event()

    # ------------------------------------------------------------------ HAClient side

    def _attach(self, sub: Subscription) -> None:
        self._placed_once = True
        if self._end is not None:
            return
        if self._current is None:
            self._current = sub
        else:
            self._queue.append(sub)  # the old connection's buffer is read out first
            if len(self._queue) > _MAX_PLACEMENTS:
                # bounded: placements the application never got to. A bookmark
                # subscription loses nothing (the newest placement replays from the store's
                # resume point, which lies before every message not yet handed out)
                dropped = self._queue.popleft()
                log.warning("subscription %s: dropped %d unread message(s) of an old "
                            "connection", self.sub_id, dropped.buffered)  # fmt: skip
        self._wake()

    def _finish(self, end: BaseException | Literal[_End.STOP]) -> None:
        if self._end is None:
            self._end = end
        if end is _STOP:
            self._current = None
            self._queue.clear()
        self._wake()

    # ------------------------------------------------------------------ application side

    async def next(self, timeout: float | None = None) -> Message | None:
        """The next message; None once the subscription has ended. Raises the failure if it
        failed, TimeoutError after `timeout` seconds without a message (nothing is lost)."""
        store = self._store
        deadline = None
        while True:
            if self._count >= _CHECK_EVERY and store is not None:
                # before taking a message, so a cancelled or timed-out wait loses none
                if store.window_size(self.sub_id) >= self.max_window:
                    if timeout is not None:
                        deadline = deadline or asyncio.get_running_loop().time() + timeout
                    await self._wait_for_discards(store, deadline)
                self._count = 0
            sub = self._current
            if sub is None:
                if self._queue:
                    self._current = self._queue.popleft()
                    continue
                left = None
                if timeout is not None:
                    deadline = deadline or asyncio.get_running_loop().time() + timeout
                    left = max(0.0, deadline - asyncio.get_running_loop().time())
                if not await self._wait(left):
                    return None
                continue
            try:
                if timeout is None or sub._buf:  # no timer unless it has to wait
                    item = await sub.next()
                else:
                    deadline = deadline or asyncio.get_running_loop().time() + timeout
                    item = await sub.next(max(0.0, deadline - asyncio.get_running_loop().time()))
            except Disconnected:
                if self._current is sub:
                    self._current = None  # its buffer is drained; wait for the next placement
                continue
            if item is None:  # ended cleanly: a range completed, or the client was closed
                if self._current is sub:
                    self._current = None
                if not self._queue:
                    self._finish(_STOP)
                continue
            if store is None:
                return item
            if type(item) is PersistedBookmark:
                if self.spec.sow and self._sow_point is None:
                    # the answer is all in: the changes after its point are tracked from here
                    self._sow_point = item.bookmark
                    store.start(self.sub_id, item.bookmark)
                else:
                    store.persisted(self.sub_id, item.bookmark)
                continue
            if item.header.c == "sow":
                return item  # a record of the answer: its bookmark is not in stream order
            if item.bookmark is not None and not store.log(item):
                self.duplicates += 1
                continue
            self._count += 1
            return item

    async def _wait_for_discards(self, store: BookmarkStore, deadline: float | None) -> None:
        if not self._full_warned:
            self._full_warned = True
            log.warning(
                "subscription %s: the bookmark store holds %d entries (max_window); waiting "
                "for the application to discard processed messages",
                self.sub_id,
                store.window_size(self.sub_id),
            )
        loop = asyncio.get_running_loop()
        while store.window_size(self.sub_id) >= self.max_window and self._end is None:
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError
            await asyncio.sleep(_FULL_POLL)

    def discard(self, message: Message) -> bool:
        """Mark `message` processed in the bookmark store (any order)."""
        return self._store is not None and self._store.discard(message)

    async def unsubscribe(self, timeout: float | None = 10.0) -> None:
        """Stop this subscription (now and after reconnects); iteration ends at once."""
        if self._end is not None:
            return
        await self._ha.unsubscribe(self.sub_id, timeout=timeout)
