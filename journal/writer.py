"""The journal's writer thread: group commit, segment rolls, fences and maintenance calls.

`submit()` hands a batch of encoded records to the writer thread. The writer takes every batch
submitted since its last write, writes them and makes them durable with one `pwritev` with
RWF_DSYNC (group commit; the runway below), updates the index in one LMDB transaction, then calls each batch's
callback with the batch's starting position. It appends to the journal's layout (state.py):
rolls a segment onto it and moves its durable end; it is handed the layout, the index, its file
operations and the durability mode, and owns its thread, its queue and the active segment's
descriptor.

States: running -> stopped (`stop()`: the thread drains what was submitted and ends; `submit`
raises JournalClosed from then on) -> closed (`close()`: the runway cut, the segment synced, its
descriptor closed).

Every file operation goes through `self._io` (fileio.py), so tests can fail each one.

`commit_inline()` is the one exception to "commits happen on the writer thread": a small batch
when the writer is idle and the batch fits in the open segment is committed on the caller's
thread (the event loop), under the writer's lock. So LMDB is written from two threads, never at
once: every write transaction (the index update of a commit, maintenance calls) runs with the
lock held or on the writer thread while it is busy, and one write transaction is begun and
ended on the same thread, as py-lmdb asks. A segment roll (file creation, renames, directory
syncs) never runs inline: a batch that does not fit goes to the writer thread.

Failure states. A write, fdatasync or roll that fails (disk full, I/O error) leaves the writer
on a valid state: a partial write is cut off; a roll makes the new segment as `<name>.new`,
syncs it, renames it and syncs the directory before it switches to it, so the writer never
keeps a closed descriptor and never counts a half-made file. The journal is then *unavailable*:
every batch fails at once with JournalUnavailable, without touching the disk, and a probe
(`_probe`, every PROBE_INTERVAL s: 1, or TICKERTAPE_JOURNAL_PROBE_INTERVAL's seconds; cut any
partial write still there, write and sync a small file, remove it) makes it available again
when writes succeed. A commit that failed also fails every batch submitted before the
submitter's `fence()` (the gap rule, docs/publishing.md).

The runway. On ext4 (and most filesystems) a write past the end of a file followed by fdatasync
must also journal the inode's new size and extents; a write over blocks already written needs
only the data flushed, measured here at about two thirds of the time. So the active segment
keeps a *runway*: up to RUNWAY_BYTES of zeros, written and synced ahead of the write position
(as PostgreSQL pre-zeroes its WAL segments), and a commit overwrites them in place (`pwrite`
at the segment's real end, which lives in memory: `Segment.size`). The runway is made at open
and in the commit that rolls a segment, and extended on the writer thread after a commit or
when it wakes idle (never on the caller's thread, never inside an ordinary commit), when fewer
than RUNWAY_LOW bytes are left, and never past the segment's `segment_size`. A commit that catches up with the runway's end just appends (still correct,
only slower). Extending it may fail (disk full): that is logged, retried after
RUNWAY_RETRY_S, and never fails a commit. The runway is cut off (ftruncate) before a segment
is sealed, at a clean close and after a failed write, so a sealed segment holds exactly its
records; only the newest segment, after a crash, can end in zeros, and recovery (recovery.py)
takes zeros after the last good record as the clean end. The runway reserves disk space early:
up to RUNWAY_BYTES more than the records need.

In `fsync` mode a commit's write and sync are one `pwritev` with RWF_DSYNC
(`FileIO.pwrite_dsync`); a short write is completed with pwrite and an fdatasync.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .errors import JournalClosed, JournalUnavailable, ProbeIntervalError
from .fileio import FileOps
from .index import IndexEntry, JournalIndex
from .record import SEGMENT_HEADER_SIZE, encode_segment_header
from .segments import Segment, segment_name
from .state import Layout

log = logging.getLogger("tickertape.journal")

PROBE_INTERVAL = 1.0  # the default; PROBE_INTERVAL_ENV overrides it (probe_interval)
PROBE_INTERVAL_ENV = "TICKERTAPE_JOURNAL_PROBE_INTERVAL"


def probe_interval(environ: Mapping[str, str]) -> float:
    """Seconds between probes of an unavailable journal: PROBE_INTERVAL, or PROBE_INTERVAL_ENV's
    value (tests that fail writes on purpose shorten it; docs/configuration.md). Read when a
    writer opens, so a bad value is a JournalError the server's start reports:
    ProbeIntervalError when it is not a number in (0, 60]."""
    raw = environ.get(PROBE_INTERVAL_ENV, "").strip()
    if not raw:
        return PROBE_INTERVAL
    try:
        seconds = float(raw)
    except ValueError:
        raise ProbeIntervalError(raw) from None
    if not 0 < seconds <= 60:  # also refuses nan
        raise ProbeIntervalError(raw)
    return seconds


PROBE_BYTES = 64 * 1024
PROBE_NAME = "probe.tmp"  # recovery.py removes one a crash left
RUNWAY_BYTES = 4 * 1024 * 1024  # zeros kept ahead of the write position (module doc)
RUNWAY_LOW = 1024 * 1024  # extend when fewer than this are left
RUNWAY_RETRY_S = 10.0  # after a failed extension (disk full), wait this long before another

T = TypeVar("T")


class _Control:
    """A maintenance call queued on the writer thread (run_in_writer)."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], Any], future: concurrent.futures.Future[Any]):
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
    unavailable_since: float = 0.0  # time.time() when it became unavailable; 0 while available
    recoveries: int = 0


DoneCallback = Callable[[int | None, BaseException | None], None]
IndexMeta = dict[bytes, bytes]

# what waits for the writer thread: a batch of records, a fence, or a maintenance call
Batch = tuple[bytes, list[IndexEntry], DoneCallback, IndexMeta | None]
Fence = tuple[None, list[IndexEntry], None, None]
Control = tuple[_Control, list[IndexEntry], None, None]
Pending = Batch | Fence | Control


class JournalWriter:
    def __init__(self, layout: Layout, index: JournalIndex, io: FileOps, durability: str):
        """Open the layout's newest segment for writing, zero its runway, start the thread."""
        self._probe_interval = probe_interval(os.environ)  # first: a bad value opens nothing
        self.layout = layout
        self.index = index
        self.durability = durability  # "fsync" or "write"
        self.stats = CommitStats()
        self._io = io
        # no O_APPEND: commits pwrite at the segment's end, inside its runway
        self._fd = io.open(layout.segments[-1].path, os.O_WRONLY)
        self._pending: list[Pending] = []
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._busy = False  # the thread is committing what it took from _pending
        self._failure: JournalUnavailable | None = None  # fails batches until the next fence
        self._unavailable: JournalUnavailable | None = None  # fails them until a probe succeeds
        self._next_probe = 0.0
        self._dirty_tail = False  # a failed write could not be cut off; the probe must first
        # the active segment's file size as written and synced (records + runway); 0: no runway
        self._runway_end = 0
        self._runway_retry = 0.0  # time.monotonic() before which no extension is tried
        self.prepare_runway()
        self._thread = threading.Thread(target=self._writer, name="journal-writer", daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        """Whether the caller runs on the writer thread (a run_in_writer call)."""
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Let the thread commit what was submitted, then end it; later submits are refused."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def close(self) -> None:
        """stop(), then leave the active segment holding exactly its records, synced, and close
        its descriptor. Shutdown must end even on a broken device: what fails here is logged,
        not raised; every acknowledged record was synced at its commit already. Idempotent."""
        if self._closed:
            return
        self.stop()
        if not self._dirty_tail:
            try:
                self.trim_runway()  # a closed segment holds exactly its records
                self._io.fsync(self._fd)
            except OSError as exc:
                log.error(
                    "journal: final sync of %s failed: %s", self.layout.segments[-1].path, exc
                )
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._closed = True

    def submit(
        self,
        data: bytes,
        entries: list[IndexEntry],
        on_done: DoneCallback,
        meta: IndexMeta | None = None,
    ) -> None:
        """Queue encoded records for the next group commit (any thread).

        entries: (publisher_id, seq, timestamp_us, offset within `data`) for each message record.
        on_done(position_of_first_byte, None) runs on the writer thread once durable, or
        on_done(None, error) if the write failed. meta: index metadata stored with this commit.
        """
        with self._cond:
            if self._closing:
                raise JournalClosed()
            self._pending.append((data, entries, on_done, meta))
            self._cond.notify()

    def commit_inline(
        self,
        data: bytes,
        entries: list[IndexEntry],
        on_done: DoneCallback,
        meta: IndexMeta | None = None,
        on_written: Callable[[], None] | None = None,
    ) -> bool:
        """Commit on the calling thread when the writer thread is idle: nothing queued, nothing
        being written, the journal available, and `data` fits in the open segment (a roll is
        the writer thread's). Returns False (nothing done) otherwise, and the caller submit()s.
        on_done runs before this returns, as submit()'s would on the writer; a failed write
        makes the journal unavailable exactly as on the writer thread.

        on_written, if given, runs once the data is durable and before the index update (whose
        LMDB transaction is derived state: an open after a crash re-indexes what it misses), so
        a caller on the event loop can answer (the `persisted` ack) a few µs sooner. Nothing
        else runs on this thread in between, so no reader can look the batch up meanwhile.

        Why: a lone small commit handed to the writer costs two thread wake-ups (here to the
        writer, the writer back to the event loop), on a virtual machine about as much as the
        fdatasync itself; the caller blocks for the fdatasync instead, and what arrives
        meanwhile makes the next, larger batch (which goes to the writer thread)."""
        with self._cond:
            if (
                self._pending
                or self._busy
                or self._closing
                or self._failure is not None
                or self._unavailable is not None
            ):
                return False
            size = self.layout.segments[-1].size
            if size and size + len(data) > self.layout.segment_size:
                return False  # it would roll the segment: not on the event loop
            self._commit([(data, entries, on_done, meta)], on_written)  # the writer waits
            if self._runway_wanted():
                self._cond.notify()  # the writer thread extends it, off this thread
        return True

    def _writer(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                while not self._pending and not self._closing:
                    if self._unavailable is None:
                        if self._runway_wanted():
                            break
                        self._cond.wait()
                        continue
                    left = self._next_probe - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._pending
                if not batch and self._closing:
                    return
                self._pending = []
                self._busy = True
            if self._unavailable is not None and time.monotonic() >= self._next_probe:
                self._probe()
            run: list[Batch] = []
            for item in batch:
                head = item[0]
                if head is None or type(head) is _Control:  # a fence, or maintenance
                    if run:  # both come between two commits
                        self._commit_fitting(run)
                        run = []
                    if head is None:  # a fence: the submitter has dealt with the failure
                        self._failure = None
                    else:
                        head.run()
                else:
                    run.append(cast(Batch, item))
            if run:
                self._commit_fitting(run)
            if self._unavailable is None and self._runway_wanted():
                self._extend_runway()

    def _runway_wanted(self) -> bool:
        if self.durability != "fsync" or time.monotonic() < self._runway_retry:
            return False
        end = self._runway_end
        if end >= SEGMENT_HEADER_SIZE + self.layout.segment_size:
            return False  # it reaches the segment's size: nothing more to zero
        return end - (SEGMENT_HEADER_SIZE + self.layout.segments[-1].size) < RUNWAY_LOW

    def prepare_runway(self) -> None:
        """Zero the active segment's runway now if it is short (at open, before the writer
        thread starts, and right after a roll), so commits find it in place rather than
        waiting for the writer thread to make it. Never raises (module doc)."""
        if self._runway_wanted():
            self._extend_runway()

    def _extend_runway(self) -> None:
        """Writer thread, between commits: zero the next stretch of the active segment and
        sync it. A failure is logged and leaves commits appending (module doc)."""
        seg = self.layout.segments[-1]
        start = max(self._runway_end, SEGMENT_HEADER_SIZE + seg.size)
        cap = SEGMENT_HEADER_SIZE + self.layout.segment_size
        length = min(start + RUNWAY_BYTES, cap) - start
        if length <= 0:
            return
        try:
            self._io.extend(self._fd, start, length)
        except OSError as exc:
            self._runway_retry = time.monotonic() + RUNWAY_RETRY_S
            log.warning(
                "journal: could not extend the zeroed runway of %s (%s); commits append to the "
                "file meanwhile (slower), retrying in %.0fs",
                seg.path,
                exc,
                RUNWAY_RETRY_S,
            )
            # zeros past the end are harmless; cutting them keeps the disk space free
            with contextlib.suppress(OSError):
                self._io.ftruncate(self._fd, start)
            self._runway_end = start
            return
        self._runway_end = start + length

    def trim_runway(self) -> None:
        """Cut the runway off the active segment, leaving exactly its records (a clean close;
        the writer thread has stopped). OSError propagates."""
        end = SEGMENT_HEADER_SIZE + self.layout.segments[-1].size
        if self._runway_end > end:
            self._io.ftruncate(self._fd, end)
        self._runway_end = 0

    @property
    def available(self) -> bool:
        """False from a failed write until a probe succeeds (writes fail at once meanwhile)."""
        return self._unavailable is None

    def _set_unavailable(self, exc: OSError) -> JournalUnavailable:
        err = JournalUnavailable(exc)
        self.stats.failures += 1
        if self._unavailable is None:
            self.stats.unavailable_since = time.time()
            log.error(
                "journal: %s; unavailable until a probe write succeeds (every %gs)",
                err,
                self._probe_interval,
            )
        self._unavailable = err
        self._failure = err
        self._next_probe = time.monotonic() + self._probe_interval
        return err

    def _probe(self) -> None:
        """Whether the device takes writes again: cut what a failed write left, then write and
        sync a small file. Success makes the journal available; failure waits for the next."""
        io = self._io
        probe = os.path.join(self.layout.directory, PROBE_NAME)
        try:
            if self._dirty_tail:
                io.ftruncate(self._fd, SEGMENT_HEADER_SIZE + self.layout.segments[-1].size)
                io.fdatasync(self._fd)
                self._dirty_tail = False
                self._runway_end = 0
            fd = io.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                self._pwrite_all(fd, bytes(PROBE_BYTES), 0)
                io.fdatasync(fd)
            finally:
                io.close(fd)
        except OSError as exc:
            self._next_probe = time.monotonic() + self._probe_interval
            log.debug("journal: probe failed: %s", exc)
            return
        finally:
            _unlink_quietly(probe)
        down = time.time() - self.stats.unavailable_since
        self._unavailable = None
        self.stats.unavailable_since = 0.0
        self.stats.recoveries += 1
        log.warning("journal: writes succeed again after %.1fs; the journal is available", down)

    def _commit_fitting(self, run: list[Batch]) -> None:
        """Commit a run of batches, rolling segments between batches where one would overflow."""
        room = self.layout.segment_size - self.layout.segments[-1].size
        part: list[Batch] = []
        size = 0
        for item in run:
            n = len(item[0])
            if part and size + n > room:
                self._commit(part)
                part, size = [], 0
                room = self.layout.segment_size - self.layout.segments[-1].size
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

    def _commit(self, batch: list[Batch], on_written: Callable[[], None] | None = None) -> None:
        failed = self._failure or self._unavailable
        if failed is not None:
            for item in batch:
                item[2](None, failed)
            return
        started = time.perf_counter()
        data = batch[0][0] if len(batch) == 1 else b"".join(b[0] for b in batch)
        layout = self.layout
        seg = layout.segments[-1]
        meta: IndexMeta = {}
        for item in batch:
            if item[3]:
                meta.update(item[3])  # only the batches in this commit: metadata never runs ahead
        if not data:  # only markers: durable already, since earlier commits finished
            if meta:  # metadata alone (a queue checkpoint of a quiet server): no record moves
                try:
                    self.index.add((), layout.end, meta)
                except Exception:  # derived data, conservative when missing
                    log.exception("journal: index metadata update failed")
            for item in batch:
                item[2](layout.end, None)
            return
        try:
            if seg.size and seg.size + len(data) > layout.segment_size:
                self._roll()
                seg = layout.segments[-1]
                self.prepare_runway()  # in the roll's commit, slow already: inline ones find it
            self._write_at(data, SEGMENT_HEADER_SIZE + seg.size)
        except OSError as exc:
            self._undo_partial_write(seg)
            err = self._set_unavailable(exc)
            for item in batch:
                item[2](None, err)
            return
        base = layout.end
        entries: list[IndexEntry] = []
        off = base
        for chunk, ents, _, _ in batch:
            entries.extend((p, s, t, off + o) for p, s, t, o in ents)
            off += len(chunk)
        seg.size += len(data)
        new_end = base + len(data)
        if on_written is not None:
            layout.end = new_end  # readers see the batch by position before the caller answers
            try:
                on_written()
            except Exception:  # the caller's: the commit itself must still finish
                log.exception("journal: error in a commit's on_written callback")
        try:
            self.index.add(entries, new_end, meta)
        except Exception:  # the records are durable; a later open re-indexes them
            log.exception("journal: index update failed; the index is rebuilt at the next start")
        layout.end = new_end
        st = self.stats
        st.commits += 1
        st.records += len(entries)
        st.bytes += len(data)
        st.last_latency_s = time.perf_counter() - started
        off = base
        for chunk, _, cb, _ in batch:
            cb(off, None)
            off += len(chunk)

    def _write_at(self, data: bytes, offset: int) -> None:
        """Write data at `offset` of the active segment (inside the runway, or past the file's
        end) and, in fsync mode, make it durable: one pwritev(RWF_DSYNC) when it is written
        whole, which it is but for a short write."""
        io, fd = self._io, self._fd
        view = memoryview(data)
        end = offset + len(data)
        if self.durability == "fsync":
            n = io.pwrite_dsync(fd, view, offset)
            if n < len(view):  # short: write the rest, then sync it all
                self._pwrite_all(fd, view[n:], offset + n)
                io.fdatasync(fd)
        else:
            self._pwrite_all(fd, view, offset)
        if end > self._runway_end:
            self._runway_end = end

    def _pwrite_all(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        view = memoryview(data)
        while view:
            n = self._io.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def _undo_partial_write(self, seg: Segment) -> None:
        """Cut what a failed write left past the last commit; if even that fails, the probe
        cuts it before anything else is written (an append after it would misplace records)."""
        try:
            self._io.ftruncate(self._fd, SEGMENT_HEADER_SIZE + seg.size)
            self._runway_end = 0  # the cut took the runway too
        except OSError as exc:
            self._dirty_tail = True
            log.error(
                "journal: could not cut a partial write from %s (%s); the probe will", seg.path, exc
            )

    def _roll(self) -> None:
        """Seal the active segment and switch to a new one. The switch happens only once the
        new file is complete and durable under its name; an error before leaves everything as
        it was (the old descriptor open, no new file; perhaps without its runway)."""
        io = self._io
        old = self.layout.segments[-1]
        base = old.end
        path = os.path.join(self.layout.directory, segment_name(base))
        tmp = path + ".new"
        fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        renamed = False
        try:
            self._pwrite_all(fd, encode_segment_header(base), 0)
            io.fsync(fd)
            # Seal the old segment before the new one gets its name, so no segment but the
            # newest is ever seen with a runway; after the new file is made, so a full disk
            # fails the roll here rather than after the cut freed the runway's space.
            if self._runway_end > SEGMENT_HEADER_SIZE + old.size:
                io.ftruncate(self._fd, SEGMENT_HEADER_SIZE + old.size)
                self._runway_end = 0
            io.fsync(self._fd)
            io.rename(tmp, path)
            renamed = True
            io.fsync_dir(self.layout.directory)
        except OSError:
            with contextlib.suppress(OSError):
                io.close(fd)
            _unlink_quietly(path if renamed else tmp)
            raise
        old_fd, self._fd = self._fd, fd
        self._runway_end = 0
        self.layout.segments.append(Segment(base, path, 0))
        try:
            io.close(old_fd)
        except OSError as exc:  # its data is synced, and the descriptor is released anyway
            log.warning("journal: closing sealed segment %s: %s", old.path, exc)
        log.info("journal: sealed %s at %d bytes; writing %s", old.path, old.size, path)

    def run_in_writer(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run fn() on the writer thread between two group commits; its result in a Future."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise JournalClosed()
            self._pending.append((_Control(fn, fut), [], None, None))
            self._cond.notify()
        return fut


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("journal: could not remove %s: %s", path, exc)
