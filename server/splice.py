"""Replay delivery frames spliced straight from journal bytes.

`splice_frames(buf, base, start, end, topic, head)` turns the whole journal records at the start
of `buf` (the bytes of a segment from position `base`, journal/record.py's layout) into the
delivery frames one plain bookmark subscription gets (docs/protocol.md §1, protocol/framing.py):
for every message on exactly `topic` at a position in [start, end),

    u32 BE length | head | header fragment | ,"bm":"<pub>|<seq>|"} | body

(a replicated record's origin block is skipped: its deliveries are exactly the original's), where
`head` is the subscription's header up to and including its topic member (the layout is
server/frames.py's `STORED`, which the pure-Python functions here use). It returns
`(frames, sent, stop_offset, last_pub, last_seq, at_end)`: stop_offset is where the walk
stopped (the first record at or past `end`, a partial record, or the end of `buf`), last_pub and
last_seq name the last record gone through (None if none), at_end whether it stopped at `end`.

`splice_at(buf, base, positions, head, tail)` makes the frames of the messages at the given
positions (an array('Q'); the queue deliveries of server/queues.py), each with `tail` (the
lease's `lp` member) before the closing brace, and returns `(frames, bookmarks, count)`:
bookmarks as str `"pub|seq|"` (what a consumer acknowledges with), count how many positions were
done before the first whose record is not whole in buf. Positions must ascend (each at or past
the end of the record before); one that does not, or that holds no message record, raises
ValueError.

The C version (server/_splice.c, built when a compiler is there) does it without a Python
object per record; the `_py` functions are the reference both are tested against and the fallback
(also used when the environment sets TICKERTAPE_PURE_PYTHON=1). The server logs at start which
one it runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from journal.accelerators import load
from journal.record import (
    KIND_MESSAGE,
    RECORD_HEADER_SIZE,
    RawTuple,
    record_length_at,
    scan_records,
)
from protocol.bookmarks import format_bookmark

from .frames import STORED, pack_len

__all__ = [
    "ACCELERATED",
    "records_before",
    "splice_at",
    "splice_at_py",
    "splice_frames",
    "splice_frames_py",
]


def records_before(
    buf: bytes, base: int, end: int
) -> tuple[list[RawTuple], int, tuple[int, int] | None, bool]:
    """The walk of splice_frames and filter_scan.scan (journal/_record.h's walk_next in C): the
    whole records at the start of `buf` (from position `base`) before position `end`, the offset
    where the walk stopped, the (publisher, seq) of the last record it passed, and whether it
    stopped at `end`."""
    recs, stop = scan_records(buf, base)
    at_end = False
    for i, r in enumerate(recs):
        if r[0] >= end:
            recs, stop, at_end = recs[:i], r[0] - base, True
            break
    return recs, stop, (recs[-1][2], recs[-1][3]) if recs else None, at_end


def splice_frames_py(
    buf: bytes, base: int, start: int, end: int, topic: bytes, head: bytes
) -> tuple[bytes, int, int, int | None, int | None, bool]:
    out: list[bytes] = []
    sent = 0
    recs, stop, last, at_end = records_before(buf, base, end)
    for pos, kind, pub, seq, _ts, tb, body, extra in recs:
        if kind != KIND_MESSAGE or tb != topic or pos < start:
            continue
        frag = extra[1] if extra is not None else b""
        hdr = STORED % (head, b"", frag, pub, seq, b"")
        out += (pack_len(len(hdr) + len(body)), hdr, body)
        sent += 1
    lp, ls = last or (None, None)
    return b"".join(out), sent, stop, lp, ls, at_end


def splice_at_py(
    buf: bytes, base: int, positions: Sequence[int], head: bytes, tail: bytes
) -> tuple[bytes, list[str], int]:
    out: list[bytes] = []
    bms = []
    n = len(buf)
    min_off = None
    for p in positions:
        off = p - base
        if min_off is not None and off < min_off and off + RECORD_HEADER_SIZE <= n:
            raise ValueError(f"position {p} is inside the record before it: positions must ascend")
        if off < 0 or off + RECORD_HEADER_SIZE > n:
            break
        min_off = off + record_length_at(buf, off)
        if min_off > n:
            break
        recs, _ = scan_records(buf[off:min_off], p)
        if not recs or recs[0][1] != KIND_MESSAGE:
            raise ValueError(f"no message record at position {p}")
        _pos, _kind, pub, seq, _ts, _tb, body, extra = recs[0]
        frag = extra[1] if extra is not None else b""
        hdr = STORED % (head, b"", frag, pub, seq, tail)
        out += (pack_len(len(hdr) + len(body)), hdr, body)
        bms.append(format_bookmark(pub, seq))
    return b"".join(out), bms, len(bms)


_c = load("server._splice")  # None without a compiler at install time: same bytes, slower
splice_frames = _c.splice_frames if _c else splice_frames_py
splice_at = _c.splice_at if _c else splice_at_py
ACCELERATED = _c is not None
