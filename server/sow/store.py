"""The SOW store: LMDB, the only SOW module that imports lmdb.

The store is derived data: everything in it is a fold of the journal, so it is written without
fsync (`sync=False`); what a crash loses, catch-up reads again from the journal. It lives in
`<JournalDirectory>/sow/`.

Databases (topic and key as UTF-8; integers big-endian):

- `rec`:  topic | 0x00 | key  ->  value (below): the latest message of each record
- `meta`: b"position" -> u64: the journal position the store reflects (every record before it
          is applied, none after it); b"format" -> b"1"; b"count" | 0x00 | topic -> u64: the
          records of the topic, written with the position; b"counts" -> b"1" when every
          topic's count is there (a store written before counts were kept has none: counted
          by a scan at open, then kept); b"expiring" -> b"1" once a record
          with its own `e` was written (a start then looks for them: server/sow/manager.py)

Record value:

```
offset size  field
0      8     u64 journal position of the message
8      8     u64 publisher id
16     8     u64 publisher sequence
24     8     u64 receive time, µs since the Unix epoch
32     2     u16 header fragment length H (journal/record.py: wire-ready members, `k` last)
34     H     header fragment
34+H   ...   body
```

`store_rows` turns committed batch rows (server/pipeline.py's Batch.msgs) into record keys and
values in one call: in C in server/_publish.c (built with the publish scanner, whose rows these
are), `store_rows_py` the reference and the fallback.

`apply` writes one batch of changes and the new position in one write transaction, so the
position on disk always describes the records on disk. Reads open their own read transaction
(`reader`): a snapshot that later writes never change, and that never blocks them.

**Resident pages** (`trim`): LMDB reads through a shared read-only map of its data file, so
every page a put or a query touched stays in the process's resident set (file pages of the page
cache, reclaimable, but counted in its RSS), and the RSS of a store of 10M records would be the
store's size. `trim` drops the map's pages from the resident set (madvise MADV_DONTNEED on the
mapping found in /proc/self/maps: for a shared file mapping the data stay in the page cache and
the next access maps them again, a minor fault); the writes and the close of a read snapshot (a query's end)
call it at most every TRIM_SECONDS once the data file is past TRIM_ABOVE, so the RSS stays near what one flush or query touches.
Linux only; elsewhere it does nothing.

At open, a data file LMDB cannot read, a failed full read, or an unknown format moves the store
aside as `sow.unreadable-<time>` and starts an empty one (`rebuilt` says why): the manager then
folds the whole journal again and logs it.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import lmdb

from journal.accelerators import load

__all__ = [
    "DEFAULT_MAP_SIZE",
    "Reader",
    "SowStore",
    "StoreFull",
    "Stored",
    "store_rows",
    "store_rows_py",
]

DEFAULT_MAP_SIZE = 64 * 1024**3  # address space only; the file grows as needed
FORMAT = b"1"
HEAD = _HEAD = struct.Struct(">QQQQH")  # a record value's fixed part (below the header fragment)
_Q = struct.Struct(">Q")
TRIM_ABOVE = 32 * 1024**2  # data file bytes past which `trim` is worth its refaults
TRIM_SECONDS = 2.0
_MADV_DONTNEED = 4
COUNTS_KEPT = b"counts"  # b"1": meta holds every topic's record count (count\0<topic>)
_COUNT = b"count\x00"

Stored = tuple[int, int, int, int, bytes, bytes]
"""(position, publisher id, seq, receive time µs, header fragment, body) of a record."""


class StoreFull(RuntimeError):
    def __init__(self, map_size: int) -> None:
        super().__init__(
            f"the SOW store reached its map size of {map_size} bytes; the store cannot grow: "
            "delete records or move <JournalDirectory> to a larger disk"
        )


def encode_value(position: int, pub: int, seq: int, ts: int, hdr: bytes, body: bytes) -> bytes:
    return _HEAD.pack(position, pub, seq, ts, len(hdr)) + hdr + body


def decode_value(v: bytes | memoryview) -> Stored:
    position, pub, seq, ts, h = _HEAD.unpack_from(v, 0)
    at = _HEAD.size
    return position, pub, seq, ts, bytes(v[at : at + h]), bytes(v[at + h :])


def record_key(topic: str, k: str) -> bytes:
    return topic.encode("utf-8") + b"\x00" + k.encode("utf-8")


_K_OPEN = b',"k":"'


def store_rows_py(
    msgs: list[tuple[Any, ...]], base: int, targets: dict[str, tuple[bytes, dict[bytes, bytes]]]
) -> int:
    """Put the rows of batch rows `msgs` (topic, pub, seq, ts, body, offset, header fragment,
    expiration; their data at journal position `base`) into their topic's dict:
    targets[topic] = (record_key(topic, ""), {record key: value}), the latest of a key
    winning; rows of other topics are skipped. Returns how many were put, or -1 at the first
    whose fragment is not exactly `,"k":"<key>"` with a key of plain text, or that has its
    own expiration (the rows before it are in)."""
    done = 0
    for m in msgs:
        t = targets.get(m[0])
        if t is None:
            continue
        hdr = m[6]
        k = hdr[6:-1]
        if (
            (len(m) > 7 and m[7] is not None)
            or len(hdr) < 8
            or len(hdr) > 0xFFFF
            or not hdr.startswith(_K_OPEN)
            or hdr[-1:] != b'"'
            or b"\\" in k
            or b'"' in k
        ):
            return -1
        body = m[4]
        t[1][t[0] + k] = _HEAD.pack(base + m[5], m[1], m[2], m[3], len(hdr)) + hdr + body
        done += 1
    return done


def _libc_madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        f = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    f.restype = ctypes.c_int
    return f


_madvise = _libc_madvise()

_c = load("server._publish")  # the publish scanner's module (None: no compiler at install)
store_rows = _c.store_rows if _c is not None else store_rows_py


def _records(cur: lmdb.Cursor, topic: str, after: str | None) -> Iterator[tuple[str, Stored]]:
    """The records of `topic` under `cur` in key order, from the first key after `after`."""
    prefix = topic.encode("utf-8") + b"\x00"
    start = prefix + (after.encode("utf-8") + b"\x00" if after is not None else b"")
    if not cur.set_range(start):
        return
    n = len(prefix)
    for key, value in cur:
        if not bytes(key).startswith(prefix):
            return
        yield bytes(key[n:]).decode("utf-8"), decode_value(value)


class Reader:
    """One read snapshot of the store; close it when done (it pins LMDB pages)."""

    def __init__(
        self,
        txn: lmdb.Transaction,
        db: lmdb._Database,
        position: int,
        on_close: Callable[[], object] | None = None,
    ) -> None:
        self._txn = txn
        self._db = db
        self.position = position
        self._on_close = on_close  # the store's `trim`: a query's pages leave the resident set

    def get(self, topic: str, k: str) -> Stored | None:
        v = self._txn.get(record_key(topic, k), db=self._db)
        return None if v is None else decode_value(v)

    def count(self) -> int:
        """The records of every topic in this snapshot (LMDB keeps the count: no scan)."""
        return int(self._txn.stat(self._db)["entries"])

    def keys(self, topic: str, after: str | None = None) -> Iterator[tuple[str, Stored]]:
        """The records of `topic` in key order, from the first key after `after`."""
        return _records(self._txn.cursor(db=self._db), topic, after)

    def chunks(self, topic: str, size: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """The records of `topic` in key order, as lists of at most `size` (record key, value)
        pairs read in C (server/sow/answer.py makes their frames); keys are whole record keys
        (`record_key`)."""
        prefix = topic.encode("utf-8") + b"\x00"
        cur = self._txn.cursor(db=self._db)
        if not cur.set_range(prefix):
            return
        # buffers=False (`reader`): the pairs are bytes
        it: Iterator[tuple[bytes, bytes]] = cur.iternext(keys=True, values=True)  # type: ignore[assignment]
        while True:
            items = list(islice(it, size))
            if not items:
                return
            if not items[-1][0].startswith(prefix):  # the topic ends in this chunk
                n = 0
                while n < len(items) and items[n][0].startswith(prefix):
                    n += 1
                if n:
                    yield items[:n]
                return
            yield items

    def cursor(self, topic: str) -> ChunkCursor:
        """The records of `topic` read forward in chunks, with or without their values."""
        return ChunkCursor(self._txn, self._db, topic.encode("utf-8") + b"\x00")

    def close(self) -> None:
        if self._txn is not None:
            try:
                self._txn.abort()
            except lmdb.Error:  # the store closed first (shutdown): nothing left to release
                self._on_close = None
            self._txn = None  # type: ignore[assignment]
            if self._on_close is not None:
                self._on_close()


class ChunkCursor:
    """A topic's records in key order, read in chunks each with its values or as its record keys
    only (`next`); `values(keys)` reads the pairs of listed keys. A historical answer reads
    only the keys of the chunks whose records the fold mostly replaced (server/sow/history.py):
    the checkpoint's values of those are never copied out of LMDB."""

    def __init__(self, txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes) -> None:
        self._cur = txn.cursor(db=db)
        self.values = txn.cursor(db=db).getmulti  # a cursor of its own: `_cur` keeps its place
        self._prefix = prefix
        self._at: bytes | None = prefix  # where the next chunk starts (None: the topic's end)
        self._after = False  # `_at` is the last key read: the next chunk starts past it

    def next(self, size: int, values: bool = True) -> list[Any]:
        """At most `size` of the next records: (record key, value) pairs, or record keys."""
        at, cur = self._at, self._cur
        if at is None or not cur.set_range(at):
            self._at = None
            return []
        it: Iterator[Any] = (
            cur.iternext(keys=True, values=True) if values else cur.iternext(values=False)
        )
        if self._after and cur.key() == at:
            next(it)
        items = list(islice(it, size))
        prefix = self._prefix
        last = items[-1] if items else None
        if last is None or not (last if not values else last[0]).startswith(prefix):
            self._at = None  # the topic ends in this chunk
            n = 0
            while n < len(items) and (items[n] if not values else items[n][0]).startswith(prefix):
                n += 1
            return items[:n]
        self._at, self._after = (last if not values else last[0]), True
        return items


class SowStore:
    _span: tuple[int, int] | None
    _trimmed: float

    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.map_size = map_size
        self.rebuilt: str | None = None
        # why a write of updates failed, once one did: the position stays where it was, so the
        # next start folds the journal again from before the lost updates (never past them)
        self.failed: str | None = None
        self._counts: dict[str, int] | None = None  # per topic, from the check at open
        try:
            self._open()
            problem = self._check()
        except lmdb.Error as exc:
            problem = f"LMDB cannot read it: {exc}"
        if problem is not None:
            self._counts = None
            try:
                self.env.close()
            except Exception:
                pass
            aside = (
                f"{path}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}"
            )
            os.rename(path, aside)
            os.makedirs(path)
            self.rebuilt = f"{problem}; moved to {aside}"
            self._open()
            with self.env.begin(write=True) as txn:
                txn.put(b"format", FORMAT, db=self._meta)

    def tree_bytes(self) -> int:
        """The bytes of the record tree's pages in use (about a compact copy's size)."""
        try:
            with self.env.begin() as txn:
                st = txn.stat(self._rec)
        except lmdb.Error:  # closed (shutdown)
            return 0
        return int((st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"])

    def trim(self, force: bool = False) -> bool:
        """Drop the map's pages from the resident set (module docstring): at most every
        TRIM_SECONDS and only past TRIM_ABOVE bytes of data, unless `force`. True when done."""
        now = time.monotonic()
        if not force and now - self._trimmed < TRIM_SECONDS:
            return False
        self._trimmed = now
        try:
            used = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        except lmdb.Error:  # closed (shutdown)
            return False
        if (not force and used < TRIM_ABOVE) or _madvise is None:
            return False
        span = self._map_span()
        if span is None:
            return False
        start, size = span
        return (
            _madvise(ctypes.c_void_p(start), ctypes.c_size_t(min(size, used)), _MADV_DONTNEED) == 0
        )

    def _map_span(self) -> tuple[int, int] | None:
        """(address, length) of LMDB's map of the data file in this process, or None."""
        if self._span is None:
            target = os.path.realpath(os.path.join(self.path, "data.mdb"))
            try:
                with open("/proc/self/maps") as f:
                    for line in f:
                        parts = line.split(maxsplit=5)
                        if len(parts) == 6 and parts[5].rstrip("\n") == target:
                            lo, hi = (int(x, 16) for x in parts[0].split("-"))
                            if self._span is None or hi - lo > self._span[1]:
                                self._span = (lo, hi - lo)
            except OSError:
                return None
        return self._span

    def _open(self) -> None:
        self._span = None  # the map's address range (trim)
        self._trimmed = 0.0
        self.env = lmdb.open(
            self.path,
            map_size=self.map_size,
            max_dbs=4,
            sync=False,
            metasync=False,
            writemap=False,  # as journal/index.py: a full disk is an error, not SIGBUS
            max_readers=512,
        )
        self._rec = self.env.open_db(b"rec")
        self._meta = self.env.open_db(b"meta")

    def _check(self) -> str | None:
        """Read every page once (LMDB's compacting copy to /dev/null walks the whole tree in
        C), so damage surfaces now and not in a query; take the record counts per topic
        (`topics`) from `meta`, or count them when this store does not keep them."""
        with open(os.devnull, "wb") as sink:
            self.env.copyfd(sink.fileno(), compact=True)
        with self.env.begin() as txn:
            fmt = txn.get(b"format", db=self._meta)
            count = txn.stat(self._rec)["entries"]
            if txn.get(COUNTS_KEPT, db=self._meta) == b"1":
                counts = {}
                cur = txn.cursor(db=self._meta)
                if cur.set_range(_COUNT):
                    for key, value in cur:
                        if not key.startswith(_COUNT):
                            break
                        if _Q.unpack(value)[0]:
                            counts[key[len(_COUNT) :].decode("utf-8")] = _Q.unpack(value)[0]
                self._counts = counts
        if fmt is None:
            if count:
                return "the store has records but no format mark"
            with self.env.begin(write=True) as txn:
                txn.put(b"format", FORMAT, db=self._meta)
            return None
        if bytes(fmt) != FORMAT:
            return f"unknown store format {bytes(fmt)!r} (this version writes {FORMAT!r})"
        return None

    @property
    def counts_kept(self) -> bool:
        """Whether `meta` holds the record counts (a store of an older version does not)."""
        with self.env.begin() as txn:
            return txn.get(COUNTS_KEPT, db=self._meta) == b"1"

    @property
    def position(self) -> int | None:
        """The journal position the store reflects; None for a store never written."""
        with self.env.begin() as txn:
            v = txn.get(b"position", db=self._meta)
        return None if v is None else _Q.unpack(v)[0]

    def reader(self, position: int) -> Reader:
        return Reader(self.env.begin(buffers=False), self._rec, position, self.trim)

    def write(self) -> lmdb.Transaction:
        """A write transaction for `put` / `delete` / `set_position` (use it in `with`)."""
        return self.env.begin(write=True)

    def put(self, txn: lmdb.Transaction, topic: str, k: str, value: bytes) -> bool:
        """Store a record; True when it replaced one."""
        try:
            old = txn.replace(record_key(topic, k), value, db=self._rec)
        except lmdb.MapFullError:
            raise StoreFull(self.map_size) from None
        return old is not None

    def put_many(self, txn: lmdb.Transaction, rows: Iterable[tuple[bytes, bytes]]) -> int:
        """Store (record key, value) rows; how many were new records (the
        growth of the entry count: putmulti's own count includes the rows it replaced)."""
        before = txn.stat(self._rec)["entries"]
        try:
            txn.cursor(db=self._rec).putmulti(rows)
        except lmdb.MapFullError:
            raise StoreFull(self.map_size) from None
        return int(txn.stat(self._rec)["entries"] - before)

    def replace(self, txn: lmdb.Transaction, topic: str, k: str, value: bytes) -> bytes | None:
        """Store a record; the value it replaced, or None."""
        try:
            old = txn.replace(record_key(topic, k), value, db=self._rec)
        except lmdb.MapFullError:
            raise StoreFull(self.map_size) from None
        return None if old is None else bytes(old)

    def pop(self, txn: lmdb.Transaction, topic: str, k: str) -> bytes | None:
        """Delete a record; its value, or None when there was none."""
        old = txn.pop(record_key(topic, k), db=self._rec)
        return None if old is None else bytes(old)

    def delete(self, txn: lmdb.Transaction, topic: str, k: str) -> bool:
        return bool(txn.delete(record_key(topic, k), db=self._rec))

    def topic_records(self, txn: lmdb.Transaction, topic: str) -> Iterator[tuple[str, Stored]]:
        return _records(txn.cursor(db=self._rec), topic, None)

    def topics(self) -> dict[str, int]:
        """Record counts per topic (at open: from `meta` when kept there, else a full scan)."""
        if self._counts is not None:
            counts, self._counts = self._counts, None
            return counts
        counts = {}
        with self.env.begin() as txn:
            for key in txn.cursor(db=self._rec).iternext(keys=True, values=False):
                t = bytes(key).split(b"\x00", 1)[0].decode("utf-8")
                counts[t] = counts.get(t, 0) + 1
        return counts

    def set_position(
        self, txn: lmdb.Transaction, position: int, counts: dict[str, int] | None = None
    ) -> None:
        """Write the position the store reflects, and the record counts of the topics in
        `counts` (those that changed: the store then keeps every topic's count). Nothing once
        a write has failed (`failed`): the store no longer reflects the journal up to here."""
        if self.failed is not None:
            return
        try:
            txn.put(b"position", _Q.pack(position), db=self._meta)
            if counts is not None:
                for topic, n in counts.items():
                    txn.put(_COUNT + topic.encode("utf-8"), _Q.pack(max(n, 0)), db=self._meta)
                txn.put(COUNTS_KEPT, b"1", db=self._meta)
        except lmdb.MapFullError:
            raise StoreFull(self.map_size) from None

    def note_expiring(self, txn: lmdb.Transaction) -> None:
        """A record with its own `e` is written in `txn` (see `expiring`)."""
        txn.put(b"expiring", b"1", db=self._meta)

    @property
    def expiring(self) -> bool:
        """Whether a record with its own `e` was ever written here (since the last clear)."""
        with self.env.begin() as txn:
            return txn.get(b"expiring", db=self._meta) is not None

    def clear(self) -> None:
        """Drop every record and the position (a rebuild from the journal's start)."""
        self._counts = None
        with self.env.begin(write=True) as txn:
            txn.drop(self._rec, delete=False)
            txn.delete(b"position", db=self._meta)
            txn.delete(b"expiring", db=self._meta)
            cur = txn.cursor(db=self._meta)
            if cur.set_range(_COUNT):
                while cur.key().startswith(_COUNT):
                    if not cur.delete():
                        break
            txn.put(COUNTS_KEPT, b"1", db=self._meta)  # zero records, all counted

    def close(self) -> None:
        self.env.close()
