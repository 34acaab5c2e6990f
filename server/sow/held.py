"""The held writes of the SOW store (docs/sow.md "How the store is kept"): a `HeldWrites`
object that `SowManager` (server/sow/manager.py) makes once the store is open, handed the store,
the record counts it keeps, and the fold's own steps (`put`, `delete`) as callables.

Puts are held in memory as the latest store row per key (`store_rows`, C with a Python twin in
server/sow/store.py): per topic, record key -> value. They are written in one LMDB write
transaction, in key order, with the journal position of the last record they hold and the
record counts that changed:

- **live** (`defer`, `flush`): the puts of the commits that need nothing else (no delete,
  nobody watching the topic for out-of-focus notices or deltas, no `<Expiration>`: the
  manager asks `holdable` per topic of a commit), written when DEFER_RECORDS keys are held,
  when the oldest is DEFER_SECONDS old (`tick`), and before every read of the store;
- **catch-up** at start (`catch_up`): the journal from the store's position to its end, the
  holds written per CATCH_UP_KEYS keys and before each delete record.

So a stream of updates over a bounded set of keys costs one LMDB put per key and write, and
page copies per write, not per message or per commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_SOW_DELETE

from .history import Checkpoints
from .store import SowStore, decode_value, record_key, store_rows

__all__ = ["CATCH_UP_KEYS", "DEFER_RECORDS", "DEFER_SECONDS", "HeldWrites", "Holds"]

log = logging.getLogger("tickertape.sow")

# live puts are written when this many keys are held, or the oldest was held this long (the
# tick): a bound on the memory they hold and on the journal a restart after a crash reads
DEFER_RECORDS = 32_768
DEFER_SECONDS = 0.25
CATCH_UP_KEYS = 65_536  # keys held by catch-up between two writes

Holds = dict[str, tuple[bytes, dict[bytes, bytes]]]
"""topic -> (record key prefix, record key -> value): the held rows (store_rows' targets)."""


Put = Callable[..., str | None]
"""f(txn, topic, pos, pub, seq, ts, hdr, body, exp): the fold's put of one message (the manager's)."""


class HeldWrites:
    def __init__(
        self,
        store: SowStore,
        counts: dict[str, int],
        recount: set[str],
        is_sow: Callable[[str], bool],
        holdable: Callable[[str], bool],
        put: Put,
        delete: Callable[[Any, str, bytes], int],
        checkpoints: Checkpoints | None,
        window: float | None,
    ) -> None:
        self.store = store
        self.counts = counts  # records per topic: shared with the manager, which owns it
        self.recount = recount  # topics whose count changed since the last write (shared)
        self.is_sow = is_sow
        self.holdable = holdable  # may a put to this topic be held (nobody watching, no expiry)
        self.put = put
        self.delete = delete
        self.checkpoints = checkpoints
        self.window = window
        # topic -> (record key prefix, record key -> value) of committed puts not yet in the
        # store (the latest per key: store_rows), and the journal end they bring the store to
        self.held: Holds = {}
        self.held_end: int | None = None
        self.held_since = 0.0

    def catch_up(self, journal: Journal, position: int, end: int) -> int:
        """The fold from `position` to `end`, as the live commits do it: puts held as the
        latest row per key (store_rows) and written in key order per CATCH_UP_KEYS keys, with
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

    def _write_held(self, txn: Any, targets: Holds) -> None:
        """Put the held rows (in key order: LMDB fills each page it touches once), count the
        new records, and empty the holds."""
        store = self.store
        for topic, (_prefix, rows) in targets.items():
            if rows:
                added = store.put_many(txn, sorted(rows.items()))
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
            if store_rows(puts, base, targets) < 0:
                return False  # the rows before the odd one are in: flushed, then all applied
        self.held_end = end
        if sum(len(rows) for _prefix, rows in targets.values()) >= DEFER_RECORDS:
            self.flush()
        return True

    def body(self, topic: str, k: str) -> bytes | None:
        """The body committed for record `k` of `topic`: held and not yet written, else in the
        store; None when none."""
        held = self.held.get(topic)
        value = held[1].get(record_key(topic, k)) if held is not None else None
        if value is not None:
            return decode_value(value)[5]
        reader = self.store.reader(0)
        try:
            rec = reader.get(topic, k)
        finally:
            reader.close()
        return None if rec is None else rec[5]

    def tick(self) -> None:
        """Write what is held once the oldest hold is DEFER_SECONDS old."""
        if self.held_end is not None and time.monotonic() - self.held_since >= DEFER_SECONDS:
            self.flush()

    def changed_counts(self) -> dict[str, int]:
        """The counts to write with the position: the topics whose count changed since the
        last write that committed (`recount` is cleared after each commit)."""
        return {t: self.counts.get(t, 0) for t in self.recount}

    def flush(self) -> None:
        """Write the deferred puts and the position they bring the store to, in one write
        transaction. A failure is logged and costs the store those updates until a restart
        catches up from the journal (as a failed commit apply does)."""
        end = self.held_end
        if end is None:
            return
        targets, self.held = self.held, {}
        self.held_end = None
        store = self.store
        try:
            with store.write() as txn:
                self._write_held(txn, targets)
                store.set_position(txn, end, self.changed_counts())
        except Exception:
            log.exception(
                "SOW store: writing deferred updates failed; queries may lag until restart"
            )
            return
        self.recount.clear()
        if self.checkpoints is not None:
            self.checkpoints.maybe_make(end, self.window)
