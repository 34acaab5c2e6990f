"""A fast file bookmark store for applications that discard in the order they receive.

Each subscription owns one fixed-size slot of a memory-mapped file holding its resume point;
`discard(message)` overwrites it with that message's bookmark (a memcpy into the page cache:
no system call, survives `kill -9`). Only the resume point is on disk: messages discarded out
of order are not remembered, so an application that discards out of order gets, after a
restart, everything after the oldest point it discarded up to in order. Within one process the
store still drops duplicates and out-of-order messages per publisher (the newest sequence per
publisher is kept in memory), so reconnects and failover deliver nothing twice.

Marks (periodic `persisted` acks) move the resume point when everything received before them
is discarded. A mark that arrives while a replay is still re-sending messages already seen
(the newest message was a duplicate) is ignored: it lies behind the resume point, and with no
record of what was discarded after it, moving back would repeat messages after a restart.

File format (this module owns it; integers little-endian)::

    header, 64 bytes: magic b"TTBMRING" | version u16 (1) | slot size u16 (512) |
                      zero u32 | crc32 u32 of bytes 0..16 | zero to 64
    slot i at 64 + 512 * i:
      0    4  crc32 of bytes 4..256
      4    2  sub_id length (0: free slot) | 6 250 sub_id UTF-8
      256 128 half A | 384 128 half B, each:
              0 4 crc32 of bytes 4..128 | 4 8 generation u64 | 12 2 point length |
              14 114 resume point text (a bookmark, a list, or EPOCH)
      The resume point is the valid half with the higher generation; a write goes to the
      other half, so a torn write never loses the previous point.

Recovery: a slot whose identity checksum fails is dropped (reported); a slot with no valid
half resumes at EPOCH (reported). The header must be readable (else CorruptStore). A point
longer than 114 bytes (a long list given as the start) is stored as EPOCH.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib

from protocol.bookmarks import format_bookmark, publisher_bookmark

from .bookmarks import EPOCH, MOST_RECENT, NOW, BookmarkStore, tracked
from .errors import CorruptStore, StoreFull
from .message import Message
from .storefile import RecoveryReport, open_locked, recovered

__all__ = ["RingBookmarkStore"]

MAGIC = b"TTBMRING"
VERSION = 1
HEADER = 64
SLOT = 512
HALF = 128
POINT_MAX = HALF - 14
SUB_MAX = 250
_HEAD = struct.Struct("<8sHHI")
_HALF = struct.Struct("<QH")
_crc = zlib.crc32


class _Ring:
    """In-memory state of one subscription (the file holds only `point`)."""

    __slots__ = ("behind", "gen", "highest", "last", "mark", "pending", "point", "slot")

    def __init__(self, slot: int, point: str, gen: int):
        self.slot = slot
        self.point = point
        self.gen = gen
        self.highest: dict[int, int] = {}
        self.last: tuple[int, int] | None = None  # newest message received
        self.pending = False  # `last` is not discarded yet
        self.behind = False  # the newest message was a duplicate: a replay is catching up
        self.mark: tuple[tuple[int, int] | None, str] | None = None  # (after message, point)


class RingBookmarkStore(BookmarkStore):
    """Slot-per-subscription resume points (module docstring). `max_subscriptions` bounds the
    file (default 10,000 slots)."""

    path: str  # a file store always has one

    def __init__(self, path: str | os.PathLike, *, max_subscriptions: int = 10_000,
                 max_publishers: int = 100_000):  # fmt: skip
        self.path = os.fspath(path)
        self.max_subscriptions = max_subscriptions
        self.max_publishers = max_publishers
        self._subs: dict[str, _Ring] = {}
        self._free: list[int] = []
        self._fd = open_locked(self.path)
        self.recovery = recovered(self._fd, self._load)

    def __repr__(self) -> str:
        return f"<RingBookmarkStore {self.path} {len(self._subs)} subscription(s)>"

    # ------------------------------------------------------------------ file

    def _load(self) -> RecoveryReport:
        report = RecoveryReport(self.path)
        size = os.fstat(self._fd).st_size
        if size < HEADER:
            if size and any(os.pread(self._fd, size, 0)):
                raise CorruptStore(self.path, 0, f"{size} bytes: shorter than the header")
            head = _HEAD.pack(MAGIC, VERSION, SLOT, 0)
            os.ftruncate(self._fd, 0)
            os.ftruncate(self._fd, HEADER + SLOT)
            os.pwrite(self._fd, head + struct.pack("<I", _crc(head)), 0)
            size = HEADER + SLOT
        self._mm = mmap.mmap(self._fd, size)
        mm = self._mm
        magic, version, slot_size, _ = _HEAD.unpack_from(mm, 0)
        (crc,) = struct.unpack_from("<I", mm, 16)
        if magic != MAGIC:
            raise CorruptStore(self.path, 0, f"magic {magic!r} is not {MAGIC!r}")
        if crc != _crc(mm[0:16]) or version != VERSION or slot_size != SLOT:
            raise CorruptStore(self.path, 8, "bad header (checksum, version or slot size)")
        slots = (size - HEADER) // SLOT
        if (size - HEADER) % SLOT:
            report.damage(HEADER + slots * SLOT, "partial slot at the end", (size - HEADER) % SLOT)
            self._resize(HEADER + slots * SLOT)
        for i in range(slots):
            off = HEADER + i * SLOT
            (crc,) = struct.unpack_from("<I", mm, off)
            (n,) = struct.unpack_from("<H", mm, off + 4)
            if n == 0 and crc == 0:
                self._free.append(i)
                continue
            if crc != _crc(mm[off + 4 : off + 256]) or n > SUB_MAX:
                report.damage(off, "slot identity checksum mismatch: slot dropped", SLOT, 1)
                mm[off : off + SLOT] = bytes(SLOT)
                self._free.append(i)
                continue
            sub_id = mm[off + 6 : off + 6 + n].decode("utf-8", "replace")
            best = None
            for h in (off + 256, off + 256 + HALF):
                (hcrc,) = struct.unpack_from("<I", mm, h)
                gen, plen = _HALF.unpack_from(mm, h + 4)
                valid = hcrc == _crc(mm[h + 4 : h + HALF]) and plen <= POINT_MAX
                if valid and (best is None or gen > best[0]):
                    best = (gen, mm[h + 14 : h + 14 + plen].decode())
            if best is None:
                report.damage(off + 256, f"{sub_id!r}: no valid resume point, resumes at EPOCH",
                              2 * HALF, 1)  # fmt: skip
                best = (0, EPOCH)
            self._subs[sub_id] = _Ring(i, best[1], best[0])
            report.records += 1
        self._free.sort(reverse=True)
        return report

    def _resize(self, size: int) -> None:
        self._mm.close()
        os.ftruncate(self._fd, size)
        self._mm = mmap.mmap(self._fd, size)

    def _write_point(self, ring: _Ring, point: str) -> None:
        if len(point) > POINT_MAX:
            point = EPOCH
        ring.point = point
        ring.gen += 1
        raw = point.encode()
        body = (_HALF.pack(ring.gen, len(raw)) + raw).ljust(HALF - 4, b"\0")
        h = HEADER + ring.slot * SLOT + 256 + (ring.gen & 1) * HALF
        self._mm[h : h + HALF] = _crc(body).to_bytes(4, "little") + body

    def _new_slot(self, sub_id: str) -> _Ring:
        raw = sub_id.encode()
        if len(raw) > SUB_MAX:
            raise ValueError(f"sub_id of {len(raw)} bytes: the ring store holds up to {SUB_MAX}")
        if self._free:
            slot = self._free.pop()
        else:
            slot = (len(self._mm) - HEADER) // SLOT
            if slot >= self.max_subscriptions:
                raise StoreFull(self.path, SLOT, f"{self.max_subscriptions} subscriptions")
            self._resize(HEADER + (slot + 1) * SLOT)
        off = HEADER + slot * SLOT
        ident = (struct.pack("<H", len(raw)) + raw).ljust(252, b"\0")
        mm = self._mm
        mm[off + 256 : off + SLOT] = bytes(2 * HALF)
        mm[off : off + 256] = struct.pack("<I", _crc(ident)) + ident
        ring = self._subs[sub_id] = _Ring(slot, EPOCH, 0)
        return ring

    # ------------------------------------------------------------------ BookmarkStore

    def start(self, sub_id: str, bookmark: str) -> str:
        self._check()
        ring = self._subs.get(sub_id)
        if bookmark == MOST_RECENT:
            if ring is None:
                ring = self._new_slot(sub_id)
                self._write_point(ring, EPOCH)
            return ring.point
        if ring is None:
            ring = self._new_slot(sub_id)
        ring.highest.clear()
        ring.last = ring.mark = None
        ring.pending = False
        self._write_point(ring, bookmark)
        return bookmark

    def log(self, message: Message) -> bool:
        got = tracked(message)
        ring = None if got is None else self._subs.get(got[0])
        if got is None or ring is None:
            return True
        _, pub, seq, _ = got
        highest = ring.highest
        h = highest.get(pub)
        if h is not None and seq <= h:
            ring.behind = True
            return False
        ring.behind = False
        if h is None and len(highest) >= self.max_publishers:
            del highest[next(iter(highest))]
        highest[pub] = seq
        ring.last = (pub, seq)
        ring.pending = True
        return True

    def discard_bookmark(self, sub_id: str, bookmark: str) -> bool:
        self._check()
        ring = self._subs.get(sub_id)
        if ring is None:
            return False
        point = bookmark
        key = publisher_bookmark(bookmark)
        if key is None:
            return False
        mark = ring.mark
        if mark is not None and mark[0] == key:
            point = mark[1]  # everything before the mark is discarded now
            ring.mark = None
        if key == ring.last:
            ring.pending = False
        self._write_point(ring, point)
        return True

    def persisted(self, sub_id: str, bookmark: str) -> None:
        self._check()
        ring = self._subs.get(sub_id)
        if ring is None or ring.behind:
            return  # a replay still re-sending what was seen: the mark lags the resume point
        if not ring.pending:
            if ring.point != bookmark:
                self._write_point(ring, bookmark)  # everything received is discarded
        else:
            ring.mark = (ring.last, bookmark)

    def most_recent(self, sub_id: str, elsewhere: bool = False) -> str:
        """One point, not a list: `elsewhere` changes nothing (a failover to an instance with
        another order of publishers can pass over messages; the memory and logged stores do
        not)."""
        self._check()
        ring = self._subs.get(sub_id)
        if ring is None:
            return EPOCH
        if ring.point == NOW and ring.last is not None:
            return format_bookmark(*ring.last)
        return ring.point

    def window_size(self, sub_id: str) -> int:
        return 0  # nothing is held per message

    def purge(self, sub_id: str | None = None) -> None:
        self._check()
        ids = list(self._subs) if sub_id is None else [sub_id]
        for sid in ids:
            ring = self._subs.pop(sid, None)
            if ring is not None:
                off = HEADER + ring.slot * SLOT
                self._mm[off : off + SLOT] = bytes(SLOT)
                self._free.append(ring.slot)
        self._free.sort(reverse=True)

    def sync(self) -> None:
        self._check()
        self._mm.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._mm.flush()
        finally:
            self._mm.close()
            os.close(self._fd)
