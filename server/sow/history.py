"""Historical SOW queries (`sow` with `bm`): the state of the store as of a point of the journal.

The cost does not grow with how far back the point is. The store is copied now and then into a
**checkpoint** (`<JournalDirectory>/sow-checkpoints/<position>/`, an LMDB copy made from one
read snapshot, so its own `position` says exactly what it holds): one when the journal has
grown `CHECKPOINT_EVERY` bytes since the last. A historical query opens the newest checkpoint
at or before its point (an empty state at the journal's start when there is none), then folds
the journal from the checkpoint's position to the point into an overlay in memory: at most one
checkpoint interval of journal, whatever the point. The answer then reads the checkpoint
through the overlay (`HistoricalReader`, the `Reader` interface of server/sow/store.py).

Checkpoints older than the topic's `<History><Window>` (and beyond `KEEP` of them) are removed,
the newest one always kept. A point before the journal's start, or older than the window, is
refused with `invalid bookmark`.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_SOW_DELETE
from protocol.bookmarks import Bookmark, BookmarkSpec, Epoch, InvalidBookmark, Timestamp
from protocol.filters import FilterError, compile_filter

from ..matching import body_matches
from .keys import BadSowKey, KeyMaker, k_fragment, key_from_fragment
from .records import BY_FILTER, decode_delete
from .store import Reader, Stored

__all__ = ["CHECKPOINT_EVERY", "Checkpoints", "HistoricalReader", "locate_point"]

log = logging.getLogger("tickertape.sow")

# journal bytes between two checkpoints (the environment variable is for tests)
CHECKPOINT_EVERY = int(os.environ.get("TICKERTAPE_SOW_CHECKPOINT_BYTES", 32 * 1024 * 1024))
KEEP = 16
_EMPTY = object()


class HistoricalReader:
    """A checkpoint read through the overlay of the journal folded after it."""

    def __init__(
        self,
        base: Reader | None,
        overlay: dict[tuple[str, str], Stored | None],
        position: int,
        on_close: Callable[[], None],
    ) -> None:
        self.base = base
        self.overlay = overlay
        self.position = position
        self._on_close = on_close

    def get(self, topic: str, k: str) -> Stored | None:
        got = self.overlay.get((topic, k), _EMPTY)
        if got is not _EMPTY:
            return got  # type: ignore[return-value]
        return self.base.get(topic, k) if self.base is not None else None

    def keys(self, topic: str, after: str | None = None) -> Iterator[tuple[str, Stored]]:
        mine = sorted(k for t, k in self.overlay if t == topic)
        base = self.base.keys(topic, after) if self.base is not None else iter(())
        i = 0
        for k, rec in base:
            while i < len(mine) and mine[i] < k:
                o = self.overlay[(topic, mine[i])]
                if o is not None:
                    yield mine[i], o
                i += 1
            if i < len(mine) and mine[i] == k:
                i += 1
            got = self.overlay.get((topic, k), _EMPTY)
            if got is _EMPTY:
                yield k, rec
            elif got is not None:
                yield k, got  # type: ignore[misc]
        for k in mine[i:]:
            o = self.overlay[(topic, k)]
            if o is not None:
                yield k, o

    def close(self) -> None:
        if self.base is not None:
            self.base.close()
            self.base = None
        self._on_close()


class Checkpoints:
    """The store's checkpoints: made from the live store, read by historical queries."""

    def __init__(self, directory: str, store_env: Callable[[], lmdb.Environment | None]) -> None:
        self.directory = directory
        self._store_env = store_env
        os.makedirs(directory, exist_ok=True)
        self.last = max(self.positions(), default=-1)
        self._busy = False

    def positions(self) -> list[int]:
        return sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())

    def maybe_make(self, position: int, window: float | None) -> None:
        """Copy the store (in a thread) when the journal grew CHECKPOINT_EVERY since the last."""
        if self._busy or position - max(self.last, 0) < CHECKPOINT_EVERY:
            return
        env = self._store_env()
        if env is None:
            return
        self._busy = True
        self.last = position
        threading.Thread(target=self._make, args=(env, window), daemon=True).start()

    def _make(self, env: lmdb.Environment, window: float | None) -> None:
        tmp = os.path.join(self.directory, f"tmp-{os.getpid()}-{time.time_ns()}")
        try:
            os.makedirs(tmp)
            env.copy(tmp, compact=True)
            with lmdb.open(tmp, readonly=True, max_dbs=4, lock=False) as copy:
                meta = copy.open_db(b"meta")
                with copy.begin() as txn:
                    v = txn.get(b"position", db=meta)
            if v is None:
                shutil.rmtree(tmp, ignore_errors=True)
                return
            pos = int.from_bytes(v, "big")
            final = os.path.join(self.directory, f"{pos:020d}")
            if os.path.exists(final):
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.rename(tmp, final)
            self._prune(window)
        except Exception:
            log.exception("SOW checkpoint failed (historical queries read more journal)")
            shutil.rmtree(tmp, ignore_errors=True)
        finally:
            self._busy = False

    def _prune(self, window: float | None) -> None:
        positions = self.positions()
        keep = set(positions[-KEEP:])
        now = time.time()
        for p in positions[:-1]:
            path = os.path.join(self.directory, f"{p:020d}")
            old = window is not None and now - os.path.getmtime(path) > window + 60
            if p not in keep or old:
                shutil.rmtree(path, ignore_errors=True)

    def reader(
        self,
        journal: Journal,
        end: int,
        is_sow: Callable[[str], Any],
        maker: Callable[[str], KeyMaker | None],
    ) -> HistoricalReader:
        """The state as of journal position `end` (every record before it): the newest
        checkpoint at or before it, and the journal folded from there (runs off the loop)."""
        base_pos = max((p for p in self.positions() if p <= end), default=None)
        env = None
        base = None
        start = journal.start_position
        if base_pos is not None and base_pos >= start:
            env = lmdb.open(
                os.path.join(self.directory, f"{base_pos:020d}"),
                readonly=True,
                max_dbs=4,
                lock=False,
            )
            rec_db = env.open_db(b"rec")  # before the read transaction, which must know it
            base = Reader(env.begin(buffers=False), rec_db, base_pos)
            start = base_pos
        overlay: dict[tuple[str, str], Stored | None] = {}
        for recs in journal.raw_batches(start, end):
            for pos, kind, pub, seq, ts, tb, body, extra in recs:
                if kind == KIND_MESSAGE:
                    topic = tb.decode("utf-8", "replace")
                    if not is_sow(topic):
                        continue
                    hdr = extra[1] if extra else b""
                    k = key_from_fragment(hdr) if hdr else None
                    if k is None:
                        m = maker(topic)
                        try:
                            k = m.key(body, None) if m is not None else None
                        except BadSowKey:
                            k = None
                        if k is None:
                            continue
                        hdr = hdr + k_fragment(k)
                    overlay[(topic, k)] = (pos, pub, seq, ts, hdr, body)
                elif kind == KIND_SOW_DELETE:
                    topic = tb.decode("utf-8", "replace")
                    got = decode_delete(body)
                    if got is None:
                        continue
                    form, payload = got
                    if form != BY_FILTER:  # by keys (K, or E: expired)
                        for k in payload.split(","):
                            if k:
                                overlay[(topic, k)] = None
                        continue
                    try:
                        f = compile_filter(payload)
                    except FilterError:
                        continue
                    view = HistoricalReader(base, overlay, pos, lambda: None)
                    for k, rec in list(view.keys(topic)):
                        if body_matches(f, rec[5]):
                            overlay[(topic, k)] = None

        def closed() -> None:
            if env is not None:
                env.close()

        return HistoricalReader(base, overlay, end, closed)


def locate_point(
    journal: Journal, point: BookmarkSpec
) -> tuple[int, int | None, tuple[int, int] | None]:
    """Where a historical query's `point` is in `journal`: (the position the state ends at, the
    point's time in µs when known, its bookmark when it is one). A bookmark includes its
    message; a timestamp, every message recorded at or before it. Raises InvalidBookmark for a
    point the journal cannot answer."""
    if isinstance(point, Epoch):
        return journal.start_position, None, None
    if isinstance(point, Bookmark):
        pos = journal.locate(point.publisher_id, point.seq)
        if pos is None:
            raise InvalidBookmark(
                f"bookmark {point} is not in the journal (or no longer): a historical "
                "query needs a message the journal holds"
            )
        recs, _ = journal.read_raw(pos, 4096)
        ts = recs[0][4] if recs else None
        return journal.after(pos), ts, (point.publisher_id, point.seq)
    if isinstance(point, Timestamp):
        return journal.locate_time(point.micros), point.micros, None
    raise InvalidBookmark(
        "a historical query takes one bookmark or one timestamp, not a list or a range"
    )
