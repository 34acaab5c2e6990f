"""Replication's per-record work over runs of records (the replication fast paths).

A replication batch holds hundreds of the source's journal records. Taking each as a tuple,
looking up its publisher and re-encoding it with journal/record.py's `encode_record` costs a few
Python objects and calls per record, on the destination (which shares the cores with its source
when both run on one machine). These two functions do it for a whole run at once:

`replicate_records(body, pos, highest, known, name, group, ts, base, first_msg, origins)
    -> (records, entries, msgs, stop, dups, unknown, pubs)`: the destination's intake
(server/pipeline_replicate.py). From `pos`, while each whole record of `body` is a message
whose topic (bytes) is a key of `known` (-> the topic str; the caller puts only topics that are
recorded there): a sequence at or below the publisher's highest (`highest`: pub -> seq, missing
= 0) is a duplicate, counted in `dups` and left out; any other is re-encoded as
`encode_record(KIND_MESSAGE, pub, seq, ts, topic, body, exp, hdr, origin)` with this instance's
receive time `ts` and the source record's origin block (else (its receive time, `name`,
`group`)) into `records`, with `(pub, seq, ts, base + offset)` in `entries`, `(topic, pub, seq,
ts, body, base + offset, hdr, exp)` in `msgs` (server/pipeline.py's Batch rows), its origin
tuple in `origins[first_msg + i]`, and `highest[pub] = seq`. `stop` is the first record not
walked: len(body), a queue event, a topic not in `known` (`unknown` is then that topic, else
None), or a record that is not whole or whose fields do not fit it; the caller's ordinary path
takes it. `pubs`: pub -> (first seq, last seq, offset of the last) of the records taken.
The records are already verified (the receiver's `verified_prefix`): no crc is checked here.

`kept_span(buf, pos, topics) -> (stop, unknown, count)`: the source's filter
(server/replication/sender.py `select`) for the common run: the end of the whole records from
`pos` that are messages without an origin block whose topic maps to True in `topics` (the
Filter's cache, bytes -> bool); `unknown` the topic at `stop` when the only reason it stopped is
that the topic is not in `topics` yet, else None; `count` the records walked (the sender's
`sent_messages` statistic).

The C version (server/_replicate.c, built when a compiler is there) does it without a Python
call per record; the `_py` functions are the reference both are tested against and the fallback
(also used when TICKERTAPE_PURE_PYTHON=1).
"""

from __future__ import annotations

import struct
from typing import Any

from journal.accelerators import load
from journal.record import (
    FLAG_ORIGIN,
    KIND_MESSAGE,
    KNOWN_FLAGS,
    MAX_ORIGIN_NAME,
    RECORD_HEADER_SIZE,
    encode_record,
    scan_records,
)

from .batch_row import BatchRow, BatchTuple

__all__ = [
    "ACCELERATED",
    "kept_span",
    "kept_span_py",
    "replicate_records",
    "replicate_records_py",
]

_head = struct.Struct("<IIBBH").unpack_from
_u16 = struct.Struct("<H").unpack_from

Intake = tuple[
    bytes,
    list[tuple[int, int, int, int]],
    list[BatchTuple],
    int,
    int,
    bytes | None,
    dict[int, tuple[int, int, int]],
]


def _whole(buf: bytes, pos: int) -> tuple[int, int, int, bytes] | None:
    """(size, kind, flags, topic) of the record at buf[pos] when it is whole and its optional
    fields and topic fit in it (the walk's condition in both versions), else None."""
    end = len(buf)
    if end - pos < RECORD_HEADER_SIZE:
        return None
    length, _crc, kind, flags, tlen = _head(buf, pos)
    total = 4 + length
    if length < RECORD_HEADER_SIZE - 4 or pos + total > end or flags & ~KNOWN_FLAGS:
        return None
    at, stop = pos + RECORD_HEADER_SIZE, pos + total
    if flags & 1:
        at += 4
        if at > stop:
            return None
    if flags & 2:
        if at + 2 > stop:
            return None
        at += 2 + _u16(buf, at)[0]
    if flags & FLAG_ORIGIN:
        if at + 9 > stop:
            return None
        at += 9 + buf[at + 8]
        if at + 1 > stop:
            return None
        at += 1 + buf[at]
    if at + tlen > stop:
        return None
    return total, kind, flags, bytes(buf[at : at + tlen])


def replicate_records_py(
    body: bytes,
    pos: int,
    highest: dict[int, int],
    known: dict[bytes, str],
    name: bytes,
    group: bytes,
    ts: int,
    base: int,
    first_msg: int,
    origins: dict[int, Any],
) -> Intake:
    if not 0 <= pos <= len(body):
        raise ValueError("pos is outside body")
    if len(name) > MAX_ORIGIN_NAME or len(group) > MAX_ORIGIN_NAME:
        raise ValueError("name and group must each be at most 255 bytes")
    out: list[bytes] = []
    entries: list[tuple[int, int, int, int]] = []
    msgs: list[BatchTuple] = []
    pubs: dict[int, tuple[int, int, int]] = {}
    size = base
    dups = 0
    unknown = None
    n = len(body)
    while pos < n:
        got = _whole(body, pos)
        if got is None or got[1] != KIND_MESSAGE:
            break
        total, _kind, _flags, tb = got
        (rec,) = scan_records(body[pos : pos + total], 0)[0]
        _p, _k, pub, seq, src_ts, _tb, data, extra = rec
        if seq <= highest.get(pub, 0):
            dups += 1
            pos += total
            continue
        topic = known.get(tb)
        if topic is None:
            unknown = tb
            break
        if extra is None:
            exp, hdr, origin = None, b"", (src_ts, name, group)
        else:
            exp, hdr = extra[0], extra[1]
            origin = extra[2] if len(extra) > 2 else (src_ts, name, group)  # type: ignore[misc]
        new = encode_record(KIND_MESSAGE, pub, seq, ts, tb, data, exp, hdr, origin)
        out.append(new)
        entries.append((pub, seq, ts, size))
        origins[first_msg + len(msgs)] = origin
        msgs.append((topic, pub, seq, ts, data, size, hdr, exp))
        first = pubs[pub][0] if pub in pubs else seq
        pubs[pub] = (first, seq, size)
        highest[pub] = seq
        size += len(new)
        pos += total
    return b"".join(out), entries, msgs, pos, dups, unknown, pubs


def kept_span_py(buf: bytes, pos: int, topics: dict[bytes, bool]) -> tuple[int, bytes | None, int]:
    if not 0 <= pos <= len(buf):
        raise ValueError("pos is outside buf")
    n = len(buf)
    count = 0
    while pos < n:
        got = _whole(buf, pos)
        if got is None or got[1] != KIND_MESSAGE or got[2] & FLAG_ORIGIN:
            break
        ok = topics.get(got[3])
        if ok is None:
            return pos, got[3], count
        if not ok:
            break
        pos += got[0]
        count += 1
    return pos, None, count


_c = load("server._replicate")  # None without a compiler at install time: same results, slower
if _c is not None:
    _c.configure(BatchRow)
kept_span = _c.kept_span if _c else kept_span_py
replicate_records = _c.replicate_records if _c else replicate_records_py
ACCELERATED = _c is not None
