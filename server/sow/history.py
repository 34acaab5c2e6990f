"""Historical SOW queries (`sow` with `bm`): the state of the store as of a point of the journal.

A historical query opens the newest checkpoint of the store at or before its point
(server/sow/checkpoints.py; an empty state at the journal's start when there is none), then
folds the journal from the checkpoint's position to the point into an overlay in memory (at
most one checkpoint interval of journal while every checkpoint is kept). The answer then reads
the checkpoint through the overlay (`HistoricalReader`, the `Reader` interface of
server/sow/store.py).

The fold (`_Fold.run`) reads the journal's stored bytes into a FoldTable (server/_sowfold.c):
per record key a pointer to its newest message in the blocks read, no Python object per
message; sorted once (its FoldOrder, server/_sowfold_order.c), it is merged with the
checkpoint's chunks as the answer is made, so the
objects of the records it changed are made while the client reads, as a current query's are.
Where the fold replaced most of the checkpoint's records, its chunks are read as keys only
(`HistoricalReader._merged`): the values of the replaced records are never read.
A delete record, or a message the table cannot take (a fragment other than the plain `k`, or
none), flushes the table into the overlay dict and is folded here, one by one; the answer then
reads the dict (sorted, merged per chunk by `merge_rows`, in C). The tuple fold (`run_py`) is
the reference the tests hold both to, and the fold of a compacted segment.

A point before the journal's start, or older than the window, is refused with `invalid
bookmark`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from journal.accelerators import load
from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_SOW_DELETE, record_length_at, scan_records
from protocol.bookmarks import Bookmark, BookmarkSpec, Epoch, InvalidBookmark, Timestamp
from protocol.filters import FilterError, compile_filter

from ..matching import body_matches
from .keys import BadSowKey, KeyMaker, k_fragment, key_from_fragment
from .records import BY_FILTER, decode_delete
from .store import (
    ChunkCursor,
    Reader,
    Stored,
    decode_value,
    encode_value,
    record_key,
    store_rows,
)

_c = load("server._sowfold")  # None: the tuple fold and merge_rows_py (the references) only
FoldTable = getattr(_c, "FoldTable", None)
# journal bytes read per FoldTable.fold call (4 MiB: a query's server CPU at the costliest point
# about 160 -> 150 ms against 1 MiB, fewer Python steps per byte; 16 MiB no better)
FOLD_BLOCK = 4 << 20
# journal bytes a FoldTable may hold (its entries point into them) before the messages still
# newest are copied together and the blocks let go (then past twice what that copy holds):
# memory grows with the records a fold changed, as the store does, not the journal it reads
FOLD_HOLD = 64 << 20
# the share of a checkpoint chunk's records the fold replaced past which the next chunk is read
# as keys only (HistoricalReader._merged)
DENSE = 0.6
RECORD_MIN = 64  # journal bytes a keyed message takes, about, at the least (46 of header and k)

__all__ = ["HistoricalReader", "fold_state", "locate_point", "merge_rows"]

_EMPTY = object()

# The blocks the last fold read, kept after its answer is done and dropped one by one as the
# next fold reads: the memory of each (freed then, the allocator's to give again) takes the
# next block read, instead of fresh pages that the kernel faults in and zeroes (the pages of
# 35 MB of journal were a fifth of a query's server CPU at the costliest point). At most one
# fold's blocks, FOLD_HOLD bytes at most, stay between two historical queries.
_spent: list[bytes] = []


def _at_most(blocks: list[bytes], limit: int) -> list[bytes]:
    """The newest of `blocks` that take at most `limit` bytes together."""
    total, i = 0, len(blocks)
    while i and total + len(blocks[i - 1]) <= limit:
        i -= 1
        total += len(blocks[i])
    return blocks[i:]


def merge_rows_py(
    chunk: list[tuple[bytes, bytes]], rows: list[tuple[bytes, bytes | None]], i: int
) -> tuple[list[tuple[bytes, bytes]], int]:
    """A checkpoint's chunk (key order) merged with the overlay's rows (key order; None: the
    record deleted since) from index i, taking the rows whose key is at most the chunk's
    last: a row replaces the chunk's pair of its key, the deleted are left out. Returns the
    merged pairs and the first row not taken. The reference of server/_sowfold.c's."""
    out: list[tuple[bytes, bytes]] = []
    if not chunk:
        return out, i
    last = chunk[-1][0]
    c, nc, nr = 0, len(chunk), len(rows)
    while c < nc:
        if i < nr and rows[i][0] <= last and rows[i][0] <= chunk[c][0]:
            if rows[i][0] == chunk[c][0]:
                c += 1  # replaced
            if rows[i][1] is not None:
                out.append(rows[i])  # type: ignore[arg-type]
            i += 1
        else:
            out.append(chunk[c])
            c += 1
    return out, i


merge_rows = getattr(_c, "merge_rows", merge_rows_py)


@dataclass(eq=False, repr=False)
class HistoricalReader:
    """A checkpoint read through the overlay of the journal folded after it: record key ->
    store value (server/sow/store.py's layout), or None for a record deleted since; or, when
    the whole fold went through a FoldTable (puts only), its FoldOrder instead."""

    base: Reader | None
    overlay: dict[bytes, bytes | None]
    position: int
    _on_close: Callable[[], None]
    order: Any = None

    def get(self, topic: str, k: str) -> Stored | None:
        if self.order is not None:
            v = self.order.get(record_key(topic, k))
            if v is not None:
                return decode_value(v)
            return self.base.get(topic, k) if self.base is not None else None
        got = self.overlay.get(record_key(topic, k), _EMPTY)
        if got is not _EMPTY:
            return None if got is None else decode_value(got)  # type: ignore[arg-type]
        return self.base.get(topic, k) if self.base is not None else None

    def _mine(self, topic: str) -> list[tuple[bytes, bytes | None]]:
        """The overlay's rows of `topic`, in key order."""
        rows = sorted(self.overlay.items())  # keys are unique: the values are never compared
        prefix = record_key(topic, "")
        lo = bisect_left(rows, (prefix,))
        hi = bisect_left(rows, (prefix[:-1] + b"\x01",), lo)
        return rows if lo == 0 and hi == len(rows) else rows[lo:hi]

    def chunks(self, topic: str, size: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """`Reader.chunks` of the state: each of the checkpoint's chunks merged with the
        overlay's rows up to its last key (`merge_rows`, in C; or the FoldOrder's `merge`),
        the overlay's rows past the checkpoint's last key after them."""
        order = self.order
        if order is not None:
            order.seek(record_key(topic, ""))
            if self.base is not None:
                yield from self._merged(order, self.base.cursor(topic), size)
            while rest := order.rest(size):
                yield rest
            return
        base = self.base.chunks(topic, size) if self.base is not None else iter(())
        mine = self._mine(topic)
        i, n = 0, len(mine)
        for chunk in base:
            if i == n or mine[i][0] > chunk[-1][0]:  # nothing folded in this chunk's range
                yield chunk
                continue
            out, i = merge_rows(chunk, mine, i)
            if out:
                yield out
        rest = [kv for kv in mine[i:] if kv[1] is not None]
        for j in range(0, len(rest), size):
            yield rest[j : j + size]  # type: ignore[misc]

    def _merged(self, order: Any, cur: ChunkCursor, size: int) -> Iterator[list[Any]]:
        """The checkpoint's chunks (`cur`) merged with the FoldOrder's entries. While the
        fold replaced most of a chunk's records (at the costliest points, just before a
        checkpoint, every one), the next chunk is read as its keys only and the values of the
        keys it did not replace fetched (`merge_keys`): the checkpoint's values of the
        others are never read. Reading the keys and fetching the rest costs more than reading
        the pairs when fewer are replaced (a fetch is a lookup, about twice a step of the
        cursor), so a chunk replaced less than DENSE goes back to the pairs."""
        assert self.base is not None
        dense = order.left() >= DENSE * self.base.count()
        while True:
            if dense:
                keys = cur.next(size, values=False)
                if not keys:
                    return
                out, taken = order.merge_keys(keys, cur.values)
                n = len(keys)
            else:
                chunk = cur.next(size)
                if not chunk:
                    return
                left = order.left()
                out = order.merge(chunk)
                taken, n = left - order.left(), len(chunk)
            dense = taken >= DENSE * n
            if out:
                yield out

    def keys(self, topic: str, after: str | None = None) -> Iterator[tuple[str, Stored]]:
        n = len(record_key(topic, ""))
        start = record_key(topic, after) if after is not None else None
        for chunk in self.chunks(topic, 1024):
            for key, value in chunk:
                if start is None or key > start:
                    yield key[n:].decode("utf-8"), decode_value(value)

    def close(self) -> None:
        if self.base is not None:
            self.base.close()
            self.base = None
        self._on_close()


def fold_state(
    journal: Journal,
    base: Reader | None,
    start: int,
    end: int,
    is_sow: Callable[[str], Any],
    maker: Callable[[str], KeyMaker | None],
    on_close: Callable[[], None],
) -> HistoricalReader:
    """The state as of journal position `end`: the checkpoint `base` (None: the empty state at
    `start`, the journal's) with the journal from `start` (its position) folded over it. Runs
    off the loop (it reads the journal)."""
    overlay: dict[bytes, bytes | None] = {}
    order = _Fold(overlay, is_sow, maker).run(journal, start, end, base)
    return HistoricalReader(base, overlay, end, on_close, order)


class _Fold:
    """The journal folded into a historical query's overlay: record key -> store value, or
    None for a record deleted (the live fold's rules, server/sow/manager.py)."""

    def __init__(
        self,
        overlay: dict[bytes, bytes | None],
        is_sow: Callable[[str], Any],
        maker: Callable[[str], KeyMaker | None],
    ) -> None:
        self.overlay = overlay
        self.is_sow = is_sow
        self.maker = maker
        self._topics: dict[bytes, str | None] = {}
        self.base: Reader | None = None  # the checkpoint folded over (`run`)
        # FoldTable.fold's targets: topic bytes -> (record key prefix, the overlay) or None
        self._by_bytes: dict[bytes, tuple[bytes, dict[bytes, bytes | None]] | None] = {}
        # store_rows' targets: every topic's rows go to the one overlay
        self._targets: dict[str, tuple[bytes, dict[bytes, bytes | None]]] = {}

    def sow_topic(self, tb: bytes) -> str | None:
        """The topic of a message record when it is a SOW topic (cached per topic)."""
        try:
            return self._topics[tb]
        except KeyError:
            pass
        topic = tb.decode("utf-8", "replace")
        got = topic if self.is_sow(topic) else None
        if len(self._topics) > 65536:
            self._topics.clear()
        self._topics[tb] = got
        if got is not None:
            self._targets[got] = (record_key(got, ""), self.overlay)
        return got

    def run(self, journal: Journal, start: int, end: int, base: Reader | None) -> Any:
        """Fold the journal from `start` to `end` over the checkpoint `base`: its stored bytes
        into a FoldTable (C: a table of pointers into the blocks read, no object per message;
        the records it cannot take, here one by one after a flush of the table into the
        overlay, so that each key's newest change wins), or its records as tuples (`run_py`,
        the reference; and a compacted segment, whose bytes are not stored as they were
        written). Returns the table's FoldOrder (its entries in key order) when every record
        went through it (the overlay dict is then left empty), else None (the dict holds the
        fold)."""
        self.base = base
        if FoldTable is None:
            self.run_py(journal, start, end)
            return None
        # sized for the keys it may meet (about the checkpoint's records, and no more than
        # messages of RECORD_MIN bytes in the journal it reads), so that it seldom grows
        table = FoldTable(hint=min(base.count(), (end - start) // RECORD_MIN) if base else 0)
        hold = FOLD_HOLD
        pos = start
        read: list[bytes] = []  # the blocks the table holds (recycled by the next fold)
        while pos < end:
            if _spent:  # the memory of a block the last fold read, for the next read's
                _spent.pop()
            blk = journal.read_block(pos, FOLD_BLOCK)
            if blk is None:  # a compacted segment: its records as tuples
                recs, nxt = journal.read_raw(pos, FOLD_BLOCK)
                if recs:
                    table.flush()
                    self.fold([r for r in recs if r[0] < end])
                    if recs[-1][0] >= end:
                        break
                    pos = nxt
                    continue
            else:
                buf, at = blk
                read.append(buf)
                off, at_end, stopped = table.fold(buf, at, end, self._by_bytes, self._learn)
                if at_end:
                    break
                if stopped:  # the record at `off`, folded here after what came before it
                    table.flush()
                    read.clear()
                    size = record_length_at(buf, off)
                    self.fold(scan_records(buf[off : off + size], at + off)[0])
                    off += size
                if table.held() > hold:  # what is still newest, copied together
                    hold = max(FOLD_HOLD, 2 * table.compact())
                    read.clear()
                if off:
                    pos = at + off
                    continue
                nxt = at
            # nothing here: a segment's end (or a compacted range's)
            after = journal.next_position(nxt)
            if after <= pos or after >= journal.end_position:
                break
            pos = after
        _spent[:] = _at_most(read, FOLD_HOLD)
        if self.overlay:
            table.flush()
            return None
        return table.sort()

    def _learn(self, tb: bytes) -> tuple[bytes, dict[bytes, bytes | None]] | None:
        """FoldTable.fold's target for a topic it meets first: the overlay when a SOW topic."""
        topic = self.sow_topic(tb)
        return None if topic is None else (record_key(topic, ""), self.overlay)

    def run_py(self, journal: Journal, start: int, end: int) -> None:
        for recs in journal.raw_batches(start, end):
            self.fold(recs)

    def fold(self, recs: Any) -> None:
        """Fold journal records (RawTuples) in order."""
        rows: list[tuple[Any, ...]] = []
        for pos, kind, pub, seq, ts, tb, body, extra in recs:
            if kind == KIND_MESSAGE:
                topic = self.sow_topic(tb)
                if topic is not None:
                    rows.append((topic, pub, seq, ts, body, pos, extra[1] if extra else b""))
            elif kind == KIND_SOW_DELETE:
                self.put(rows)
                rows = []
                self.delete(tb, body, self.base, pos)
        self.put(rows)

    def put(self, rows: list[tuple[Any, ...]]) -> None:
        """Fold message rows (topic, pub, seq, ts, body, position, header fragment): in C
        (store_rows) when each fragment is the plain `k` member, else row by row, the key
        made from the body when the record has none (recorded before the topic was a SOW
        topic). Rows put twice (C, then the rest of the batch here) end the same."""
        if not rows or store_rows(rows, 0, self._targets) >= 0:  # type: ignore[arg-type]
            return
        overlay = self.overlay
        for topic, pub, seq, ts, body, pos, hdr in rows:
            k = key_from_fragment(hdr) if hdr else None
            if k is None:
                m = self.maker(topic)
                try:
                    k = m.key(body, None) if m is not None else None
                except BadSowKey:
                    k = None
                if k is None:
                    continue
                hdr = hdr + k_fragment(k)
            overlay[record_key(topic, k)] = encode_value(pos, pub, seq, ts, hdr, body)

    def delete(self, tb: bytes, body: bytes, base: Reader | None, pos: int) -> None:
        topic = tb.decode("utf-8", "replace")
        got = decode_delete(body)
        if got is None:
            return
        form, payload = got
        overlay = self.overlay
        if form != BY_FILTER:  # by keys (K, or E: expired)
            for k in payload.split(","):
                if k:
                    overlay[record_key(topic, k)] = None
            return
        try:
            f = compile_filter(payload)
        except FilterError:
            return
        view = HistoricalReader(base, overlay, pos, lambda: None)
        for k, rec in list(view.keys(topic)):
            if body_matches(f, rec[5]):
                overlay[record_key(topic, k)] = None


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
