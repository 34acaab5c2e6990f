"""The journal's LMDB index: the only module that imports lmdb.

The index is derived data: everything in it can be rebuilt from the segment files, so it is
written without fsync (`sync=False`) and checked against the journal at open. The journal is the
source of truth; the index only makes lookups fast.

Databases (all keys big-endian so LMDB's byte order is numeric order):

- `bm`:   publisher_id u64 | seq u64           -> position u64     (sparse: a publisher's first
          message after each start, then whenever 64 of its messages or 64 KiB of journal have
          passed since its last entry; a lookup takes the floor entry and scans at most that far)
- `time`: timestamp_us u64                     -> position u64     (sparse: every 256th record
          and the first record of each second; a lookup scans forward at most that far)
- `pub`:  publisher_id u64                     -> seq u64 | position u64 (highest per publisher)
- `meta`: b"indexed_upto"                      -> position u64 (everything before it is indexed)
          b"user:" + key                        -> value (`add`'s meta: the server's small state)
          b"user:owner:" + publisher_id u64     -> user name, UTF-8: the user a client name is
          bound to (`owners`; written with that publisher's first record under
          authentication, and kept through `reset`: it cannot be derived from the segments)

Writes happen on the journal writer thread only, one transaction per group commit.
Reads may come from any thread (each opens its own read transaction).
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Iterable

import lmdb

_Q = struct.Struct(">Q")
_QQ = struct.Struct(">QQ")
_pack_q = _Q.pack
_pack_qq = _QQ.pack
_unpack_q = _Q.unpack
_unpack_qq = _QQ.unpack

OWNER_KEY = b"owner:"  # + publisher id u64 BE, in `add`'s meta: a client name's user
OWNER_PREFIX = b"user:" + OWNER_KEY
TIME_STRIDE = 256
BM_STRIDE = 64
BM_SPAN = 64 * 1024
DEFAULT_MAP_SIZE = 64 * 1024**3  # address space only; the file grows as needed

IndexEntry = tuple[int, int, int, int]
"""(publisher_id, seq, timestamp_us, position) of one message record."""


class IndexFull(RuntimeError):
    def __init__(self, map_size: int):
        super().__init__(
            f"journal index reached its map size of {map_size} bytes; raise the index map size "
            "(TransactionLog <IndexMapSize>) or archive old journal files"
        )


def data_file_problem(path: str) -> str | None:
    """Why `path`/data.mdb cannot be opened safely, or None. Checked before LMDB maps the file:
    a file shorter than its own meta page says would be a SIGBUS on first read, and garbage in
    the meta pages an lmdb.Error. The layout read here is LMDB's meta page (lmdb.h: MDB_meta
    after a 16-byte page header: magic, version, address, map size, two MDB_db of 48 bytes,
    last page number, transaction id); the page size is the free DB's md_pad."""
    f = os.path.join(path, "data.mdb")
    try:
        size = os.path.getsize(f)
    except FileNotFoundError:
        return None  # a new index
    if size == 0:
        return None
    if size < 2 * 4096:
        return f"data.mdb is {size} bytes, shorter than its two meta pages"
    with open(f, "rb") as fh:
        head = fh.read(2 * 65536)
    best = None
    psize = struct.unpack_from("<I", head, 16 + 24)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1):
        return f"data.mdb has an impossible page size {psize}"
    for page in (0, 1):
        off = page * psize + 16
        if off + 152 > len(head):
            return "data.mdb is truncated inside its meta pages"
        magic, version = struct.unpack_from("<II", head, off)
        if magic != 0xBEEFC0DE or version != 1:
            return f"meta page {page} of data.mdb has no LMDB signature"
        last_pg, txnid = struct.unpack_from("<QQ", head, off + 120)
        if best is None or txnid > best[1]:
            best = (last_pg, txnid)
    assert best is not None  # both meta pages were read
    need = (best[0] + 1) * psize
    if size < need:
        return f"data.mdb is {size} bytes but its meta page says {need}: the file was truncated"
    return None


class JournalIndex:
    def __init__(self, path: str, map_size: int = DEFAULT_MAP_SIZE):
        """Opens the index at path. A data file that LMDB cannot open safely (data_file_problem)
        or that fails a full read is moved aside as `<path>.unreadable-<time>` and a new, empty
        index is made (`rebuilt` is then the reason): the journal re-indexes the segments."""
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.map_size = map_size
        self.rebuilt: str | None = None
        problem = data_file_problem(path)
        if problem is None:
            try:
                self._open()
                self._check_readable()
                return
            except lmdb.Error as exc:
                with contextlib.suppress(Exception):
                    self.env.close()
                problem = f"LMDB cannot read it: {exc}"
        aside = f"{path}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}"
        os.rename(path, aside)
        os.makedirs(path)
        self.rebuilt = f"{problem}; moved to {aside}"
        self._open()

    def _check_readable(self) -> None:
        """Read every entry once, so damage inside the file surfaces now, not in a lookup."""
        for db in (self._meta, self._pub, self._bm, self._time):
            with self.env.begin(db=db) as txn:
                for _ in txn.cursor().iternext(keys=True, values=False):
                    pass

    def _open(self) -> None:
        self.env = lmdb.open(
            self.path,
            map_size=self.map_size,
            max_dbs=8,
            sync=False,
            metasync=False,
            # Not writemap=True, though it saves ~4 us of a commit's ~6 us index transaction
            # (measured: 1 entry, p50): with it LMDB grows data.mdb to map_size at once (a
            # 64 GiB sparse file by default) and stores through the mapping, so a full disk
            # becomes SIGBUS in the writer instead of an error the journal survives.
            writemap=False,
            max_readers=256,
        )
        self._bm = self.env.open_db(b"bm")
        self._time = self.env.open_db(b"time")
        self._pub = self.env.open_db(b"pub")
        self._meta = self.env.open_db(b"meta")
        self._since_time = TIME_STRIDE  # so the first record written gets a time entry
        self._bm_last: dict[int, tuple[int, int]] = {}  # pub -> (seq, position) of its last entry
        self._last_second = -1

    def close(self) -> None:
        self.env.close()

    # -- reads ---------------------------------------------------------------------------

    def indexed_upto(self) -> int:
        with self.env.begin(db=self._meta) as txn:
            v = txn.get(b"indexed_upto")
        return _unpack_q(v)[0] if v else 0

    def locate_floor(self, publisher_id: int, seq: int) -> tuple[int, int] | None:
        """(seq, position) of the publisher's last index entry at or before seq, or None."""
        with self.env.begin(db=self._bm) as txn:
            cur = txn.cursor()
            key = _pack_qq(publisher_id, seq)
            if cur.set_range(key):
                if cur.key() == key:
                    return seq, _unpack_q(cur.value())[0]
                if not cur.prev():
                    return None
            elif not cur.last():
                return None
            pub, found = _unpack_qq(cur.key())
            if pub != publisher_id:
                return None
            return found, _unpack_q(cur.value())[0]

    def time_floor(self, ts_us: int) -> int | None:
        """Position of the last indexed record with timestamp <= ts_us, or None."""
        with self.env.begin(db=self._time) as txn:
            cur = txn.cursor()
            if cur.set_range(_pack_q(ts_us + 1)):
                if not cur.prev():
                    return None
            elif not cur.last():
                return None
            return _unpack_q(cur.value())[0]

    def newest_time_below(self, position: int) -> int | None:
        """An upper bound of the receive time of the newest message below `position`, at most
        a second above it; None if no indexed message lies below `position`.

        The `time` db holds the first message of each second (and every TIME_STRIDE-th), so the
        last entry below `position` is in the same second as the newest message there or a later
        one: its time plus a second bounds that message's. Keys are times and positions never
        decrease with them, so the entry is found by bisecting the keys (about 64 lookups)."""
        with self.env.begin(db=self._time) as txn:
            cur = txn.cursor()
            if not cur.first() or _unpack_q(cur.value())[0] >= position:
                return None
            lo = _unpack_q(cur.key())[0]  # a key whose position is below `position`
            cur.last()
            if _unpack_q(cur.value())[0] < position:
                return _unpack_q(cur.key())[0] + 1_000_000
            hi = _unpack_q(cur.key())[0]  # every key >= hi is at or past `position`
            while hi - lo > 1:
                mid = (lo + hi) // 2
                cur.set_range(_pack_q(mid))  # the first key >= mid (hi's at the latest)
                key = _unpack_q(cur.key())[0]
                if key < hi and _unpack_q(cur.value())[0] < position:
                    lo = key
                else:
                    hi = mid
            return lo + 1_000_000

    def publishers(self) -> dict[int, tuple[int, int]]:
        """publisher_id -> (highest seq, position of that message)."""
        with self.env.begin(db=self._pub) as txn:
            return {_unpack_q(k)[0]: _unpack_qq(v) for k, v in txn.cursor()}

    def count(self) -> int:
        with self.env.begin(db=self._bm) as txn:
            return txn.stat(self._bm)["entries"]

    # -- writes (writer thread) ----------------------------------------------------------

    def get_meta(self, key: bytes) -> bytes | None:
        with self.env.begin(db=self._meta) as txn:
            return txn.get(b"user:" + key)

    def add(
        self, entries: Iterable[IndexEntry], upto: int, meta: dict[bytes, bytes] | None = None
    ) -> None:
        """Index one committed batch.

        entries: iterable of (publisher_id, seq, timestamp_us, position), in journal order.
        upto: the journal position just after the batch.
        meta: small values written in the same transaction (e.g. queue recovery checkpoints),
        readable with get_meta; like everything here they must be derivable or conservative.
        """
        bm_items = []
        time_items = []
        highest: dict[int, tuple[int, int]] = {}
        since = self._since_time
        last_second = self._last_second
        # the first timestamp of the next second (no division per record on this hot loop)
        next_second = (last_second + 1) * 1_000_000 if last_second >= 0 else 0
        bm_last = self._bm_last
        for pub, seq, ts, pos in entries:
            last = bm_last.get(pub)
            if last is None or seq - last[0] >= BM_STRIDE or pos - last[1] >= BM_SPAN:
                bm_items.append((_pack_qq(pub, seq), _pack_q(pos)))
                bm_last[pub] = (seq, pos)
            highest[pub] = (seq, pos)
            since += 1
            if since >= TIME_STRIDE or ts >= next_second or ts < next_second - 1_000_000:
                time_items.append((_pack_q(ts), _pack_q(pos)))
                since = 0
                last_second = ts // 1_000_000
                next_second = (last_second + 1) * 1_000_000
        try:
            with self.env.begin(write=True) as txn:
                if bm_items:
                    txn.cursor(self._bm).putmulti(bm_items)
                if time_items:
                    # a later record with an equal timestamp must not replace the earlier position
                    txn.cursor(self._time).putmulti(time_items, overwrite=False)
                if highest:
                    pubs = txn.cursor(self._pub)
                    for pub, (seq, pos) in highest.items():
                        pubs.put(_pack_q(pub), _pack_qq(seq, pos))
                txn.put(b"indexed_upto", _pack_q(upto), db=self._meta)
                if meta:
                    for k, v in meta.items():
                        txn.put(b"user:" + k, v, db=self._meta)
        except lmdb.MapFullError:
            raise IndexFull(self.map_size) from None
        self._since_time = since
        self._last_second = last_second

    def owners(self) -> dict[int, str]:
        """publisher id -> the user its client name is bound to (docs/security.md)."""
        out = {}
        with self.env.begin(db=self._meta) as txn:
            cur = txn.cursor()
            if cur.set_range(OWNER_PREFIX):
                for k, v in cur:
                    if not k.startswith(OWNER_PREFIX):
                        break
                    out[_unpack_q(k[len(OWNER_PREFIX) :])[0]] = v.decode("utf-8", "replace")
        return out

    def reset(self) -> None:
        """Drop everything (used when the index is found inconsistent with the journal) but
        the client name bindings, which the segments cannot give back."""
        with self.env.begin(write=True) as txn:
            kept = [(k, v) for k, v in txn.cursor(db=self._meta) if k.startswith(OWNER_PREFIX)]
            for db in (self._bm, self._time, self._pub, self._meta):
                txn.drop(db, delete=False)
            for k, v in kept:
                txn.put(k, v, db=self._meta)
        self._since_time = TIME_STRIDE
        self._last_second = -1
        self._bm_last.clear()

    def sync(self) -> None:
        self.env.sync(True)
