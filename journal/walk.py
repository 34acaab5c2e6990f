"""The one walk over stored records: checked runs, damage skipped and reported.

Every reader of plain segment bytes goes through `next_run` / `good_runs`: Journal.read_raw,
read and read_block and with them the records iterators (reading.py), recovery's scan of the
tail (recovery.py), and the archive / compaction tasks, which read whole segment files without
a Journal (job_input.py).

The walk takes a window of bytes at a position, hands out its prefix of whole, good records
(record.verified_prefix: a length that holds the record's own fields, a known kind and flags,
the crc32), and when the record at the position is damaged, finds the next good record
(record.resync), reports the region in between and goes on from there. A record is never handed
out unchecked, and a damaged one never at all. A source supplies the bytes: `FileRecords` reads
a plain segment file with pread, `BufferRecords` a segment already in memory.

Positions are journal positions (record.py); a report names the *file* offset of the damaged
region (segment header included), its size and why, as Integrity.damaged takes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from .record import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    record_length_at,
    resync,
    verified_prefix,
)

Report = Callable[[int, int, str], None]
"""report(file offset, bytes skipped, reason) for each damaged region a walk skips."""

DAMAGED = "bad length, kind or checksum"
RUNS_PAST = "record runs past the end of the segment"
RESYNC_WINDOW = 1024 * 1024
# consecutive resync windows overlap: a good record that began near one's end is whole in the next
RESYNC_OVERLAP = 64 * 1024

B = TypeVar("B", bytes, memoryview)
B_co = TypeVar("B_co", bytes, memoryview, covariant=True)


class RecordSource(Protocol[B_co]):
    """Where a walk reads: the records of one plain segment, by journal position."""

    def window(self, position: int, limit: int, max_bytes: int | None) -> B_co:
        """Stored bytes from position: at most max_bytes (None: up to limit), or the whole
        record there when it is larger (at least a record header, so its length is seen: a
        window too small for it would take a good record for a damaged one), never past
        limit."""
        ...

    def find_good(self, position: int, limit: int) -> int:
        """Position of the first good record at or after position, else limit."""
        ...

    def file_offset(self, position: int) -> int:
        """The file offset of position (for reports)."""
        ...


class FileRecords:
    """A plain segment file read with pread on an open descriptor (the journal's read fds)."""

    __slots__ = ("base", "fd")

    def __init__(self, fd: int, base: int):
        self.fd = fd
        self.base = base

    def file_offset(self, position: int) -> int:
        return SEGMENT_HEADER_SIZE + position - self.base

    def window(self, position: int, limit: int, max_bytes: int | None) -> bytes:
        left = limit - position
        off = SEGMENT_HEADER_SIZE + position - self.base
        want = left if max_bytes is None else min(max(max_bytes, RECORD_HEADER_SIZE), left)
        buf = os.pread(self.fd, want, off)
        if len(buf) >= 4:
            size = record_length_at(buf, 0)
            if len(buf) < size <= left:  # one record larger than max_bytes: all of it
                buf = os.pread(self.fd, size, off)
        return buf

    def find_good(self, position: int, limit: int) -> int:
        while position < limit:
            buf = os.pread(
                self.fd, min(RESYNC_WINDOW, limit - position), self.file_offset(position)
            )
            found = resync(buf, 0)
            if found >= 0:
                return position + found
            if position + len(buf) >= limit:
                break
            position += max(1, len(buf) - RESYNC_OVERLAP)
        return limit


class BufferRecords:
    """A plain segment's records already in memory (`records`: the file after its header)."""

    __slots__ = ("base", "view")

    def __init__(self, records: bytes | bytearray | memoryview, base: int):
        self.view = memoryview(records)
        self.base = base

    def file_offset(self, position: int) -> int:
        return SEGMENT_HEADER_SIZE + position - self.base

    def window(self, position: int, limit: int, max_bytes: int | None) -> memoryview:
        a = position - self.base
        z = limit - self.base
        if max_bytes is not None and max_bytes < z - a:
            n = max(max_bytes, RECORD_HEADER_SIZE)
            size = record_length_at(self.view, a) if z - a >= 4 else 0
            z = min(z, a + (size if n < size <= z - a else n))
        return self.view[a:z]

    def find_good(self, position: int, limit: int) -> int:
        found = resync(self.view[: limit - self.base], position - self.base)
        return limit if found < 0 else self.base + found


def next_run(
    src: RecordSource[B],
    start: int,
    limit: int,
    report: Report,
    max_bytes: int | None = None,
    keep_cut: bool = False,
) -> tuple[int, B] | None:
    """The walk's step: (position, bytes) of the first run of whole, checked records at or
    after `start` (a record boundary) and before `limit`, at most max_bytes (None: as long as
    the good records go on) unless one record is larger; None if no good record is left. Each
    damaged region passed on the way is reported, one that reaches `limit` (nothing good after
    it: a torn tail, or a file shorter than its segment) too.

    keep_cut: the bytes may end with the start of a record that max_bytes cut short (never a
    damaged one), for readers that stop at a record running past their buffer anyway: cutting
    it off copies the window, a tenth of what a replay costs."""
    pos = start
    while pos < limit:
        buf = src.window(pos, limit, max_bytes)
        stop, bad = verified_prefix(buf)
        if stop:
            if stop == len(buf) or (keep_cut and bad < 0):
                return pos, buf
            return pos, buf[:stop]
        nxt = src.find_good(pos + 1, limit)
        report(src.file_offset(pos), nxt - pos, DAMAGED if bad == 0 else RUNS_PAST)
        pos = nxt
    return None


def good_runs(
    src: RecordSource[B],
    start: int,
    limit: int,
    report: Report,
    max_bytes: int | None = None,
) -> Iterator[tuple[int, B]]:
    """Every run of next_run() in [start, limit), in order: all the good records, each damaged
    region between them reported once, when the walk passes it."""
    while (run := next_run(src, start, limit, report, max_bytes)) is not None:
        yield run
        start = run[0] + len(run[1])
