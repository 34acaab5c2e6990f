"""The one walk over stored records (journal/walk.py) and the journal's records iterators."""

import os

import pytest

from journal.journal import Journal, segment_name
from journal.record import (
    KIND_MESSAGE,
    KIND_QUEUE_EVENT,
    R_BODY,
    R_EXTRA,
    R_KIND,
    R_POSITION,
    R_PUBLISHER,
    R_SEQ,
    R_TIMESTAMP,
    R_TOPIC,
    SEGMENT_HEADER_SIZE,
    RawRecord,
    RecordKind,
    encode_record,
    scan_records,
)
from journal.walk import DAMAGED, RUNS_PAST, BufferRecords, FileRecords, good_runs
from tests.support.journal_data import all_raw, build, mixed_records, queue_event, submit


def test_kinds_and_the_raw_record_shape():
    assert KIND_MESSAGE is RecordKind.MESSAGE and KIND_MESSAGE == 1
    assert KIND_QUEUE_EVENT is RecordKind.QUEUE_EVENT and KIND_QUEUE_EVENT == 2
    fields = RawRecord._fields
    for name, idx in (
        ("position", R_POSITION),
        ("kind", R_KIND),
        ("publisher_id", R_PUBLISHER),
        ("seq", R_SEQ),
        ("timestamp_us", R_TIMESTAMP),
        ("topic", R_TOPIC),
        ("body", R_BODY),
        ("extra", R_EXTRA),
    ):
        assert fields[idx] == name
    rec = encode_record(KIND_MESSAGE, 9, 3, 77, b"t", b"{}", expiration=30, header=b',"x":1')
    (raw,), _ = scan_records(rec, 100)
    assert RawRecord._make(raw) == RawRecord(100, 1, 9, 3, 77, b"t", b"{}", (30, b',"x":1'))


def _records(n: int, body: int = 40) -> bytes:
    return b"".join(
        encode_record(KIND_MESSAGE, 1, s, 10 + s, b"t", b"x" * (body + s % 7)) for s in range(n)
    )


def _walk(src, start, limit, max_bytes):
    reports = []
    runs = list(good_runs(src, start, limit, lambda *a: reports.append(a), max_bytes))
    return [(p, bytes(b)) for p, b in runs], reports


@pytest.mark.parametrize("max_bytes", [None, 1, 100, 1000])
def test_file_and_buffer_sources_walk_alike(tmp_path, max_bytes):
    """The same runs and the same reports, whether the bytes come from a file or from memory;
    windows of max_bytes (a record larger than that comes whole); damage in the middle and a
    partial record at the end are reported with their file offsets."""
    base = 5000
    good = _records(30)
    recs, _ = scan_records(good, 0)
    offs = [r[0] for r in recs]
    body = bytearray(good)
    body[offs[10] + 20] ^= 0xFF  # record 10's crc fails
    body += good[offs[0] : offs[1]][:-5]  # a torn record at the end
    path = tmp_path / "seg"
    path.write_bytes(b"\0" * SEGMENT_HEADER_SIZE + bytes(body))
    limit = base + len(body)
    fd = os.open(path, os.O_RDONLY)
    try:
        from_file = _walk(FileRecords(fd, base), base, limit, max_bytes)
    finally:
        os.close(fd)
    from_memory = _walk(BufferRecords(bytes(body), base), base, limit, max_bytes)
    assert from_file == from_memory
    runs, reports = from_memory
    assert b"".join(b for _, b in runs) == good[: offs[10]] + good[offs[11] :]
    assert runs[0][0] == base
    assert reports == [
        (SEGMENT_HEADER_SIZE + offs[10], offs[11] - offs[10], DAMAGED),
        (SEGMENT_HEADER_SIZE + len(good), len(body) - len(good), RUNS_PAST),
    ]
    if max_bytes is not None:  # every window holds at least one record (each is < 100 bytes)
        assert all(len(b) <= max(max_bytes, 100) for _, b in runs)


def test_records_iterator_bounds_and_shapes(tmp_path):
    j = build(str(tmp_path / "j"), batches=6, per_batch=40, segment_size=4096)
    try:
        submit(j, [queue_event("q1", [(1, 0, 0)], ts=0)])
        want = all_raw(j)
        assert len(j.segments) > 3
        got = list(j.records())
        assert all(type(r) is RawRecord for r in got)
        assert [tuple(r) for r in got] == want
        assert [r.kind for r in got][-1] == RecordKind.QUEUE_EVENT
        assert [r for b in j.raw_batches(max_bytes=500) for r in b] == want
        mid, end = want[50][0], want[120][0]
        assert [tuple(r) for r in j.records(mid, end)] == want[50:120]
        assert list(j.records(j.end_position)) == []
        assert [r.seq for r in j.scan()] == [r[3] for r in want]
    finally:
        j.close()


def test_records_skip_damage_and_report_it_once(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d, segment_size=4096)
    for k in range(5):
        submit(j, mixed_records(20, start_seq=1 + 20 * k))
    before = list(j.records())
    seg = j.sealed_segments()[1]
    j.close()
    victim = next(r for r in before if seg.base < r.position < seg.end)
    with open(os.path.join(d, segment_name(seg.base)), "r+b") as f:
        f.seek(SEGMENT_HEADER_SIZE + victim.position - seg.base + 30)
        f.write(b"\xff\xff")
    j = Journal(d, segment_size=4096)
    try:
        for _ in range(2):
            after = list(j.records())
            assert after == [r for r in before if r.position != victim.position]
        assert j.integrity.damaged_regions == 1
        assert j.integrity.last_damage["offset"] == SEGMENT_HEADER_SIZE + victim.position - seg.base
        # the lookups that walk records go past the damage too
        nxt = next(r for r in after if r.position > victim.position and r.kind == KIND_MESSAGE)
        assert j.locate(nxt.publisher_id, nxt.seq) == nxt.position
        assert j.locate_time(victim.timestamp_us - 1) == nxt.position
    finally:
        j.close()
