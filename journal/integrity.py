"""What the journal found damaged at rest, for the log, /stats and /metrics (docs/integrity.md).

Readers report each damaged region they skip (file, offset, bytes, reason); one region is
counted and logged once however many readers meet it (a replay per subscriber reads it again).
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("tickertape.journal")

MAX_REMEMBERED = 10_000  # regions remembered so they are counted once; past it, counted again


class Integrity:
    def __init__(self) -> None:
        self.damaged_regions = 0
        self.damaged_bytes = 0
        self.truncated_bytes = 0
        self.last_damage: dict | None = None
        self.index_rebuilds = 0
        self._seen: set[tuple[str, int]] = set()
        self._lock = threading.Lock()

    def damaged(self, path: str, offset: int, size: int, reason: str) -> None:
        """A damaged region of `size` bytes at file offset `offset` was skipped by a reader."""
        with self._lock:
            key = (path, offset)
            if key in self._seen:
                return
            if len(self._seen) >= MAX_REMEMBERED:
                self._seen.clear()
            self._seen.add(key)
            self.damaged_regions += 1
            self.damaged_bytes += size
            self.last_damage = {
                "file": path,
                "offset": offset,
                "bytes": size,
                "reason": reason,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        log.warning(
            "journal: damaged data in %s at offset %d (%s): %d bytes skipped, not served; the "
            "records after it are served. Restore the file from the archive to recover what was there",
            path,
            offset,
            reason,
            size,
        )

    def snapshot(self) -> dict:
        return {
            "damaged_regions": self.damaged_regions,
            "damaged_bytes": self.damaged_bytes,
            "truncated_bytes": self.truncated_bytes,
            "index_rebuilds": self.index_rebuilds,
            "last_damage": self.last_damage,
        }
