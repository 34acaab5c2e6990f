"""Plain publish frames turned into journal records in one pass (the publish fast path).

A publisher sends thousands of frames like `{"c":"publish","t":"orders","s":42}<body>` per
read. Decoding each into a Header, checking its fields and encoding its record costs a few
Python objects and calls per message; these two functions do it for a whole run at once:

`publish_span(buf, pos, max_size) -> end`: the end of the run of whole frames from `pos` whose
header starts with `{"c":"publish"` and whose length is 1..max_size (`pos` if the frame there is
not one). The frame decoder (protocol/framing.py) hands such a run to the session undecoded.

`publish_records(raw, pos, pub, ts, highest, known, base)
    -> (records, entries, msgs, stop, highest, asked, unknown)`: walks the frames of `raw` from
`pos` while each is a *plain publish*: a header of exactly the members c ("publish"), t, s and
optionally a ("persisted") and cid, each once, in any order, without white space; strings of
printable ASCII without `"` or `\\`; t of 1..MAX_TOPIC_BYTES and cid of at most MAX_CID_BYTES;
s a decimal integer in 1..MAX_SEQ without leading zeros, above the sequence before it
(`highest` for the first); its topic a key of `known` (topic bytes -> the topic str, the ones the caller checked
are stored as they are). For each it appends the journal record (journal/record.py: kind
message, flags 0) to `records`, `(pub, seq, ts, base + offset)` to `entries` and
`(topic, pub, seq, ts, body, base + offset, b"", None)` to `msgs` (server/batch_row.py's BatchRow,
whose fields the C twin checks at its configure()).

A SOW topic's value in `known` is the tuple `(topic, paths, maker)` (server/sow/: `key_spec`):
its frames also get their record key `k` (server/sow/keys.py), computed from the body at the
`<Key>` paths (`paths`: each path's member names as bytes; `maker`: the KeyMaker), into the
header fragment `,"k":"<k>"` of the record (flag 2) and of the row. A body without a key this
scanner makes stops the walk there (the ordinary path keys or refuses it): the Python version
takes what KeyMaker.key takes; the C version takes a subset, the bodies whose text gives the
same key without decoding (strict JSON, key values a string without escapes, an integer, true
or false: see server/_publish.c), and stops before the others. `stop` is where it stopped: len(raw), or the first frame not taken, which the caller
hands to the ordinary path (anything unusual: other members, escapes, white space, a duplicate
sequence, ...); `highest` the last sequence taken; `asked` whether a taken frame had
`a="persisted"`; `unknown` the topic at `stop` when that is the only reason it stopped, else
None. Each frame taken is one the ordinary path (decode_header, check_fields, cmd_publish)
would store with exactly these fields: the grammar is a strict subset of what it accepts.

The C version (server/_publish.c, built when a compiler is there) does it without a Python
call per message; the `_py` functions are the reference both are tested against and the
fallback (also used when TICKERTAPE_PURE_PYTHON=1).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from journal.accelerators import load
from journal.record import KIND_MESSAGE, RecordFieldError, encode_record
from protocol.headers import (
    FAST_PUBLISH_ACK,
    FAST_PUBLISH_FIELDS,
    MAX_CID_BYTES,
    MAX_SEQ,
    MAX_TOPIC_BYTES,
)

from .batch_row import BatchRow, BatchTuple

__all__ = [
    "ACCELERATED",
    "publish_records",
    "publish_records_py",
    "publish_span",
    "publish_span_py",
]

PUBLISH_PREFIX = b'{"c":"publish"'
_ACK = FAST_PUBLISH_ACK.encode()
_unpack_len = struct.Struct(">I").unpack_from
# one member: a key, then a plain string or a decimal integer without a leading zero
_MEMBER = re.compile(
    rb'"([\x20\x21\x23-\x5b\x5d-\x7e]*)":(?:"([\x20\x21\x23-\x5b\x5d-\x7e]*)"|([1-9][0-9]*))'
)
# The members a plain publish header may have: the string ones with their longest value, and the
# sequence. They are protocol/headers.py's "fast" publish fields, with its limits: a field
# classified there as fast that the scanners do not read stops the import (and the C twin's
# configure), rather than pass through unread.
_STRINGS = {b"c": len(b"publish"), b"t": MAX_TOPIC_BYTES, b"a": len(_ACK), b"cid": MAX_CID_BYTES}
_SEQ = b"s"
_SEQ_DIGITS = len(str(MAX_SEQ))
MEMBERS = tuple(sorted(f.encode() for f in FAST_PUBLISH_FIELDS))
if MEMBERS != tuple(sorted([*_STRINGS, _SEQ])):
    raise RuntimeError(
        f"protocol/headers.py's fast publish fields are {MEMBERS}; server/publish_scan.py reads "
        f"{sorted([*_STRINGS, _SEQ])}: teach it (and server/_publish.c) the new ones"
    )

Rows = tuple[bytes, list[tuple[int, int, int, int]], list[BatchTuple], int, int, bool, bytes | None]


def publish_span_py(buf: bytes | bytearray, pos: int, max_size: int) -> int:
    n = len(buf)
    if pos < 0:
        return n
    while n - pos >= 4 + len(PUBLISH_PREFIX):
        (length,) = _unpack_len(buf, pos)
        if length < len(PUBLISH_PREFIX) or length > max_size or pos + 4 + length > n:
            break
        if not buf.startswith(PUBLISH_PREFIX, pos + 4):
            break
        pos += 4 + length
    return pos


def _header(frame: bytes) -> tuple[int, bytes, int, bool] | None:
    """(header length, topic, seq, asked) of a plain publish header at the start of frame."""
    if not frame.startswith(b"{"):
        return None
    p = 1
    got: dict[bytes, bytes] = {}
    while True:
        m = _MEMBER.match(frame, p)
        if m is None:
            return None
        key, text, number = m.group(1), m.group(2), m.group(3)
        if key in got:
            return None
        if key == _SEQ:
            if number is None or len(number) > _SEQ_DIGITS or int(number) > MAX_SEQ:
                return None
            got[key] = number
        elif key in _STRINGS and text is not None and len(text) <= _STRINGS[key]:
            got[key] = text
        else:
            return None
        p = m.end()
        if p >= len(frame):
            return None
        if frame[p] == 0x7D:  # }
            break
        if frame[p] != 0x2C:  # ,
            return None
        p += 1
    t, a = got.get(b"t"), got.get(b"a")
    if got.get(b"c") != b"publish" or not t or _SEQ not in got:
        return None
    if a is not None and a != _ACK:
        return None
    return p + 1, t, int(got[_SEQ]), a is not None


def publish_records_py(
    raw: bytes, pos: int, pub: int, ts: int, highest: int, known: dict[bytes, Any], base: int
) -> Rows:
    if not 0 <= pos <= len(raw):
        raise ValueError("pos is outside raw")
    out: list[bytes] = []
    entries: list[tuple[int, int, int, int]] = []
    msgs: list[BatchTuple] = []
    n = len(raw)
    size = base
    asked = False
    unknown = None
    while n - pos >= 4:
        (length,) = _unpack_len(raw, pos)
        if pos + 4 + length > n:
            break
        frame = raw[pos + 4 : pos + 4 + length]
        got = _header(frame)
        if got is None or got[2] <= highest:
            break
        hlen, tb, seq, a = got
        topic = known.get(tb)
        if topic is None:
            unknown = tb
            break
        body = frame[hlen:]
        hdr = b""
        if isinstance(topic, tuple):  # a SOW topic: (topic, paths, maker)
            topic, _paths, maker = topic
            keyed = maker.fragment(body)  # server/sow/keys.py KeyMaker
            if keyed is None:
                break
            hdr = keyed
        try:
            rec = encode_record(KIND_MESSAGE, pub, seq, ts, tb, body, header=hdr)
        except RecordFieldError:  # a key longer than a header fragment holds
            break
        out.append(rec)
        entries.append((pub, seq, ts, size))
        msgs.append((topic, pub, seq, ts, body, size, hdr, None))
        size += len(rec)
        highest = seq
        asked |= a
        pos += 4 + length
    return b"".join(out), entries, msgs, pos, highest, asked, unknown


_c = load("server._publish")  # None without a compiler at install time: same results, slower
if _c is not None:
    _c.configure(MAX_TOPIC_BYTES, MAX_CID_BYTES, MAX_SEQ, _ACK, MEMBERS, BatchRow)
publish_span = _c.publish_span if _c else publish_span_py
publish_records = _c.publish_records if _c else publish_records_py
ACCELERATED = _c is not None
