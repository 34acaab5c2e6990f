"""A publish store in one memory-mapped file: survives the client process being killed.

Contract: client/pubstore.py. A store file serves one client at a time (an exclusive `flock`;
a second opener gets StoreLocked). A record is in the kernel's page cache when `store()`
returns (an mmap'ed write), so `kill -9` loses nothing; `sync()` / `close()` msync for power
loss.

File format (this module owns it; integers little-endian)::

    offset 0, 64 bytes: file header
      0   8  magic  b"TTPUBLOG"
      8   2  version (1)
      10  2  header size (64)
      12  4  crc32 of bytes 0..12
      16 24  ack slot 0 | 40 24  ack slot 1, each:
             generation u64 | acked_seq u64 | crc32 u32 of those 16 bytes | zero u32
             The current `acked_seq` is the valid slot with the higher generation; an update
             writes the other slot, so a torn write never loses the previous value.
    offset 64 to the end of the file: the data area, a ring of records, each starting at an
    8-byte aligned offset:
      0   4  magic b"TTPR"
      4   4  hcrc: crc32 of bytes 8..40 (the rest of this fixed header)
      8   4  payload length P = T + X + B
      12  4  pcrc: crc32 of the payload
      16  8  seq u64
      24  8  expiration f64 seconds (NaN: none)
      32  2  T topic length | 34 2 X correlation id length | 36 4 B body length
      40  P  topic UTF-8, correlation id UTF-8, body
      then zero to 7 padding bytes (not covered).

Space is reused once acked: records are appended at the tail of the ring and the head moves
forward as persisted acks arrive; the tail wraps to the start of the data area when the record
fits before the head. The file grows (doubling, up to `max_bytes`) only when the unpersisted
records need the room. A wrapped ring that is full is unwrapped by copying its wrapped part
after the first lap (the copies carry the same sequence numbers; a crash mid-copy leaves
duplicates, which recovery folds).

Recovery (open): read the header (unreadable: CorruptStore), then scan the whole data area for
records whose header checksum holds (a record is found by its magic at an aligned offset, so
recovery does not depend on ring pointers). Records with `seq <= acked_seq` are stale (their
space was free to reuse). Every other record is unpersisted and is kept if its payload checksum
holds; one that fails, or is cut off by the end of the file, is dropped and reported, as are
sequence numbers missing between `acked_seq` and the newest valid record. The kept records are
then written compactly to a new file that replaces the old one (rename), so damage never
survives an open. `recovery` holds the RecoveryReport; a damaged file logs a warning.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import struct
import zlib
from collections import deque

from .errors import CorruptStore, StoreFull
from .pubstore import PublishStore, StoredPublish, record_size
from .storefile import RecoveryReport, open_locked, recovered

__all__ = ["FilePublishStore"]

MAGIC = b"TTPUBLOG"
VERSION = 1
HEADER = 64
DATA = HEADER
REC_MAGIC = b"TTPR"
_FILE_HEAD = struct.Struct("<8sHH")  # magic, version, header size; crc32 follows
_SLOT = struct.Struct("<QQ")  # generation, acked_seq; crc32 + zero follow
_SLOT_OFFSETS = (16, 40)
_REC = struct.Struct("<4sIIIQdHHI")  # magic hcrc P pcrc seq exp T X B  (40 bytes)
_REC_FIXED = struct.Struct("<IIQdHHI")  # P pcrc seq exp T X B          (bytes 8..40)
REC_HEADER = _REC.size
_crc = zlib.crc32
_FIXED_PACK = _REC_FIXED.pack
_join = b"".join
_NAN = float("nan")
INITIAL_CAPACITY = 1024 * 1024


def _align(n: int) -> int:
    return (n + 7) & ~7


def _decode(mm: mmap.mmap, off: int) -> StoredPublish:
    """The record at `off` (its checksums already checked)."""
    _, _, plen, _, seq, exp, tlen, xlen, _ = _REC.unpack_from(mm, off)
    start = off + REC_HEADER
    topic = mm[start : start + tlen].decode()
    corr = mm[start + tlen : start + tlen + xlen].decode() if xlen else None
    body = mm[start + tlen + xlen : start + plen]
    return StoredPublish(seq, topic, body, None if math.isnan(exp) else exp, corr)


class FilePublishStore(PublishStore):
    """A file-backed publish store (see the module docstring for format and recovery).

    `max_bytes` bounds the file (default 256 MiB), `max_messages` the unpersisted records
    (default 1,000,000). Opening a damaged file never raises for damage after the header: read
    `recovery` for what was dropped.
    """

    path: str  # a file store always has one

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        max_messages: int = 1_000_000,
        initial_bytes: int = INITIAL_CAPACITY,
    ):
        self.path = os.fspath(path)
        if max_bytes < HEADER + 4096:
            raise ValueError("max_bytes must be at least 4160")
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self._initial = max(4096, min(_align(initial_bytes), max_bytes))
        self._live: deque[tuple[int, int, int]] = deque()  # (seq, offset, aligned size)
        self._topics: dict[str, bytes] = {}
        self._gen = 0
        self._acked = 0
        self._last = 0
        self._tail = DATA
        self._fd = open_locked(self.path)
        self.recovery = recovered(self._fd, self._open)

    def __repr__(self) -> str:
        return f"<FilePublishStore {self.path} acked={self._acked} last={self._last}>"

    # ------------------------------------------------------------------ open and recovery

    def _open(self) -> RecoveryReport:
        report = RecoveryReport(self.path)
        size = os.fstat(self._fd).st_size
        if size == 0 or (size < HEADER and not any(os.pread(self._fd, size, 0))):
            self._create(self._fd, [], 0, 0)
            return report
        if size < HEADER:
            raise CorruptStore(self.path, 0, f"file of {size} bytes is shorter than the header")
        with mmap.mmap(self._fd, size, access=mmap.ACCESS_READ) as mm:
            acked, gen = self._read_header(mm, report)
            records = self._scan(mm, size, acked, report)
        seqs = sorted(records)
        if seqs:
            present = set(seqs)
            report.missing = [s for s in range(acked + 1, seqs[-1]) if s not in present][:1000]
        report.records = len(seqs)
        last = max(acked, seqs[-1] if seqs else 0)
        # rewrite compactly: damage and stale records never outlive an open
        tmp = self.path + ".tmp"
        old = self._fd
        fd = open_locked(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            self._create(fd, [records[s] for s in seqs], acked, gen)
            self._mm.flush()
            os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            if getattr(self, "_mm", None) is not None:
                self._mm.close()
            os.close(fd)
            self._fd = old
            raise
        os.close(old)
        self._last = last
        return report

    def _read_header(self, mm: mmap.mmap, report: RecoveryReport) -> tuple[int, int]:
        magic, version, hsize = _FILE_HEAD.unpack_from(mm, 0)
        if magic != MAGIC:
            raise CorruptStore(self.path, 0, f"magic {magic!r} is not {MAGIC!r}")
        (crc,) = struct.unpack_from("<I", mm, 12)
        if crc != _crc(mm[0:12]):
            raise CorruptStore(self.path, 12, "file header checksum mismatch")
        if version != VERSION or hsize != HEADER:
            raise CorruptStore(self.path, 8, f"version {version} / header {hsize} unsupported")
        best = None
        for off in _SLOT_OFFSETS:
            gen, acked = _SLOT.unpack_from(mm, off)
            (crc,) = struct.unpack_from("<I", mm, off + 16)
            if crc == _crc(mm[off : off + 16]):
                if best is None or gen > best[0]:
                    best = (gen, acked)
            else:
                report.damage(off, "ack slot checksum mismatch (the other slot is used)")
        if best is None:
            report.damage(16, "both ack slots damaged: every valid record is republished")
            return 0, 0
        return best[1], best[0]

    def _scan(
        self, mm: mmap.mmap, size: int, acked: int, report: RecoveryReport
    ) -> dict[int, StoredPublish]:
        """Every valid unpersisted record by its sequence number."""
        found: dict[int, StoredPublish] = {}
        off = DATA
        find = mm.find
        while True:
            off = find(REC_MAGIC, off)
            if off < 0:
                return found
            if off % 8:
                off = _align(off)
                continue
            if off + REC_HEADER > size:
                report.damage(off, "record header cut off by the end of the file", size - off, 1)
                return found
            _, hcrc, plen, pcrc, seq, exp, tlen, xlen, blen = _REC.unpack_from(mm, off)
            if hcrc != _crc(mm[off + 8 : off + REC_HEADER]) or plen != tlen + xlen + blen:
                off += 8  # not a record header: a body that holds the magic, or stale bytes
                continue
            end = off + REC_HEADER + plen
            if seq <= acked:
                # stale: persisted before its space was reused; skip it whole if intact
                off = _align(end) if end <= size else off + 8
                continue
            if end > size:
                report.damage(off, f"record seq {seq} cut off by the end of the file",
                              size - off, 1)  # fmt: skip
                return found
            payload = mm[off + REC_HEADER : end]
            if _crc(payload) != pcrc:
                report.damage(off, f"record seq {seq}: payload checksum mismatch", end - off, 1)
                off += 8
                continue
            if seq not in found:
                found[seq] = _decode(mm, off)
            off = _align(end)

    def _create(self, fd: int, records: list[StoredPublish], acked: int, gen: int) -> None:
        """Write a fresh file on `fd`: header, ack slot, `records` packed from DATA."""
        need = DATA + sum(_align(REC_HEADER + len(r.topic.encode()) + len(r.body) +
                                 len((r.correlation_id or "").encode())) for r in records)  # fmt: skip
        cap = self._initial
        while cap < need * 2 and cap < self.max_bytes:
            cap = min(cap * 2, self.max_bytes)
        cap = max(cap, _align(need))
        os.ftruncate(fd, 0)
        os.ftruncate(fd, cap)
        head = _FILE_HEAD.pack(MAGIC, VERSION, HEADER)
        os.pwrite(fd, head + struct.pack("<I", _crc(head)), 0)
        self._fd = fd
        self._mm = mmap.mmap(fd, cap)
        self._cap = cap
        self._gen = gen
        self._write_slot(acked)
        self._write_slot(acked)  # both slots valid: a later torn write leaves the other
        self._acked = acked
        self._live.clear()
        self._tail = DATA
        for r in records:
            self._append(r.seq, r.topic, r.body, r.expiration, r.correlation_id)

    # ------------------------------------------------------------------ writing

    def _write_slot(self, acked: int) -> None:
        self._gen += 1
        off = _SLOT_OFFSETS[self._gen % 2]
        raw = _SLOT.pack(self._gen, acked)
        self._mm[off : off + 24] = raw + struct.pack("<II", _crc(raw), 0)

    def _place(self, n: int, commit: bool = True) -> int | None:
        """Offset where a record of aligned size `n` goes now, growing or unwrapping the ring
        if needed; None when that would pass max_bytes. `commit=False` only checks."""
        live = self._live
        if not live:
            if DATA + n <= self._cap:
                return DATA
            return self._grow(DATA + n, commit)
        head = live[0][1]
        tail = self._tail
        if tail > head:  # not wrapped: free space is [tail, cap) and [DATA, head)
            if tail + n <= self._cap:
                return tail
            if DATA + n <= head:
                return DATA
            return self._grow(tail + n, commit)
        if tail + n <= head:  # wrapped: free space is [tail, head)
            return tail
        return self._unwrap(n, commit)

    def _grow(self, need: int, commit: bool = True) -> int | None:
        """Make the file at least `need` bytes; returns the tail offset (None past max_bytes)."""
        if need > self.max_bytes:
            return None
        if not commit:
            return self._tail
        cap = self._cap
        while cap < need:
            cap *= 2
        cap = min(_align(cap), self.max_bytes)
        self._mm.close()
        os.ftruncate(self._fd, cap)
        self._mm = mmap.mmap(self._fd, cap)
        self._cap = cap
        return self._tail if self._live else DATA

    def _unwrap(self, n: int, commit: bool = True) -> int | None:
        """The ring is wrapped and full: copy the wrapped records after the end of the first
        lap, so the live records are contiguous again, then place `n` after them."""
        live = self._live
        split = next((i for i in range(1, len(live)) if live[i][1] < live[i - 1][1]), 0)
        if not split:  # pragma: no cover - wrapped implies a split
            return None
        lap_end = live[split - 1][1] + live[split - 1][2]
        moved = sum(e[2] for e in itertools.islice(live, split, None))
        need = lap_end + moved + n
        if need > self._cap and self._grow(need, commit) is None:
            return None
        if not commit:
            return lap_end + moved
        mm = self._mm
        dst = lap_end
        for i in range(split, len(live)):
            seq, src, size = live[i]
            mm[dst : dst + size] = mm[src : src + size]
            live[i] = (seq, dst, size)
            dst += size
        self._tail = dst
        return dst

    def _append(
        self, seq: int, topic: str, body: bytes, exp: float | None, corr: str | None
    ) -> None:
        """Write one record at the ring's tail (the hot path of store())."""
        tb = self._topics.get(topic)
        if tb is None:
            if len(self._topics) >= 1024:
                self._topics.clear()  # bounded: a publisher to many topics re-encodes now and then
            tb = self._topics[topic] = topic.encode()
        xb = corr.encode() if corr else b""
        blen = len(body)
        plen = len(tb) + len(xb) + blen
        fixed = _FIXED_PACK(plen, _crc(body, _crc(xb, _crc(tb))), seq,
                            _NAN if exp is None else exp, len(tb), len(xb), blen)  # fmt: skip
        size = (REC_HEADER + plen + 7) & ~7
        live = self._live
        tail = self._tail
        if live and tail > live[0][1] and tail + size <= self._cap:
            off = tail  # the common case: room after the tail, not wrapped
        else:
            placed = self._place(size)
            if placed is None:
                raise StoreFull(self.path, size, f"{self.max_bytes} bytes")
            off = placed
        rec = _join((REC_MAGIC, _crc(fixed).to_bytes(4, "little"), fixed, tb, xb, body))
        self._mm[off : off + len(rec)] = rec
        live.append((seq, off, size))
        self._tail = off + size

    # ------------------------------------------------------------------ PublishStore

    @property
    def last_seq(self) -> int:
        return self._last

    @property
    def acked_seq(self) -> int:
        return self._acked

    @property
    def file_bytes(self) -> int:
        return self._cap

    def fits(self, size: int) -> bool:
        if len(self._live) >= self.max_messages:
            return False
        # `size` is record_size() (64 bytes of overhead): at least this store's aligned record
        return self._place(_align(size), commit=False) is not None

    def store(
        self,
        topic: str,
        body: bytes,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> int:
        self._check()
        if len(self._live) >= self.max_messages:
            size = record_size(topic, body, correlation_id)
            raise StoreFull(self.path, size, f"{self.max_messages} messages")
        seq = self._last + 1
        self._append(seq, topic, body, expiration, correlation_id)
        self._last = seq
        return seq

    def discard_up_to(self, seq: int) -> int:
        self._check()
        if seq <= self._acked:
            return 0
        self._write_slot(seq)  # durable first: only then may the space be reused
        self._acked = seq
        live = self._live
        n = 0
        while live and live[0][0] <= seq:
            live.popleft()
            n += 1
        if not live:
            self._tail = DATA
        return n

    def _advance(self, seq: int) -> None:
        self._last = max(self._last, seq)
        if seq > self._acked:
            self._write_slot(seq)
            self._acked = seq

    def get(self, seq: int) -> StoredPublish | None:
        self._check()
        live = self._live
        if not live:
            return None
        i = seq - live[0][0]
        if 0 <= i < len(live) and live[i][0] == seq:
            return _decode(self._mm, live[i][1])
        for e in live:  # after a damaged file lost sequence numbers
            if e[0] == seq:
                return _decode(self._mm, e[1])
        return None

    def first_after(self, seq: int) -> StoredPublish | None:
        self._check()
        live = self._live
        if not live:
            return None
        i = max(0, seq + 1 - live[0][0])
        if i < len(live) and (i == 0 or live[i - 1][0] <= seq) and live[i][0] > seq:
            return _decode(self._mm, live[i][1])
        for e in live:  # not consecutive (sequence numbers lost to damage)
            if e[0] > seq:
                return _decode(self._mm, e[1])
        return None

    def unpersisted_count(self) -> int:
        return len(self._live)

    def sync(self) -> None:
        self._check()
        self._mm.flush()
        os.fsync(self._fd)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._mm.flush()
            os.fsync(self._fd)
        finally:
            self._mm.close()
            os.close(self._fd)
