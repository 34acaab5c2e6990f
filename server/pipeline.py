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
What one batch holds, and the `AckGate` door to the sync gate, are in server/pipeline_batch.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from journal.index import OWNER_KEY
from journal.journal import Journal
from journal.record import KIND_MESSAGE, encode_record

from . import frames
from .fanout import Fanout, Message
from .pipeline_batch import AckGate, Batch
from .pipeline_publish import TOPIC_CACHE_LIMIT, BatchedIntake, Publisher
from .pipeline_replicate import REPL_FROM, ReplicatedIntake
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


def _no_spec(topic: str) -> None:
    return None


def _never(topic: str) -> bool:
    return False


class Pipeline(BatchedIntake, ReplicatedIntake):
    batch: Batch

    def __init__(
        self,
        journal: Journal | None,
        recorded: Callable[[str], bool],
        loop: asyncio.AbstractEventLoop,
        fanout: Fanout,
        on_backlog: Callable[[bool], None],
        max_inflight: int = 64 * 1024 * 1024,
    ) -> None:
        self.loop = loop
        self.fanout = fanout
        self.on_backlog = on_backlog
        self.journal = journal
        self.recorded = recorded  # topic -> bool (is it in the transaction log)
        self.max_inflight = max_inflight
        self.highest: dict[int, int] = {}  # pub -> highest seq accepted (stored or in flight)
        # pub -> highest seq durable (and acked by every active sync destination): logon acks
        self.durable: dict[int, int] = {}
        self.durable_pos: dict[int, int] = {}
        # pub -> the user its client name is bound to (authenticated publishers; bind_owner)
        self.owners: dict[int, str] = {}
        if journal is not None:
            for pub, (seq, pos) in journal.publishers().items():
                self.highest[pub] = seq
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
        self.gaps: dict[int, int] = {}  # pub -> the sequence it must send next (after a failure)
        self.refused_above_gap = 0
        self.last_ts = 0
        self.delivered_end = journal.end_position if journal is not None else 0
        self._topics: dict[str, tuple[bytes, bytes, bool, bool]] = {}
        # topics whose publishes need the ordinary path (SOW topics: their key is computed
        # there, server/sow/): the run paths (publish_run, publish_raw) leave them to publish()
        self.keyed: Callable[[str], bool] = _never
        # a keyed topic's key spec for publish_raw (server/sow/ key_spec), None: not there
        self.key_spec: Callable[[str], Any] = _no_spec
        # publish_raw(): topic bytes -> topic, for topics stored as they are published
        self._plain_topics: dict[bytes, str] = {}
        self._lone = True  # the last batch flushed held at most one publisher (read_done)
        self.waiters: list[asyncio.Future[None]] = []  # tailing replays, resolved at every commit
        self.last_bm: tuple[int, int] | None = None  # (pub, seq) of the newest durable record
        self.published = 0
        self.duplicates = 0
        # extra consumers of committed messages (queues): f(msgs, delivered_end)
        self.on_deliver: list[Callable[[list[Message], int], None]] = []
        # f(batch): last chance to add records (queue events) to a batch
        self.before_flush: list[Callable[[Batch], None]] = []
        self.replicated = 0  # messages stored from replication links (also in `published`)
        self.replicated_duplicates = 0  # replicated messages dropped as duplicates
        self._repl_topics: dict[bytes, str] = {}
        self._repl_meta_pending: dict[bytes, bytes] = {}
        # sync replication (server/replication/sync.py): holds acks; None without destinations
        self.gate: AckGate | None = None

    def attach_gate(self, gate: AckGate) -> None:
        """Committed batches go through `gate`: it may hold their acks (then `_release`s them
        in order) and wakes the tailing replays when its durable end moves."""
        self.gate = gate
        gate.release = self._release
        gate.wake = self._wake_waiters

    @property
    def topics_seen(self) -> int:
        return len(self._topics)

    # -- intake --------------------------------------------------------------------------

    def topic_info(self, topic: str) -> tuple[bytes, bytes, bool, bool]:
        """(topic bytes, topic member, recorded, plain): plain = recorded and not keyed, what
        the run paths may store as it comes."""
        info = self._topics.get(topic)
        if info is None:
            if len(self._topics) >= TOPIC_CACHE_LIMIT:
                self._topics.clear()
            recorded = self.recorded(topic)
            plain = recorded and not self.keyed(topic)
            info = (topic.encode(), frames.topic_member_text(topic), recorded, plain)
            self._topics[topic] = info
        return info

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
        highest = self.highest.get(pub, 0)
        batch = self.batch
        if seq is None:
            seq = highest + 1
        elif seq <= highest:
            self.duplicates += 1
            if client is not None and client.wants_persisted:
                # already stored (or in a commit ahead of this batch): ack it with this batch
                acks = batch.acks
                if acks.get(client, 0) < seq:
                    acks[client] = seq
                self._schedule()
            return seq, DUPLICATE
        if self.gaps and pub in self.gaps:
            if seq != self.gaps[pub]:
                self.refused_above_gap += 1
                return seq, ABOVE_GAP
        ts = int(time.time() * 1_000_000)
        ts = max(self.last_ts, ts)  # receive times never go backwards in journal order
        tb, _tj, recorded, _plain = self.topic_info(topic)
        if recorded and self.journal is not None:
            rec = encode_record(KIND_MESSAGE, pub, seq, ts, tb, body, exp, hdr)
            data = batch.data
            off = len(data)
            batch.entries.append((pub, seq, ts, off))
            data += rec
        else:
            off = -1
        if self.gaps:
            self.gaps.pop(pub, None)
        self.last_ts = ts
        self.highest[pub] = seq
        if pub not in batch.first_seq:
            batch.first_seq[pub] = seq
        batch.msgs.append((topic, pub, seq, ts, body, off, hdr, exp))
        batch.last[pub] = (seq, off)
        if self.fanout.early:
            self.fanout.deliver(
                [self._message(topic, pub, seq, ts, body, off, hdr, exp, 0)], early=True
            )
        if client is not None and client.wants_persisted:
            batch.acks[client] = seq
        self.published += 1
        if not self.scheduled:
            self._schedule()
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
            self._schedule()
        return True

    def add_flush(self, client: Publisher, cid: Any, acks: list[str]) -> None:
        self.batch.flushes.append((client, cid, acks))
        self._schedule()

    def after_commit(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call fn(err) once everything accepted so far is durable (err None) or failed."""
        self.batch.after.append(fn)
        self._schedule()

    def schedule(self) -> None:
        """Commit the open batch soon, even if nothing else is added to it."""
        self._schedule()

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

    def _schedule(self) -> None:
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
                return
            if inline:
                self._committed(batch, *done_now[0], size)
                return
        loop = self.loop
        cb = self._committed

        def done(
            pos: int | None, err: BaseException | None, batch: Batch = batch, size: int = size
        ) -> None:
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
        """size = -1 for a batch that never went to the journal (nothing to wait for)."""
        if size >= 0:
            self.inflight_bytes -= size
            self.inflight_batches -= 1
            self.inflight.popleft()
            if self.holding and err is None:
                # the writer is free: hand it the held batch before this one's acks and
                # deliveries (not inline: that would commit it, and ack it, before this one)
                self.flush(inline=False)
            elif self.holding:
                self.holding = False
                self._schedule()
        if self.backlogged and self.inflight_bytes < self.max_inflight // 2:
            self.backlogged = False
            self.on_backlog(False)
        if batch.durable:
            end = (pos if pos is not None else self.delivered_end) + len(batch.data)
            for on_durable in batch.durable:
                on_durable(end, err)
        if err is not None:
            self._failed(batch, err)
            return
        fanout = self.fanout
        # 1. conflated persisted acks, unless a sync destination has not acked this batch yet
        gate = self.gate
        held = gate is not None and gate.committed(batch, self._end_after(batch, pos))
        if not held:
            for client, seq in batch.acks.items():
                client.persisted(seq)
        # 2. sequences now durable (for logon acks): one update per publisher, not per message;
        # a held batch's sequences only at its release (a reconnecting publisher is told what
        # its sync destinations hold too, like its `persisted` acks)
        base = pos if pos is not None else self.delivered_end
        if not held:
            self._durable_seqs(batch)
        durable_pos = self.durable_pos
        for pub, (_seq, off) in batch.last.items():
            if off >= 0:
                durable_pos[pub] = base + off
        if self.journal is not None and batch.data:
            self.delivered_end = base + len(batch.data)
            if batch.entries:
                pub, seq = batch.entries[-1][:2]
                self.last_bm = (pub, seq)
        # 3. fan-out: messages are only materialized for topics someone wants
        if fanout.active or self.on_deliver:
            msgs = self._messages(batch, base)
            if msgs and fanout.active:
                fanout.deliver(msgs)
            for consumer in self.on_deliver:
                try:
                    consumer(msgs, self.delivered_end)
                except Exception:  # one consumer's bug must not stop acks and deliveries
                    log.exception("error in a consumer of committed messages")
        if self.waiters:
            self._wake_waiters()
        if held:
            return
        # 4. flush markers: everything before them is processed and durable
        for client, cid, acks in batch.flushes:
            client.flush_done(cid, acks)
        for fn in batch.after:
            fn(None)

    def _end_after(self, batch: Batch, pos: int | None) -> int:
        """The journal end once `batch` is committed (its data starts at `pos`)."""
        if self.journal is None or not batch.data:
            return self.delivered_end
        return (pos if pos is not None else self.delivered_end) + len(batch.data)

    def _durable_seqs(self, batch: Batch) -> None:
        durable = self.durable
        for pub, (seq, _off) in batch.last.items():
            if durable.get(pub, 0) < seq:
                durable[pub] = seq

    def _release(self, batch: Batch) -> None:
        """The sync gate let a held batch through: its acks, flush markers, callbacks."""
        self._durable_seqs(batch)
        for client, seq in batch.acks.items():
            client.persisted(seq)
        for client, cid, acks in batch.flushes:
            client.flush_done(cid, acks)
        for fn in batch.after:
            fn(None)

    def _wake_waiters(self) -> None:
        """Tailing replays look at the journal end again."""
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _messages(self, batch: Batch, base: int) -> list[Message]:
        wanted = self.fanout.router.match if not self.on_deliver else None
        make = self._message
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

    def _message(
        self,
        topic: str,
        pub: int,
        seq: int,
        ts: int,
        body: bytes,
        off: int,
        hdr: bytes,
        exp: Any,
        base: int,
    ) -> Message:
        tj = self.topic_info(topic)[1]
        if off >= 0:
            position = base + off
            suffix = frames.LIVE_SUFFIX % (tj, pub, seq, hdr)
        else:
            position = -1
            suffix = tj + hdr
        return Message(topic, pub, seq, ts, body, suffix, position, exp, hdr)

    def not_yet_durable(self) -> list[Message]:
        """Messages accepted but not yet committed, in journal order (for a `live` join)."""
        out: list[Message] = []
        for batch in (*self.inflight, self.batch):
            out.extend(self._message(*m, 0) for m in batch.msgs)
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
        highest = self.highest
        for pub, first in batch.first_seq.items():
            if highest.get(pub, 0) >= first:
                highest[pub] = first - 1
            gap = self.gaps.get(pub)
            if gap is None or first < gap:
                self.gaps[pub] = first

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
