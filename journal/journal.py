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
  Layout changes run on the writer thread between two commits (`run_in_writer`), commit by
  renaming the manifest, and swap the segment list in one assignment; files that left the layout
  are unlinked (and their cached fds closed) only after a grace period, so a read in flight
  finishes on the file it started with.

Durability: `submit()` hands a batch of encoded records to the writer thread. The writer takes
every batch submitted since its last write, writes them with one `write` and makes them durable
with one `fdatasync` (group commit; `durability="write"` skips the fdatasync, a named weaker mode
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

import bisect
import concurrent.futures
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .compacted import CompactedReader, CorruptCompacted, is_compacted_name
from .index import BM_SPAN, JournalIndex
from .manifest import Manifest, load_manifest, save_manifest
from .record import (
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    CorruptRecord,
    Record,
    decode_records,
    decode_segment_header,
    encode_segment_header,
    record_length_at,
    scan_records,
)

log = logging.getLogger("tickertape.journal")

DEFAULT_SEGMENT_SIZE = 256 * 1024 * 1024
READ_BLOCK = 256 * 1024
MAX_PENDING_BYTES = 256 * 1024 * 1024


class JournalError(Exception):
    pass


class JournalClosed(JournalError):
    def __init__(self):
        super().__init__("the journal is closed; open it again before writing")


class JournalUnavailable(JournalError):
    """A write failed: nothing in the batch is persisted. Protocol reason `journal unavailable`."""

    reason = "journal unavailable"

    def __init__(self, cause: BaseException):
        super().__init__(
            f"journal write failed ({cause}); nothing in this batch was persisted. "
            "Free disk space or fix the journal device; the server retries on the next publish"
        )
        self.cause = cause


class JournalLocked(JournalError):
    """Another process holds the journal in a way that excludes this open (see Journal(exclusive=))."""

    def __init__(self, directory: str, exclusive: bool):
        what = ("a server (or another tool) has this journal open; let it apply the change, or stop it first"
                if exclusive else "`tickertape archive|compact` is applying a change to it; wait for it to finish")
        super().__init__(f"journal {directory} is locked: {what}")
        self.directory = directory


class CorruptSegment(JournalError):
    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(
            f"journal segment {path} is damaged at offset {offset}: {reason}. Move the file "
            "aside (and the segments after it) to start without it, or restore it from the archive"
        )
        self.path = path
        self.offset = offset
        self.reason = reason


@dataclass(eq=False)
class Segment:
    base: int
    path: str
    size: int  # bytes of records (file size minus header); for a compacted one, end - base
    reader: CompactedReader | None = None  # set for a compacted segment

    @property
    def end(self) -> int:
        return self.base + self.size

    @property
    def kind(self) -> str:
        return "plain" if self.reader is None else "compacted"

    @property
    def file_bytes(self) -> int:
        return self.reader.file_bytes if self.reader is not None else self.size + SEGMENT_HEADER_SIZE


def _seg_base(seg: Segment) -> int:
    return seg.base


class _Control:
    """A maintenance call queued on the writer thread (run_in_writer)."""

    __slots__ = ("fn", "future")

    def __init__(self, fn, future):
        self.fn = fn
        self.future = future

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # handed to the caller
            self.future.set_exception(exc)


@dataclass
class CommitStats:
    commits: int = 0
    records: int = 0
    bytes: int = 0
    last_latency_s: float = 0.0
    failures: int = 0


DoneCallback = Callable[[int | None, BaseException | None], None]


def segment_name(base: int) -> str:
    return f"{base:020d}.seg"


def _base_of(name: str) -> int | None:
    """The base position in a plain segment's name, or None for a name not made by segment_name."""
    stem = name[:-4]
    return int(stem) if len(stem) == 20 and stem.isdigit() else None


class Journal:
    def __init__(
        self,
        directory: str,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        durability: str = "fsync",
        index_map_size: int | None = None,
        exclusive: bool = False,
    ):
        """exclusive: fail with JournalLocked if any other Journal has the directory open (the
        maintenance CLI applies changes this way only when no server runs); by default a Journal
        takes a shared lock, so an exclusive opener sees it."""
        if durability not in ("fsync", "write"):
            raise ValueError(f"durability must be 'fsync' or 'write', not {durability!r}")
        self.directory = directory
        self.segment_size = segment_size
        self.durability = durability
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise JournalLocked(directory, exclusive) from None
        kw = {"map_size": index_map_size} if index_map_size else {}
        self.index = JournalIndex(os.path.join(directory, "index"), **kw)
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self._read_fds: dict[str, int] = {}  # by path: a compacted file may reuse a base
        self._read_lock = threading.Lock()
        self._retired: list[tuple[float, Segment, int | None]] = []  # (when, segment, cached fd)
        self.manifest = Manifest()
        self.stats = CommitStats()
        self.recovery: dict = {}
        try:
            self._open_segments()
        except BaseException:
            self.index.close()
            os.close(self._lock_fd)
            raise
        self._end = self.segments[-1].end
        self._fd = os.open(self.segments[-1].path, os.O_WRONLY | os.O_APPEND)
        self._pending: list[tuple[bytes, list, DoneCallback]] = []
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._failure: JournalUnavailable | None = None
        self._thread = threading.Thread(target=self._writer, name="journal-writer", daemon=True)
        self._thread.start()

    # -- opening and recovery ------------------------------------------------------------

    def _open_segments(self) -> None:
        started = time.monotonic()
        names = self._listing()
        segs: list[Segment] = []
        for i, name in enumerate(names):
            if isinstance(name, Segment):  # a compacted segment named by the manifest
                if segs and name.base != segs[-1].end:
                    raise CorruptSegment(
                        name.path, 0, f"starts at position {name.base} but the previous segment ends at {segs[-1].end} (a segment is missing)"
                    )
                segs.append(name)
                continue
            path = os.path.join(self.directory, name)
            with open(path, "rb") as f:
                head = f.read(SEGMENT_HEADER_SIZE)
            size = os.path.getsize(path) - SEGMENT_HEADER_SIZE
            last = i == len(names) - 1
            try:
                base = decode_segment_header(head)
            except CorruptRecord as exc:
                if last and size <= 0:
                    # crash between creating the file and writing its header: start it again
                    log.warning("journal: %s has no complete header (%s); rewriting it", path, exc.reason)
                    base = segs[-1].end if segs else 0
                    self._write_new_segment_file(path, base)
                    size = 0
                else:
                    raise CorruptSegment(path, exc.offset, exc.reason) from None
            if segs and base != segs[-1].end:
                raise CorruptSegment(
                    path, 0, f"starts at position {base} but the previous segment ends at {segs[-1].end} (a segment is missing)"
                )
            segs.append(Segment(base, path, size))
        if not segs or segs[-1].reader is not None:
            base = segs[-1].end if segs else self.manifest.start
            path = os.path.join(self.directory, segment_name(base))
            self._write_new_segment_file(path, base)
            segs.append(Segment(base, path, 0))
        self.segments = segs
        self._bases = [s.base for s in segs]

        upto = self.index.indexed_upto()
        first, end = segs[0].base, segs[-1].end
        if upto > end or (upto < first and self.index.count() > 0 and upto != 0):
            log.warning(
                "journal: index checkpoint %d is outside the journal [%d, %d]; rebuilding the index",
                upto, first, end,
            )
            self.index.reset()
            upto = first
        upto = max(upto, first)
        indexed, dropped = self._scan_and_index(upto)
        self._seed_removed_publishers()
        self.recovery = {
            "segments": len(self.segments),
            "reindexed_records": indexed,
            "dropped_bytes": dropped,
            "seconds": round(time.monotonic() - started, 3),
        }
        log.info(
            "journal: opened %s: %d segments, positions [%d, %d), %d records re-indexed in %.3fs",
            self.directory, len(self.segments), self.segments[0].base, self.segments[-1].end,
            indexed, self.recovery["seconds"],
        )

    def _listing(self) -> list:
        """Plain segment names and compacted Segments, in position order, per the manifest.

        Files the manifest has superseded (a crash after its commit) or never committed (a
        crash before it) are deleted here, and logged.
        """
        man = self.manifest = load_manifest(self.directory)
        named = {e["file"]: e for e in man.compacted}
        items: list[tuple[str, object]] = []
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".seg"):
                base = _base_of(name)
                if base is not None and (base < man.start or man.covered_by_compacted(base) is not None):
                    self._discard(name, "superseded by the manifest")
                    continue
                items.append((name, name))
            elif is_compacted_name(name) and name not in named:
                self._discard(name, "an uncommitted compaction output (not in the manifest)")
        for fname, e in named.items():
            path = os.path.join(self.directory, fname)
            try:
                reader = CompactedReader(path)
            except FileNotFoundError:
                raise CorruptSegment(path, 0, "the manifest names this compacted segment but it is missing") from None
            except CorruptCompacted as exc:
                raise CorruptSegment(path, exc.offset, exc.reason) from None
            if (reader.base, reader.end) != (e["base"], e["end"]):
                reader.close()
                raise CorruptSegment(path, 0, f"covers [{reader.base}, {reader.end}) but the manifest says [{e['base']}, {e['end']})")
            items.append((f"{reader.base:020d}", Segment(reader.base, path, reader.end - reader.base, reader)))
        items.sort(key=lambda kv: kv[0])
        return [v for _, v in items]

    def _seed_removed_publishers(self) -> None:
        """Dedup state of publishers whose newest message was removed lives in the manifest; an
        index rebuilt from the remaining segments gets it back from there."""
        if not self.manifest.publishers:
            return
        have = self.index.publishers()
        missing = [(int(p), seq, 0, pos) for p, (seq, pos) in self.manifest.publishers.items()
                   if have.get(int(p), (-1, 0))[0] < seq]
        if missing:
            self.index.add(missing, self.index.indexed_upto())

    def _discard(self, name: str, why: str) -> None:
        path = os.path.join(self.directory, name)
        log.warning("journal: removing %s: %s", path, why)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _index_compacted(self, seg: Segment, pos: int) -> int:
        indexed = 0
        while True:
            try:
                recs, nxt = seg.reader.read(pos, 4 * READ_BLOCK, verify=True)
            except CorruptCompacted as exc:
                raise CorruptSegment(seg.path, exc.offset, exc.reason) from None
            if not recs:
                self.index.add((), seg.end)
                return indexed
            self._index_records(recs, nxt)
            indexed += len(recs)
            pos = nxt

    def _scan_and_index(self, start: int) -> tuple[int, int]:
        """Verify and index every record from `start` to the end; truncate a bad tail."""
        indexed = 0
        i = self._segment_index(start)
        while i < len(self.segments):
            seg = self.segments[i]
            pos = max(start, seg.base)
            if seg.reader is not None:
                indexed += self._index_compacted(seg, pos)
                i += 1
                continue
            with open(seg.path, "rb") as f:
                while pos < seg.end:
                    f.seek(SEGMENT_HEADER_SIZE + (pos - seg.base))
                    buf = f.read(min(4 * READ_BLOCK, seg.end - pos))
                    try:
                        recs, stop = decode_records(buf, 0, len(buf), pos)
                    except CorruptRecord as exc:
                        recs, stop = decode_records(buf, 0, exc.offset, pos)
                        self._index_records(recs, pos + stop)
                        return indexed + len(recs), self._truncate_tail(i, pos + stop, exc.reason)
                    if not recs:
                        need = record_length_at(buf, 0) if len(buf) >= 4 else RECORD_HEADER_SIZE
                        if len(buf) >= RECORD_HEADER_SIZE and pos + need <= seg.end:
                            f.seek(SEGMENT_HEADER_SIZE + (pos - seg.base))
                            buf = f.read(need)  # one record larger than the read block
                            try:
                                recs, stop = decode_records(buf, 0, len(buf), pos)
                            except CorruptRecord as exc:
                                return indexed, self._truncate_tail(i, pos, exc.reason)
                        else:
                            return indexed, self._truncate_tail(i, pos, "record runs past the end of the file")
                    self._index_records(recs, pos + stop)
                    indexed += len(recs)
                    pos += stop
            i += 1
        return indexed, 0

    def _index_records(self, recs: list[Record], upto: int) -> None:
        if recs:
            self.index.add(((r.publisher_id, r.seq, r.timestamp_us, r.position) for r in recs if r.kind == 1), upto)

    def _truncate_tail(self, seg_i: int, position: int, reason: str) -> int:
        seg = self.segments[seg_i]
        if seg_i != len(self.segments) - 1:
            raise CorruptSegment(seg.path, SEGMENT_HEADER_SIZE + position - seg.base, reason)
        dropped = seg.end - position
        if dropped <= 0:
            return 0
        offset = SEGMENT_HEADER_SIZE + position - seg.base
        log.warning(
            "journal: truncating damaged tail of %s at offset %d (%s): %d bytes dropped; "
            "they were never acknowledged as persisted",
            seg.path, offset, reason, dropped,
        )
        with open(seg.path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
        seg.size = position - seg.base
        return dropped

    def _segment_index(self, position: int) -> int:
        return max(0, bisect.bisect_right(self._bases, position) - 1)

    def _write_new_segment_file(self, path: str, base: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, encode_segment_header(base))
            os.fsync(fd)
        finally:
            os.close(fd)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- writing -------------------------------------------------------------------------

    def submit(self, data: bytes, entries: list, on_done: DoneCallback, meta: dict | None = None) -> None:
        """Queue encoded records for the next group commit (any thread).

        entries: (publisher_id, seq, timestamp_us, offset within `data`) for each message record.
        on_done(position_of_first_byte, None) runs on the writer thread once durable, or
        on_done(None, error) if the write failed. meta: index metadata stored with this commit.
        """
        with self._cond:
            if self._closing:
                raise JournalClosed()
            self._pending.append((data, entries, on_done, meta))
            self._pending_bytes += len(data)
            self._cond.notify()

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def end_position(self) -> int:
        """Position just after the last durable record."""
        return self._end

    @property
    def start_position(self) -> int:
        return self.segments[0].base

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                batch = self._pending
                if not batch and self._closing:
                    return
                self._pending = []
                self._pending_bytes = 0
            run = []
            for item in batch:
                if item[0] is None:  # a fence: the submitter has dealt with the failure
                    if run:
                        self._commit_fitting(run)
                        run = []
                    self._failure = None
                elif type(item[0]) is _Control:  # maintenance: between two commits
                    if run:
                        self._commit_fitting(run)
                        run = []
                    item[0].run()
                else:
                    run.append(item)
            if run:
                self._commit_fitting(run)

    def _commit_fitting(self, run) -> None:
        """Commit a run of batches, rolling segments between batches where one would overflow."""
        room = self.segment_size - self.segments[-1].size
        part, size = [], 0
        for item in run:
            n = len(item[0])
            if part and size + n > room:
                self._commit(part)
                part, size = [], 0
                room = self.segment_size - self.segments[-1].size
            part.append(item)
            size += n
        if part:
            self._commit(part)

    def fence(self) -> None:
        """After a failed commit every later batch fails too, until this marker is reached.

        This keeps a batch queued behind a failed one from being stored past the gap: the
        submitter rolls its state back, then calls fence(); batches submitted after the fence
        are written normally.
        """
        with self._cond:
            if self._closing:
                return
            self._pending.append((None, [], None, None))
            self._cond.notify()

    def _commit(self, batch) -> None:
        if self._failure is not None:
            for item in batch:
                item[2](None, self._failure)
            return
        started = time.perf_counter()
        data = batch[0][0] if len(batch) == 1 else b"".join(b[0] for b in batch)
        seg = self.segments[-1]
        if not data:  # only markers: durable already, since earlier commits finished
            for item in batch:
                item[2](self._end, None)
            return
        try:
            if seg.size and seg.size + len(data) > self.segment_size:
                self._roll()
                seg = self.segments[-1]
            self._write_all(data)
            if self.durability == "fsync":
                os.fdatasync(self._fd)
        except OSError as exc:
            self._undo_partial_write(seg)
            self.stats.failures += 1
            err = JournalUnavailable(exc)
            self._failure = err
            log.error("journal: %s", err)
            for item in batch:
                item[2](None, err)
            return
        base = self._end
        entries = []
        off = base
        for chunk, ents, _, _ in batch:
            entries.extend((p, s, t, off + o) for p, s, t, o in ents)
            off += len(chunk)
        seg.size += len(data)
        new_end = base + len(data)
        meta = {}
        for item in batch:
            if item[3]:
                meta.update(item[3])  # only the batches in this commit: metadata never runs ahead
        try:
            self.index.add(entries, new_end, meta)
        except Exception:  # the records are durable; a later open re-indexes them
            log.exception("journal: index update failed; the index is rebuilt at the next start")
        self._end = new_end
        st = self.stats
        st.commits += 1
        st.records += len(entries)
        st.bytes += len(data)
        st.last_latency_s = time.perf_counter() - started
        off = base
        for chunk, _, cb, _ in batch:
            cb(off, None)
            off += len(chunk)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _undo_partial_write(self, seg: Segment) -> None:
        try:
            os.ftruncate(self._fd, SEGMENT_HEADER_SIZE + seg.size)
        except OSError as exc:  # pragma: no cover - the device is gone; recovery at open handles it
            log.error("journal: could not cut a partial write from %s: %s", seg.path, exc)

    def _roll(self) -> None:
        old = self.segments[-1]
        os.fsync(self._fd)
        os.close(self._fd)
        base = old.end
        path = os.path.join(self.directory, segment_name(base))
        self._write_new_segment_file(path, base)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.segments.append(Segment(base, path, 0))
        self._bases.append(base)
        log.info("journal: sealed %s at %d bytes; writing %s", old.path, old.size, path)

    def close(self) -> None:
        """Drain everything submitted, make it durable, and close. Idempotent."""
        if self._closed:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        os.fsync(self._fd)
        os.close(self._fd)
        with self._read_lock:
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
        for seg in self.segments:
            if seg.reader is not None:
                seg.reader.close()
        self.collect_garbage(grace_s=0.0)
        self.index.sync()
        self.index.close()
        os.close(self._lock_fd)  # releases the lock
        self._closed = True

    # -- reading -------------------------------------------------------------------------

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
        and the durable end, or the whole record there when it is larger."""
        limit = min(seg.end, self._end) - position
        fd = self._reader_fd(seg)
        off = SEGMENT_HEADER_SIZE + position - seg.base
        buf = os.pread(fd, min(max_bytes, limit), off)
        if len(buf) >= 4:
            size = record_length_at(buf, 0)
            if size > len(buf):
                if size > limit:
                    raise CorruptSegment(seg.path, off, "record runs past the end of the segment")
                buf = os.pread(fd, size, off)
        return buf

    def read(self, position: int, max_bytes: int = READ_BLOCK, verify: bool = False) -> tuple[list[Record], int]:
        """Records from `position` (a record boundary) up to about max_bytes, and the next position.

        Reads only durable records. At the end of the journal returns ([], position).
        """
        seg, position = self._at(position)
        if seg is None:
            return [], position
        if seg.reader is not None:
            try:
                return seg.reader.read(position, max_bytes, verify)
            except CorruptCompacted as exc:
                raise CorruptSegment(seg.path, exc.offset, exc.reason) from None
        buf = self._pread(seg, position, max_bytes)
        off = SEGMENT_HEADER_SIZE + position - seg.base
        try:
            recs, stop = decode_records(buf, 0, len(buf), position, verify)
        except CorruptRecord as exc:
            raise CorruptSegment(seg.path, off + exc.offset, exc.reason) from None
        if not recs:
            raise CorruptSegment(seg.path, off, "record runs past the end of the segment")
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
        recs, stop = scan_records(self._pread(seg, position, max_bytes), position)
        if not recs:
            raise CorruptSegment(seg.path, SEGMENT_HEADER_SIZE + position - seg.base, "record runs past the end of the segment")
        return recs, position + stop

    def read_block(self, position: int, max_bytes: int = READ_BLOCK) -> tuple[bytes, int] | None:
        """The stored bytes from `position` to at most max_bytes on (more when the record there
        is larger), within its segment and the durable end, as (bytes, position); the position
        is normalized like read_raw's. None in a compacted segment, whose bytes are not stored
        as they were written (use read_raw). Replay and queues splice frames from these bytes.
        """
        seg, position = self._at(position)
        if seg is None:
            return b"", position
        if seg.reader is not None:
            return None
        return self._pread(seg, position, max_bytes), position

    def scan(self, position: int | None = None, max_bytes: int = READ_BLOCK):
        """Iterate every durable record from `position` (default: the start) to the current end."""
        pos = self.start_position if position is None else position
        while True:
            recs, nxt = self.read(pos, max_bytes)
            if not recs:
                if nxt >= self._end:
                    return
                nxt2 = self.next_position(nxt)  # a segment boundary, or the end of a compacted range
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
            raise CorruptSegment(seg.path, SEGMENT_HEADER_SIZE + position - seg.base, "no record at this position")
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

    # -- maintenance: layout changes (journal/maintenance.py decides what; this applies it) ----

    def sealed_segments(self) -> list[Segment]:
        """Every segment but the one being written, oldest first (a snapshot)."""
        return list(self.segments[:-1])

    def run_in_writer(self, fn) -> concurrent.futures.Future:
        """Run fn() on the writer thread between two group commits; its result in a Future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise JournalClosed()
            self._pending.append((_Control(fn, fut), [], None, None))
            self._cond.notify()
        return fut

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
                raise JournalError(f"new layout has a gap or overlap at {a.end} / {b.base} ({a.path}, {b.path})")
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
        log.info("journal: manifest generation %d: %d sealed segments from position %d; %d retired",
                 manifest.generation, len(sealed), new[0].base, len(gone))
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


__all__ = [
    "RECORD_HEADER_SIZE",
    "CorruptSegment",
    "Journal",
    "JournalClosed",
    "JournalError",
    "JournalLocked",
    "JournalUnavailable",
    "Segment",
]
