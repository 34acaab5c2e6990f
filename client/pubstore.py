"""Publish stores: what an `HAClient` keeps of every publish until the server has persisted it.

Contract of every `PublishStore` (the memory one here, the file one in client/pubstore_file.py):

- `store(topic, body, ...)` assigns the next sequence number (`last_seq + 1`) and keeps the
  message; the caller sends it with that `s`. Sequence numbers come from the store and nowhere
  else, so a store that outlives the process (file) continues the numbering.
- The kept messages are exactly `acked_seq < seq <= last_seq`, oldest first, in increasing
  sequence order (consecutive, unless a damaged file lost some; see RecoveryReport.missing).
- `discard_up_to(s)`: the server persisted everything through `s` (a conflated `persisted` ack,
  or the logon ack's `s`). Idempotent; `acked_seq` never goes back.
- `resync(server_seq)`: after a logon. Discards through the server's `s`; when the server knows
  a higher sequence than the store has handed out (a new store for an old client name), the
  numbering continues after it. What is left is what the client must republish.
- Bounds: `max_messages` and `max_bytes` (`record_size()`: about topic + body + 64 bytes). `fits(size)`
  says whether one more message of `size` bytes has room now; `store()` raises StoreFull when it
  does not (the HAClient waits for room before calling it), and for a message that could never
  fit.
- `unpersisted_count()` = messages kept. After `close()` every call raises StoreClosed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from typing import Self

import msgspec

from .errors import StoreClosed, StoreFull

__all__ = ["MemoryPublishStore", "PublishStore", "StoredPublish", "record_size"]

RECORD_OVERHEAD = 64


def record_size(topic: str, body: bytes, correlation_id: str | None = None) -> int:
    """The size a message is charged against a store's `max_bytes` (an upper bound of what
    the file store writes for it)."""
    return 4 * (len(topic) + len(correlation_id or "")) + len(body) + RECORD_OVERHEAD


class StoredPublish(msgspec.Struct, frozen=True, gc=False):
    """One kept publish: its sequence number and what is needed to send it again."""

    seq: int
    topic: str
    body: bytes
    expiration: float | None = None
    correlation_id: str | None = None


class PublishStore(ABC):
    """See the module docstring for the contract."""

    path: str | None = None
    _closed = False

    def _check(self) -> None:
        if self._closed:
            raise StoreClosed(self.path)

    @property
    @abstractmethod
    def last_seq(self) -> int:
        """Highest sequence number handed out (or learned from the server)."""

    @property
    @abstractmethod
    def acked_seq(self) -> int:
        """Highest sequence number known persisted by the server."""

    @abstractmethod
    def store(
        self,
        topic: str,
        body: bytes,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> int:
        """Keep a message; returns its sequence number."""

    @abstractmethod
    def fits(self, size: int) -> bool:
        """True if one more message of record_size() `size` has room now."""

    @abstractmethod
    def discard_up_to(self, seq: int) -> int:
        """The server persisted everything through `seq`; returns how many were dropped."""

    @abstractmethod
    def get(self, seq: int) -> StoredPublish | None:
        """The kept message with this sequence number, or None."""

    @abstractmethod
    def first_after(self, seq: int) -> StoredPublish | None:
        """The oldest kept message with a sequence number above `seq`, or None."""

    @abstractmethod
    def unpersisted_count(self) -> int:
        """Messages kept: stored and not yet persisted by the server."""

    @abstractmethod
    def close(self) -> None:
        """Release the store (files: sync and unlock). Idempotent."""

    def resync(self, server_seq: int) -> int:
        """After logon: discard what the server has; returns how many remain to republish."""
        self.discard_up_to(server_seq)
        if server_seq > self.last_seq:
            self._advance(server_seq)
        return self.unpersisted_count()

    @abstractmethod
    def _advance(self, seq: int) -> None:
        """Continue numbering after `seq` (only called with an empty store)."""

    def entries_after(self, seq: int) -> Iterator[StoredPublish]:
        """Kept messages above `seq`, oldest first (a snapshot walk; tolerant of discards)."""
        entry = self.first_after(seq)
        while entry is not None:
            yield entry
            entry = self.first_after(entry.seq)

    def sync(self) -> None:
        """Make what is stored durable against power loss (files); memory: nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryPublishStore(PublishStore):
    """Keeps publishes in process memory: survives disconnects and failover, not the process.

    Bounded by `max_messages` (default 1,000,000) and `max_bytes` (default 256 MiB).
    """

    def __init__(self, *, max_messages: int = 1_000_000, max_bytes: int = 256 * 1024 * 1024):
        if max_messages < 1 or max_bytes < RECORD_OVERHEAD:
            raise ValueError("publish store bounds must allow at least one message")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._entries: deque[StoredPublish] = deque()
        self._bytes = 0
        self._last = 0
        self._acked = 0

    def __repr__(self) -> str:
        return f"<MemoryPublishStore acked={self._acked} last={self._last}>"

    @property
    def last_seq(self) -> int:
        return self._last

    @property
    def acked_seq(self) -> int:
        return self._acked

    def fits(self, size: int) -> bool:
        return len(self._entries) < self.max_messages and self._bytes + size <= self.max_bytes

    def store(
        self,
        topic: str,
        body: bytes,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> int:
        self._check()
        size = record_size(topic, body, correlation_id)
        if not self.fits(size):
            limit = f"{self.max_messages} messages / {self.max_bytes} bytes"
            raise StoreFull(None, size, limit)
        seq = self._last + 1
        self._entries.append(StoredPublish(seq, topic, body, expiration, correlation_id))
        self._bytes += size
        self._last = seq
        return seq

    def discard_up_to(self, seq: int) -> int:
        self._check()
        if seq <= self._acked:
            return 0
        self._acked = seq
        entries = self._entries
        n = 0
        while entries and entries[0].seq <= seq:
            e = entries.popleft()
            self._bytes -= record_size(e.topic, e.body, e.correlation_id)
            n += 1
        return n

    def _advance(self, seq: int) -> None:
        self._last = max(self._last, seq)
        self._acked = max(self._acked, seq)

    def get(self, seq: int) -> StoredPublish | None:
        entries = self._entries
        if not entries:
            return None
        i = seq - entries[0].seq
        if 0 <= i < len(entries) and entries[i].seq == seq:
            return entries[i]
        return None

    def first_after(self, seq: int) -> StoredPublish | None:
        entries = self._entries
        if not entries:
            return None
        i = max(0, seq + 1 - entries[0].seq)
        return entries[i] if i < len(entries) else None

    def unpersisted_count(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        self._closed = True
