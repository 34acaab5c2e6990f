"""The transaction log: segment files, one writer thread with group commit, reads, recovery.

Layout on disk (`directory`):

- `<base:020d>.seg`: segment files in the format of record.py. Only the newest is written; a
  segment is sealed (fsynced, never written again) when the next batch would take it past
  `segment_size`.
- `index/`: the LMDB index (index.py), derived from the segments.
- `MANIFEST` (manifest.py), once compaction or removal has run: which compacted files
  (compacted.py) replace which position ranges, and the position below which segments were
  removed. Plain and compacted segments are read through the same calls (`read`, `read_raw`,
  `next_position`, `after`); a compacted range may have gaps where records were dropped.
  `raw_batches` / `records` / `scan` walk every record across segments and gaps (reading.py).
  Layout changes run on the writer thread between two commits (`run_in_writer`), commit by
  renaming the manifest, and swap the segment list in one assignment; files that left the layout
  are unlinked (and their cached fds closed) only after a grace period, so a read in flight
  finishes on the file it started with.

Durability: `submit()` hands a batch of encoded records to the writer thread. The writer takes
every batch submitted since its last write, writes them and makes them durable with one `pwritev`
with RWF_DSYNC, into the zeros the writer keeps ahead of the newest segment's records (group
commit; writer.py; `durability="write"` skips the sync, a named weaker mode
that survives a process crash but not a power loss), updates the index in one LMDB transaction,
then calls each batch's callback with the batch's starting position. A failed write (disk full,
I/O error) truncates the partial write away and fails every batch in that commit with
`JournalUnavailable`; the journal stays open and readable and the next commit tries again.

Recovery at open: segment headers are checked, the newest segment is scanned from the index's
checkpoint with checksums verified, a torn or damaged tail is truncated (and logged: file, offset,
bytes dropped), and every record past the checkpoint is indexed again.

States: open -> closing (writer drains what was submitted) -> closed. `submit` after close raises
JournalClosed.

The Journal is a façade: it holds the directory's lock and puts together the objects that do the
work, each handed what it uses: the layout (state.py), the reader (reading.py), the writer
(writer.py) and, at open, the recovery (recovery.py), and the index (index.py) they share. Its
reads and writes are those objects' own bound methods, so a call costs no extra hop.
"""

from __future__ import annotations

import fcntl
import logging
import os

from .errors import CorruptSegment, JournalClosed, JournalError, JournalLocked, JournalUnavailable
from .fileio import FileIO, FileOps
from .index import JournalIndex
from .integrity import Integrity
from .manifest import Manifest
from .record import RECORD_HEADER_SIZE
from .recovery import Recovery
from .segments import DEFAULT_SEGMENT_SIZE, READ_BLOCK, Segment, segment_name
from .writer import CommitStats, DoneCallback, JournalWriter

log = logging.getLogger("tickertape.journal")


class Journal:
    def __init__(
        self,
        directory: str,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        durability: str = "fsync",
        index_map_size: int | None = None,
        exclusive: bool = True,
        io: FileOps | None = None,
    ):
        """Open (or create) the journal in `directory`, recovering it (recovery.py).

        The directory is locked exclusively before anything in it is read, for as long as the
        Journal is open: a second server (or a maintenance tool while a server runs) gets
        JournalLocked naming the holder's pid. `exclusive` is kept for callers; every open is
        exclusive. io: the writer's file operations (fileio.py; tests pass a FaultyIO)."""
        if durability not in ("fsync", "write"):
            raise ValueError(f"durability must be 'fsync' or 'write', not {durability!r}")
        self.directory = directory
        self.segment_size = segment_size
        self.durability = durability
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = _lock(directory)
        kw = {"map_size": index_map_size} if index_map_size else {}
        self.index = JournalIndex(os.path.join(directory, "index"), **kw)
        self.integrity = Integrity()
        opening = Recovery(directory, segment_size, self.index, self.integrity)
        try:
            self.layout, self.reader = opening.open()
            self.writer = JournalWriter(self.layout, self.index, io or FileIO(), durability)
        except BaseException:
            reader = getattr(opening, "reader", None)  # set once the layout was read
            if reader is not None:
                reader.close()
            self.index.close()
            os.close(self._lock_fd)
            raise
        self.recovery = opening.report
        self.stats: CommitStats = self.writer.stats
        self._closed = False
        r, w = self.reader, self.writer
        self.read = r.read
        self.read_raw = r.read_raw
        self.read_block = r.read_block
        self.raw_batches = r.raw_batches
        self.records = r.records
        self.scan = r.scan
        self.next_position = r.next_position
        self.after = r.after
        self.holds = r.holds
        self.locate = r.locate
        self.locate_time = r.locate_time
        self.publishers = self.index.publishers
        self.publisher_owners = self.index.owners  # publisher id -> the user its name is bound to
        self.disk_bytes = r.disk_bytes
        self.collect_garbage = r.collect_garbage
        self.submit = w.submit
        self.commit_inline = w.commit_inline
        self.fence = w.fence
        self.run_in_writer = w.run_in_writer

    @property
    def segments(self) -> list[Segment]:
        """Every segment in position order, the last one being written (state.py)."""
        return self.layout.segments

    @property
    def manifest(self) -> Manifest:
        return self.layout.manifest

    @property
    def end_position(self) -> int:
        """Position just after the last durable record."""
        return self.layout.end

    @property
    def start_position(self) -> int:
        return self.layout.segments[0].base

    @property
    def available(self) -> bool:
        """False from a failed write until a probe succeeds (writes fail at once meanwhile)."""
        return self.writer.available

    def close(self) -> None:
        """Drain everything submitted, make it durable, and close. Idempotent."""
        if self._closed:
            return
        self.writer.close()
        self.reader.close()
        try:
            self.index.sync()
        except Exception as exc:  # derived data: rebuilt from the segments at the next open
            log.error("journal: final index sync failed: %s", exc)
        self.index.close()
        os.close(self._lock_fd)  # releases the lock
        self._closed = True

    # -- maintenance: layout changes (journal/maintenance.py decides what; this applies it) ----

    def sealed_segments(self) -> list[Segment]:
        """Every segment but the one being written, oldest first (a snapshot)."""
        return list(self.layout.segments[:-1])

    def commit_layout(self, manifest: Manifest, sealed: list[Segment]) -> list[Segment]:
        """Writer thread only (run_in_writer): commit `manifest` and make `sealed` the sealed part
        of the journal (the segment being written stays). `sealed` must run without a gap up to
        the active segment. The manifest's rename is the commit point; readers switch at their
        next lookup. Returns the segments that left the layout (retired, unlinked later)."""
        if not self.writer.on_thread():
            raise RuntimeError("commit_layout runs on the journal writer thread (run_in_writer)")
        gone = self.layout.replace(manifest, sealed)
        self.reader.retire(gone)
        log.info(
            "journal: manifest generation %d: %d sealed segments from position %d; %d retired",
            manifest.generation,
            len(sealed),
            self.layout.segments[0].base,
            len(gone),
        )
        return gone


def _lock(directory: str) -> int:
    """Take the directory's lock (exclusive, not waiting) and write our pid into it."""
    path = os.path.join(directory, "LOCK")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise JournalLocked(directory, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "READ_BLOCK",
    "RECORD_HEADER_SIZE",
    "CorruptSegment",
    "DoneCallback",
    "Journal",
    "JournalClosed",
    "JournalError",
    "JournalLocked",
    "JournalUnavailable",
    "Segment",
    "segment_name",
]
