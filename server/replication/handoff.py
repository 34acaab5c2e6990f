"""A publisher that moved here: what it published elsewhere goes ahead of what it publishes here
(docs/replication.md "A publisher that moves").

Each instance drops a replicated message whose sequence number is at or below the highest it
holds of that publisher (the duplicate check), so a publisher's messages must reach every
instance in the publisher's order. A publisher that fails over breaks that order across paths:
it published up to seq 71 on C, C replicated them to A but not yet to B, C dies; the publisher
logs on to A, is told 71, and goes on with 72 there. A sends 72.. to B (they are A's own), but
not 69..71, which came from C (loop prevention and pass-through leave them out); when C comes
back it sends B 69..71, and B drops them, holding 72: acknowledged messages lost on B, and never
delivered to its subscribers.

So when a publisher logs on to an instance whose newest message of it came from another
instance, the instance takes from its journal that publisher's newest run of records from
other instances (up to the highest it has accepted, not the sequence the logon reports: while a
sync destination has not acknowledged them, replicated records are in the journal but not yet
released, and the logon reports less; the publisher then resends them, duplicates here, and
goes on with its own. Records accepted but not yet written when it logs on, one commit's
worth, are still left out) (`foreign_tail`: back to its last record published here, at most
HANDOFF_MAX_BYTES) and each sender puts them on its link ahead of anything after the logon
(Sender.hand_off): the destination stores the ones it lacks, in the publisher's order, before
the first one published here, and drops the others as duplicates. The bound is the
replication backlog an instance can hold unacknowledged for a destination (MAX_UNACKED): what
the publisher's former instance had not yet sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from journal.journal import Journal
from journal.record import (
    KIND_MESSAGE,
    RawTuple,
    encode_record,
    raw_origin,
)
from protocol.replication import MAX_BATCH_BODY, encode_batch

__all__ = ["HANDOFF_MAX_BYTES", "Handoffs", "foreign_tail", "reencoded"]

log = logging.getLogger("tickertape.replication")

HANDOFF_MAX_BYTES = 8 * 1024 * 1024  # sender.py's MAX_UNACKED: what a peer can lag behind
PENDING_MAX_BYTES = 4 * HANDOFF_MAX_BYTES  # per destination, while its link is down
_READ = 256 * 1024


def _record_at(journal: Journal, position: int) -> RawTuple | None:
    recs, _ = journal.read_raw(position, 1)
    return recs[0] if recs and recs[0][0] == position else None


def foreign_tail(journal: Journal, pub: int, seq: int) -> list[RawTuple]:
    """Publisher `pub`'s message records after its last one published here, up to its `seq`
    (the highest accepted: its newest the journal holds at or below it), oldest first; []
    when its newest is its own here (or none is found). At most HANDOFF_MAX_BYTES of them (the
    newest)."""
    newest = journal.locate(pub, seq)
    if newest is None:  # accepted, not yet written: the newest written before it
        floor = journal.index.locate_floor(pub, seq)
        if floor is None:
            return []
        seq, newest = floor
    rec = _record_at(journal, newest)
    if rec is None or raw_origin(rec[7]) is None:
        return []
    # back along the publisher's index entries to one published here (or the window's start)
    start, s = newest, seq
    index = journal.index
    while start > journal.start_position and newest - start < HANDOFF_MAX_BYTES:
        floor = index.locate_floor(pub, s - 1) if s > 1 else None
        if floor is None:
            start = journal.start_position
            break
        s, start = floor
        rec = _record_at(journal, start)
        if rec is None or raw_origin(rec[7]) is None:
            break
    out: list[RawTuple] = []
    size = 0
    pos = start
    while pos <= newest:
        recs, nxt = journal.read_raw(pos, _READ)
        for r in recs:
            if r[0] > newest:
                break
            if r[1] != KIND_MESSAGE or r[2] != pub:
                continue
            if raw_origin(r[7]) is None:  # published here: what came before it, A sent itself
                out.clear()
                size = 0
                continue
            out.append(r)
            size += len(r[5]) + len(r[6]) + 64
        if nxt <= pos:
            nxt = journal.next_position(nxt)
            if nxt <= pos:
                break
        pos = nxt
    while size > HANDOFF_MAX_BYTES and out:
        r = out.pop(0)
        size -= len(r[5]) + len(r[6]) + 64
    return out


class Handoffs:
    """One destination's handed-off records (Sender.hand_off), as link batches of at most
    MAX_BATCH_BODY: each [body, the position it was sent at on the current link or None], kept
    until an ack past that position says the destination committed it (its pipeline commits in
    link order), and sent again on a new link. At most PENDING_MAX_BYTES wait; past that the
    oldest go (WARNING)."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self.pending: list[list] = []
        self.size = 0

    def add(self, records: list[RawTuple], keeps: Callable[[RawTuple], bool]) -> bool:
        """The records `keeps` says the destination carries; True when any were queued."""
        chunk: list[bytes] = []
        size = 0
        before = len(self.pending)
        for r in records:
            if not keeps(r):
                continue
            rec = reencoded(r)
            if chunk and size + len(rec) > MAX_BATCH_BODY:
                self.pending.append([b"".join(chunk), None])
                chunk, size = [], 0
            chunk.append(rec)
            size += len(rec)
            self.size += len(rec)
        if chunk:
            self.pending.append([b"".join(chunk), None])
        while self.size > PENDING_MAX_BYTES and len(self.pending) > 1:
            old = self.pending.pop(0)
            self.size -= len(old[0])
            log.warning(
                "replication to %s: more than %d bytes of moved publishers' records wait for "
                "the link; the oldest (%d bytes) are not sent",
                self.dest,
                PENDING_MAX_BYTES,
                len(old[0]),
            )
        return len(self.pending) > before

    def new_link(self) -> None:
        for h in self.pending:
            h[1] = None  # what the last link may not have committed goes again

    def send(self, send: Callable[[bytes], None], pos: int) -> list[int]:
        """The batches not yet sent on this link, as [pos, pos) (no position moves: the
        destination's resume point stays); the sizes of those sent."""
        sizes = []
        for h in self.pending:
            if h[1] is None:
                send(encode_batch(pos, pos, h[0]))
                h[1] = pos
                sizes.append(len(h[0]))
        return sizes

    def acked(self, pos: int) -> None:
        keep = [h for h in self.pending if h[1] is None or h[1] >= pos]
        if len(keep) != len(self.pending):
            self.pending = keep
            self.size = sum(len(h[0]) for h in keep)


def reencoded(r: RawTuple) -> bytes:
    """A raw record's bytes as stored: encoded again with its optional fields (expiration,
    header fragment, origin)."""
    extra = r[7]
    exp, hdr = (None, b"") if extra is None else (extra[0], extra[1])
    return encode_record(r[1], r[2], r[3], r[4], r[5], r[6], exp, hdr, raw_origin(extra))
