"""Compacted journal segments: the format, its writer and its reader. This module owns these bytes.

A compacted segment replaces one or more consecutive sealed segments (plain or compacted) that
covered the journal positions [base, end). It keeps each retained record's *original bytes*
(crc32 included) at its *original position*, so every position held by the LMDB index, a replay
cursor or a queue stays valid; dropped records leave gaps, like Kafka offsets after compaction.
Records are grouped in blocks of about 1 MiB, each compressed as one zstd frame, and a block
index at the end of the file lets a reader find the block for a position with one bisect and
one decompression.

File `<base:020d>.<tag>.cseg` in the journal directory (`tag` names the request that wrote it,
so re-compacting a range never reuses a name). All integers little-endian:

```
offset size  field
0      4     magic b"TTC\\x01"  (the last byte is the format version)
4      4     u32 crc32 of header bytes [8, 64)
8      8     u64 base position: first position covered (the base of the first source segment)
16     8     u64 end position: position after the range covered (end of the last source segment)
24     8     u64 records retained
32     8     u64 bytes of records retained (uncompressed, as in a plain segment)
40     8     u64 file offset of the block index
48     4     u32 block count
52     4     u32 source segments replaced
56     8     i64 drop cutoff, microseconds since the epoch (0: nothing was dropped for age)
64     ...   blocks, back to back
```

Block:

```
0      4     u32 C: compressed bytes
4      4     u32 U: uncompressed bytes (the block's records, back to back)
8      4     u32 crc32 of the runs and the C compressed bytes (everything after this header)
12     4     u32 R: runs in this block
16     12*R  runs: u64 position of the run's first record | u32 bytes of the run
..     C     one zstd frame of U bytes
```

A *run* is a stretch of records that were contiguous in the source (nothing dropped between
them); the records of a run sit at positions `run position + offset in the run`, exactly as in a
plain segment. Runs follow each other in the uncompressed bytes in position order.

Block index (at the offset the header gives), one entry per block, then a u32 crc32 of the entries:

```
0      8     u64 position of the block's first record
8      8     u64 position just after the block's last record
16     8     u64 file offset of the block
24     4     u32 records in the block
28     4     u32 reserved (0)
```

Reading: `read_raw(position)` returns the retained records at or after `position` (a dropped
position reads as the next retained record), and the position after the last one returned; past
the last retained record it returns ([], end). Checksums: the header and the block index are
checked at open, each block's compressed bytes when it is decompressed, and the records' own
crc32 when they are decoded (`read`, as for plain segments).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import zstandard

from .record import (
    BytesLike,
    CorruptRecord,
    RawTuple,
    Record,
    checked_size,
    decode_records,
    scan_records,
)

MAGIC = b"TTC\x01"
HEADER = struct.Struct("<4sIQQQQQIIq")
HEADER_SIZE = HEADER.size  # 64
BLOCK_HEAD = struct.Struct("<IIII")
RUN = struct.Struct("<QI")
INDEX_ENTRY = struct.Struct("<QQQII")
SUFFIX = ".cseg"
DEFAULT_BLOCK_SIZE = 1 << 20
DEFAULT_LEVEL = 3

assert HEADER_SIZE == 64

BlockRuns = tuple[tuple[int, int, int], ...]
"""A block's runs: (position of the run's first record, offset in the block's bytes, bytes)."""
T = TypeVar("T", bound=tuple[Any, ...])  # Record or RawTuple: position first


class CorruptCompacted(ValueError):
    """A compacted segment that cannot be read; `offset` is a file offset."""

    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(f"compacted segment {path} is damaged at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


def compacted_name(base: int, tag: str) -> str:
    return f"{base:020d}.{tag}{SUFFIX}"


def is_compacted_name(name: str) -> bool:
    return name.endswith(SUFFIX) and not name.startswith(".")


class CompactedWriter:
    """Writes one compacted segment to `path` (write to a temporary name; the caller renames).

    Feed records in position order with add_run(position, records_bytes, record_sizes); call
    finish() to write the block index and the header. Returns a summary dict from finish().
    """

    def __init__(
        self,
        path: str,
        base: int,
        end: int,
        *,
        sources: int = 1,
        cutoff_us: int = 0,
        level: int = DEFAULT_LEVEL,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ):
        self.path = path
        self.base = base
        self.end = end
        self.sources = sources
        self.cutoff_us = cutoff_us
        self.block_size = block_size
        self._cctx = zstandard.ZstdCompressor(level=level)
        self._f = open(path, "wb")
        self._f.write(b"\0" * HEADER_SIZE)
        self._offset = HEADER_SIZE
        self._parts: list[BytesLike] = []  # the pending block's bytes, in order
        self._runs: list[list[int]] = []  # [position, bytes] of the pending block
        self._pending = 0
        self._block_records = 0
        self._index: list[bytes] = []
        self.records = 0
        self.raw_bytes = 0
        self._last_end = base
        # crc32 of each block's uncompressed bytes (for read-back checks)
        self.raw_crcs: list[int] = []

    def add_run(self, position: int, data: BytesLike, record_sizes: list[int]) -> None:
        """Several contiguous records at once: `data` holds them back to back, `record_sizes`
        their sizes; blocks are cut between records, never inside one."""
        view = memoryview(data)
        start = 0
        acc = 0
        count = 0
        for n in record_sizes:
            if acc and self._pending + acc + n > self.block_size:
                self._add_contiguous(position + start, view[start : start + acc], count)
                start += acc
                acc = 0
                count = 0
            acc += n
            count += 1
        if acc:
            self._add_contiguous(position + start, view[start : start + acc], count)

    def _add_contiguous(self, position: int, data: BytesLike, nrecords: int) -> None:
        n = len(data)
        if position < self._last_end or position + n > self.end:
            raise ValueError(f"run at {position} (+{n}) is outside [{self._last_end}, {self.end})")
        runs = self._runs
        if runs and runs[-1][0] + runs[-1][1] == position:
            runs[-1][1] += n
        else:
            runs.append([position, n])
        self._parts.append(data)
        self._pending += n
        self._block_records += nrecords
        self.records += nrecords
        self.raw_bytes += n
        self._last_end = position + n
        if self._pending >= self.block_size:
            self._flush_block()

    def _flush_block(self) -> None:
        if not self._parts:
            return
        raw = b"".join(self._parts)
        self.raw_crcs.append(zlib.crc32(raw))
        comp = self._cctx.compress(raw)
        runs = self._runs
        runb = b"".join(RUN.pack(p, n) for p, n in runs)
        head = BLOCK_HEAD.pack(len(comp), len(raw), zlib.crc32(comp, zlib.crc32(runb)), len(runs))
        first = runs[0][0]
        last_end = runs[-1][0] + runs[-1][1]
        self._index.append(INDEX_ENTRY.pack(first, last_end, self._offset, self._block_records, 0))
        self._f.write(head)
        self._f.write(runb)
        self._f.write(comp)
        self._offset += len(head) + len(runb) + len(comp)
        self._parts = []
        self._runs = []
        self._pending = 0
        self._block_records = 0

    def finish(self, fsync: bool = True) -> dict[str, Any]:
        """Write the block index and the header (and fsync); the file's summary."""
        self._flush_block()
        index = b"".join(self._index)
        index_offset = self._offset
        self._f.write(index)
        self._f.write(struct.pack("<I", zlib.crc32(index)))
        body = HEADER.pack(
            MAGIC,
            0,
            self.base,
            self.end,
            self.records,
            self.raw_bytes,
            index_offset,
            len(self._index),
            self.sources,
            self.cutoff_us,
        )
        header = MAGIC + struct.pack("<I", zlib.crc32(body[8:])) + body[8:]
        self._f.seek(0)
        self._f.write(header)
        self._f.flush()
        if fsync:
            os.fsync(self._f.fileno())
        self._f.seek(0, os.SEEK_END)
        size = self._f.tell()
        self._f.close()
        return {
            "path": self.path,
            "base": self.base,
            "end": self.end,
            "records": self.records,
            "raw_bytes": self.raw_bytes,
            "file_bytes": size,
            "blocks": len(self._index),
        }

    def abort(self) -> None:
        try:
            self._f.close()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class CompactedReader:
    """Reads a compacted segment through the same calls as a plain one (see Journal.read_raw).

    Thread-safe: positioned reads on one fd, and a one-block cache replaced atomically.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self._load()
        except BaseException:
            os.close(self.fd)
            raise
        self._cache: tuple[int, bytes, BlockRuns] = (-1, b"", ())
        self._lock = threading.Lock()
        self._dctx = threading.local()

    def _load(self) -> None:
        head = os.pread(self.fd, HEADER_SIZE, 0)
        if len(head) < HEADER_SIZE:
            raise CorruptCompacted(
                self.path, 0, f"header truncated ({len(head)} of {HEADER_SIZE} bytes)"
            )
        (
            magic,
            hcrc,
            self.base,
            self.end,
            self.records,
            self.raw_bytes,
            index_off,
            nblocks,
            self.sources,
            self.cutoff_us,
        ) = HEADER.unpack(head)
        if magic[:3] != MAGIC[:3]:
            raise CorruptCompacted(self.path, 0, f"not a compacted segment (magic {magic!r})")
        if magic != MAGIC:
            raise CorruptCompacted(self.path, 0, f"unsupported compacted format version {magic[3]}")
        if zlib.crc32(head[8:]) != hcrc:
            raise CorruptCompacted(self.path, 4, "header checksum mismatch")
        size = os.fstat(self.fd).st_size
        want = nblocks * INDEX_ENTRY.size + 4
        if index_off + want != size:
            raise CorruptCompacted(
                self.path, index_off, f"file is {size} bytes; the header says {index_off + want}"
            )
        raw = os.pread(self.fd, want, index_off)
        if zlib.crc32(raw[:-4]) != struct.unpack_from("<I", raw, len(raw) - 4)[0]:
            raise CorruptCompacted(self.path, index_off, "block index checksum mismatch")
        self.file_bytes = size
        # the index's columns: each entry's first position, end, file offset and records
        columns = list(zip(*INDEX_ENTRY.iter_unpack(raw[:-4]))) or [()] * 4
        self.first_positions: list[int] = list(columns[0])
        self.block_ends: list[int] = list(columns[1])
        self.block_offsets: list[int] = list(columns[2])
        self.block_records: list[int] = list(columns[3])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    @property
    def blocks(self) -> int:
        return len(self.first_positions)

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        d = getattr(self._dctx, "d", None)
        if d is None:
            d = self._dctx.d = zstandard.ZstdDecompressor()
        return d

    def block(self, i: int) -> tuple[bytes, BlockRuns]:
        """(uncompressed bytes, runs as ((position, offset in the bytes, length), ...))."""
        cached = self._cache
        if cached[0] == i:
            return cached[1], cached[2]
        off = self.block_offsets[i]
        head = os.pread(self.fd, BLOCK_HEAD.size, off)
        if len(head) < BLOCK_HEAD.size:
            raise CorruptCompacted(self.path, off, "block header truncated")
        clen, ulen, ccrc, nruns = BLOCK_HEAD.unpack(head)
        rsize = nruns * RUN.size
        data = os.pread(self.fd, rsize + clen, off + BLOCK_HEAD.size)
        if len(data) < rsize + clen:
            raise CorruptCompacted(self.path, off, "block truncated")
        comp = memoryview(data)[rsize:]
        if zlib.crc32(data) != ccrc:
            raise CorruptCompacted(self.path, off, "block checksum mismatch")
        try:
            buf = self._decompressor().decompress(comp, max_output_size=ulen)
        except zstandard.ZstdError as exc:
            raise CorruptCompacted(self.path, off, f"zstd: {exc}") from None
        if len(buf) != ulen:
            raise CorruptCompacted(self.path, off, f"block holds {len(buf)} bytes, not {ulen}")
        found = []
        boff = 0
        for k in range(nruns):
            p, n = RUN.unpack_from(data, k * RUN.size)
            found.append((p, boff, n))
            boff += n
        if boff != ulen:
            raise CorruptCompacted(self.path, off, "runs do not add up to the block size")
        runs = tuple(found)
        self._cache = (i, buf, runs)
        return buf, runs

    def _block_for(self, position: int) -> int:
        """Index of the first block that may hold a record at or after position."""
        i = bisect.bisect_right(self.first_positions, position) - 1
        if i < 0:
            return 0
        return i + 1 if position >= self.block_ends[i] else i

    def _collect(
        self, position: int, max_bytes: int, decode: Callable[[bytes, int], tuple[list[T], int]]
    ) -> tuple[list[T], int]:
        """Whole records at or after position, about max_bytes of positions' worth (at least one
        record unless none is left), and the position just after the last one returned."""
        nb = len(self.first_positions)
        i = self._block_for(position)
        out: list[T] = []
        nxt = position
        first = None
        while i < nb:
            buf, runs = self.block(i)
            for rpos, boff, n in runs:
                rend = rpos + n
                if rend <= position:
                    continue
                o = 0
                if rpos < position:
                    o = position - rpos
                    if checked_size(buf, boff + o, boff + n) <= 0:
                        # not a record boundary: decode the run and skip to the first record after it
                        recs, stop = decode(buf[boff : boff + n], rpos)
                        if stop != n:
                            raise CorruptCompacted(
                                self.path, self.block_offsets[i], "a run ends inside a record"
                            )
                        k = 0
                        while k < len(recs) and recs[k][0] < position:
                            k += 1
                        if k == len(recs):
                            continue
                        o = recs[k][0] - rpos
                if first is None:
                    first = rpos + o
                budget = max(max_bytes - (rpos + o - first), 1)
                lim = min(n, o + budget)
                recs, stop = decode(buf[boff + o : boff + lim], rpos + o)
                if not recs:
                    recs, stop = decode(buf[boff + o : boff + n], rpos + o)
                    if not recs:
                        raise CorruptCompacted(
                            self.path,
                            self.block_offsets[i],
                            f"no whole record at position {rpos + o}",
                        )
                out.extend(recs)
                nxt = rpos + o + stop
                if nxt < rend or nxt - first >= max_bytes:  # the budget ends inside this run
                    return out, nxt
            i += 1
        if not out:
            return [], self.end
        return out, nxt

    def read_raw(self, position: int, max_bytes: int) -> tuple[list[RawTuple], int]:
        return self._collect(position, max_bytes, scan_records)

    def read(self, position: int, max_bytes: int) -> tuple[list[Record], int]:
        def dec(part: bytes, rpos: int) -> tuple[list[Record], int]:
            try:
                return decode_records(part, 0, len(part), rpos)
            except CorruptRecord as exc:
                raise CorruptCompacted(
                    self.path, -1, f"record at position {rpos + exc.offset}: {exc.reason}"
                ) from None

        return self._collect(position, max_bytes, dec)

    def holds(self, position: int) -> bool:
        """Whether a retained record starts exactly at position."""
        recs, _ = self.read_raw(position, 1)
        return bool(recs) and recs[0][0] == position

    def record_end(self, position: int) -> int | None:
        """Position just after the retained record at position, or None if none starts there."""
        recs, nxt = self.read_raw(position, 1)
        if not recs or recs[0][0] != position:
            return None
        return recs[1][0] if len(recs) > 1 else nxt

    def iter_blocks(self) -> Iterator[tuple[bytes, BlockRuns]]:
        """(uncompressed bytes, runs) for every block, in order (the batch job's reader)."""
        for i in range(len(self.first_positions)):
            yield self.block(i)
