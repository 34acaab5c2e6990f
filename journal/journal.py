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
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

from .errors import CorruptSegment, JournalClosed, JournalError, JournalLocked, JournalUnavailable
from .fileio import FileIO
from .index import JournalIndex
from .integrity import Integrity
from .manifest import Manifest, save_manifest
from .reading import JournalReader
from .record import RECORD_HEADER_SIZE
from .recovery import JournalRecovery
from .segments import DEFAULT_SEGMENT_SIZE, READ_BLOCK, Segment, segment_name
from .state import CommitStats, DoneCallback
from .writer import JournalWriter

log = logging.getLogger("tickertape.journal")

MAX_PENDING_BYTES = 256 * 1024 * 1024


class Journal(JournalRecovery, JournalWriter, JournalReader):
    def __init__(
        self,
        directory: str,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        durability: str = "fsync",
        index_map_size: int | None = None,
        exclusive: bool = True,
        io: FileIO | None = None,
    ):
        """Open (or create) the journal in `directory`; state.py lists what it holds.

        The directory is locked exclusively before anything in it is read, for as long as the
        Journal is open: a second server (or a maintenance tool while a server runs) gets
        JournalLocked naming the holder's pid. `exclusive` is kept for callers; every open is
        exclusive. io: the writer's file operations (fileio.py; tests pass a FaultyIO)."""
        if durability not in ("fsync", "write"):
            raise ValueError(f"durability must be 'fsync' or 'write', not {durability!r}")
        self.directory = directory
        self.segment_size = segment_size
        self.durability = durability
        self._io = io or FileIO()
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = _lock(directory)
        kw = {"map_size": index_map_size} if index_map_size else {}
        self.index = JournalIndex(os.path.join(directory, "index"), **kw)
        self.segments = []
        self._bases = []
        self._read_fds = {}
        self._read_lock = threading.Lock()
        self._retired = []
        self.manifest = Manifest()
        self.stats = CommitStats()
        self.integrity = Integrity()
        self.recovery = {}
        try:
            self._open_segments()
        except BaseException:
            self.index.close()
            os.close(self._lock_fd)
            raise
        self._end = self.segments[-1].end
        try:
            # no O_APPEND: commits pwrite at the segment's end, inside its runway (writer.py)
            self._fd = self._io.open(self.segments[-1].path, os.O_WRONLY)
        except BaseException:
            self.index.close()
            os.close(self._lock_fd)
            raise
        self._pending = []
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._failure = None
        self._unavailable = None
        self._next_probe = 0.0
        self._dirty_tail = False
        self.prepare_runway()
        self._thread = threading.Thread(target=self._writer, name="journal-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Drain everything submitted, make it durable, and close. Idempotent."""
        if self._closed:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        # Shutdown must end even on a broken device: what fails here is logged, not raised;
        # every acknowledged record was synced at its commit already.
        if not self._dirty_tail:
            try:
                self.trim_runway()  # a closed segment holds exactly its records
                self._io.fsync(self._fd)
            except OSError as exc:
                log.error("journal: final sync of %s failed: %s", self.segments[-1].path, exc)
        for fd in (self._fd, *self._read_fds.values()):
            try:
                os.close(fd)
            except OSError:
                pass
        with self._read_lock:
            self._read_fds.clear()
        for seg in self.segments:
            if seg.reader is not None:
                seg.reader.close()
        self.collect_garbage(grace_s=0.0)
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
        return list(self.segments[:-1])

    def commit_layout(self, manifest: Manifest, sealed: list[Segment]) -> list[Segment]:
        """Writer thread only (run_in_writer): commit `manifest` and make `sealed` the sealed part
        of the journal (the segment being written stays). `sealed` must run without a gap up to
        the active segment. The manifest's rename is the commit point; readers switch at their
        next lookup. Returns the segments that left the layout (retired, unlinked later)."""
        if threading.current_thread() is not self._thread:
            raise RuntimeError("commit_layout runs on the journal writer thread (run_in_writer)")
        active = self.segments[-1]
        new = list(sealed) + [active]
        for a, b in zip(new, new[1:]):
            if a.end != b.base:
                raise JournalError(
                    f"new layout has a gap or overlap at {a.end} / {b.base} ({a.path}, {b.path})"
                )
        manifest.generation = self.manifest.generation + 1
        save_manifest(self.directory, manifest)
        kept = {id(s) for s in new}
        gone = [s for s in self.segments if id(s) not in kept]
        self.manifest = manifest
        self.segments = new
        self._bases = [s.base for s in new]
        now = time.monotonic()
        with self._read_lock:
            for seg in gone:
                self._retired.append((now, seg, self._read_fds.pop(seg.path, None)))
        log.info(
            "journal: manifest generation %d: %d sealed segments from position %d; %d retired",
            manifest.generation,
            len(sealed),
            new[0].base,
            len(gone),
        )
        return gone

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
                if all(s.path != seg.path for s in self.segments):
                    try:
                        os.unlink(seg.path)
                    except FileNotFoundError:
                        pass
                done += 1
            self._retired = keep
        return done


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
