"""What a replication link hands the pipeline: `ReplicationIntake.replicate`, which the
`Pipeline` (server/pipeline.py) owns and hands the open batch, the sequences and the topics.

A replication batch goes through the publish path's dedup and batching, with two differences:
each kept record is re-encoded with an origin block (journal/record.py) and this instance's
receive time, and the source's resume point (`repl-from:<source>`, docs/replication.md) is
committed in the same batch, so a restart resumes the link exactly where the journal ends.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from journal.record import (
    KIND_MESSAGE,
    KIND_SOW_DELETE,
    MAX_ORIGIN_NAME,
    RawTuple,
    encode_record,
    raw_origin,
    record_length_at,
    scan_records,
)

from .fanout import Fanout
from .pipeline_publish import TOPIC_CACHE_LIMIT, OpenBatch, Sequences, TopicCache
from .replicate_scan import replicate_records

REPL_FROM = b"repl-from:"  # server/replication/__init__.py: the resume point of a source
_u64 = struct.Struct("<Q")

__all__ = ["REPL_FROM", "ReplicationIntake"]


@dataclass(eq=False, repr=False)
class ReplicationIntake:
    """Replication links' batches into the open batch, through the publish path's dedup."""

    open: OpenBatch
    seqs: Sequences
    topics: TopicCache
    fanout: Fanout
    journaled: bool

    def __post_init__(self) -> None:
        self.replicated = 0  # messages stored from replication links (also in `published`)
        self.duplicates = 0  # replicated messages dropped as duplicates
        self.topic_names: dict[bytes, str] = {}
        self.known: dict[bytes, str] = {}  # replicate_block: topics that are recorded
        # journal metadata for the next replication batch (remember_meta)
        self.pending: dict[bytes, bytes] = {}
        # the SOW manager's intake of replicated delete records (server/sow/manager.py), if any
        self.replicated_delete: (
            Callable[[str, bytes, int, tuple[int, bytes, bytes]], None] | None
        ) = None

    def replicate(
        self,
        records: list[RawTuple],
        source_name: bytes,
        source_group: bytes,
        end_position: int,
        on_durable: Callable[[int, BaseException | None], None],
        translate_in: Callable[[RawTuple], bytes | None] | None = None,
    ) -> tuple[int, int]:
        """Take one replication batch: `records` are the source's (verified, in its journal
        order), `end_position` the source position after them. Returns (stored, duplicates).

        Per message record, the dedup of publish(): a sequence at or below the publisher's
        highest is a duplicate (dropped, counted); the others are re-encoded with an origin
        block (the source record's own, else the source instance, group and receive time) and
        this instance's receive time, then committed, fanned out and fed to queues exactly like
        a publish. SOW delete records go to `replicated_delete` (the SOW manager journals them
        in this batch, in their place). Queue-event records go through `translate_in` (bytes of the local record, or
        None to leave it out). `repl-from:<source>` = end_position is committed in the same
        batch, and on_durable(end, err) runs at the local commit (never held for this instance's
        own sync destinations: an ack there would wait on the source's ack of us), or err.
        """
        ts = self.seqs.now()
        stored, dups = self._take(records, source_name, source_group, ts, translate_in)
        self._taken(stored, dups, ts, source_name, end_position, on_durable)
        return stored, dups

    def replicate_block(
        self,
        body: bytes,
        base_position: int,
        source_name: bytes,
        source_group: bytes,
        end_position: int,
        on_durable: Callable[[int, BaseException | None], None],
        translate_in: Callable[[RawTuple], bytes | None] | None = None,
    ) -> tuple[int, int, int]:
        """replicate() of the records in `body` (a batch's body, verified; the first record at
        source position `base_position`), without a tuple per record: runs of messages go
        through server/replicate_scan.py's `replicate_records` (C when built), anything else
        (queue events, topics not recorded, live subscribers that want each message before it
        is durable, publishers past a gap) through replicate()'s loop. The same batch results,
        byte for byte. Returns (records received, stored, duplicates)."""
        ts = self.seqs.now()
        if (
            not self.journaled
            or self.fanout.early
            or self.seqs.gaps
            or len(source_name) > MAX_ORIGIN_NAME
            or len(source_group) > MAX_ORIGIN_NAME
        ):
            recs = scan_records(body, base_position)[0]
            stored, dups = self._take(recs, source_name, source_group, ts, translate_in)
            self._taken(stored, dups, ts, source_name, end_position, on_durable)
            return len(recs), stored, dups
        batch = self.open.batch
        known = self.known
        highest = self.seqs.highest
        received = stored = dups = pos = 0
        end = len(body)
        while pos < end:
            if batch.origins is None:
                batch.origins = {}
            records, entries, msgs, stop, d, unknown, pubs = replicate_records(
                body,
                pos,
                highest,
                known,
                source_name,
                source_group,
                ts,
                len(batch.data),
                len(batch.msgs),
                batch.origins,
            )
            received += len(entries) + d
            dups += d
            if entries:
                batch.data += records
                batch.entries += entries
                batch.msgs += msgs
                first_seq, last = batch.first_seq, batch.last
                for pub, (first, seq, off) in pubs.items():
                    if pub not in first_seq:
                        first_seq[pub] = first
                    last[pub] = (seq, off)
                stored += len(entries)
            if stop >= end:
                break
            if unknown is not None:
                topic = self._repl_topic(unknown)
                if self.topics.info(topic)[2]:
                    if len(known) >= TOPIC_CACHE_LIMIT:
                        known.clear()
                    known[unknown] = topic
                    pos = stop
                    continue
            # one record for the ordinary loop: a queue event, a topic that is not recorded
            nxt = stop + record_length_at(body, stop) if end - stop >= 4 else end
            one = scan_records(body[stop:nxt], base_position + stop)[0]
            if not one:
                break  # a partial record: the receiver verified the batch, so never here
            s, d = self._take(one, source_name, source_group, ts, translate_in)
            received += 1
            stored += s
            dups += d
            pos = nxt
        self._taken(stored, dups, ts, source_name, end_position, on_durable)
        return received, stored, dups

    def remember_meta(self, key: bytes, value: bytes) -> None:
        """Journal metadata for the replication links (server/replication/identity.py),
        committed with the next replication batch, as the resume points are."""
        self.pending[key] = value

    def _repl_topic(self, tb: bytes) -> str:
        topics = self.topic_names
        topic = topics.get(tb)
        if topic is None:
            if len(topics) >= TOPIC_CACHE_LIMIT:
                topics.clear()
            topic = topics[tb] = tb.decode("utf-8", "replace")
        return topic

    def _take(
        self,
        records: list[RawTuple],
        source_name: bytes,
        source_group: bytes,
        ts: int,
        translate_in: Callable[[RawTuple], bytes | None] | None,
    ) -> tuple[int, int]:
        """replicate()'s loop, one record at a time: (stored, duplicates)."""
        batch = self.open.batch
        seqs = self.seqs
        highest_of = seqs.highest
        journaled = self.journaled
        data = batch.data
        entries = batch.entries
        msgs = batch.msgs
        first_seq = batch.first_seq
        last = batch.last
        early = self.fanout.early
        stored = dups = 0
        for rec in records:
            pos, kind, pub, seq, src_ts, tb, body, extra = rec
            if kind == KIND_SOW_DELETE:
                # journaled here by the SOW manager, where it stands among the messages
                sow_delete = self.replicated_delete
                if sow_delete is not None and journaled:
                    origin = raw_origin(extra) or (src_ts, source_name, source_group)
                    sow_delete(self._repl_topic(tb), bytes(body), ts, origin)
                continue
            if kind != KIND_MESSAGE:
                if translate_in is not None and journaled:
                    local = translate_in(rec)
                    if local is not None:
                        data += local
                continue
            if seq <= highest_of.get(pub, 0):
                dups += 1
                continue
            topic = self._repl_topic(tb)
            if extra is None:
                exp, hdr, origin = None, b"", (src_ts, source_name, source_group)
            else:
                exp, hdr = extra[0], extra[1]
                origin = raw_origin(extra) or (src_ts, source_name, source_group)
            if self.topics.info(topic)[2] and journaled:
                off = len(data)
                entries.append((pub, seq, ts, off))
                data += encode_record(KIND_MESSAGE, pub, seq, ts, tb, body, exp, hdr, origin)
            else:
                off = -1
            if seqs.gaps:
                seqs.gaps.pop(pub, None)
            highest_of[pub] = seq
            if pub not in first_seq:
                first_seq[pub] = seq
            if batch.origins is None:
                batch.origins = {}
            batch.origins[len(msgs)] = origin
            msgs.append((topic, pub, seq, ts, body, off, hdr, exp))
            last[pub] = (seq, off)
            if early:
                self.fanout.deliver(
                    [self.topics.message(topic, pub, seq, ts, body, off, hdr, exp, 0)], early=True
                )
            stored += 1
        return stored, dups

    def _taken(
        self,
        stored: int,
        dups: int,
        ts: int,
        source_name: bytes,
        end_position: int,
        on_durable: Callable[[int, BaseException | None], None],
    ) -> None:
        """The end of a replication batch: counters, the resume point, the durable callback."""
        batch = self.open.batch
        seqs = self.seqs
        seqs.last_ts = ts
        seqs.published += stored
        seqs.duplicates += dups
        self.replicated += stored
        self.duplicates += dups
        if self.journaled:
            # the resume point is committed with this very batch, even one that adds no record
            # (all filtered or duplicates: metadata alone, as a queue checkpoint): durable with
            # it, or failed with it. Parked for a later batch with records, it outlived a failed
            # commit of the records it came after, and was written past them: the source never
            # sent them again (issue 23, seams round 79)
            meta = batch.meta
            if meta is None:
                meta = batch.meta = {}
            pending = self.pending
            if pending:
                meta.update(pending)
                pending.clear()
            meta[REPL_FROM + source_name] = _u64.pack(end_position)
        batch.durable.append(on_durable)
        self.open.schedule()
