"""What a replication link hands the pipeline: `ReplicatedIntake.replicate`, mixed into
`Pipeline` (server/pipeline.py), which provides the attributes declared here.

A replication batch goes through the publish path's dedup and batching, with two differences:
each kept record is re-encoded with an origin block (journal/record.py) and this instance's
receive time, and the source's resume point (`repl-from:<source>`, docs/replication.md) is
committed in the same batch, so a restart resumes the link exactly where the journal ends.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

from journal.record import KIND_MESSAGE, RawTuple, encode_record, raw_origin

REPL_FROM = b"repl-from:"  # server/replication/__init__.py: the resume point of a source
TOPIC_CACHE_LIMIT = 50_000
_u64 = struct.Struct("<Q")

__all__ = ["REPL_FROM", "ReplicatedIntake"]


class ReplicatedIntake:
    # provided by Pipeline
    batch: Any
    highest: dict[int, int]
    journal: Any
    fanout: Any
    gaps: dict[int, int]
    last_ts: int
    published: int
    duplicates: int
    replicated: int
    replicated_duplicates: int
    _repl_topics: dict[bytes, str]
    _repl_meta_pending: dict[bytes, bytes]

    def topic_info(self, topic: str) -> tuple[bytes, bytes, bool]:
        raise NotImplementedError

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
    ) -> Any:
        raise NotImplementedError

    def _schedule(self) -> None:
        raise NotImplementedError

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
        a publish. Queue-event records go through `translate_in` (bytes of the local record, or
        None to leave it out). `repl-from:<source>` = end_position is committed in the same
        batch, and on_durable(end, err) runs at the local commit (never held for this instance's
        own sync destinations: an ack there would wait on the source's ack of us), or err.
        """
        batch = self.batch
        highest_of = self.highest
        journal = self.journal
        data = batch.data
        entries = batch.entries
        msgs = batch.msgs
        first_seq = batch.first_seq
        last = batch.last
        topics = self._repl_topics
        early = self.fanout.early
        ts = max(self.last_ts, int(time.time() * 1_000_000))
        stored = dups = 0
        for rec in records:
            pos, kind, pub, seq, src_ts, tb, body, extra = rec
            if kind != KIND_MESSAGE:
                if translate_in is not None and journal is not None:
                    local = translate_in(rec)
                    if local is not None:
                        data += local
                continue
            if seq <= highest_of.get(pub, 0):
                dups += 1
                continue
            topic = topics.get(tb)
            if topic is None:
                if len(topics) >= TOPIC_CACHE_LIMIT:
                    topics.clear()
                topic = topics[tb] = tb.decode("utf-8", "replace")
            if extra is None:
                exp, hdr, origin = None, b"", (src_ts, source_name, source_group)
            else:
                exp, hdr = extra[0], extra[1]
                origin = raw_origin(extra) or (src_ts, source_name, source_group)
            if self.topic_info(topic)[2] and journal is not None:
                off = len(data)
                entries.append((pub, seq, ts, off))
                data += encode_record(KIND_MESSAGE, pub, seq, ts, tb, body, exp, hdr, origin)
            else:
                off = -1
            if self.gaps:
                self.gaps.pop(pub, None)
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
                    [self._message(topic, pub, seq, ts, body, off, hdr, exp, 0)], early=True
                )
            stored += 1
        self.last_ts = ts
        self.published += stored
        self.duplicates += dups
        self.replicated += stored
        self.replicated_duplicates += dups
        if journal is not None:
            # the journal stores metadata only with records: a batch that adds none leaves its
            # resume point for the next one that does (conservative: a restart re-receives
            # records that were all filtered or duplicates, and drops them again)
            pending = self._repl_meta_pending
            pending[REPL_FROM + source_name] = _u64.pack(end_position)
            if data:
                if batch.meta is None:
                    batch.meta = {}
                batch.meta.update(pending)
                pending.clear()
        batch.durable.append(on_durable)
        self._schedule()
        return stored, dups
