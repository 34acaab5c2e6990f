"""Message queues (docs/protocol.md §8): every queue of the instance, its recovery, its timers, and
where it meets the pipeline. One queue's state machine is server/queue.py's `Queue`.

`QueueManager` is each queue's `QueueHost`: it reads messages back from the journal (through a
one-block cache, so a run of deliveries costs one read; the frames of a run are spliced from
that block), keeps one loop timer for every lease heap, adds the queues' events to the batch
being committed (and their checkpoints, at most once a second), and publishes dead letters.

Narrow doors: the journal it reads, the loop it sets timers on, and `Commits` (the pipeline:
committed messages in, events and dead letters out). Recovery (`recover`) runs before the
server accepts connections, off the loop: from each queue's checkpoint, messages on the
underlying topic become waiting and the events after it are applied
(journal/queue_events.py).
"""

from __future__ import annotations

import array
import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Protocol

from config.model import QueueSpec
from journal.journal import Journal
from journal.queue_events import apply_events, checkpoint_key, decode_checkpoint, encode_checkpoint
from journal.record import (
    KIND_MESSAGE,
    KIND_QUEUE_EVENT,
    RECORD_HEADER_SIZE,
    encode_record,
    record_length_at,
    scan_records,
)

from . import frames
from .fanout import Message
from .pipeline import Batch, Publisher
from .queue import Queue
from .queue_state import QueueState, StoredMessage, now_us
from .splice import splice_at

__all__ = ["Commits", "QueueManager"]

log = logging.getLogger("tickertape.queues")

EVENT_FLUSH_DELAY = 0.005
CACHE_BLOCK = 256 * 1024


class Commits(Protocol):
    """What the queues use of the pipeline."""

    delivered_end: int
    on_deliver: list[Callable[[list[Message], int], None]]
    before_flush: list[Callable[[Batch], None]]

    def schedule(self) -> None: ...
    def publish(
        self,
        client: Publisher | None,
        pub: int,
        seq: int | None,
        topic: str,
        body: bytes,
        hdr: bytes = b"",
        exp: Any = None,
    ) -> tuple[int, int]: ...


def _events_committed(taken: list[tuple[Queue, bytes]], err: BaseException | None) -> None:
    if err is not None:
        for q, body in taken:
            q.events_failed(body)


class QueueManager:
    """All queues of the instance: recovery, routing of committed messages, timers, commands."""

    def __init__(
        self,
        specs: Iterable[QueueSpec],
        instance: str,
        journal: Journal | None,
        loop: asyncio.AbstractEventLoop,
        commits: Commits,
    ) -> None:
        self.instance = instance
        self.journal = journal
        self.loop = loop
        self.commits = commits
        self.queues: dict[str, Queue] = {}
        self.loading = False
        for spec in specs:
            self.queues[spec.name] = Queue(self, spec)
        self._timer: asyncio.TimerHandle | None = None
        self._event_timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._block: tuple[bytes, int] | None = None  # journal bytes of the last read (_block_at)
        self._compacted: dict[int, StoredMessage] = {}  # the last compacted block read
        self.recovery_seconds = 0.0
        self._last_checkpoint = 0.0

    # -- wiring ----------------------------------------------------------------------------------

    def get(self, name: str | None) -> Queue | None:
        """The queue of that name, if there is one."""
        return self.queues.get(name or "")

    def attach(self, pipeline: Commits) -> None:
        pipeline.on_deliver.append(self.on_committed)
        pipeline.before_flush.append(self.before_flush)

    def call_soon(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon(fn)

    def on_committed(self, msgs: list[Message], end: int) -> None:
        for m in msgs:
            if m.position < 0:
                continue
            tb = None
            for q in self.queues.values():
                if tb is None:
                    tb = m.topic.encode()
                if q.wants_topic(tb) and q.passes_filter(m.body):
                    q.offer_fresh(m)

    def before_flush(self, batch: Batch) -> None:
        taken = []
        for q in self.queues.values():
            body = q.take_events()
            if body is not None:
                batch.data += encode_record(KIND_QUEUE_EVENT, 0, 0, 0, q.name_b, body)
                taken.append((q, body))
        if taken:
            batch.after.append(partial(_events_committed, taken))
        now = time.monotonic()
        if now - self._last_checkpoint >= 1.0 and any(
            q.checkpoint_dirty for q in self.queues.values()
        ):
            self._last_checkpoint = now
            # a checkpoint committed with this batch covers only what this batch makes durable
            end = self.commits.delivered_end
            meta = batch.meta or {}
            for q in self.queues.values():
                meta[checkpoint_key(q.name_b)] = encode_checkpoint(q.low_water(end))
                q.checkpoint_dirty = False
            batch.meta = meta

    def events_added(self) -> None:
        """Queue events ride with the next commit; if none comes soon, commit them anyway.

        An ack whose reply was asked for forces a commit at once (after_commit); the others are
        made durable within EVENT_FLUSH_DELAY, so a quiet server does not hold them in memory.
        """
        if self._event_timer is None and not self.loading:
            self._event_timer = self.loop.call_later(EVENT_FLUSH_DELAY, self._flush_events)

    def _flush_events(self) -> None:
        self._event_timer = None
        self.commits.schedule()

    def arm(self, deadline: float) -> None:
        if deadline >= self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = self.loop
        self._timer_at = deadline
        self._timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        now = time.monotonic()
        for q in self.queues.values():
            q.lease_timeouts(now)

    def stop(self) -> None:
        """No more timers (shutdown): pending events go with the pipeline's last commit."""
        for timer in (self._timer, self._event_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._event_timer = None
        self._timer_at = float("inf")

    def tick(self) -> None:
        """Expire waiting messages whose time is up (the server's periodic tick)."""
        now = now_us()
        for q in self.queues.values():
            q.expire_due(now)

    # -- reads -----------------------------------------------------------------------------------

    def _block_at(self, position: int) -> tuple[bytes, int] | None:
        """The journal block (bytes, base) holding the whole record at position: the cached one,
        else the block read from there (and kept). None where the bytes are not stored as
        written (a compacted segment) or no longer stored."""
        blk = self._block
        if blk is not None:
            buf, base = blk
            off = position - base
            if 0 <= off <= len(buf) - RECORD_HEADER_SIZE and off + record_length_at(
                buf, off
            ) <= len(buf):
                return blk
        journal = self.journal
        if journal is None or position < journal.start_position:
            return None
        got = journal.read_block(position, CACHE_BLOCK)
        if got is None or got[1] != position or not got[0]:
            return None
        self._block = got
        return got

    def splice_run(
        self, positions: array.array, head: bytes, tail: bytes
    ) -> tuple[bytes, list[str], int] | None:
        """splice_at over the journal block holding positions[0], or None where the bytes are
        not stored as written (compacted, removed): the caller then reads record by record."""
        blk = self._block_at(positions[0])
        if blk is None:
            return None
        try:
            return splice_at(blk[0], blk[1], positions, head, tail)  # the first record is whole
        except ValueError:
            log.exception("queue delivery from the journal block at %d", blk[1])
            self._block = None
            return None

    def read(self, position: int) -> StoredMessage | None:
        """(position, pub, seq, ts, topic_b, body, header fragment) of the message at position,
        or None if the journal no longer holds one there."""
        journal = self.journal
        if journal is None or position < journal.start_position:
            return None
        blk = self._block_at(position)
        if blk is not None:
            buf, base = blk
            off = position - base
            r = scan_records(buf[off : off + record_length_at(buf, off)], position)[0][0]
            if r[1] != KIND_MESSAGE:
                return None
            return (r[0], r[2], r[3], r[4], r[5], r[6], r[7][1] if r[7] else b"")
        rec = self._compacted.get(
            position
        )  # a compacted segment: its retained records, by position
        if rec is not None:
            return rec
        recs, _ = journal.read_raw(position, CACHE_BLOCK)
        self._compacted = {
            r[0]: (r[0], r[2], r[3], r[4], r[5], r[6], r[7][1] if r[7] else b"")
            for r in recs
            if r[1] == KIND_MESSAGE
        }
        return self._compacted.get(position)

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild every queue from its checkpoint and the journal after it (off the loop)."""
        journal = self.journal
        if journal is None or not self.queues:
            return
        started = time.monotonic()
        self.loading = True
        starts = []
        for q in self.queues.values():
            raw = journal.index.get_meta(checkpoint_key(q.name_b))
            starts.append(decode_checkpoint(raw, journal.start_position))
        pos = max(journal.start_position, min(starts))
        qlist = list(self.queues.values())
        by_name = {q.name_b: q for q in qlist}
        qstart = {q.name_b: max(s, journal.start_position) for q, s in zip(qlist, starts)}
        done: dict[bytes, set] = {q.name_b: set() for q in qlist}
        counts: dict[bytes, dict] = {q.name_b: {} for q in qlist}
        scanned = 0
        while True:
            recs, nxt = journal.read_raw(pos, 4 * 1024 * 1024)
            if not recs:
                nxt2 = journal.next_position(nxt)
                if nxt2 == pos:
                    break
                pos = nxt2
                continue
            for position, kind, _pub, _seq, ts, tb, body, extra in recs:
                scanned += 1
                if kind == KIND_MESSAGE:
                    for q in qlist:
                        if (
                            position >= qstart[q.name_b]
                            and q.wants_topic(tb)
                            and q.passes_filter(body)
                        ):
                            q.add_waiting(position, ts, extra[0] if extra else None)
                elif kind == KIND_QUEUE_EVENT:
                    if tb in by_name:
                        apply_events(body, done[tb], counts[tb])
            pos = journal.next_position(nxt)
        for q in qlist:
            d = done[q.name_b]
            if d:
                keep = [(p, t) for p, t in zip(q.avail_pos, q.avail_ts) if p not in d]
                q.avail_pos = array.array("Q", (p for p, _ in keep))
                q.avail_ts = array.array("Q", (t for _, t in keep))
                for p in d:
                    q.expiry.pop(p, None)
            q.counts = {p: c for p, c in counts[q.name_b].items() if p not in d}
        self.loading = False
        self.recovery_seconds = time.monotonic() - started
        for q in qlist:
            log.info(
                "queue %s: recovered %d waiting messages (%d delivered before) in %.3fs",
                q.name,
                q.depth,
                len(q.counts),
                self.recovery_seconds,
            )
        log.info("queues: recovery scanned %d records in %.3fs", scanned, self.recovery_seconds)

    # -- dead letters --------------------------------------------------------------------------------

    def dead_letter(
        self,
        q: QueueState,
        position: int,
        reason: str,
        deliveries: int,
        rec: StoredMessage | None,
    ) -> None:
        rec = rec or self.read(position)
        if rec is None:
            return
        _, pub, seq, ts, topic_b, body, extra = rec
        hdr = frames.dead_letter_fragment(reason, deliveries, q.name, pub, seq)
        assert q.spec.dead_letter_topic is not None
        self.commits.publish(None, q.dlt_pub, None, q.spec.dead_letter_topic, body, hdr, None)
        q.stats["dead_lettered"] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: q.snapshot() for name, q in self.queues.items()}
