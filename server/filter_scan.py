"""A content filter over a block of journal records: filtered replay without a Python object per record.

``filter_frames(buf, base, start, end, topic, head, flt)`` is ``server.splice.splice_frames``
with a filter: the delivery frames of the messages on exactly ``topic`` at positions in
``[start, end)`` whose body the filter (a :class:`CompiledFilter`) is TRUE for, and the same
``(frames, sent, stop_offset, last_pub, last_seq, at_end)``.

With the C scanner (server/_filterscan.c, built when a compiler is there) and a filter that has
a program, the records are walked and the bodies evaluated in C; the bodies the scanner cannot
decide come back as positions and are evaluated by ``flt.match_raw``, the reference; the frames
are then spliced by ``splice_at``. Otherwise :func:`scan_py` does the same walk in Python with
``match_raw`` for every record. TICKERTAPE_PURE_PYTHON=1 turns the C scanner off, as it does
the splice accelerator.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from journal.accelerators import load
from journal.record import KIND_MESSAGE, record_length_at, scan_records
from protocol.filters.api import CompiledFilter
from server.splice import records_before, splice_at

__all__ = ["ACCELERATED", "filter_frames", "scan", "scan_py"]

Scanned = tuple[bytes, bytes, int, int | None, int | None, bool]
"""(matched, unsure, stop_offset, last_pub, last_seq, at_end): matched and unsure are native
u64 arrays of positions (array('Q') bytes)."""


def scan_py(
    buf: bytes, base: int, start: int, end: int, topic: bytes, match: Callable[[bytes], bool]
) -> Scanned:
    """The reference walk: every message on ``topic`` in ``[start, end)`` whose body ``match``
    accepts; nothing is unsure."""
    recs, stop, last, at_end = records_before(buf, base, end)
    hits = array("Q")
    for pos, kind, _pub, _seq, _ts, tb, body, _extra in recs:
        if kind == KIND_MESSAGE and tb == topic and pos >= start and match(body):
            hits.append(pos)
    lp, ls = last or (None, None)
    return hits.tobytes(), b"", stop, lp, ls, at_end


_c = load("server._filterscan")  # None without a compiler at install time: same answers, slower
scan = _c.scan if _c else None
ACCELERATED = _c is not None


def u64_array(raw: bytes) -> array[int]:
    a = array("Q")
    a.frombytes(raw)
    return a


def _body_at(buf: bytes, base: int, pos: int) -> bytes:
    off = pos - base
    recs, _ = scan_records(buf[off : off + record_length_at(buf, off)], pos)
    body: bytes = recs[0][6]
    return body


def filter_frames(
    buf: bytes, base: int, start: int, end: int, topic: bytes, head: bytes, flt: CompiledFilter
) -> tuple[bytes, int, int, Any, Any, bool]:
    """splice_frames' result for the messages the filter is TRUE for (see the module doc)."""
    if scan is not None and flt.program is not None:
        hits, unsure, stop, lp, ls, at_end = scan(buf, base, start, end, topic, flt.program)
        if unsure:
            match = flt.match_raw
            more = [p for p in u64_array(unsure) if match(_body_at(buf, base, p))]
            if more:
                hits = array("Q", sorted(u64_array(hits).tolist() + more)).tobytes()
    else:
        hits, _, stop, lp, ls, at_end = scan_py(buf, base, start, end, topic, flt.match_raw)
    if not hits:
        return b"", 0, stop, lp, ls, at_end
    frames, _bookmarks, sent = splice_at(buf, base, u64_array(hits), head, b"")
    return frames, sent, stop, lp, ls, at_end
