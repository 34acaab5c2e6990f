"""The `sow` frames of a query's answer made from store values in bulk (docs/protocol.md §14).

`sow_frames(items, prefix, head, extra, no_sowkey) -> (frames, taken)` turns `items`, a list of
(record key, value) pairs read from the store in key order (server/sow/store.py's value layout:
u64 BE position, publisher, sequence, receive time, u16 BE H, H bytes header fragment, body),
into one `sow` frame each, back to back:

    u32 BE length | head | ,"bm":"<pub>|<seq>|" | fragment | extra | } | body

which is server/frames.py's `sow_record` with `head` = `{"c":"sow"` and the topic member, and
`extra` the query's `query_id` / `sub_id` members. With `no_sowkey` the fragment is cut at its
last `,"k":` (the key is always its last member: server/sow/keys.py). It stops at the first item
whose key does not start with `prefix` (the store holds every topic in one key space: the
records after the query's topic) and says how many items it took. A value too short for its
fields raises ValueError.

The C version (server/_splice.c) makes a chunk of an answer without a Python object per record;
`sow_frames_py` is the reference it is tested against and the fallback (TICKERTAPE_PURE_PYTHON).
`matching(items, f)` keeps the items whose body filter `f` matches: a compiled filter with a
block-scanner program is evaluated in C over the chunk (server/_filterscan.c's `scan_values`, as
a filtered replay is), the bodies it cannot decide by the Python evaluator, the reference; any
other predicate by `body_matches` per item.
"""

from __future__ import annotations

from array import array

from journal.accelerators import load
from protocol.bookmarks import BOOKMARK_FORMAT
from protocol.filters.api import CompiledFilter

from ..filter_scan import u64_array
from ..frames import pack_len
from ..matching import Predicate, body_matches
from .store import HEAD

__all__ = ["ACCELERATED", "matching", "sow_frames", "sow_frames_py", "value_body"]

_K = b',"k":'
_BM = b',"bm":"' + BOOKMARK_FORMAT + b'"'
_HEAD_SIZE = HEAD.size


def value_body(value: bytes) -> bytes:
    """The body of a store value."""
    return value[_HEAD_SIZE + int.from_bytes(value[32:34], "big") :]


def sow_frames_py(
    items: list[tuple[bytes, bytes]], prefix: bytes, head: bytes, extra: bytes, no_sowkey: bool
) -> tuple[bytes, int]:
    """The reference (module docstring)."""
    out = []
    taken = 0
    for key, value in items:
        if not key.startswith(prefix):
            break
        if len(value) < _HEAD_SIZE:
            raise ValueError(f"SOW store value of {len(value)} bytes is too short for its fields")
        _pos, pub, seq, _ts, h = HEAD.unpack_from(value, 0)
        if _HEAD_SIZE + h > len(value):
            raise ValueError(f"SOW store value of {len(value)} bytes is too short for its fields")
        frag = value[_HEAD_SIZE : _HEAD_SIZE + h]
        if no_sowkey:
            i = frag.rfind(_K)
            if i >= 0:
                frag = frag[:i]
        body = value[_HEAD_SIZE + h :]
        tag = head + _BM % (pub, seq) + frag + extra + b"}"
        out.append(pack_len(len(tag) + len(body)) + tag + body)
        taken += 1
    return b"".join(out), taken


_c = load("server._splice")
sow_frames = getattr(_c, "sow_frames", None) or sow_frames_py
ACCELERATED = sow_frames is not sow_frames_py


_fc = load("server._filterscan")
_scan_values = getattr(_fc, "scan_values", None)


def matching(items: list[tuple[bytes, bytes]], f: Predicate) -> list[tuple[bytes, bytes]]:
    """The items (record key, value) whose body `f` matches, in their order."""
    info = getattr(f, "__self__", None)
    if _scan_values is not None and info.__class__ is CompiledFilter and info.program is not None:
        hits, unsure = _scan_values(items, info.program)
        idx: list[int] | array[int] = u64_array(hits)
        if unsure:
            match = info.match_raw
            more = [i for i in u64_array(unsure) if match(value_body(items[i][1]))]
            if more:
                idx = sorted([*idx, *more])
        return [items[i] for i in idx]
    return [it for it in items if body_matches(f, value_body(it[1]))]
