"""The SOW store's checkpoints: the copies historical queries start from (server/sow/history.py).

The store is copied now and then into a **checkpoint** (`<JournalDirectory>/sow-checkpoints/
<position>/`, an LMDB copy made from one read snapshot in a thread, so its own `position` says
exactly what it holds and the live store is not blocked): one when the journal has grown
`CHECKPOINT_EVERY` bytes since the last, and at least the size of the store's record tree (so a
copy never writes more than the journal grew, and the fold after a checkpoint stays in
proportion to a full answer). A historical query opens the newest checkpoint at or before its
point and folds the journal after it: the longest fold is the longest stretch of journal
without a checkpoint.

Which are kept (`keep`, after each copy):

- those older than the longest `<History><Window>` of the SOW topics, or before the journal's
  start (its segments removed: the journal right after them is gone), are removed;
- with `<SOW><MaxCheckpointSize>`, while the kept ones take more than it on disk, the one whose
  removal leaves the shortest stretch of journal without a checkpoint (from the one before it,
  or the journal's start, to the one after it) goes, the older on a tie. So they thin out
  evenly over what the window holds, and the longest fold grows with the journal over the
  number of copies that fit, rather than some points folding from the journal's start
  (keeping the newest few made a point 5M updates back in a 10M-update journal take 20x a
  current query);
- without it every other one stays: about the journal's own size on disk (a copy, about the
  record tree's size, per that much journal);
- the newest always stays, whatever its size (a copy is made in a temporary directory first:
  while it is made, the disk holds one more).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmdb

from journal.journal import Journal

from .history import HistoricalReader, fold_state
from .keys import KeyMaker
from .store import Reader

__all__ = ["CHECKPOINT_EVERY", "Checkpoints", "over_limit"]

log = logging.getLogger("tickertape.sow")

# journal bytes between two checkpoints (the environment variable is for tests)
CHECKPOINT_EVERY = int(os.environ.get("TICKERTAPE_SOW_CHECKPOINT_BYTES", 32 * 1024 * 1024))


def over_limit(kept: list[tuple[int, int]], start: int, limit: int) -> list[int]:
    """The positions to remove so that the checkpoints `kept` ((position, bytes), position
    order) take at most `limit` bytes: each time the one whose removal leaves the shortest
    stretch without a checkpoint (from the one before it, or `start`, to the one after it),
    the older on a tie; never the newest."""
    kept = list(kept)
    total = sum(size for _p, size in kept)
    gone: list[int] = []
    while total > limit and len(kept) > 1:
        best = min(
            range(len(kept) - 1),
            key=lambda i: (kept[i + 1][0] - (kept[i - 1][0] if i else start), kept[i][0]),
        )
        pos, size = kept.pop(best)
        total -= size
        gone.append(pos)
    return gone


def _disk_bytes(path: str) -> int:
    total = 0
    for name in os.listdir(path):
        try:
            total += os.stat(os.path.join(path, name)).st_blocks * 512
        except OSError:  # removed meanwhile
            pass
    return total


@dataclass(eq=False, repr=False)
class Checkpoints:
    """The store's checkpoints: made from the live store, read by historical queries."""

    directory: str
    _store_env: Callable[[], lmdb.Environment | None]
    _after_copy: Callable[[], object] | None = None  # the store's trim (the copy read every page)
    _store_bytes: Callable[[], int] | None = None  # the size of the store's record tree
    # the journal's first position (segments removed)
    _journal_start: Callable[[], int] | None = None
    limit: int | None = None  # <SOW><MaxCheckpointSize>: bytes on disk (None: no bound)

    def __post_init__(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self.last = max(self.positions(), default=-1)
        self._busy = False

    def positions(self) -> list[int]:
        return sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())

    def maybe_make(self, position: int, window: float | None) -> None:
        """Copy the store (in a thread) when the journal grew CHECKPOINT_EVERY since the last,
        and at least the store's own size (`store_bytes`: a copy never writes more than the
        journal grew, and the fold after a checkpoint stays in proportion to the answer)."""
        grown = position - max(self.last, 0)
        if self._busy or grown < CHECKPOINT_EVERY:
            return
        env = self._store_env()
        if env is None or (self._store_bytes is not None and grown < self._store_bytes()):
            return
        self._busy = True
        self.last = position
        threading.Thread(target=self._make, args=(env, window), daemon=True).start()

    def _make(self, env: lmdb.Environment, window: float | None) -> None:
        tmp = os.path.join(self.directory, f"tmp-{os.getpid()}-{time.time_ns()}")
        try:
            os.makedirs(tmp)
            env.copy(tmp, compact=True)
            if self._after_copy is not None:
                self._after_copy()  # the copy read every page of the map
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
            self.keep(window)
        except Exception:
            log.exception("SOW checkpoint failed (historical queries read more journal)")
            shutil.rmtree(tmp, ignore_errors=True)
        finally:
            self._busy = False

    def keep(self, window: float | None) -> None:
        """Remove the checkpoints no point can use, then those past the limit on disk
        (module docstring); the newest stays."""
        start = self._journal_start() if self._journal_start is not None else None
        now = time.time()
        positions = self.positions()
        for p in positions[:-1]:
            path = self._path(p)
            try:
                old = window is not None and now - os.path.getmtime(path) > window + 60
            except OSError:  # removed meanwhile
                continue
            if old or (start is not None and p < start):
                shutil.rmtree(path, ignore_errors=True)
        if self.limit is None:
            return
        kept = [(p, _disk_bytes(self._path(p))) for p in self.positions()]
        for p in over_limit(kept, start or 0, self.limit):
            shutil.rmtree(self._path(p), ignore_errors=True)

    def disk_bytes(self) -> int:
        """What the kept checkpoints take on disk."""
        return sum(_disk_bytes(self._path(p)) for p in self.positions())

    def _open(self, position: int) -> lmdb.Environment | None:
        """The checkpoint at `position` opened for reading; None when it is gone, or damaged
        (then removed, with a warning): LMDB cannot open it, or its data file is shorter than
        the pages its meta page says it holds (a copy torn by a crash before it reached the
        disk: reading past the file's end through LMDB's map would kill the server with
        SIGBUS)."""
        path = self._path(position)
        try:
            size = os.path.getsize(os.path.join(path, "data.mdb"))
            env = lmdb.open(path, readonly=True, max_dbs=4, lock=False)
        except (OSError, lmdb.Error) as exc:
            if not os.path.isdir(path):
                return None  # removed since it was listed (`keep`)
            why = str(exc)
        else:
            whole = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            if whole <= size:
                return env
            env.close()
            why = f"its data file has {size:,} bytes of the {whole:,} its pages take"
        log.warning(
            "SOW checkpoint %s is damaged (%s): removed; historical queries start from the "
            "checkpoint before it",
            path,
            why,
        )
        shutil.rmtree(path, ignore_errors=True)
        return None

    def _path(self, position: int) -> str:
        return os.path.join(self.directory, f"{position:020d}")

    def reader(
        self,
        journal: Journal,
        end: int,
        is_sow: Callable[[str], Any],
        maker: Callable[[str], KeyMaker | None],
    ) -> HistoricalReader:
        """The state as of journal position `end` (every record before it): the newest
        checkpoint at or before it, and the journal folded from there (runs off the loop)."""
        start = journal.start_position
        env, base = None, None
        for base_pos in sorted((p for p in self.positions() if start <= p <= end), reverse=True):
            env = self._open(base_pos)
            if env is None:  # removed since it was listed (`keep`), or damaged: the one before
                continue
            rec_db = env.open_db(b"rec")  # before the read transaction, which must know it
            base = Reader(env.begin(buffers=False), rec_db, base_pos)
            start = base_pos
            break

        def closed() -> None:
            if env is not None:
                env.close()

        return fold_state(journal, base, start, end, is_sow, maker, closed)
