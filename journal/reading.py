"""Reads from the journal: records, raw records and stored bytes by position, the records
iterators, and lookups by (publisher, sequence) and by time, over the journal's layout
(state.py). The reader owns the read descriptors: one per file, opened on first use, and those of
files a layout change retired, closed (and the files unlinked) once no read can still be on them.

Every read of a plain segment goes through walk.good_runs: only whole records whose checks pass
are returned; damage is skipped and reported to `integrity` (file, offset, bytes, reason).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .compacted import CorruptCompacted
from .errors import CorruptSegment
from .index import BM_SPAN, JournalIndex
from .integrity import Integrity
from .record import (
    KIND_MESSAGE,
    R_KIND,
    R_POSITION,
    R_PUBLISHER,
    R_SEQ,
    R_TIMESTAMP,
    SEGMENT_HEADER_SIZE,
    RawRecord,
    RawTuple,
    Record,
    decode_records,
    record_length_at,
    scan_records,
)
from .segments import READ_BLOCK, Segment
from .state import Layout
from .walk import FileRecords, next_run

T = TypeVar("T", bound=tuple[Any, ...])  # Record or RawTuple: position first


class JournalReader:
    def __init__(self, layout: Layout, index: JournalIndex, integrity: Integrity):
        self.layout = layout
        self.index = index
        self.integrity = integrity  # damage found by a read is reported here
        self._read_fds: dict[str, int] = {}  # by path: a compacted file may reuse a base
        self._read_lock = threading.Lock()
        self._retired: list[tuple[float, Segment, int | None]] = []  # (when, segment, its fd)

    def fd_of(self, seg: Segment) -> int:
        """The cached read descriptor of a segment's file."""
        fd = self._read_fds.get(seg.path)
        if fd is None:
            with self._read_lock:
                fd = self._read_fds.get(seg.path)
                if fd is None:
                    fd = os.open(seg.path, os.O_RDONLY)
                    self._read_fds[seg.path] = fd
        return fd

    @property
    def start_position(self) -> int:
        return self.layout.segments[0].base

    def _at(self, position: int) -> tuple[Segment | None, int]:
        """(segment, position) for a read at `position`: a position below the start moves to the
        start; the segment is None where there is nothing to read (the durable end, or exactly
        at a segment's end)."""
        if position >= self.layout.end:
            return None, position
        segs, i = self.layout.find(position)
        seg = segs[i]
        if position < seg.base:  # below the start (removed)
            position = seg.base
        if position >= seg.end:
            return None, position
        return seg, position

    def source(self, seg: Segment) -> FileRecords:
        return FileRecords(self.fd_of(seg), seg.base)

    def pread(self, seg: Segment, position: int, max_bytes: int) -> bytes:
        """Stored bytes of a plain segment from position, at most max_bytes within the segment
        and the durable end, or the whole record there when it is larger (as far as the
        segment goes: a damaged length is found by the checks, not here)."""
        return self.source(seg).window(position, min(seg.end, self.layout.end), max_bytes)

    def _intact(self, seg: Segment, position: int, max_bytes: int) -> tuple[bytes, int]:
        """(bytes of whole, checked records from position, position), perhaps ending with the
        start of a record max_bytes cut short (every reader here stops at a record that runs
        past its buffer; walk.next_run's keep_cut). Damage is reported and skipped, so the
        position returned may be past the one asked for; (b"", end) when nothing good is left
        in the segment (end: its end, or the durable end)."""
        limit = min(seg.end, self.layout.end)
        report = functools.partial(self.integrity.damaged, seg.path)
        run = next_run(self.source(seg), position, limit, report, max_bytes, keep_cut=True)
        return (b"", limit) if run is None else (run[1], run[0])

    def resync(self, seg: Segment, position: int, limit: int) -> int:
        """The position of the first good record at or after position in seg, else limit."""
        return self.source(seg).find_good(position, limit)

    def read(self, position: int, max_bytes: int = READ_BLOCK) -> tuple[list[Record], int]:
        """Records from `position` (a record boundary) up to about max_bytes, and the next position.

        Reads only durable, checked records (damage is skipped and reported). At the end of a
        segment returns ([], position).
        """
        seg, position = self._at(position)
        if seg is None:
            return [], position
        if seg.reader is not None:
            try:
                return seg.reader.read(position, max_bytes)
            except CorruptCompacted as exc:
                raise CorruptSegment(seg.path, exc.offset, exc.reason) from None
        buf, position = self._intact(seg, position, max_bytes)
        recs, stop = decode_records(buf, 0, len(buf), position, False)
        return recs, position + stop

    def read_raw(self, position: int, max_bytes: int = READ_BLOCK) -> tuple[list[RawTuple], int]:
        """Like read(), as RawTuples (record.RawRecord's shape; the replay fast path). Stops at a
        segment end.

        In a compacted segment the records returned are the retained ones at or after position;
        past the last one it returns ([], the segment's end), which next_position carries on.
        """
        seg, position = self._at(position)
        if seg is None:
            return [], position
        if seg.reader is not None:
            try:
                return seg.reader.read_raw(position, max_bytes)
            except CorruptCompacted as exc:
                raise CorruptSegment(seg.path, exc.offset, exc.reason) from None
        buf, position = self._intact(seg, position, max_bytes)
        recs, stop = scan_records(buf, position)
        return recs, position + stop

    def read_block(self, position: int, max_bytes: int = READ_BLOCK) -> tuple[bytes, int] | None:
        """Checked stored bytes from `position`: whole good records, to at most max_bytes on
        (more when the record there is larger), and perhaps the start of the next record cut
        short by max_bytes (never a damaged one), within its segment and the durable end, as
        (bytes, position); the position is normalized like read_raw's and moves past damage
        (reported, never returned). None in a compacted segment, whose bytes are not stored as
        they were written (use read_raw). Replay and queues splice frames from these bytes.
        """
        seg, position = self._at(position)
        if seg is None:
            return b"", position
        if seg.reader is not None:
            return None
        return self._intact(seg, position, max_bytes)

    def _walk(
        self,
        read: Callable[[int, int], tuple[list[T], int]],
        start: int | None,
        end: int | None,
        max_bytes: int,
    ) -> Iterator[list[T]]:
        """Batches of read(position, max_bytes) from start to end, across segment ends and the
        gaps of compacted segments, to the durable end as it is when the walk gets there."""
        pos = self.start_position if start is None else start
        while end is None or pos < end:
            recs, nxt = read(pos, max_bytes)
            if not recs:
                nxt2 = self.next_position(nxt)  # a segment's end, or a compacted range's
                if nxt2 == pos or nxt2 >= self.layout.end:
                    return
                pos = nxt2
                continue
            if end is not None and recs[-1][0] >= end:
                yield [r for r in recs if r[0] < end]
                return
            yield recs
            pos = nxt

    def raw_batches(
        self, start: int | None = None, end: int | None = None, max_bytes: int = READ_BLOCK
    ) -> Iterator[list[RawTuple]]:
        """Every durable record from `start` (a record boundary; default: the start of the
        journal) to `end` (default: the durable end), in batches of about max_bytes, as
        RawTuples: the form for hot loops (unpack them, or index with record.R_*).

        This is the journal's walk of its records: every record is checked before it is
        returned (walk.good_runs); damage is skipped and reported to `integrity`; segment ends
        and the gaps compaction left are passed. Records appended while it runs are included
        up to the end as it is when the walk reaches it."""
        return self._walk(self.read_raw, start, end, max_bytes)

    def records(
        self, start: int | None = None, end: int | None = None, max_bytes: int = READ_BLOCK
    ) -> Iterator[RawRecord]:
        """raw_batches(), one RawRecord at a time (named fields; for loops that are not hot)."""
        make = RawRecord._make
        for batch in self._walk(self.read_raw, start, end, max_bytes):
            yield from map(make, batch)

    def scan(self, position: int | None = None, max_bytes: int = READ_BLOCK) -> Iterator[Record]:
        """Every durable record from `position` (default: the start) to the current end,
        decoded (topic as str): the same walk as raw_batches()."""
        for batch in self._walk(self.read, position, None, max_bytes):
            yield from batch

    def next_position(self, position: int) -> int:
        """Normalize a position that sits at the end of a sealed segment to the next segment's start
        (and one below the start of the journal to the start)."""
        segs, i = self.layout.find(position)
        if position < segs[0].base:
            return segs[0].base
        if position >= segs[i].end and i + 1 < len(segs):
            return segs[i + 1].base
        return position

    def locate(self, publisher_id: int, seq: int) -> int | None:
        """Position of the message (publisher_id, seq), or None if the journal does not hold it.

        The index is sparse (index.py): take the floor entry, then scan forward; the scan is
        bounded because the index has an entry at least every BM_SPAN bytes of a publisher's run.
        """
        floor = self.index.locate_floor(publisher_id, seq)
        if floor is None:
            return None
        found_seq, pos = floor
        if pos < self.start_position:
            return None
        if found_seq == seq:
            return pos if self.holds(pos) else None  # compaction may have dropped it
        horizon = pos + 4 * BM_SPAN + READ_BLOCK
        for batch in self.raw_batches(pos, max_bytes=64 * 1024):
            for r in batch:
                if r[R_PUBLISHER] == publisher_id and r[R_KIND] == KIND_MESSAGE:
                    if r[R_SEQ] == seq:
                        return r[R_POSITION]
                    if r[R_SEQ] > seq:
                        return None
            if batch[-1][R_POSITION] >= horizon:
                break
        return None

    def after(self, position: int) -> int:
        """Position of the record that follows the one at `position`."""
        segs, i = self.layout.find(position)
        seg = segs[i]
        if seg.reader is not None:
            e = seg.reader.record_end(position)
            if e is None:
                raise CorruptSegment(seg.path, 0, f"no record at position {position}")
            return self.next_position(e)
        offset = SEGMENT_HEADER_SIZE + position - seg.base
        head = os.pread(self.fd_of(seg), 4, offset)
        if len(head) < 4:
            raise CorruptSegment(seg.path, offset, "no record at this position")
        return self.next_position(position + record_length_at(head, 0))

    def locate_time(self, ts_us: int) -> int:
        """Position of the first record with a timestamp after ts_us (the durable end if none)."""
        pos = self.index.time_floor(ts_us)
        if pos is None or pos < self.start_position:
            pos = self.start_position
        # the time index has an entry at least every TIME_STRIDE records: read small blocks
        for batch in self.raw_batches(pos, max_bytes=48 * 1024):
            for r in batch:
                if r[R_TIMESTAMP] > ts_us:
                    return r[R_POSITION]
        return self.layout.end

    def disk_bytes(self) -> int:
        return sum(s.file_bytes for s in self.layout.segments)

    def holds(self, position: int) -> bool:
        """Whether a record starts at position (False where compaction dropped it or below the
        start). Plain segments are taken on trust: positions come from the index."""
        segs, i = self.layout.find(position)
        seg = segs[i]
        if position < seg.base or position >= self.layout.end:
            return False
        return seg.reader is None or seg.reader.holds(position)

    # -- the descriptors' life -----------------------------------------------------------------

    def retire(self, gone: list[Segment]) -> None:
        """Segments a layout change took out: their files go at a later collect_garbage."""
        now = time.monotonic()
        with self._read_lock:
            for seg in gone:
                self._retired.append((now, seg, self._read_fds.pop(seg.path, None)))

    def collect_garbage(self, grace_s: float = 30.0) -> int:
        """Unlink retired files (and close their fds) once no read can still be starting on them."""
        now = time.monotonic()
        done = 0
        with self._read_lock:
            keep = []
            for when, seg, fd in self._retired:
                if now - when < grace_s:
                    keep.append((when, seg, fd))
                    continue
                if fd is not None:
                    os.close(fd)
                if seg.reader is not None:
                    seg.reader.close()
                if all(s.path != seg.path for s in self.layout.segments):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(seg.path)
                done += 1
            self._retired = keep
        return done

    def close(self) -> None:
        """Close every descriptor and compacted reader, and remove what was retired."""
        with self._read_lock:
            fds = list(self._read_fds.values())
            self._read_fds.clear()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for seg in self.layout.segments:
            if seg.reader is not None:
                seg.reader.close()
        self.collect_garbage(grace_s=0.0)
