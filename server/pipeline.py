"""The path of a published message: dedup, stamp, batch, group commit, acks, fan-out.

(DESIGN.md §2.) Everything here runs on the event loop except the journal's writer thread.

1. `publish()` checks the sequence against the publisher's highest (duplicates are acked, not
   stored), stamps a bookmark and a non-decreasing receive time, encodes the journal record into
   the open batch, and schedules one `flush()` per loop iteration.
2. `flush()` hands the open batch to the journal (one submit per loop iteration; the writer
   merges whatever is queued into one write + one fdatasync).
3. `_committed()` runs on the loop when the batch is durable: one conflated `persisted` ack per
   publishing connection, then delivery to subscriptions, then flush markers.

A failed commit (disk full) fails every batch up to the point where the loop has rolled back the
publishers' sequences, so no later batch can be stored past a gap: see `_failed()`.

Back-pressure: bytes submitted but not yet durable are bounded (`max_inflight`); past it every
publishing connection stops reading until the journal catches up.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import TYPE_CHECKING

from journal.record import KIND_MESSAGE, encode_record

from . import frames
from .matching import Body, body_matches

if TYPE_CHECKING:  # pragma: no cover
    from .app import Server

log = logging.getLogger("tickertape.pipeline")

TOPIC_CACHE_LIMIT = 50_000
STORED, DUPLICATE, ABOVE_GAP = 0, 1, 2  # publish() outcomes


class Message:
    """A message of a committed batch, ready for delivery. `bm` is b"" on unrecorded topics."""

    __slots__ = ("body", "exp", "hdr", "position", "pub", "seq", "suffix", "topic", "ts")

    def __init__(self, topic, pub, seq, ts, body, suffix, position, exp, hdr=b""):
        self.topic = topic
        self.pub = pub
        self.seq = seq
        self.ts = ts
        self.body = body
        self.suffix = suffix  # b',"t":"...","bm":"..."' + the record's header fragment
        self.position = position
        self.exp = exp  # the publish's expiration (`e`, seconds) or None
        self.hdr = hdr  # the record's header fragment


class Batch:
    __slots__ = (
        "acks",
        "after",
        "data",
        "doomed",
        "entries",
        "first_seq",
        "flushes",
        "last",
        "meta",
        "msgs",
    )

    def __init__(self) -> None:
        self.data = bytearray()
        self.entries: list = []  # (pub, seq, ts, offset in data) for the journal index
        self.msgs: list = []  # (topic, pub, seq, ts, body, offset or -1, header fragment, expiration)
        self.acks: dict = {}  # conn -> highest seq to ack as persisted
        self.flushes: list = []  # (conn, cid, ack types) waiting for everything before them
        self.first_seq: dict = {}  # pub -> lowest seq in this batch (for rollback)
        self.last: dict = {}  # pub -> (highest seq, offset in data or -1)
        self.after: list = []  # callables(err) once this batch is durable (err None) or failed
        self.meta: dict | None = None  # index metadata committed with this batch
        self.doomed = False  # failed with an earlier batch (Pipeline._failed): rolled back already

    def empty(self) -> bool:
        return not (self.data or self.msgs or self.acks or self.flushes or self.after)


class Pipeline:
    def __init__(self, server: Server, journal, recorded, max_inflight: int = 64 * 1024 * 1024):
        self.server = server
        self.journal = journal
        self.recorded = recorded  # topic -> bool (is it in the transaction log)
        self.max_inflight = max_inflight
        self.highest: dict[int, int] = {}  # pub -> highest seq accepted (stored or in flight)
        self.durable: dict[int, int] = {}  # pub -> highest seq durable
        self.durable_pos: dict[int, int] = {}
        if journal is not None:
            for pub, (seq, pos) in journal.publishers().items():
                self.highest[pub] = seq
                self.durable[pub] = seq
                self.durable_pos[pub] = pos
        self.batch = Batch()
        self.scheduled = False
        self.inflight_bytes = 0
        self.inflight_batches = 0
        self.inflight: collections.deque[Batch] = collections.deque()  # submitted, in commit order
        self.early_subs = 0  # subscriptions with the `live` option that joined the live stream
        self.paused_conns: set = set()
        self.failing = False  # between a failed commit and the loop's rollback
        self.gaps: dict[int, int] = {}  # pub -> the sequence it must send next (after a failure)
        self.refused_above_gap = 0
        self.last_ts = 0
        self.delivered_end = journal.end_position if journal is not None else 0
        self._topics: dict[str, tuple] = {}
        self.waiters: list = []  # futures of tailing replays, resolved at every commit
        self.last_bm: tuple[int, int] | None = None  # (pub, seq) of the newest durable record
        self.published = 0
        self.delivered = 0
        self.duplicates = 0
        self.on_deliver = []  # extra consumers of committed messages: f(msgs, delivered_end)
        self.before_flush = []  # f(batch): last chance to add records (queue events) to a batch

    # -- intake --------------------------------------------------------------------------

    def topic_info(self, topic: str) -> tuple:
        info = self._topics.get(topic)
        if info is None:
            if len(self._topics) >= TOPIC_CACHE_LIMIT:
                self._topics.clear()
            info = (topic.encode(), frames.topic_member_text(topic), self.recorded(topic))
            self._topics[topic] = info
        return info

    def publish(
        self, conn, pub: int, seq: int | None, topic: str, body: bytes, hdr: bytes = b"", exp=None
    ) -> tuple[int, int]:
        """Accept one publish. Returns (seq, outcome): STORED, DUPLICATE, or ABOVE_GAP (refused:
        an earlier sequence of this publisher failed to commit and was not sent again yet).

        Nothing changes before the record is encoded: RecordFieldError leaves no trace.
        hdr: wire-ready header members stored with the message (`,"x":...`); exp: the `e` header.
        conn may be None for messages the server publishes itself (dead letters).
        """
        highest = self.highest.get(pub, 0)
        batch = self.batch
        if seq is None:
            seq = highest + 1
        elif seq <= highest:
            self.duplicates += 1
            if conn is not None and conn.wants_persisted:
                # already stored (or in a commit ahead of this batch): ack it with this batch
                acks = batch.acks
                if acks.get(conn, 0) < seq:
                    acks[conn] = seq
                self._schedule()
            return seq, DUPLICATE
        if self.gaps and pub in self.gaps:
            if seq != self.gaps[pub]:
                self.refused_above_gap += 1
                return seq, ABOVE_GAP
        ts = int(time.time() * 1_000_000)
        ts = max(self.last_ts, ts)  # receive times never go backwards in journal order
        tb, _tj, recorded = self.topic_info(topic)
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
        if self.early_subs:
            self.deliver([self._message(topic, pub, seq, ts, body, off, hdr, exp, 0)], early=True)
        if conn is not None and conn.wants_persisted:
            batch.acks[conn] = seq
        self.published += 1
        if not self.scheduled:
            self._schedule()
        return seq, STORED

    def add_flush(self, conn, cid, acks) -> None:
        self.batch.flushes.append((conn, cid, acks))
        self._schedule()

    def after_commit(self, fn) -> None:
        """Call fn(err) once everything accepted so far is durable (err None) or failed."""
        self.batch.after.append(fn)
        self._schedule()

    def add_record(self, record: bytes) -> None:
        """Append an encoded non-message record (a queue event) to the open batch."""
        self.batch.data += record
        self._schedule()

    def schedule(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.server.loop.call_soon(self.flush)

    # -- commit --------------------------------------------------------------------------

    def flush(self) -> None:
        self.scheduled = False
        batch = self.batch
        for fn in self.before_flush:
            fn(batch)
        if batch.empty():
            return
        self.batch = Batch()
        if self.journal is None or (not batch.data and self.inflight_batches == 0):
            self._committed(batch, self.delivered_end, None, -1)
            return
        size = len(batch.data)
        self.inflight_bytes += size
        self.inflight_batches += 1
        self.inflight.append(batch)
        loop = self.server.loop
        cb = self._committed

        def done(pos, err, batch=batch, size=size):
            loop.call_soon_threadsafe(cb, batch, pos, err, size)

        try:
            self.journal.submit(bytes(batch.data), batch.entries, done, batch.meta)
        except Exception as exc:  # closed journal during shutdown
            self._committed(batch, None, exc, size)
            return
        if self.inflight_bytes > self.max_inflight:
            self._pause_publishers()

    def _committed(self, batch: Batch, pos, err, size: int) -> None:
        """size = -1 for a batch that never went to the journal (nothing to wait for)."""
        if size >= 0:
            self.inflight_bytes -= size
            self.inflight_batches -= 1
            self.inflight.popleft()
        if self.paused_conns and self.inflight_bytes < self.max_inflight // 2:
            self._resume_publishers()
        if err is not None:
            self._failed(batch, err)
            return
        server = self.server
        # 1. conflated persisted acks
        for conn, seq in batch.acks.items():
            conn.persisted(seq)
        # 2. sequences now durable (for logon acks): one update per publisher, not per message
        base = pos if pos is not None else self.delivered_end
        durable = self.durable
        for pub, (seq, off) in batch.last.items():
            if durable.get(pub, 0) < seq:
                durable[pub] = seq
                if off >= 0:
                    self.durable_pos[pub] = base + off
        if self.journal is not None and batch.data:
            self.delivered_end = base + len(batch.data)
            if batch.entries:
                pub, seq = batch.entries[-1][:2]
                self.last_bm = (pub, seq)
        # 3. fan-out: messages are only materialized for topics someone wants
        if server.router.count or self.on_deliver:
            msgs = self._messages(batch, base)
            if msgs and server.router.count:
                self.deliver(msgs)
            for consumer in self.on_deliver:
                try:
                    consumer(msgs, self.delivered_end)
                except Exception:  # one consumer's bug must not stop acks and deliveries
                    log.exception("error in a consumer of committed messages")
        if self.waiters:
            waiters, self.waiters = self.waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        # 4. flush markers: everything before them is processed and durable
        for conn, cid, acks in batch.flushes:
            conn.flush_done(cid, acks)
        for fn in batch.after:
            fn(None)

    def _messages(self, batch: Batch, base: int) -> list[Message]:
        wanted = self.server.router.match if not self.on_deliver else None
        make = self._message
        return [
            make(topic, pub, seq, ts, body, off, hdr, exp, base)
            for topic, pub, seq, ts, body, off, hdr, exp in batch.msgs
            if wanted is None or wanted(topic)
        ]

    def _message(self, topic, pub, seq, ts, body, off, hdr, exp, base) -> Message:
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
        out = []
        for batch in (*self.inflight, self.batch):
            out.extend(self._message(*m, 0) for m in batch.msgs)
        return out

    def join_early(self, sub) -> None:
        """`live` option: from now on `sub` gets messages when they are published, before they
        are durable; the ones already published but not yet durable are queued now, in order."""
        self.early_subs += 1
        f = sub.filter
        out = sub.out
        for m in self.not_yet_durable():
            if not sub.matches_topic(m.topic) or (f is not None and not body_matches(f, m.body)):
                continue
            tail = frames.timestamp_part(m.ts) if sub.timestamp else b""
            frames.write_live(out.buf, sub.prefix, m.suffix, tail, m.body)
            out.sent += 1

    def _failed(self, batch: Batch, err) -> None:
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

    def _notify_failed(self, batch: Batch, err) -> None:
        reason = getattr(err, "reason", "journal unavailable")
        for conn in batch.acks:
            conn.persist_failed(reason, str(err))
        for conn, cid, acks in batch.flushes:
            conn.flush_failed(cid, acks, reason)
        for fn in batch.after:
            fn(err)

    def _fence(self) -> None:
        """Fail everything queued behind a failed commit until the loop has rolled back.

        The journal fails batches submitted before the fence marker it processes after a failure
        (see Journal.fence); batches built after the rollback are accepted again.
        """
        if self.journal is not None:
            self.journal.fence()

    def _pause_publishers(self) -> None:
        for conn in list(self.server.connections):
            if conn.is_publisher and conn not in self.paused_conns:
                conn.pause_reading("journal behind")
                self.paused_conns.add(conn)

    def _resume_publishers(self) -> None:
        for conn in self.paused_conns:
            conn.resume_reading("journal behind")
        self.paused_conns.clear()

    # -- delivery ------------------------------------------------------------------------

    def deliver(self, msgs, early: bool = False) -> None:
        """Live fan-out to every matching subscription: of committed messages, or (early=True)
        of just-published ones to subscriptions with the `live` option."""
        match = self.server.router.match
        write = frames.write_live
        touched = set()
        delivered = 0
        for m in msgs:
            groups = match(m.topic)
            if not groups:
                continue
            body = None
            for out, subs in groups:
                chosen = None
                for sub in subs:
                    if not sub.live or sub.early is not early:
                        continue
                    f = sub.filter
                    if f is not None:
                        if body is None:
                            body = Body(m.body)
                        if not body.matches(f):
                            continue
                    if chosen is None:
                        chosen = sub
                    elif type(chosen) is list:
                        chosen.append(sub)
                    else:
                        chosen = [chosen, sub]
                if chosen is None:
                    continue
                if type(chosen) is list:
                    prefix = frames.group_prefix([s.sub_id for s in chosen])
                    ts = any(s.timestamp for s in chosen)
                else:
                    prefix = chosen.prefix
                    ts = chosen.timestamp
                write(out.buf, prefix, m.suffix, frames.timestamp_part(m.ts) if ts else b"", m.body)
                out.sent += 1
                touched.add(out)
                delivered += 1
        self.delivered += delivered
        for out in touched:
            out.flush()
