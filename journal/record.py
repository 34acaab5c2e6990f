"""Journal record and segment-header formats. This module owns these bytes; nobody else slices them.

Segment file `<base:020d>.seg`:

```
offset size  field
0      4     magic  b"TTJ\\x01"  (the last byte is the format version)
4      4     u32 LE reserved (0)
8      8     u64 LE base position: the journal position of the first record in this file
16     ...   records, back to back
..     ...   the newest segment only: zeros up to the end of the file (its runway, below)
```

The runway: the segment being written is kept longer than its records by pre-zeroed space
that commits overwrite (journal/writer.py); where its records end is held in memory, never
taken from the file's size. A sealed segment, or one closed cleanly, ends exactly at its last
record. After a crash, zeros after the newest segment's last good record are its clean end.

A *position* is a byte offset in the logical journal (all segments' records concatenated, segment
headers not counted): the record at file offset `o` of a segment with base `b` has position
`b + o - 16`. Positions only grow, so they order records and name them compactly.

Record (little-endian):

```
offset size  field
0      4     u32 length: bytes after this field (record size = 4 + length)
4      4     u32 crc32 (zlib) of bytes [8, 4 + length): everything after the crc
8      1     u8  kind (RecordKind): 1 = message, 2 = queue event (body is the event),
                                           3 = SOW delete (server/sow/records.py)
9      1     u8  flags (below)
10     2     u16 topic length T
12     8     u64 publisher id
20     8     u64 publisher sequence
28     8     u64 receive time, microseconds since the Unix epoch (UTC), non-decreasing
36     4     u32 expiration, seconds       only if flags & 1 (the publish's `e`, rounded up)
..     2     u16 header fragment length H   only if flags & 2
..     H     header fragment               only if flags & 2: wire-ready JSON members, each
                                           starting with ',' (e.g. `,"x":"corr-1"`), appended
                                           as-is to the header of every delivery of the message
..     8     u64 origin receive time, µs    only if flags & 4 (origin block, below)
..     1     u8  N                          only if flags & 4
..     N     origin instance name, UTF-8    only if flags & 4
..     1     u8  G                          only if flags & 4
..     G     origin group name, UTF-8       only if flags & 4
..     T     topic, UTF-8
..     ...   body, as published
```

Flags: bit 0 = expiration present (the publish's `e`), bit 1 = header fragment present, bit 2 =
origin block present. A record with flags 0 is exactly the fixed header, topic and body.

The origin block says where a record received by replication was first published: the receive
time the *origin* instance stamped, and that instance's name and group. A record published on
this instance has none (its origin is this instance); a replicated one always has one, copied
from the source record if it had one. The record's own receive time (offset 28) is always this
instance's, so time bookmarks stay per instance. Deliveries never show the block: a replicated
message is delivered exactly like the original (same bookmark, header fragment and body).

Every read checks each record (`verified_prefix`: a length that holds the record's own fields,
a known kind and flags, the crc); a damaged record is never served: readers report it and go on
at the next good record (`resync`). A partial record at the end of the newest segment is a
torn tail, which recovery truncates (docs/integrity.md).
"""

from __future__ import annotations

import math
import struct
import zlib
from enum import IntEnum
from typing import TYPE_CHECKING, Final, NamedTuple

from .accelerators import load

if TYPE_CHECKING:
    import numpy as np

MAGIC = b"TTJ\x01"
SEGMENT_HEADER = struct.Struct("<4sIQ")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 16

RECORD_HEADER = struct.Struct("<IIBBHQQQ")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 36
_AFTER_CRC = struct.Struct("<BBHQQQ")
_pack_after_crc = _AFTER_CRC.pack
_pack_prefix = struct.Struct("<II").pack
_unpack_header = RECORD_HEADER.unpack_from
_crc32 = zlib.crc32


class RecordKind(IntEnum):
    """The record's kind byte (offset 8)."""

    MESSAGE = 1  # a published message
    QUEUE_EVENT = 2  # a queue's acks and leases: topic = the queue's name, body = the entries
    SOW_DELETE = 3  # records removed from a SOW topic (server/sow/records.py)


# the names older callers import; the same objects as the members
KIND_MESSAGE = RecordKind.MESSAGE
KIND_QUEUE_EVENT = RecordKind.QUEUE_EVENT
KIND_SOW_DELETE = RecordKind.SOW_DELETE
_KIND_VALUES = frozenset(int(k) for k in RecordKind)
MAX_TOPIC = 0xFFFF

BytesLike = bytes | bytearray | memoryview


class CorruptRecord(ValueError):
    """A record that cannot be read at `offset`; `reason` says why."""

    def __init__(self, offset: int, reason: str):
        super().__init__(f"bad record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class RecordFieldError(ValueError):
    """A field that the record format cannot hold (encode_record); nothing was written."""

    def __init__(self, what: str):
        super().__init__(f"cannot store this message: {what}")
        self.what = what


FLAG_EXPIRATION = 1
FLAG_HEADER = 2
FLAG_ORIGIN = 4
KNOWN_FLAGS = FLAG_EXPIRATION | FLAG_HEADER | FLAG_ORIGIN
MAX_ORIGIN_NAME = 0xFF  # bytes, for the origin's instance name and its group name each
MAX_U64 = (1 << 64) - 1
_u32 = struct.Struct("<I")
_u16 = struct.Struct("<H")
_u64 = struct.Struct("<Q")


class Record(NamedTuple):
    """One record, decoded (decode_records, Journal.read / scan)."""

    position: int
    kind: int  # a RecordKind value (a plain int: not converted on the read path)
    publisher_id: int
    seq: int
    timestamp_us: int
    topic: str  # decoded as UTF-8, undecodable bytes replaced
    body: bytes
    expiration: int | None = None
    header: bytes = b""
    origin: Origin | None = None


class Origin(NamedTuple):
    """A replicated record's origin block: where (and when) the message was first published.
    The raw read paths hand it out as a plain tuple of this shape."""

    timestamp_us: int  # receive time the origin instance stamped, µs since the epoch
    instance: bytes  # the origin instance's <Name>, UTF-8 as stored
    group: bytes  # the origin instance's group, UTF-8 as stored


OriginTuple = tuple[int, bytes, bytes]
"""An Origin built as a plain tuple (the hot paths); Origin is a subtype of it."""

RawExtra = tuple[int | None, bytes] | tuple[int | None, bytes, OriginTuple]
"""The optional fields of a raw record: (expiration in seconds or None, header fragment), and a
third member, the origin, only when the record has one (a replicated record). Index it: [0] and
[1] are always there; `raw_origin(extra)` reads the third."""


def raw_origin(extra: RawExtra | None) -> OriginTuple | None:
    """The origin of a raw record from its `extra` member (None: published on this instance)."""
    if extra is None or len(extra) < 3:
        return None
    return extra[2]  # type: ignore[misc]  # len checked: the three-member shape


class RawRecord(NamedTuple):
    """One record as the raw read paths hand it out: undecoded, topic and body as stored.

    This is the documented shape of every raw record. The hot paths (scan_records,
    Journal.read_raw, CompactedReader.read_raw, replay and queue recovery in the server) build
    plain tuples of exactly this shape, typed `RawTuple`, and index or unpack them (the R_*
    constants below): building a NamedTuple per record makes scan_records 2.2 times as slow
    (1M records of 130 bytes: 0.28 s -> 0.63 s). Readers that are not hot take RawRecords
    (Journal.records: about +40% over raw_batches) or name a tuple's fields with
    RawRecord._make(t).
    """

    position: int  # journal position of the record (orders records and names them)
    kind: int  # a RecordKind value
    publisher_id: int  # 0 for a queue event
    seq: int  # the publisher's sequence number; 0 for a queue event
    timestamp_us: int  # receive time, microseconds since the Unix epoch (UTC); 0 for a queue event
    topic: bytes  # the topic as stored (UTF-8, not decoded); a queue event's: the queue's name
    body: bytes  # the message as published; a queue event's entries
    extra: RawExtra | None  # None when the record has no optional fields (flags 0)


RawTuple = tuple[int, int, int, int, int, bytes, bytes, RawExtra | None]
"""A RawRecord built as a plain tuple (the hot paths); RawRecord is a subtype of it."""

# field indexes of a RawTuple, for the hot loops (Final: a type checker knows each field's type)
R_POSITION: Final = 0
R_KIND: Final = 1
R_PUBLISHER: Final = 2
R_SEQ: Final = 3
R_TIMESTAMP: Final = 4
R_TOPIC: Final = 5
R_BODY: Final = 6
R_EXTRA: Final = 7


def encode_record(
    kind: int,
    publisher_id: int,
    seq: int,
    ts_us: int,
    topic: bytes,
    body: bytes,
    expiration: int | None = None,
    header: bytes = b"",
    origin: OriginTuple | None = None,
) -> bytes:
    """The record's bytes. RecordFieldError for a field the format cannot hold: checked before
    anything else, so a caller can encode first and change its own state only after.
    origin: (origin receive time, instance name, group name) for a record received by
    replication; None for a record published here."""
    if len(topic) > MAX_TOPIC or len(header) > 0xFFFF:
        raise RecordFieldError(
            f"the topic ({len(topic)} bytes) and the header fragment ({len(header)} bytes) "
            f"must each be at most {MAX_TOPIC} bytes"
        )
    if not (0 <= seq <= MAX_U64 and 0 <= publisher_id <= MAX_U64 and 0 <= ts_us <= MAX_U64):
        raise RecordFieldError(
            f"sequence {seq}, publisher {publisher_id} and time {ts_us} must be 0..2^64-1"
        )
    if expiration is not None and not math.isfinite(expiration):
        raise RecordFieldError(f"expiration {expiration!r} is not a finite number of seconds")
    if origin is not None:
        ots, oname, ogroup = origin
        if len(oname) > MAX_ORIGIN_NAME or len(ogroup) > MAX_ORIGIN_NAME:
            raise RecordFieldError(
                f"the origin's instance name ({len(oname)} bytes) and group ({len(ogroup)} "
                f"bytes) must each be at most {MAX_ORIGIN_NAME} bytes"
            )
        if not 0 <= ots <= MAX_U64:
            raise RecordFieldError(f"origin time {ots} must be 0..2^64-1")
    if expiration is None and not header and origin is None:
        rest = _pack_after_crc(kind, 0, len(topic), publisher_id, seq, ts_us) + topic + body
    else:
        flags = 0
        extra = b""
        if expiration is not None:
            flags |= FLAG_EXPIRATION
            # whole seconds, rounded up: a fraction must not become 0 (expired at once) on reread
            extra += _u32.pack(min(max(math.ceil(expiration), 0), 0xFFFFFFFF))
        if header:
            flags |= FLAG_HEADER
            extra += _u16.pack(len(header)) + header
        if origin is not None:
            flags |= FLAG_ORIGIN
            extra += _u64.pack(origin[0]) + bytes((len(origin[1]),)) + origin[1]
            extra += bytes((len(origin[2]),)) + origin[2]
        rest = (
            _pack_after_crc(kind, flags, len(topic), publisher_id, seq, ts_us)
            + extra
            + topic
            + body
        )
    return _pack_prefix(len(rest) + 4, _crc32(rest)) + rest


def _extras(
    buf: BytesLike, at: int, flags: int
) -> tuple[int | None, bytes, OriginTuple | None, int]:
    """(expiration, header fragment, origin, offset of the topic) for a record with flags."""
    exp = None
    hdr = b""
    origin = None
    if flags & FLAG_EXPIRATION:
        exp = _u32.unpack_from(buf, at)[0]
        at += 4
    if flags & FLAG_HEADER:
        n = _u16.unpack_from(buf, at)[0]
        hdr = bytes(buf[at + 2 : at + 2 + n])
        at += 2 + n
    if flags & FLAG_ORIGIN:
        ots = _u64.unpack_from(buf, at)[0]
        n = buf[at + 8]
        name = bytes(buf[at + 9 : at + 9 + n])
        at += 9 + n
        g = buf[at]
        origin = (ots, name, bytes(buf[at + 1 : at + 1 + g]))
        at += 1 + g
    return exp, hdr, origin, at


def _topic_start(buf: BytesLike, pos: int, limit: int, flags: int) -> int:
    """Where the topic of the record at buf[pos] starts (after its optional fields), or -1 if
    those run past `limit` (the record's end)."""
    at = pos + RECORD_HEADER_SIZE + (4 if flags & FLAG_EXPIRATION else 0)
    if flags & FLAG_HEADER:
        if at + 2 > limit:
            return -1
        at += 2 + _u16.unpack_from(buf, at)[0]
    if flags & FLAG_ORIGIN:
        if at + 9 > limit:
            return -1
        at += 9 + buf[at + 8]
        if at + 1 > limit:
            return -1
        at += 1 + buf[at]
    return at if at <= limit else -1


def encode_segment_header(base: int) -> bytes:
    return SEGMENT_HEADER.pack(MAGIC, 0, base)


def decode_segment_header(data: bytes) -> int:
    """Return the base position; raise CorruptRecord(0, ...) on a bad header."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise CorruptRecord(
            0, f"segment header truncated ({len(data)} of {SEGMENT_HEADER_SIZE} bytes)"
        )
    magic, _reserved, base = SEGMENT_HEADER.unpack_from(data)
    if magic[:3] != MAGIC[:3]:
        raise CorruptRecord(0, f"not a journal segment (magic {magic!r})")
    if magic != MAGIC:
        raise CorruptRecord(0, f"unsupported journal format version {magic[3]}")
    return base


def decode_records(
    buf: BytesLike, start: int, end: int, base_position: int, verify: bool = True
) -> tuple[list[Record], int]:
    """Decode whole records in buf[start:end].

    Returns (records, stop): `stop` is the offset after the last whole, valid record. A partial
    record at the end is not an error (the caller reads more); a bad crc or impossible length
    raises CorruptRecord with the offset in `buf`.
    """
    out: list[Record] = []
    append = out.append
    pos = start
    while end - pos >= RECORD_HEADER_SIZE:
        length, crc, kind, flags, tlen, pub, seq, ts = _unpack_header(buf, pos)
        total = 4 + length
        if length < RECORD_HEADER_SIZE - 4 + tlen:
            raise CorruptRecord(pos, f"length {length} is shorter than its own header")
        if pos + total > end:
            break
        if verify and _crc32(memoryview(buf)[pos + 8 : pos + total]) != crc:
            raise CorruptRecord(pos, "checksum mismatch")
        tstart = pos + RECORD_HEADER_SIZE
        exp, hdr, origin = None, b"", None
        if flags:
            if _topic_start(buf, pos, pos + total, flags) < 0:
                raise CorruptRecord(pos, "optional fields run past the end of the record")
            exp, hdr, origin, tstart = _extras(buf, tstart, flags)
            if tstart + tlen > pos + total:
                raise CorruptRecord(pos, "optional fields run past the end of the record")
        append(
            Record(
                base_position + pos,
                kind,
                pub,
                seq,
                ts,
                bytes(buf[tstart : tstart + tlen]).decode("utf-8", "replace"),
                bytes(buf[tstart + tlen : pos + total]),
                exp,
                hdr,
                None if origin is None else Origin(*origin),
            )
        )
        pos += total
    return out, pos


def record_length_at(buf: BytesLike, pos: int) -> int:
    """Size of the record starting at buf[pos] (needs at least 4 bytes)."""
    return 4 + struct.unpack_from("<I", buf, pos)[0]


def scan_records(buf: bytes, base_position: int) -> tuple[list[RawTuple], int]:
    """Fast path for replay: whole records in `buf` as plain tuples, without checksum checks.

    Returns ([RawTuple, ...], stop): each record as a plain tuple in the shape of RawRecord
    (position, kind, publisher_id, seq, timestamp_us, topic, body, extra), extra None for a
    record without optional fields, else (expiration, header fragment). Used on records already
    verified (sealed segments and the recovered tail); topic is left as bytes so callers can
    compare and cache without decoding.
    """
    out: list[RawTuple] = []
    append = out.append
    unpack = _unpack_header
    pos = 0
    end = len(buf)
    hsize = RECORD_HEADER_SIZE
    while end - pos >= hsize:
        length, _crc, kind, flags, tlen, pub, seq, ts = unpack(buf, pos)
        nxt = pos + 4 + length
        if nxt > end:
            break
        t = pos + hsize
        extra = None
        if flags:
            exp, hdr, origin, t = _extras(buf, t, flags)
            extra = (exp, hdr) if origin is None else (exp, hdr, origin)
        b = t + tlen
        append((base_position + pos, kind, pub, seq, ts, buf[t:b], buf[b:nxt], extra))
        pos = nxt
    return out, pos


def record_offsets(buf: BytesLike) -> tuple[list[int], int]:
    """Offsets of the whole records in buf (from offset 0), and the offset after the last one.

    The batch job's walk over records the walk (walk.py) has checked already: one pass over
    the length fields. A partial record at the end stops the walk; a length shorter than a
    record's own header raises CorruptRecord.
    """
    offs: list[int] = []
    append = offs.append
    unpack = _u32.unpack_from
    pos = 0
    end = len(buf)
    hsize = RECORD_HEADER_SIZE
    while end - pos >= hsize:
        (length,) = unpack(buf, pos)
        nxt = pos + 4 + length
        if length < hsize - 4:
            raise CorruptRecord(pos, f"length {length} is shorter than its own header")
        if nxt > end:
            break
        append(pos)
        pos = nxt
    return offs, pos


def record_columns(buf: BytesLike, offsets: list[int], stop: int) -> dict[str, np.ndarray]:
    """Columnar view of the records at `offsets` in buf (numpy arrays; numpy is imported here
    only, so the server never needs it). Keys: offset, size, crc, kind, flags, publisher_id, seq,
    ts, expiration (0 where absent), header_start/header_end (equal where absent), topic_start
    (after the origin block, which is skipped), topic_end (= body start), body_end. Offsets are
    into buf."""
    import numpy as np

    b = np.frombuffer(buf, dtype=np.uint8)
    o = np.asarray(offsets, dtype=np.int64)
    n = len(o)
    ends = np.empty(n, dtype=np.int64)
    if n:
        ends[:-1] = o[1:]
        ends[-1] = stop

    def u(width: int, at: np.ndarray) -> np.ndarray:
        idx = at[:, None] + np.arange(width, dtype=np.int64)
        return np.ascontiguousarray(b[idx]).view(f"<u{width}").reshape(len(at))

    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        names = "offset size crc kind flags publisher_id seq ts expiration header_start header_end"
        return {k: empty for k in (names + " topic_start topic_end body_end").split()}
    hdr = b[o[:, None] + np.arange(RECORD_HEADER_SIZE, dtype=np.int64)]  # one gather: (n, 36) bytes

    def field(lo: int, width: int) -> np.ndarray:
        return np.ascontiguousarray(hdr[:, lo : lo + width]).view(f"<u{width}").reshape(n)

    kind = hdr[:, 8].copy()
    flags = hdr[:, 9].copy()
    tlen = field(10, 2).astype(np.int64)
    t = o + RECORD_HEADER_SIZE
    has_exp = (flags & FLAG_EXPIRATION) != 0
    expiration = np.zeros(n, dtype=np.uint32)
    if has_exp.any():
        expiration[has_exp] = u(4, t[has_exp])
    t = t + np.where(has_exp, 4, 0)
    has_hdr = (flags & FLAG_HEADER) != 0
    hstart = t.copy()
    hend = t.copy()
    if has_hdr.any():
        hl = u(2, t[has_hdr]).astype(np.int64)
        hstart[has_hdr] = t[has_hdr] + 2
        hend[has_hdr] = t[has_hdr] + 2 + hl
    t = hend
    has_origin = (flags & FLAG_ORIGIN) != 0
    if has_origin.any():  # skipped: u64 time, u8 N + name, u8 G + group
        t = t.copy()
        at = t[has_origin] + 9 + b[t[has_origin] + 8].astype(np.int64)
        t[has_origin] = at + 1 + b[at].astype(np.int64)
    return {
        "offset": o,
        "size": ends - o,
        "crc": field(4, 4),
        "kind": kind,
        "flags": flags,
        "publisher_id": field(12, 8),
        "seq": field(20, 8),
        "ts": field(28, 8).astype(np.int64),
        "expiration": expiration,
        "header_start": hstart,
        "header_end": hend,
        "topic_start": t,
        "topic_end": t + tlen,
        "body_end": ends,
    }


def checked_size(buf: BytesLike, pos: int, end: int) -> int:
    """Size of the good record at pos (its length, kind, flags and crc32 checked, as
    verified_prefix checks each); 0 if damaged; -1 if it runs past end."""
    if end - pos < RECORD_HEADER_SIZE:
        return -1
    length, crc, kind, flags, tlen = _check_head(buf, pos)
    total = 4 + length
    if length < RECORD_HEADER_SIZE - 4 + tlen or kind not in _KIND_VALUES or flags & ~KNOWN_FLAGS:
        return 0
    if pos + total > end:
        return -1
    t = _topic_start(buf, pos, pos + total, flags) if flags else pos + RECORD_HEADER_SIZE
    if t < 0 or t + tlen > pos + total:
        return 0
    if _crc32(memoryview(buf)[pos + 8 : pos + total]) != crc:
        return 0
    return total


_check_head = struct.Struct("<IIBBH").unpack_from


def verified_prefix_py(buf: BytesLike) -> tuple[int, int]:
    """(stop, bad): the offset after the good records at the start of buf, and that offset
    again if the record there is damaged, or -1 if buf ended (or a record runs past it)."""
    pos, end = 0, len(buf)
    while pos < end:
        n = checked_size(buf, pos, end)
        if n > 0:
            pos += n
            continue
        return pos, (pos if n == 0 else -1)
    return pos, -1


def resync_py(buf: BytesLike, start: int) -> int:
    """The first offset at or after start where a whole good record lies in buf, or -1."""
    end = len(buf)
    for pos in range(max(start, 0), end - RECORD_HEADER_SIZE + 1):
        if buf[pos + 8] in _KIND_VALUES and checked_size(buf, pos, end) > 0:
            return pos
    return -1


# the C twin (journal/_verify.c), built when a compiler and zlib's headers are there
_verify = load("journal._verify")
verified_prefix = _verify.verified_prefix if _verify else verified_prefix_py
resync = _verify.resync if _verify else resync_py
VERIFY_ACCELERATED = _verify is not None
