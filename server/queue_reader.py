"""The queues' reads of the journal: where `QueueManager` (server/queues.py) gets a queue's
messages back, and the replicated queues' events find the messages they name.

`QueueReader` keeps the one journal block read last (a run of deliveries costs one read, and the
frames of a run are spliced from that block: `splice_run`), the retained records of the last
compacted block read (a compacted segment has no bytes as written), and a memo of the positions
of (publisher, seq) pairs a peer's events named (`locate`; `forget` clears it every tick).
Its one door is the journal.
"""

from __future__ import annotations

import array
import logging
from typing import Any

from journal.journal import Journal
from journal.record import (
    KIND_MESSAGE,
    R_BODY,
    R_EXTRA,
    R_KIND,
    R_POSITION,
    R_PUBLISHER,
    R_SEQ,
    R_TIMESTAMP,
    R_TOPIC,
    RECORD_HEADER_SIZE,
    RawRecord,
    RawTuple,
    record_length_at,
    scan_records,
)

from .queue_repl import record_origin
from .queue_types import StoredMessage
from .splice import splice_at

__all__ = ["QueueReader"]

log = logging.getLogger("tickertape.queues")

CACHE_BLOCK = 256 * 1024
LOCATE_SPAN = 64 * 1024  # journal bytes whose messages one replicated-event lookup remembers
LOCATE_MEMO = 65_536  # most (publisher, seq) -> position entries remembered


class QueueReader:
    """Messages read back from the journal for the queues, through a one-block cache."""

    def __init__(self, journal: Journal | None) -> None:
        self.journal = journal
        self.block: tuple[bytes, int] | None = None  # journal bytes of the last read (block_at)
        self.compacted: dict[int, StoredMessage] = {}  # the last compacted block read
        self.located: dict[tuple[int, int], int] = {}  # locate's memo, cleared every tick

    def forget(self) -> None:
        """Drop the memo of located messages: it serves one burst of events, never stale long."""
        self.located.clear()

    def locate(self, pub: int, seq: int) -> int | None:
        """The position here of the message (pub, seq) named by a replicated event. A peer's
        events name runs of neighbouring messages (its acks, in order), and each journal lookup
        scans up to a few hundred KB (1,000 single acks caught up after a heal held the loop
        for 12 s): the messages of the span after each one found are remembered."""
        journal = self.journal
        assert journal is not None
        pos = self.located.get((pub, seq))
        if pos is not None and pos >= journal.start_position:
            return pos
        pos = journal.locate(pub, seq)
        if pos is not None:
            blk = self.block_at(pos)
            if blk is not None:  # (not a compacted segment)
                buf, base = blk
                recs, _ = scan_records(buf[pos - base : pos - base + LOCATE_SPAN], pos)
                if len(self.located) + len(recs) > LOCATE_MEMO:
                    self.located.clear()
                self.located.update(
                    ((r[R_PUBLISHER], r[R_SEQ]), r[R_POSITION])
                    for r in recs
                    if r[R_KIND] == KIND_MESSAGE
                )
        return pos

    def origin_at(self, position: int) -> tuple[tuple[str, int] | None, int, Any] | None:
        """(origin or None, receive time, `e`) of the message at position, read back."""
        journal = self.journal
        if journal is None or position < journal.start_position:
            return None
        recs, _ = journal.read_raw(position, 64 * 1024)
        r = RawRecord._make(recs[0]) if recs else None  # after a takeover only: not hot
        if r is None or r.position != position or r.kind != KIND_MESSAGE:
            return None
        extra = r.extra
        return record_origin(extra, r.timestamp_us), r.timestamp_us, extra[0] if extra else None

    def block_at(self, position: int) -> tuple[bytes, int] | None:
        """The journal block (bytes, base) holding the whole record at position: the cached one,
        else the block read from there (and kept). None where the bytes are not stored as
        written (a compacted segment) or no longer stored."""
        blk = self.block
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
        self.block = got
        return got

    def splice_run(
        self, positions: array.array, head: bytes, tail: bytes
    ) -> tuple[bytes, list[str], int] | None:
        """splice_at over the journal block holding positions[0], or None where the bytes are
        not stored as written (compacted, removed): the caller then reads record by record."""
        blk = self.block_at(positions[0])
        if blk is None:
            return None
        try:
            return splice_at(blk[0], blk[1], positions, head, tail)  # the first record is whole
        except ValueError:
            log.exception("queue delivery from the journal block at %d", blk[1])
            self.block = None
            return None

    def read(self, position: int) -> StoredMessage | None:
        """(position, pub, seq, ts, topic_b, body, header fragment) of the message at position,
        or None if the journal no longer holds one there."""
        journal = self.journal
        if journal is None or position < journal.start_position:
            return None
        blk = self.block_at(position)
        if blk is not None:
            buf, base = blk
            off = position - base
            r = scan_records(buf[off : off + record_length_at(buf, off)], position)[0][0]
            if r[R_KIND] != KIND_MESSAGE:
                return None
            return _stored(r)
        # a compacted segment: its retained records, by position
        rec = self.compacted.get(position)
        if rec is not None:
            return rec
        recs, _ = journal.read_raw(position, CACHE_BLOCK)
        self.compacted = {r[R_POSITION]: _stored(r) for r in recs if r[R_KIND] == KIND_MESSAGE}
        return self.compacted.get(position)


def _stored(r: RawTuple) -> StoredMessage:
    """A message record read back as a queue keeps it (its header fragment, b"" for none)."""
    extra = r[R_EXTRA]
    return (
        r[R_POSITION],
        r[R_PUBLISHER],
        r[R_SEQ],
        r[R_TIMESTAMP],
        r[R_TOPIC],
        r[R_BODY],
        extra[1] if extra else b"",
    )
