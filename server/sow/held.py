"""The held writes of the SOW store (docs/sow.md "How the store is kept"): a `HeldWrites`
object that `SowManager` (server/sow/manager.py) makes once the store is open, handed the store,
the record counts it keeps, and the fold's own steps (`put`, `delete`) as callables.

Puts are held in memory as the latest store row per key (`store_rows`, C with a Python twin in
server/sow/store.py): per topic, record key -> value. They are written in one LMDB write
transaction (one `putmulti` per topic), with the journal position of the last record they hold
and the record counts that changed:

- **live** (`defer`, `flush`): the puts of the commits that need nothing else (no delete,
  nobody watching the topic for out-of-focus notices or deltas, no `<Expiration>`: the
  manager asks `holdable` per topic of a commit), written when DEFER_RECORDS keys or about
  DEFER_BYTES are held, when the oldest is DEFER_SECONDS old or no commit came for a tick
  (`tick`), and before every read of the store;
- **catch-up** at start (`catch_up`): the journal from the store's position to its end, the
  holds written per CATCH_UP_KEYS keys and before each delete record.

So a stream of updates over a bounded set of keys costs one LMDB put per key and write, and
page copies per write, not per message or per commit.

**The writer thread.** A live flush does not write on the event loop: it hands what is held
(the rows and the position they bring the store to) to one writer thread (`_Writer`), which
writes them in one LMDB write transaction and then, if due, starts a checkpoint. Until that
transaction commits, the rows stay readable in `writing` (oldest first), so `body` (the merge of
a delta_publish) sees held, then writing, then the store. The acks of the commits whose puts
are being written do not wait for it: they wait on the journal only (`persisted` is durable in
the journal). Anything that reads the store or writes it from the loop calls `sync` first (a
query's snapshot, `topics`, a commit applied at once, the expiration tick, close): it waits for
the writer and writes the rest of what is held on the loop, so the store then reflects exactly
the journal up to the last commit, as before. At most `MAX_WRITING` flushes wait for the writer:
a flush past that waits for the oldest (a bound on the memory held while the disk is slow).
Only the writer writes while it has work: the loop's writes come after `sync`, so positions and
record counts are written in journal order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_SOW_DELETE

from .checkpoints import Checkpoints
from .store import SowStore, decode_value, record_key, store_rows

__all__ = ["CATCH_UP_KEYS", "DEFER_BYTES", "DEFER_RECORDS", "DEFER_SECONDS", "HeldWrites", "Holds"]

log = logging.getLogger("tickertape.sow")

# live puts are written when this many keys are held, or about this many bytes (the keys held
# times the mean journal bytes of the puts since the last write), or the oldest was held this
# long, or no commit came for a tick (the tick): a bound on the memory they hold and on the
# journal a restart after a crash reads. The longer a key is held, the more of its updates one
# put replaces, and a write copies each page it touches once: at 32,768 keys and a quarter of a
# second, 1M updates over 100k keys cost about 0.8 puts an update and the writer thread 0.8 µs
# of CPU a message; at these bounds about 0.3 puts (bench_sow, bench/RESULTS.md). The price is a
# read of the store under load waiting for a bigger write (`sync`: at most DEFER_RECORDS rows).
DEFER_RECORDS = 131_072
DEFER_BYTES = 32 * 2**20
DEFER_SECONDS = 1.0
CATCH_UP_KEYS = 65_536  # keys held by catch-up between two writes
MAX_WRITING = 2  # flushes handed to the writer thread and not yet written (the bound above)

Holds = dict[str, tuple[bytes, dict[bytes, bytes]]]
"""topic -> (record key prefix, record key -> value): the held rows (store_rows' targets)."""


Put = Callable[..., str | None]
"""f(txn, topic, pos, pub, seq, ts, hdr, body, exp): the fold's put of one message (the manager's)."""


@dataclass(eq=False, repr=False)
class HeldWrites:
    store: SowStore
    counts: dict[str, int]  # records per topic: shared with the manager, which owns it
    recount: set[str]  # topics whose count changed since the last write (shared)
    is_sow: Callable[[str], bool]
    holdable: Callable[[str], bool]  # may a put to this topic be held (nobody watching, no expiry)
    put: Put
    delete: Callable[[Any, str, bytes], int]
    checkpoints: Checkpoints | None
    window: float | None
    # topic -> (record key prefix, record key -> value) of committed puts not yet in the
    # store (the latest per key: store_rows), and the journal end they bring the store to
    held: Holds = field(init=False, default_factory=dict)
    held_end: int | None = field(init=False, default=None)
    held_since: float = field(init=False, default=0.0)
    # since the last flush: rows put (replaced ones too) and the journal bytes of their
    # commits, for the estimate of the bytes held (DEFER_BYTES); the held end the last tick saw
    held_puts: int = field(init=False, default=0)
    held_bytes: int = field(init=False, default=0)
    _ticked_end: int | None = field(init=False, default=None)
    # flushes handed to the writer and not yet committed, oldest first (read by `body`)
    writing: list[Holds] = field(init=False, default_factory=list)
    _writer: _Writer | None = field(init=False, default=None)

    def start(self, journal: Journal, position: int, end: int, rebuild: bool) -> int:
        """At start: empty the store first when `rebuild`, then `catch_up`; records read. A
        failure (a full disk, a short write) marks the store failed, as a failed live write
        does: the server serves publishes and refuses queries saying why, it does not stop."""
        try:
            if rebuild:
                self.store.clear()
            return self.catch_up(journal, position, end)
        except Exception as exc:
            self.store.failed = f"catching up from the journal failed: {exc!r}"
            log.exception(
                "SOW store: catching up from the journal failed; queries are refused until a "
                "restart with the cause removed (disk space) folds the journal in again"
            )
            return 0

    def catch_up(self, journal: Journal, position: int, end: int) -> int:
        """The fold from `position` to `end`, as the live commits do it: puts held as the
        latest row per key (store_rows) and written per CATCH_UP_KEYS keys, with
        the position of the last record they hold; a delete, or a row store_rows does not
        take, writes what is held first and is applied in journal order."""
        store = self.store
        n = 0
        targets: Holds = {}
        last = position
        for recs in journal.raw_batches(position, end):
            rows: list[tuple[Any, ...]] = []
            for pos, kind, pub, seq, ts, tb, body, extra in recs:
                n += 1
                if kind == KIND_MESSAGE:
                    topic = tb.decode("utf-8", "replace")
                    if self.is_sow(topic):
                        hdr, exp = (extra[1], extra[0]) if extra else (b"", None)
                        rows.append((topic, pub, seq, ts, body, pos, hdr, exp))
                elif kind == KIND_SOW_DELETE:
                    self._hold(targets, rows, last)
                    rows = []
                    with store.write() as txn:
                        self._write_held(txn, targets)
                        self.delete(txn, tb.decode("utf-8", "replace"), body)
                        store.set_position(txn, pos, self.changed_counts())
                    self.recount.clear()
                last = pos
            self._hold(targets, rows, last)
            if sum(len(d) for _p, d in targets.values()) >= CATCH_UP_KEYS:
                # the record at `last` is applied: a restart re-applies it, which changes
                # nothing (a put of the same value, a delete of what is gone)
                with store.write() as txn:
                    self._write_held(txn, targets)
                    store.set_position(txn, last, self.changed_counts())
                self.recount.clear()
        with store.write() as txn:
            self._write_held(txn, targets)
            store.set_position(txn, end, self.changed_counts())
        self.recount.clear()
        return n

    def _hold(self, targets: Holds, rows: list[Any], last: int) -> None:
        """Catch-up: hold `rows` (journal rows, offsets = positions) as store rows; those of a
        batch store_rows does not take are written with what is held, the Python way."""
        if not rows:
            return
        for topic in {r[0] for r in rows}:
            if topic not in targets:
                targets[topic] = (record_key(topic, ""), {})
        if store_rows(rows, 0, targets) >= 0:
            return
        store = self.store
        with store.write() as txn:
            self._write_held(txn, targets)
            for topic, pub, seq, ts, body, pos, hdr, exp in rows:
                self.put(txn, topic, pos, pub, seq, ts, hdr, body, exp)
            store.set_position(txn, last, self.changed_counts())
        self.recount.clear()

    def _write_held(self, txn: Any, targets: Holds, keep: bool = False) -> None:
        """Put the held rows, count the new records, and empty the holds (unless `keep`: the
        writer's stay readable in `writing` until the transaction commits). The rows go in the
        order their keys were first held, not sorted: a write transaction copies each page it
        touches once whatever the order, and sorting a flush's rows cost about 0.35 µs a row,
        holding the GIL, for no measurable gain in LMDB (bench_sow, bench/RESULTS.md)."""
        store = self.store
        for topic, (_prefix, rows) in targets.items():
            if rows:
                added = store.put_many(txn, rows.items())
                if not keep:
                    rows.clear()
                if added:
                    self.counts[topic] = self.counts.get(topic, 0) + added
                    self.recount.add(topic)

    def defer(self, puts: list[Any], topics: set[str], base: int, end: int) -> bool:
        """Keep a commit's puts for `flush` (True), or say they must be applied now (False):
        a put to a topic that is not `holdable`, or with a header fragment other than its `k`.
        (The manager does not ask while a delta feed watches the records.)"""
        targets = self.held
        if puts:
            holdable = self.holdable
            for topic in topics:
                if not holdable(topic):
                    return False
                if topic not in targets:
                    targets[topic] = (record_key(topic, ""), {})
            if not self.held_end:
                self.held_since = time.monotonic()
            put = store_rows(puts, base, targets)
            if put < 0:
                return False  # the rows before the odd one are in: flushed, then all applied
            self.held_puts += put
            self.held_bytes += end - base
        self.held_end = end
        keys = sum(len(rows) for _prefix, rows in targets.values())
        if keys >= DEFER_RECORDS or keys * self.held_bytes >= DEFER_BYTES * max(1, self.held_puts):
            self.flush()
        return True

    def body(self, topic: str, k: str) -> bytes | None:
        """The body committed for record `k` of `topic`: held and not yet written, else in the
        store; None when none."""
        rk = record_key(topic, k)
        # the writer removes a flush from `writing` only once it is in the store
        for holds in (self.held, *reversed(list(self.writing))):
            held = holds.get(topic)
            value = held[1].get(rk) if held is not None else None
            if value is not None:
                return decode_value(value)[5]
        reader = self.store.reader(0)
        try:
            rec = reader.get(topic, k)
        finally:
            reader.close()
        return None if rec is None else rec[5]

    def tick(self) -> None:
        """Write what is held once the oldest hold is DEFER_SECONDS old, or when no commit came
        since the last tick (a burst has ended: a query after it finds the store written)."""
        end = self.held_end
        if end is not None and (
            end == self._ticked_end or time.monotonic() - self.held_since >= DEFER_SECONDS
        ):
            self.flush()
        self._ticked_end = self.held_end

    def changed_counts(self) -> dict[str, int]:
        """The counts to write with the position: the topics whose count changed since the
        last write that committed (`recount` is cleared after each commit)."""
        return {t: self.counts.get(t, 0) for t in self.recount}

    def _take(self) -> tuple[Holds, int] | None:
        """What is held and the journal end it brings the store to, the holds emptied (and
        their counts for DEFER_BYTES); None when nothing is held."""
        end = self.held_end
        if end is None:
            return None
        targets, self.held = self.held, {}
        self.held_end = None
        self.held_puts = self.held_bytes = 0
        return targets, end

    def flush(self) -> None:
        """Hand the deferred puts and the position they bring the store to to the writer
        thread (module docstring); past MAX_WRITING flushes waiting, wait for the oldest."""
        taken = self._take()
        if taken is None:
            return
        targets, end = taken
        writer = self._writer
        if writer is None:
            writer = self._writer = _Writer(self)
        while len(self.writing) >= MAX_WRITING:
            writer.wait_one()
        self.writing.append(targets)
        writer.submit(targets, end)

    def sync(self) -> None:
        """Wait until the writer has written everything handed to it, then write what is held
        here on the calling thread: the store then reflects every commit taken so far."""
        if self._writer is not None:
            self._writer.wait_all()
        taken = self._take()
        if taken is not None:
            self.write(*taken)

    def write(self, targets: Holds, end: int) -> None:
        """Write `targets` and the position `end` in one write transaction (the writer's and
        `sync`'s). A failure is logged and marks the store failed (its position stays before
        the lost updates; queries are refused) until a restart catches up from the journal."""
        store = self.store
        if store.failed is not None:
            return  # it lacks updates already: the restart that folds them in folds these too
        try:
            with store.write() as txn:
                self._write_held(txn, targets, keep=True)
                store.set_position(txn, end, self.changed_counts())
        except Exception as exc:
            store.failed = store.failed or f"writing updates failed: {exc!r}"
            log.exception(
                "SOW store: writing deferred updates failed; queries are refused until a restart "
                "folds the journal again from the store's last position"
            )
            return
        self.recount.clear()
        store.trim()  # the pages this write touched leave the resident set (store.py)
        if self.checkpoints is not None:
            self.checkpoints.maybe_make(end, self.window)

    def close(self) -> None:
        """Write everything (`sync`) and stop the writer thread."""
        self.sync()
        if self._writer is not None:
            self._writer.stop()
            self._writer = None


class _Writer:
    """The one thread that writes live flushes (HeldWrites' module docstring). Jobs are done
    in the order submitted; `wait_one` / `wait_all` block the caller until they are done."""

    def __init__(self, held: HeldWrites) -> None:
        self.held = held
        self.jobs: queue.SimpleQueue[tuple[Holds, int] | None] = queue.SimpleQueue()
        self.done = threading.Condition()
        self.submitted = 0
        self.finished = 0
        self.thread = threading.Thread(target=self._run, name="sow-writer", daemon=True)
        self.thread.start()

    def submit(self, targets: Holds, end: int) -> None:
        self.submitted += 1
        self.jobs.put((targets, end))

    def _run(self) -> None:
        held = self.held
        while True:
            job = self.jobs.get()
            if job is None:
                return
            targets, end = job
            try:
                held.write(targets, end)
            finally:
                with self.done:
                    held.writing.remove(targets)  # in the store now (or lost: logged)
                    self.finished += 1
                    self.done.notify_all()

    def _wait(self, target: int) -> None:
        with self.done:
            while self.finished < target and self.thread.is_alive():
                self.done.wait(1.0)
        if not self.thread.is_alive():  # pragma: no cover - it ends only at stop
            self.held.writing.clear()

    def wait_one(self) -> None:
        """Until the oldest flush not yet written is written."""
        self._wait(self.finished + 1)

    def wait_all(self) -> None:
        self._wait(self.submitted)

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(10.0)
