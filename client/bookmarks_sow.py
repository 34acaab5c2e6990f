"""A bookmark store that keeps each subscription's recovery point in a SOW topic on a server
(the "SOW recovery point adapter" of AMPS): a subscriber restarted on another machine, with no
file of its own, resumes where the last one left off.

`SowBookmarkStore` behaves as `MemoryBookmarkStore` (client/bookmarks.py) while it runs. Each
subscription's recovery point is written, as one record of the SOW topic, by a *separate*
client connected to the server that holds the topic (`writer`: a `Client` or an `HAClient`;
not the client whose subscriptions the store tracks, whose own traffic it would wait behind):

```json
{"clientName": "<name>", "subId": "<sub_id>", "bookmark": "<most_recent(sub_id)>",
 "discarded": ["<bookmark>", ...]}
```

keyed by `/clientName` and `/subId`. The topic (default `/ADMIN/bookmark_store`) must be a SOW
topic with those two keys, recorded in the transaction log (docs/client.md shows the
configuration). `bookmark` is where the subscription resumes (`most_recent`, the list of the
recovery point and each publisher's point); `discarded` lists the messages after that point
the application has already discarded (out of order), so a resume does not hand them out
again: the resume is exact, as with a `LoggedBookmarkStore` file. It is bounded by the
subscription's window (`max_window` of the HAClient).

Writes: the store's methods are synchronous (they run for every message), so a discard or a
persisted ack only marks its subscription changed; the record is published `every` seconds
(0.2 by default) or at `await flush()` (which also waits for the server to make it durable).
What a crash loses is the last fraction of a second of discards: those messages are delivered
again (at least once), never skipped. `await aclose()` writes what is left and closes.

Reading: `await SowBookmarkStore.open(writer, client_name)` queries the topic for the records
of `client_name`; a subscription entered with MOST_RECENT and a record here resumes from the
record (then its own state takes over); one entered with any other bookmark starts afresh and
its record is replaced at the next write. `purge` deletes the records.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Protocol

from .bookmarks import MOST_RECENT, BookmarkStore, Subscriptions, _canonical, tracked
from .message import Message

__all__ = ["DEFAULT_TOPIC", "RecoveryWriter", "SowBookmarkStore"]

log = logging.getLogger("tickertape.client.bookmarks")

DEFAULT_TOPIC = "/ADMIN/bookmark_store"


class RecoveryWriter(Protocol):
    """What the store uses of its client (a Client or an HAClient with `sow`)."""

    async def sow(self, topic: str, *, filter: str | None = None) -> list[Message]: ...

    async def publish(self, topic: str, body: Any) -> int: ...

    async def publish_flush(self, timeout: float | None = None) -> None: ...

    async def sow_delete(self, topic: str, *, filter: str | None = None) -> int: ...


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class SowBookmarkStore(BookmarkStore):
    """Bookmark state in memory (the memory store's `Subscriptions`), each subscription's
    recovery point in a SOW topic (see the module docstring)."""

    def __init__(
        self,
        writer: RecoveryWriter,
        client_name: str,
        *,
        topic: str = DEFAULT_TOPIC,
        every: float = 0.2,
        max_publishers: int = 100_000,
    ):
        self.subs = Subscriptions(max_publishers)
        self.writer = writer
        self.client_name = client_name
        self.topic = topic
        self.every = every
        self._loaded: dict[str, tuple[str, set[str]]] = {}  # sub_id -> (bookmark, discarded)
        self._skip: dict[str, set[str]] = {}  # discarded before the restart, not to hand out
        self._dirty: set[str] = set()
        self._purged: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None
        self.write_errors = 0

    def __repr__(self) -> str:
        return f"<SowBookmarkStore {self.client_name!r} on {self.topic!r}>"

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    async def open(cls, writer: RecoveryWriter, client_name: str, **kw: Any) -> SowBookmarkStore:
        """A store with the recovery points the topic holds for `client_name`."""
        store = cls(writer, client_name, **kw)
        await store.load()
        return store

    async def load(self) -> None:
        """Read the recovery points of this client name from the topic (again)."""
        records = await self.writer.sow(
            self.topic, filter=f"/clientName = {_quote(self.client_name)}"
        )
        for msg in records:
            try:
                doc = json.loads(msg.body)
                sub_id, bm = doc["subId"], doc["bookmark"]
                done = {_canonical(b) for b in doc.get("discarded") or ()}
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%r: a record it cannot read was left out: %r", self, exc)
                continue
            if isinstance(sub_id, str) and isinstance(bm, str) and bm:
                self._loaded[sub_id] = (bm, done)

    # -- the BookmarkStore interface ---------------------------------------------------------

    def start(self, sub_id: str, bookmark: str) -> str:
        self._check()
        loaded = self._loaded.pop(sub_id, None)
        if bookmark == MOST_RECENT and sub_id not in self.subs.states and loaded is not None:
            bm, done = loaded
            self.subs.new(sub_id, bm)
            self._skip[sub_id] = done
            return bm
        self._skip.pop(sub_id, None)
        send = self.subs.start(sub_id, bookmark)[0]
        self._changed(sub_id)
        return send

    def log(self, message: Message) -> bool:
        got = tracked(message)
        state = None if got is None else self.subs.states.get(got[0])
        if got is None or state is None:
            return True
        sub_id, pub, seq, bm = got
        skip = self._skip.get(sub_id)
        if skip and bm in skip:
            # discarded before the restart: it counts as received and discarded, not handed out
            skip.discard(bm)
            state.append(pub, seq, bm)
            state.discard(bm)
            self._changed(sub_id)
            return False
        return state.log(pub, seq, bm)

    def discard_bookmark(self, sub_id: str, bookmark: str) -> bool:
        self._check()
        done = self.subs.discard(sub_id, bookmark) is not None
        if done:
            self._changed(sub_id)
        return done

    def persisted(self, sub_id: str, bookmark: str) -> None:
        self._check()
        self.subs.mark(sub_id, bookmark)
        self._changed(sub_id)

    def most_recent(self, sub_id: str, elsewhere: bool = False) -> str:
        self._check()
        return self.subs.most_recent(sub_id, elsewhere)

    def window_size(self, sub_id: str) -> int:
        return self.subs.window_size(sub_id)

    def purge(self, sub_id: str | None = None) -> None:
        self._check()
        loaded = list(self._loaded) if sub_id is None else []
        for sid in self.subs.purge(sub_id) + loaded:
            self._loaded.pop(sid, None)
            self._skip.pop(sid, None)
            self._dirty.discard(sid)
            self._purged.add(sid)
        self._schedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._closed = True

    # -- writing -----------------------------------------------------------------------------

    def record(self, sub_id: str) -> dict[str, Any] | None:
        """The record of `sub_id` as it would be written now (None: nothing to keep)."""
        state = self.subs.states.get(sub_id)
        if state is None:
            return None
        done = [e.bm for e in state.window if e.done and not e.mark]
        return {
            "clientName": self.client_name,
            "subId": sub_id,
            "bookmark": state.most_recent(),
            "discarded": done,
        }

    def _changed(self, sub_id: str) -> None:
        self._dirty.add(sub_id)
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): flush() writes it
            return
        self._timer = loop.call_later(self.every, self._write_soon)

    def _write_soon(self) -> None:
        self._timer = None
        if self._writing is None or self._writing.done():
            self._writing = asyncio.get_running_loop().create_task(self._write(durable=False))
        else:  # a write is under way: look again after it
            self._schedule()

    async def _write(self, durable: bool) -> None:
        dirty, self._dirty = self._dirty, set()
        purged, self._purged = self._purged, set()
        try:
            for sid in purged:
                await self.writer.sow_delete(
                    self.topic,
                    filter=f"/clientName = {_quote(self.client_name)} AND /subId = {_quote(sid)}",
                )
            for sid in sorted(dirty):
                rec = self.record(sid)
                if rec is not None:
                    await self.writer.publish(self.topic, rec)
            if durable:
                await self.writer.publish_flush()
        except Exception as exc:
            # the next change writes them again; a resume then starts a little earlier
            self.write_errors += 1
            self._dirty |= dirty
            self._purged |= purged
            log.warning("%r: writing recovery points failed (%r); will try again", self, exc)
            if durable:
                raise
            self._schedule()

    async def flush(self) -> None:
        """Write every changed recovery point now and wait until the server has it durable."""
        while self._writing is not None and not self._writing.done():
            await asyncio.wait([self._writing])
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._write(durable=True)

    async def aclose(self) -> None:
        """Write what is left (flush), then close."""
        if not self._closed:
            await self.flush()
        self.close()
