"""The SOW topics as the admin endpoint and its console show them (docs/console.md "SOW").

`SowConsole.topics()`: per SOW topic holding records, its records, its key paths, updates since
start and per second (over the last sample), and the store's size. `sample(elapsed)` is called
once a second by Stats.

`SowConsole.query(...)`: a query from the console (`GET /sow/<topic>?filter=&order_by=&top_n=`),
answered as one JSON document: at most `MAX_ROWS` records, each with its key, bookmark and
body. It runs on a reader thread with its own read snapshot of the store (a scan of a large
topic never holds the event loop), with the same filter and order as a `sow` command
(server/sow/query.py) and the filter the session would apply (the admin user's own filter AND
its content entitlement, decided by the endpoint: server/admin.py).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from functools import partial
from typing import Any

import msgspec

from ..matching import Predicate, body_matches, filter_at
from .manager import SowManager
from .query import OrderItem, _rank_at
from .store import SowStore

__all__ = ["MAX_ROWS", "SowConsole"]

MAX_ROWS = 1000  # records one console query returns at most
_decode = msgspec.json.Decoder().decode


class SowConsole:
    def __init__(self, sow: SowManager, readers: Executor) -> None:
        self.sow = sow
        self.readers = readers
        self._last: dict[str, int] = {}
        self.rates: dict[str, float] = {}

    def sample(self, elapsed: float) -> None:
        """Once a second: the update rate of each topic over the last `elapsed` seconds."""
        if elapsed <= 0:
            return
        now = dict(self.sow.updates)
        self.rates = {t: round((n - self._last.get(t, n)) / elapsed, 1) for t, n in now.items()}
        self._last = now

    def store_bytes(self) -> int | None:
        """Bytes of the store in use (LMDB pages up to the last one written)."""
        store = self.sow.store
        if store is None:
            return None
        return (store.env.info()["last_pgno"] + 1) * store.env.stat()["psize"]

    def topics(self) -> dict[str, Any]:
        sow = self.sow
        out = {}
        for topic in sorted(set(sow.counts) | set(sow.updates)):
            spec = sow.spec(topic)
            out[topic] = {
                "records": sow.counts.get(topic, 0),
                "keys": list(spec.keys) if spec is not None and spec.keys else ["k"],
                "expiration_s": spec.expiration if spec is not None else None,
                "updates": sow.updates.get(topic, 0),
                "updates_per_s": self.rates.get(topic, 0.0),
            }
        failed = sow.store.failed if sow.store is not None else None
        return {"store_bytes": self.store_bytes(), "failed": failed, "topics": out}

    async def query(
        self, topic: str, filt: Predicate | None, order: list[OrderItem] | None, top_n: int
    ) -> dict[str, Any]:
        store = self.sow.store
        assert store is not None
        filt = filter_at(filt, topic)
        # committed puts still held for the next store write (server/sow/held.py) go in now,
        # on the loop: the snapshot the reader thread opens then holds every committed record
        self.sow.flush()
        loop = asyncio.get_running_loop()
        scan = partial(_scan, store, topic, filt, order, max(0, min(top_n, MAX_ROWS)))
        return await loop.run_in_executor(self.readers, scan)


def _scan(
    store: SowStore, topic: str, filt: Predicate | None, order: list[OrderItem] | None, top: int
) -> dict[str, Any]:
    """The console's answer, from a read snapshot opened here (on the reader thread)."""
    reader = store.reader(0)
    try:
        matches = 0
        picked: list[tuple[Any, str]] = []
        for k, rec in reader.keys(topic):
            if filt is not None and not body_matches(filt, rec[5]):
                continue
            matches += 1
            if order is None:
                if len(picked) < top:
                    picked.append((None, k))
                continue
            try:
                doc = _decode(rec[5])
            except (ValueError, RecursionError):
                doc = None
            picked.append(([get(doc) for _p, get, _d in order], k))
        if order is not None:
            for j in range(len(order) - 1, -1, -1):
                picked.sort(key=partial(_rank_at, j), reverse=order[j][2])
            picked = picked[:top]
        records = []
        for _vals, k in picked:
            got = reader.get(topic, k)
            if got is None:  # pragma: no cover - one snapshot: it cannot go
                continue
            _pos, pub, seq, ts, _hdr, body = got
            try:
                shown: Any = _decode(body)
            except (ValueError, RecursionError):
                shown = body.decode("utf-8", "replace")
            records.append({"k": k, "bm": f"{pub}|{seq}|", "time_us": ts, "body": shown})
        return {"topic": topic, "matches": matches, "returned": len(records), "records": records}
    finally:
        reader.close()
