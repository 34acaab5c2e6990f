"""The journal's writer thread: group commit, segment rolls, fences and maintenance calls.

`submit()` hands a batch of encoded records to the writer thread. The writer takes every batch
submitted since its last write, writes them with one `write` and makes them durable with one
`fdatasync` (group commit), updates the index in one LMDB transaction, then calls each batch's
callback with the batch's starting position. Part of Journal (journal.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import JournalClosed, JournalUnavailable
from .record import SEGMENT_HEADER_SIZE
from .segments import Segment, segment_name

log = logging.getLogger("tickertape.journal")


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


class JournalWriter:

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

    def run_in_writer(self, fn) -> concurrent.futures.Future:
        """Run fn() on the writer thread between two group commits; its result in a Future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise JournalClosed()
            self._pending.append((_Control(fn, fut), [], None, None))
            self._cond.notify()
        return fut
