"""The path of a published message: dedup, stamp, batch, group commit, acks, fan-out.

(docs/architecture.md) Everything here runs on the event loop except the journal's writer thread.

1. `publish()` checks the sequence against the publisher's highest (duplicates are acked, not
   stored), stamps a bookmark and a non-decreasing receive time, encodes the journal record into
   the open batch, and schedules one `flush()` per loop iteration.
2. `flush()` hands the open batch to the journal (one submit per loop iteration; the writer
   merges whatever is queued into one write + one fdatasync). A small batch with no commit in
   flight is committed on the loop itself (`Journal.commit_inline`: no thread hand-off).
3. `_committed()` runs on the loop when the batch is durable: one conflated `persisted` ack per
   publishing connection, then live delivery (server/fanout.py) and the other consumers of
   committed messages (queues), then flush markers.

With sync replication destinations (`attach_gate`, server/replication/sync.py), step 3 keeps the
fan-out but holds a batch's `persisted` acks, flush markers and `after_commit` callbacks until
every active sync destination has acked the batch's end; the gate releases held batches in
commit order (`_release`). Nothing is held without an active sync destination, and without any
destination `gate` is None. A replication link's `on_durable` (Pipeline.replicate) is never held.

A failed commit (disk full) fails every batch up to the point where the loop has rolled back the
publishers' sequences, so no later batch can be stored past a gap: see `_failed()`.

Back-pressure: bytes submitted but not yet durable are bounded (`max_inflight`); past it
`on_backlog(True)` stops every publishing connection from reading until the journal has caught
up to half of it (`on_backlog(False)`).

Narrow doors: the journal it submits to, the loop it schedules on, the fan-out it delivers
through, `on_backlog`; a publishing client is anything with the `Publisher` methods (a session).
What one batch holds, and the `AckGate` door to the sync gate, are in server/pipeline_batch.py;
the run and replication intakes (objects handed the open batch, the publishers' `Sequences` and
the `TopicCache`) in server/pipeline_publish.py and server/pipeline_replicate.py; the commit
order's invariants, checked at each step when asked, in server/pipeline_check.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass
from functools import partial
from typing import Any

from journal.index import OWNER_KEY
from journal.journal import Journal
from journal.record import KIND_MESSAGE, encode_record

from .fanout import Fanout, Message
from .pipeline_batch import AckGate, Batch
from .pipeline_check import CHECK_COMMITS, CommitChecks
from .pipeline_publish import Publisher, RunIntake, Sequences, TopicCache
from .pipeline_replicate import REPL_FROM, ReplicationIntake
from .subscriptions import Subscription

_U64BE = struct.Struct(">Q")

log = logging.getLogger("tickertape.pipeline")

STORED, DUPLICATE, ABOVE_GAP = 0, 1, 2  # publish() outcomes
# flush(): a batch up to this size with no commit in flight is committed on the event loop
# (Journal.commit_inline): a lone publisher's round trip then has no thread hand-off in it
INLINE_COMMIT_BYTES = 4096
# the scheduled flush holds an open batch under HOLD_BYTES while a submitted batch is not
# durable yet: see _flush_soon
HOLD_BYTES = 16 * 1024

__all__ = ["ABOVE_GAP", "DUPLICATE", "REPL_FROM", "STORED", "Batch", "Pipeline", "Publisher"]


@dataclass(eq=False, repr=False)
class Pipeline:
    """The publish path's owner: the open batch and the commit order. Its intakes are objects
    of their own that it hands the open batch (itself, as an `OpenBatch`), the sequences and
    the topics: `runs` (publish_run, publish_raw) and `replication` (replicate ...)."""

    journal: Journal | None
    recorded: InitVar[Callable[[str], bool]]  # whether a topic is stored (TopicCache)
    loop: asyncio.AbstractEventLoop
    fanout: Fanout
    on_backlog: Callable[[bool], None]
    max_inflight: int = 64 * 1024 * 1024

    def __post_init__(self, recorded: Callable[[str], bool]) -> None:
        journal, fanout = self.journal, self.fanout
        self.seqs = seqs = Sequences()
        self.topics = topics = TopicCache(recorded)
        # pub -> highest seq durable (and acked by every active sync destination): logon acks
        self.durable: dict[int, int] = {}
        self.durable_pos: dict[int, int] = {}
        # pub -> the user its client name is bound to (authenticated publishers; bind_owner)
        self.owners: dict[int, str] = {}
        if journal is not None:
            for pub, (seq, pos) in journal.publishers().items():
                seqs.highest[pub] = seq
                self.durable[pub] = seq
                self.durable_pos[pub] = pos
            self.owners = journal.publisher_owners()
        self.batch = Batch()
        self.scheduled = False
        self.inflight_bytes = 0
        self.inflight_batches = 0
        self.holding = False  # the open batch waits for a commit to complete (_flush_soon)
        self.inflight: collections.deque[Batch] = collections.deque()  # submitted, in commit order
        self.backlogged = False  # on_backlog(True) was called last
        self.refused_above_gap = 0
        self.delivered_end = journal.end_position if journal is not None else 0
        self._lone = True  # the last batch flushed held at most one publisher (read_done)
        self.waiters: list[asyncio.Future[None]] = []  # tailing replays, resolved at every commit
        self.last_bm: tuple[int, int] | None = None  # (pub, seq) of the newest durable record
        # extra consumers of committed messages (queues): f(msgs, delivered_end)
        self.on_deliver: list[Callable[[list[Message], int], None]] = []
        # f(batch): last chance to add records (queue events) to a batch
        self.before_flush: list[Callable[[Batch], None]] = []
        # sync replication (server/replication/sync.py): holds acks; None without destinations
        self.gate: AckGate | None = None
        # the commit order's invariants, checked at each step (server/pipeline_check.py)
        self.checks: CommitChecks | None = CommitChecks() if CHECK_COMMITS else None
        journaled = journal is not None
        self.runs = RunIntake(self, seqs, topics, fanout, journaled)
        self.replication = ReplicationIntake(self, seqs, topics, fanout, journaled)
        self.publish_run = self.runs.publish_run
        self.publish_raw = self.runs.publish_raw
        self.replicate = self.replication.replicate
        self.replicate_block = self.replication.replicate_block
        self.remember_meta = self.replication.remember_meta

    def attach_gate(self, gate: AckGate) -> None:
        """Committed batches go through `gate`: it may hold their acks (then `_release`s them
        in order) and wakes the tailing replays when its durable end moves."""
        self.gate = gate
        gate.release = self._release
        gate.wake = self._wake_waiters

    # what the stats and the SOW store read of the intakes (`Sequences`, `ReplicationIntake`)
    highest = property(lambda self: self.seqs.highest)
    gaps = property(lambda self: self.seqs.gaps)
    last_ts = property(lambda self: self.seqs.last_ts)
    published = property(lambda self: self.seqs.published)
    duplicates = property(lambda self: self.seqs.duplicates)
    replicated = property(lambda self: self.replication.replicated)
    replicated_duplicates = property(lambda self: self.replication.duplicates)
    topics_seen = property(lambda self: len(self.topics.cache))

    @property
    def replicated_delete(
        self,
    ) -> Callable[[str, bytes, int, tuple[int, bytes, bytes]], None] | None:
        return self.replication.replicated_delete

    @replicated_delete.setter
    def replicated_delete(
        self, fn: Callable[[str, bytes, int, tuple[int, bytes, bytes]], None] | None
    ) -> None:
        self.replication.replicated_delete = fn

    # -- intake --------------------------------------------------------------------------

    def publish(
        self,
        client: Publisher | None,
        pub: int,
        seq: int | None,
        topic: str,
        body: bytes,
        hdr: bytes = b"",
        exp: Any = None,
    ) -> tuple[int, int]:
        """Accept one publish. Returns (seq, outcome): STORED, DUPLICATE, or ABOVE_GAP (refused:
        an earlier sequence of this publisher failed to commit and was not sent again yet).

        Nothing changes before the record is encoded: RecordFieldError leaves no trace.
        hdr: wire-ready header members stored with the message (`,"x":...`); exp: the `e` header.
        client may be None for messages the server publishes itself (dead letters).
        """
        seqs = self.seqs
        highest = seqs.highest.get(pub, 0)
        batch = self.batch
        if seq is None:
            seq = highest + 1
        elif seq <= highest:
            seqs.duplicates += 1
            if client is not None and client.wants_persisted:
                # already stored (or in a commit ahead of this batch): ack it with this batch
                acks = batch.acks
                if acks.get(client, 0) < seq:
                    acks[client] = seq
                self.schedule()
            return seq, DUPLICATE
        gaps = seqs.gaps
        if gaps and pub in gaps:
            if seq != gaps[pub]:
                self.refused_above_gap += 1
                return seq, ABOVE_GAP
        ts = max(seqs.last_ts, int(time.time() * 1_000_000))  # never back in journal order
        tb, _tj, recorded, _plain = self.topics.info(topic)
        if recorded and self.journal is not None:
            rec = encode_record(KIND_MESSAGE, pub, seq, ts, tb, body, exp, hdr)
            data = batch.data
            off = len(data)
            batch.entries.append((pub, seq, ts, off))
            data += rec
        else:
            off = -1
        if gaps:
            gaps.pop(pub, None)
        seqs.last_ts = ts
        seqs.highest[pub] = seq
        if pub not in batch.first_seq:
            batch.first_seq[pub] = seq
        batch.msgs.append((topic, pub, seq, ts, body, off, hdr, exp))
        batch.last[pub] = (seq, off)
        if self.fanout.early:
            self.fanout.deliver(
                [self.topics.message(topic, pub, seq, ts, body, off, hdr, exp, 0)], early=True
            )
        if client is not None and client.wants_persisted:
            batch.acks[client] = seq
        seqs.published += 1
        if not self.scheduled:
            self.schedule()
        return seq, STORED

    def bind_owner(self, pub: int, user: str) -> bool:
        """Bind publisher `pub` (a client name) to `user`, durably: the binding is committed
        to the journal's index with the open batch, which holds the publisher's first record.
        False (nothing changes) when it is bound to another user already."""
        owner = self.owners.get(pub)
        if owner is not None:
            return owner == user
        self.owners[pub] = user
        if self.journal is not None:
            batch = self.batch
            if batch.meta is None:
                batch.meta = {}
            batch.meta[OWNER_KEY + _U64BE.pack(pub)] = user.encode()
            self.schedule()
        return True

    def add_flush(self, client: Publisher, cid: Any, acks: list[str]) -> None:
        self.batch.flushes.append((client, cid, acks))
        self.schedule()

    def after_commit(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call fn(err) once everything accepted so far is durable (err None) or failed."""
        self.batch.after.append(fn)
        self.schedule()

    def read_done(self) -> None:
        """A publishing connection handled one read. When the open batch is one publish whose
        publisher waits for its `persisted` ack, nothing is in flight and the last commit held
        a single publisher (a lone publisher, one message in flight), the batch is committed
        now instead of at the end of the loop iteration: that hop is part of every round trip.
        Several publishers, or several messages, keep the hop, so that the reads of one
        iteration make one commit."""
        batch = self.batch
        if (
            self.scheduled
            and self._lone
            and self.inflight_batches == 0
            and len(batch.msgs) == 1
            and batch.acks
        ):
            self.flush()

    def schedule(self) -> None:
        """Commit the open batch soon, even if nothing else is added to it."""
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        """The end-of-iteration flush. While a batch is committing, a small open batch would
        only wait behind it in the writer's queue, and each batch costs a hand-off to the
        writer, a wake-up of the loop and a `persisted` ack per publisher: it is held, and the
        commit's completion hands it to the writer (`holding`, `_committed`) before that
        commit's acks go out. So a publisher read a few frames at a time (one frame per send)
        makes a few batches per commit, not one per read. Only batches under HOLD_BYTES wait:
        a larger one is queued at once as before, so that the writer does not sit idle for a
        loop hop between two large commits (holding everything cost a window-per-send
        publisher ~15 %), and the journal's back-pressure (which counts submitted bytes) is
        unchanged. Nothing is held with nothing in flight: a lone publish is committed at once
        (read_done, commit_inline). A batch without data (flush markers, callbacks) is not
        held: handed on with no data and nothing in flight it would complete at once, inside
        the earlier commit's completion and before that commit's acks."""
        batch = self.batch
        if self.inflight_batches and 0 < len(batch.data) < HOLD_BYTES:
            self.scheduled = False  # the next publish schedules again: the size is re-checked
            self.holding = True
            return
        self.flush()

    # -- commit --------------------------------------------------------------------------

    def flush(self, inline: bool = True) -> None:
        """Hand the open batch to the journal; inline=False never commits it on the loop."""
        self.scheduled = False
        self.holding = False
        batch = self.batch
        for fn in self.before_flush:
            fn(batch)
        if batch.empty():
            return
        self.batch = Batch()
        self._lone = len(batch.first_seq) <= 1 and len(batch.acks) <= 1
        # a batch of metadata alone (a queue checkpoint) still goes to the journal's index
        if self.journal is None or (
            not batch.data and not batch.meta and self.inflight_batches == 0
        ):
            self._committed(batch, self.delivered_end, None, -1)
            return
        size = len(batch.data)
        idle = self.inflight_batches == 0
        self.inflight_bytes += size
        self.inflight_batches += 1
        self.inflight.append(batch)
        if inline and idle and size <= min(INLINE_COMMIT_BYTES, self.max_inflight):
            if self._commit_inline(batch, size):
                return
        self._submit(batch, size)

    def _commit_inline(self, batch: Batch, size: int) -> bool:
        """Commit on the loop (the writer is idle): False when the journal says not now."""
        assert self.journal is not None
        done_now: list[tuple[int | None, BaseException | None]] = []
        try:
            inline = self.journal.commit_inline(
                bytes(batch.data),
                batch.entries,
                lambda p, e: done_now.append((p, e)),
                batch.meta,
                on_written=None if self.gate is not None else partial(self._ack_early, batch),
            )
        except Exception as exc:  # closed journal during shutdown
            self._committed(batch, None, exc, size)
            return True
        if inline:
            self._committed(batch, *done_now[0], size)
        return inline

    def _submit(self, batch: Batch, size: int) -> None:
        """Queue the batch for the writer thread; its completion comes back on the loop."""
        assert self.journal is not None
        loop = self.loop
        cb = self._committed

        def done(pos: int | None, err: BaseException | None) -> None:
            loop.call_soon_threadsafe(cb, batch, pos, err, size)

        try:
            self.journal.submit(bytes(batch.data), batch.entries, done, batch.meta)
        except Exception as exc:  # closed journal during shutdown
            self._committed(batch, None, exc, size)
            return
        if self.inflight_bytes > self.max_inflight:
            self.backlogged = True
            self.on_backlog(True)

    def _ack_early(self, batch: Batch) -> None:
        """An inline commit's data is durable (its index update comes next): its `persisted`
        acks go out now rather than after the index transaction (only without a sync gate,
        which may hold them). `_committed` then finds no acks left to send."""
        acks, batch.acks = batch.acks, {}
        for client, seq in acks.items():
            client.persisted(seq)

    def _committed(
        self, batch: Batch, pos: int | None, err: BaseException | None, size: int
    ) -> None:
        """A batch is durable (err None) or failed: the commit order, one named step each.
        size = -1 for a batch that never went to the journal (nothing to wait for).

        Durable: the end moves past it, then its acks (unless the sync gate holds them: they
        follow at `_release`, in order), then its `durable` callbacks (replication links, the
        SOW store), then live delivery and the queues, then the tailing
        replays, then its flush markers and callbacks (unless held). A failure skips them all:
        `_failed` rolls back and tells the publishers."""
        if size >= 0:
            self._retire(size, err)
        self._ease_backlog()
        base = pos if pos is not None else self.delivered_end
        if err is not None:
            if batch.durable:
                self._report_local(batch, base, err)
            self._failed(batch, err)
            return
        end = self._end_after(batch, pos)
        if self.checks is not None:
            self.checks.committed(batch, end)
        held = self.gate is not None and self.gate.committed(batch, end)
        self._advance_end(batch, base)
        if not held:
            self._release_acks(batch)
        if batch.durable:
            # after the acks, which wait for the journal only: the SOW store's fold of the
            # batch (its `durable` callback) is not on the publishers' round trip
            self._report_local(batch, base, err)
        if self.fanout.active or self.on_deliver:
            self._deliver(batch, base)
        if self.waiters:
            self._wake_waiters()
        if not held:
            self._answer_flushes(batch)

    def _retire(self, size: int, err: BaseException | None) -> None:
        """The oldest batch in flight is done: the writer is free, so a held open batch goes
        to it now, before this batch's acks and deliveries (not inline: that would commit it,
        and ack it, before this one)."""
        self.inflight_bytes -= size
        self.inflight_batches -= 1
        self.inflight.popleft()
        if self.holding and err is None:
            self.flush(inline=False)
        elif self.holding:
            self.holding = False
            self.schedule()

    def _ease_backlog(self) -> None:
        if self.backlogged and self.inflight_bytes < self.max_inflight // 2:
            self.backlogged = False
            self.on_backlog(False)

    def _report_local(self, batch: Batch, base: int, err: BaseException | None) -> None:
        """The batch's `durable` callbacks (replication links' `on_durable`, the SOW store's
        fold): the local commit, never held by the gate; `base` is where its data starts."""
        end = base + len(batch.data)
        for on_durable in batch.durable:
            on_durable(end, err)

    def _advance_end(self, batch: Batch, base: int) -> None:
        """Move `delivered_end` (and each publisher's durable position) past the batch: just
        before its fan-out, with nothing flushed in between (a lagging rejoin starts here)."""
        durable_pos = self.durable_pos
        for pub, (_seq, off) in batch.last.items():
            if off >= 0:
                durable_pos[pub] = base + off
        if self.journal is not None and batch.data:
            if self.checks is not None:
                self.checks.advance(self.delivered_end, base, len(batch.data))
            self.delivered_end = base + len(batch.data)
            if batch.entries:
                pub, seq = batch.entries[-1][:2]
                self.last_bm = (pub, seq)

    def _release_acks(self, batch: Batch) -> None:
        """`persisted` acks and the sequences logon acks report (one update per publisher):
        only for a batch below the durable end (the sync gate's, with one)."""
        if self.checks is not None:
            gate = self.gate
            self.checks.acks(batch, gate.durable_end if gate is not None else self.delivered_end)
        durable = self.durable
        for pub, (seq, _off) in batch.last.items():
            if durable.get(pub, 0) < seq:
                durable[pub] = seq
        for client, seq in batch.acks.items():
            client.persisted(seq)

    def _deliver(self, batch: Batch, base: int) -> None:
        """Live fan-out and the other consumers (queues): messages are only materialized for
        topics someone wants."""
        msgs = self._messages(batch, base)
        if self.checks is not None:
            self.checks.deliver(msgs, self.delivered_end)
        if msgs and self.fanout.active:
            self.fanout.deliver(msgs)
        for consumer in self.on_deliver:
            try:
                consumer(msgs, self.delivered_end)
            except Exception:  # one consumer's bug must not stop acks and deliveries
                log.exception("error in a consumer of committed messages")

    def _answer_flushes(self, batch: Batch) -> None:
        """Flush markers and `after_commit` callbacks: everything before them is durable."""
        for client, cid, acks in batch.flushes:
            client.flush_done(cid, acks)
        for fn in batch.after:
            fn(None)

    @property
    def accepted_end(self) -> int:
        """The journal end once everything accepted so far is committed: the batches in flight
        and the open one (above the end it reaches if one of them fails)."""
        return self.delivered_end + self.inflight_bytes + len(self.batch.data)

    def _end_after(self, batch: Batch, pos: int | None) -> int:
        """The journal end once `batch` is committed (its data starts at `pos`)."""
        if self.journal is None or not batch.data:
            return self.delivered_end
        return (pos if pos is not None else self.delivered_end) + len(batch.data)

    def _release(self, batch: Batch) -> None:
        """The sync gate let a held batch through, in commit order."""
        self._release_acks(batch)
        self._answer_flushes(batch)

    def _wake_waiters(self) -> None:
        """Tailing replays look at the journal end again."""
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _messages(self, batch: Batch, base: int) -> list[Message]:
        wanted = self.fanout.router.match if not self.on_deliver else None
        make = self.topics.message
        origins = batch.origins
        if origins:  # replicated messages carry their origin (the queues' ownership)
            out = []
            for i, (topic, pub, seq, ts, body, off, hdr, exp) in enumerate(batch.msgs):
                if wanted is None or wanted(topic):
                    m = make(topic, pub, seq, ts, body, off, hdr, exp, base)
                    m.origin = origins.get(i)
                    out.append(m)
            return out
        return [
            make(topic, pub, seq, ts, body, off, hdr, exp, base)
            for topic, pub, seq, ts, body, off, hdr, exp in batch.msgs
            if wanted is None or wanted(topic)
        ]

    def not_yet_durable(self) -> list[Message]:
        """Messages accepted but not yet committed, in journal order (for a `live` join)."""
        out: list[Message] = []
        for batch in (*self.inflight, self.batch):
            out.extend(self.topics.message(*m, 0) for m in batch.msgs)
        return out

    def join_early(self, sub: Subscription) -> None:
        """`live` option: from now on `sub` gets messages when they are published, before they
        are durable; the ones already published but not yet durable are queued now, in order."""
        self.fanout.join_early(sub, self.not_yet_durable())

    def _failed(self, batch: Batch, err: BaseException) -> None:
        """Roll back sequences so the publisher can re-send, then tell each publisher.

        The gap rule (docs/publishing.md): the lowest failed sequence R of a publisher becomes
        its gap; until a publish of exactly R arrives, every later sequence is refused, not
        stored and not acked, so a `persisted` ack can never cover a sequence that is not in
        the journal. Every batch submitted before the fence fails too, and the open batch was
        built before this failure was known: they are all failed here at once ("doomed"), so no
        batch submitted after the fence can hold a sequence above any of their gaps.
        """
        if not batch.doomed:
            open_batch = None
            if not self.batch.empty():
                open_batch, self.batch = self.batch, Batch()
            doomed = [batch, *self.inflight, *([open_batch] if open_batch else [])]
            for b in doomed:
                b.doomed = True
                self._roll_back(b)
            log.error(
                "journal commit failed: %s (%d messages not persisted; %d later batches fail with it)",
                err,
                sum(len(b.msgs) for b in doomed),
                len(doomed) - 1,
            )
            self._fence()
            if open_batch is not None:  # never submitted: fails here, not in the journal
                for on_durable in open_batch.durable:
                    on_durable(-1, err)
                self._notify_failed(open_batch, err)
        self._notify_failed(batch, err)

    def _roll_back(self, batch: Batch) -> None:
        highest, gaps = self.seqs.highest, self.seqs.gaps
        for pub, first in batch.first_seq.items():
            if highest.get(pub, 0) >= first:
                highest[pub] = first - 1
            gap = gaps.get(pub)
            if gap is None or first < gap:
                gaps[pub] = first

    def _notify_failed(self, batch: Batch, err: BaseException) -> None:
        reason = getattr(err, "reason", "journal unavailable")
        for client in batch.acks:
            client.persist_failed(reason, str(err))
        for client, cid, acks in batch.flushes:
            client.flush_failed(cid, acks, reason)
        for fn in batch.after:
            fn(err)

    def _fence(self) -> None:
        """Fail everything queued behind a failed commit until the loop has rolled back.

        The journal fails batches submitted before the fence marker it processes after a failure
        (see Journal.fence); batches built after the rollback are accepted again.
        """
        if self.journal is not None:
            self.journal.fence()
