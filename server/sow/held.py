"""The held writes of the SOW store (docs/sow.md "How the store is kept"), mixed into
`SowManager` (server/sow/manager.py), which provides the attributes declared here.

Puts are held in memory as the latest store row per key (`store_rows`, C with a Python twin in
server/sow/store.py): per topic, record key -> value. They are written in one LMDB write
transaction, in key order, with the journal position of the last record they hold and the
record counts that changed:

- **live** (`_defer`, `flush`): the puts of the commits that need nothing else (no delete,
  nobody watching the topic for out-of-focus notices or deltas, no `<Expiration>`), written
  when DEFER_RECORDS keys are held, when the oldest is DEFER_SECONDS old (the tick), and before
  every read of the store;
- **catch-up** at start (`_catch_up`): the journal from the store's position to its end, the
  holds written per CATCH_UP_KEYS keys and before each delete record.

So a stream of updates over a bounded set of keys costs one LMDB put per key and write, and
page copies per write, not per message or per commit.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_SOW_DELETE

from .history import Checkpoints
from .oof import OofNotices
from .store import SowStore, record_key, store_rows

__all__ = ["CATCH_UP_KEYS", "DEFER_RECORDS", "DEFER_SECONDS", "HeldWrites"]

log = logging.getLogger("tickertape.sow")

# live puts are written when this many keys are held, or the oldest was held this long (the
# tick): a bound on the memory they hold and on the journal a restart after a crash reads
DEFER_RECORDS = 32_768
DEFER_SECONDS = 0.25
CATCH_UP_KEYS = 65_536  # keys held by catch-up between two writes

Holds = dict[str, tuple[bytes, dict[bytes, bytes]]]
"""topic -> (record key prefix, record key -> value): the held rows (store_rows' targets)."""


class HeldWrites:
    # provided by SowManager
    store: SowStore | None
    journal: Journal | None
    counts: dict[str, int]
    oof: OofNotices | None
    checkpoints: Checkpoints | None
    window: float | None
    delta_feeds: int
    _recount: set[str]
    _deferred: Holds
    _deferred_end: int | None
    _deferred_since: float

    def spec(self, topic: str) -> Any:
        raise NotImplementedError

    def is_sow(self, topic: str) -> bool:
        raise NotImplementedError

    def _put(
        self,
        txn: Any,
        topic: str,
        pos: int,
        pub: int,
        seq: int,
        ts: int,
        hdr: bytes,
        body: bytes,
        exp: Any = None,
    ) -> str | None:
        raise NotImplementedError

    def _delete(self, txn: Any, topic: str, body: bytes) -> int:
        raise NotImplementedError

    def _catch_up(self, position: int, end: int) -> int:
        """The fold from `position` to `end`, as the live commits do it: puts held as the
        latest row per key (store_rows) and written in key order per CATCH_UP_KEYS keys, with
        the position of the last record they hold; a delete, or a row store_rows does not
        take, writes what is held first and is applied in journal order."""
        store = self.store
        journal = self.journal
        assert store is not None and journal is not None
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
                        self._delete(txn, tb.decode("utf-8", "replace"), body)
                        store.set_position(txn, pos, self._changed_counts())
                    self._recount.clear()
                last = pos
            self._hold(targets, rows, last)
            if sum(len(d) for _p, d in targets.values()) >= CATCH_UP_KEYS:
                # the record at `last` is applied: a restart re-applies it, which changes
                # nothing (a put of the same value, a delete of what is gone)
                with store.write() as txn:
                    self._write_held(txn, targets)
                    store.set_position(txn, last, self._changed_counts())
                self._recount.clear()
        with store.write() as txn:
            self._write_held(txn, targets)
            store.set_position(txn, end, self._changed_counts())
        self._recount.clear()
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
        assert store is not None
        with store.write() as txn:
            self._write_held(txn, targets)
            for topic, pub, seq, ts, body, pos, hdr, exp in rows:
                self._put(txn, topic, pos, pub, seq, ts, hdr, body, exp)
            store.set_position(txn, last, self._changed_counts())
        self._recount.clear()

    def _write_held(self, txn: Any, targets: Holds) -> None:
        """Put the held rows (in key order: LMDB fills each page it touches once), count the
        new records, and empty the holds."""
        store = self.store
        assert store is not None
        for topic, (_prefix, rows) in targets.items():
            if rows:
                added = store.put_many(txn, sorted(rows.items()))
                rows.clear()
                if added:
                    self.counts[topic] = self.counts.get(topic, 0) + added
                    self._recount.add(topic)

    def _defer(self, puts: list[Any], topics: set[str], base: int, end: int) -> bool:
        """Keep a commit's puts for `flush` (True), or say they must be applied now (False):
        a put whose record someone watches (out-of-focus notices, delta feeds), of a topic
        with <Expiration>, or with a header fragment other than its `k`."""
        if self.delta_feeds:
            return False
        targets = self._deferred
        if puts:
            oof = self.oof
            watched = oof.watching if oof is not None else None
            for topic in topics:
                spec = self.spec(topic)
                if spec is None or spec.expiration or (watched is not None and watched(topic)):
                    return False
                if topic not in targets:
                    targets[topic] = (record_key(topic, ""), {})
            if not self._deferred_end:
                self._deferred_since = time.monotonic()
            if store_rows(puts, base, targets) < 0:
                return False  # the rows before the odd one are in: flushed, then all applied
        self._deferred_end = end
        if sum(len(rows) for _prefix, rows in targets.values()) >= DEFER_RECORDS:
            self.flush()
        return True

    def _changed_counts(self) -> dict[str, int]:
        """The counts to write with the position: the topics whose count changed since the
        last write that committed (`_recount` is cleared after each commit)."""
        return {t: self.counts.get(t, 0) for t in self._recount}

    def flush(self) -> None:
        """Write the deferred puts and the position they bring the store to, in one write
        transaction. A failure is logged and costs the store those updates until a restart
        catches up from the journal (as a failed commit apply does)."""
        end = self._deferred_end
        if end is None:
            return
        targets, self._deferred = self._deferred, {}
        self._deferred_end = None
        store = self.store
        assert store is not None
        try:
            with store.write() as txn:
                self._write_held(txn, targets)
                store.set_position(txn, end, self._changed_counts())
        except Exception:
            log.exception(
                "SOW store: writing deferred updates failed; queries may lag until restart"
            )
            return
        self._recount.clear()
        if self.checkpoints is not None:
            self.checkpoints.maybe_make(end, self.window)
