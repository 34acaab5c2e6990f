"""Reads from the journal: records, raw record tuples and stored bytes by position, and
lookups by (publisher, sequence) and by time. Part of Journal (journal.py)."""

from __future__ import annotations

import bisect
import os

from .compacted import CorruptCompacted
from .errors import CorruptSegment
from .index import BM_SPAN
from .record import (
    SEGMENT_HEADER_SIZE,
    Record,
    decode_records,
    record_length_at,
    resync,
    scan_records,
    verified_prefix,
)
from .segments import READ_BLOCK, Segment, _seg_base


class JournalReader:
    def _reader_fd(self, seg: Segment) -> int:
        fd = self._read_fds.get(seg.path)
        if fd is None:
            with self._read_lock:
                fd = self._read_fds.get(seg.path)
                if fd is None:
                    fd = os.open(seg.path, os.O_RDONLY)
                    self._read_fds[seg.path] = fd
        return fd

    def _find(self, position: int) -> tuple[list[Segment], int]:
        """(segments, index of the one holding position) from one snapshot of the layout."""
        segs = self.segments
        return segs, max(0, bisect.bisect_right(segs, position, key=_seg_base) - 1)

    def _at(self, position: int):
        """(segment, position) for a read at `position`: a position below the start moves to the
        start; the segment is None where there is nothing to read (the durable end, or exactly
        at a segment's end)."""
        if position >= self._end:
            return None, position
        segs, i = self._find(position)
        seg = segs[i]
        if position < seg.base:  # below the start (removed)
            position = seg.base
        if position >= seg.end:
            return None, position
        return seg, position

    def _pread(self, seg, position: int, max_bytes: int) -> bytes:
        """Stored bytes of a plain segment from position, at most max_bytes within the segment
        and the durable end, or the whole record there when it is larger (as far as the
        segment goes: a damaged length is found by the checks, not here)."""
        limit = min(seg.end, self._end) - position
        fd = self._reader_fd(seg)
        off = SEGMENT_HEADER_SIZE + position - seg.base
        buf = os.pread(fd, min(max_bytes, limit), off)
        if len(buf) >= 4:
            size = record_length_at(buf, 0)
            if len(buf) < size <= limit:
                buf = os.pread(fd, size, off)
        return buf

    def _intact(self, seg, position: int, max_bytes: int) -> tuple[bytes, int]:
        """(bytes of checked records from position, position): whole good records, then at most
        the start of one record that the read cut short (every reader stops at a record that
        runs past its buffer; cutting it off here would copy the block, a tenth of a replay's
        cost). Damage is reported and skipped, so the position returned may be past the one
        asked for; (b"", end) when nothing good is left in the segment (end: its end, or the
        durable end)."""
        limit = min(seg.end, self._end)
        while position < limit:
            buf = self._pread(seg, position, max_bytes)
            stop, bad = verified_prefix(buf)
            if stop:
                return (buf if bad < 0 else buf[:stop]), position
            reason = (
                "bad length, kind or checksum"
                if bad == 0
                else "record runs past the end of the segment"
            )
            nxt = self._resync(seg, position + 1, limit)
            self.integrity.damaged(
                seg.path, SEGMENT_HEADER_SIZE + position - seg.base, nxt - position, reason
            )
            position = nxt
        return b"", limit

    def _resync(self, seg, position: int, limit: int) -> int:
        """The position of the first good record at or after position in seg, else limit."""
        window = 4 * READ_BLOCK
        fd = self._reader_fd(seg)
        while position < limit:
            buf = os.pread(
                fd, min(window, limit - position), SEGMENT_HEADER_SIZE + position - seg.base
            )
            found = resync(buf, 0)
            if found >= 0:
                return position + found
            if position + len(buf) >= limit:
                break
            # the next window overlaps this one by a record header and a little: a good record
            # that began near its end is found whole in the next
            position += max(1, len(buf) - 64 * 1024)
        return limit

    def read(
        self, position: int, max_bytes: int = READ_BLOCK, verify: bool = False
    ) -> tuple[list[Record], int]:
        """Records from `position` (a record boundary) up to about max_bytes, and the next position.

        Reads only durable, checked records (damage is skipped and reported; `verify` is kept
        for callers: every read verifies). At the end of a segment returns ([], position).
        """
        seg, position = self._at(position)
        if seg is None:
            return [], position
        if seg.reader is not None:
            try:
                return seg.reader.read(position, max_bytes, True)
            except CorruptCompacted as exc:
                raise CorruptSegment(seg.path, exc.offset, exc.reason) from None
        buf, position = self._intact(seg, position, max_bytes)
        recs, stop = decode_records(buf, 0, len(buf), position, False)
        return recs, position + stop

    def read_raw(self, position: int, max_bytes: int = READ_BLOCK) -> tuple[list[tuple], int]:
        """Like read(), as scan_records tuples (the replay fast path). Stops at a segment end.

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

    def scan(self, position: int | None = None, max_bytes: int = READ_BLOCK):
        """Iterate every durable record from `position` (default: the start) to the current end."""
        pos = self.start_position if position is None else position
        while True:
            recs, nxt = self.read(pos, max_bytes)
            if not recs:
                if nxt >= self._end:
                    return
                nxt2 = self.next_position(
                    nxt
                )  # a segment boundary, or the end of a compacted range
                if nxt2 == pos:
                    return
                pos = nxt2
                continue
            yield from recs
            pos = nxt

    def next_position(self, position: int) -> int:
        """Normalize a position that sits at the end of a sealed segment to the next segment's start
        (and one below the start of the journal to the start)."""
        segs, i = self._find(position)
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
        budget = 4 * BM_SPAN + READ_BLOCK
        while budget > 0:
            recs, nxt = self.read_raw(pos, 64 * 1024)
            if not recs:
                nxt2 = self.next_position(nxt)
                if nxt2 == pos:
                    return None
                pos = nxt2
                continue
            for r in recs:
                if r[2] == publisher_id and r[1] == 1:
                    if r[3] == seq:
                        return r[0]
                    if r[3] > seq:
                        return None
            budget -= nxt - pos
            pos = nxt
        return None

    def after(self, position: int) -> int:
        """Position of the record that follows the one at `position`."""
        segs, i = self._find(position)
        seg = segs[i]
        if seg.reader is not None:
            e = seg.reader.record_end(position)
            if e is None:
                raise CorruptSegment(seg.path, 0, f"no record at position {position}")
            return self.next_position(e)
        head = os.pread(self._reader_fd(seg), 4, SEGMENT_HEADER_SIZE + position - seg.base)
        if len(head) < 4:
            raise CorruptSegment(
                seg.path, SEGMENT_HEADER_SIZE + position - seg.base, "no record at this position"
            )
        return self.next_position(position + record_length_at(head, 0))

    def locate_time(self, ts_us: int) -> int:
        """Position of the first record with a timestamp after ts_us (end_position if none)."""
        pos = self.index.time_floor(ts_us)
        if pos is None or pos < self.start_position:
            pos = self.start_position
        # the time index has an entry at least every TIME_STRIDE records: read small blocks
        while True:
            recs, nxt = self.read_raw(pos, 48 * 1024)
            if not recs:
                nxt2 = self.next_position(nxt)
                if nxt2 == pos:
                    return self._end
                pos = nxt2
                continue
            for r in recs:
                if r[4] > ts_us:
                    return r[0]
            pos = nxt

    def publishers(self) -> dict[int, tuple[int, int]]:
        return self.index.publishers()

    def disk_bytes(self) -> int:
        return sum(s.file_bytes for s in self.segments)

    def holds(self, position: int) -> bool:
        """Whether a record starts at position (False where compaction dropped it or below the
        start). Plain segments are taken on trust: positions come from the index."""
        segs, i = self._find(position)
        seg = segs[i]
        if position < seg.base or position >= self._end:
            return False
        return seg.reader is None or seg.reader.holds(position)
