"""Replication's fast paths (server/replicate_scan.py, server/_replicate.c): golden records, the
records they leave to the ordinary path, damaged and truncated input, and the C version equal
to the pure-Python reference on random batches."""

from __future__ import annotations

import random

import pytest

from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record
from server import replicate_scan
from server.batch_row import BatchRow
from server.replicate_scan import kept_span_py, replicate_records_py

INTAKES = [pytest.param(replicate_records_py, id="python")]
SPANS = [pytest.param(kept_span_py, id="python")]
if replicate_scan.ACCELERATED:
    from server._replicate import kept_span as _c_span
    from server._replicate import replicate_records as _c_records

    INTAKES.append(pytest.param(_c_records, id="c"))
    SPANS.append(pytest.param(_c_span, id="c"))
else:  # pragma: no cover - a build without a compiler
    _c_records = _c_span = None

KNOWN = {b"orders": "orders", b"t/2": "t/2"}


def rec(pub, seq, topic=b"orders", body=b'{"px":1}', ts=500, exp=None, hdr=b"", origin=None):
    return encode_record(KIND_MESSAGE, pub, seq, ts, topic, body, exp, hdr, origin)


def run(impl, body, highest=None, known=KNOWN, pos=0, ts=1000, base=50, first_msg=3):
    highest = {} if highest is None else highest
    origins: dict = {}
    out = impl(body, pos, highest, known, b"tt-a", b"ny", ts, base, first_msg, origins)
    return out, highest, origins


@pytest.mark.parametrize("impl", INTAKES)
def test_golden_intake_records_rows_and_origins(impl):
    elsewhere = (77, b"tt-z", b"tokyo")
    body = (
        rec(7, 1)
        + rec(7, 2, b"t/2", b"}body{", exp=30, hdr=b',"x":"c"')
        + rec(7, 2)  # a duplicate within the batch
        + rec(8, 5, body=b"", origin=elsewhere)
        + rec(7, 3, body=b"x" * 300, ts=501)
    )
    (records, entries, msgs, stop, dups, unknown, pubs), highest, origins = run(impl, body)
    mine = (500, b"tt-a", b"ny")
    want = [
        encode_record(KIND_MESSAGE, 7, 1, 1000, b"orders", b'{"px":1}', origin=mine),
        encode_record(KIND_MESSAGE, 7, 2, 1000, b"t/2", b"}body{", 30, b',"x":"c"', mine),
        encode_record(KIND_MESSAGE, 8, 5, 1000, b"orders", b"", origin=elsewhere),
        encode_record(KIND_MESSAGE, 7, 3, 1000, b"orders", b"x" * 300, origin=(501, *mine[1:])),
    ]
    assert records == b"".join(want)
    offs = [50 + sum(len(r) for r in want[:i]) for i in range(4)]
    assert entries == [(7, 1, 1000, offs[0]), (7, 2, 1000, offs[1]), (8, 5, 1000, offs[2]),
                       (7, 3, 1000, offs[3])]  # fmt: skip
    assert msgs == [
        ("orders", 7, 1, 1000, b'{"px":1}', offs[0], b"", None),
        ("t/2", 7, 2, 1000, b"}body{", offs[1], b',"x":"c"', 30),
        ("orders", 8, 5, 1000, b"", offs[2], b"", None),
        ("orders", 7, 3, 1000, b"x" * 300, offs[3], b"", None),
    ]
    assert {type(m) for m in msgs} == {tuple}  # BatchRow's shape as a plain tuple, C and Python
    second, third = BatchRow._make(msgs[1]), BatchRow._make(msgs[2])
    assert (second.hdr, second.exp, third.pub) == (b',"x":"c"', 30, 8)
    assert (stop, dups, unknown) == (len(body), 1, None)
    assert highest == {7: 3, 8: 5}
    assert pubs == {7: (1, 3, offs[3]), 8: (5, 5, offs[2])}
    assert origins == {3: mine, 4: mine, 5: elsewhere, 6: (501, b"tt-a", b"ny")}


@pytest.mark.parametrize("impl", INTAKES)
def test_intake_leaves_queue_events_unknown_topics_and_partial_records_to_the_caller(impl):
    first = rec(7, 1)
    event = encode_record(KIND_QUEUE_EVENT, 0, 0, 0, b"q", b"entries")
    (records, entries, _m, stop, dups, unknown, _p), highest, _o = run(impl, first + event)
    assert (stop, unknown, len(entries)) == (len(first), None, 1) and highest == {7: 1}
    # a topic not known: stops before it, nothing of it changed (its publisher not added)
    other = rec(9, 1, b"new/topic")
    out, highest, origins = run(impl, first + other + first)
    assert out[3:6] == (len(first), 0, b"new/topic") and highest == {7: 1}
    assert len(origins) == 1
    # a duplicate is dropped before its topic is looked at
    out, highest, _o = run(impl, other + first, highest={9: 4})
    assert out[3:6] == (len(other) + len(first), 1, None) and highest == {9: 4, 7: 1}
    # truncated batch: stops at the partial record
    out, _h, _o = run(impl, first + first[:-1])
    assert out[3] == len(first)
    # damaged lengths and flags: stops there, never reads past the body
    for bad in (
        b"\x05\x00\x00\x00" + first[4:],  # shorter than its own header
        first[:9] + b"\x08" + first[10:],  # an unknown flag
        first[:9] + b"\x02" + first[10:36] + b"\xff\xff" + first[38:],  # header past the end
        first[:9] + b"\x04" + first[10:],  # origin block past the end
        first[:10] + b"\xff\x00" + first[12:],  # topic past the end
    ):
        out, highest, _o = run(impl, first + bad)
        assert out[3] == len(first) and highest == {7: 1}
    with pytest.raises(ValueError):
        run(impl, first, pos=len(first) + 1)
    with pytest.raises(ValueError):
        impl(first, 0, {}, KNOWN, b"x" * 256, b"ny", 1, 0, 0, {})


@pytest.mark.parametrize("impl", SPANS)
def test_kept_span(impl):
    a, b = rec(7, 1), rec(7, 2, b"t/2")
    relayed = rec(7, 3, origin=(1, b"tt-z", b"tokyo"))
    event = encode_record(KIND_QUEUE_EVENT, 0, 0, 0, b"orders", b"e")
    ok = {b"orders": True}
    assert impl(a + a, 0, ok) == (2 * len(a), None, 2)
    assert impl(a + b + a, 0, ok) == (len(a), b"t/2", 1)
    assert impl(a + b + a, 0, {b"orders": True, b"t/2": False}) == (len(a), None, 1)
    assert impl(a + relayed, 0, ok) == (len(a), None, 1)
    assert impl(a + event, 0, ok) == (len(a), None, 1)
    assert impl(a + a[:-1], 0, ok) == (len(a), None, 1)
    assert impl(a + a, len(a), ok) == (2 * len(a), None, 1)
    assert impl(event + a, 0, ok) == (0, None, 0)
    with pytest.raises(ValueError):
        impl(a, -1, ok)


def _random_batch(r: random.Random) -> bytes:
    out = []
    for _ in range(r.randint(0, 40)):
        kind = KIND_QUEUE_EVENT if r.random() < 0.05 else KIND_MESSAGE
        topic = r.choice([b"orders", b"t/2", b"unknown", b"\xff\xfe"])
        body = bytes(r.getrandbits(8) for _ in range(r.choice([0, 1, 50, 300])))
        origin = None
        if r.random() < 0.3:
            origin = (
                r.getrandbits(64),
                r.randbytes(r.randint(0, 255)),
                r.randbytes(r.randint(0, 9)),
            )
        exp = r.choice([None, 0, 5, 0xFFFFFFFF])
        hdr = r.choice([b"", b',"x":"1"'])
        out.append(encode_record(kind, r.randint(0, 3), r.randint(0, 12), r.getrandbits(64), topic,
                                 body, exp, hdr, origin))  # fmt: skip
    data = b"".join(out)
    if data and r.random() < 0.2:
        data = data[: r.randrange(len(data))]  # truncated
    return data


@pytest.mark.skipif(_c_records is None, reason="the C accelerator is not built here")
def test_c_equals_python_on_random_batches():
    r = random.Random(14)
    for _ in range(500):
        body = _random_batch(r)
        highest = {p: r.randint(0, 6) for p in range(4) if r.random() < 0.5}
        name, group = r.randbytes(r.randint(0, 255)), r.randbytes(r.randint(0, 20))
        known = dict(KNOWN) if r.random() < 0.8 else {b"orders": "orders"}
        ts, base, first = r.getrandbits(64), r.randint(0, 1 << 30), r.randint(0, 100)
        pos = 0
        while True:
            got = []
            for impl in (replicate_records_py, _c_records):
                h, o = dict(highest), {}
                got.append((impl(body, pos, h, known, name, group, ts, base, first, o), h, o))
            assert got[0] == got[1]
            stop = got[0][0][3]
            topics = {b"orders": True, b"t/2": r.random() < 0.5}
            assert kept_span_py(body, pos, topics) == _c_span(body, pos, topics)
            if stop >= len(body) or len(body) - stop < 4:
                break
            # past the record it stopped at (a queue event, an unknown topic), as the caller
            # goes on; a partial or damaged one ends the batch
            nxt = stop + 4 + int.from_bytes(body[stop : stop + 4], "little")
            if nxt > len(body) or nxt - stop < 36:
                break
            pos = nxt


def _pipeline_batch(p):
    b = p.batch
    return (bytes(b.data), b.entries, b.msgs, b.origins or {}, b.first_seq, b.last, b.meta)


@pytest.mark.parametrize("accelerated", [False, True])
async def test_replicate_block_builds_the_batch_replicate_builds(
    tmp_path, monkeypatch, accelerated
):
    """Pipeline.replicate_block (runs through replicate_records, the rest one at a time) and
    Pipeline.replicate (a tuple per record) leave the same open batch, byte for byte: queue
    events (translated), a topic that is not recorded, duplicates within and across batches."""
    from journal.journal import Journal
    from journal.record import scan_records
    from server import pipeline_replicate
    from tests.server.test_pipeline_engine import _settle, make_pipeline

    if not accelerated:
        monkeypatch.setattr(pipeline_replicate, "replicate_records", replicate_records_py)
    elif not replicate_scan.ACCELERATED:  # pragma: no cover
        pytest.skip("the C accelerator is not built here")
    r = random.Random(7)
    journals = [Journal(str(tmp_path / n), durability="write") for n in ("a", "b")]
    try:
        pipes = [make_pipeline(j) for j in journals]
        for p in pipes:
            p.seqs.last_ts = 1 << 60  # one receive time for both (never below the last one)
            p.publish(None, 2, 4, "orders", b"here already")
        events: list[list[bytes]] = [[], []]
        for _ in range(30):
            recs = []
            for _ in range(r.randint(0, 25)):
                kind = KIND_QUEUE_EVENT if r.random() < 0.1 else KIND_MESSAGE
                topic = r.choice([b"orders", b"orders", b"t/2", b"scratch", b"\xff"])
                origin = (r.getrandbits(40), b"tt-z", b"tokyo") if r.random() < 0.3 else None
                recs.append(encode_record(kind, r.randint(1, 3), r.randint(1, 60), r.getrandbits(40),
                                          topic, r.randbytes(r.randint(0, 40)),
                                          r.choice([None, 9]), r.choice([b"", b',"x":1']), origin))  # fmt: skip
            body = b"".join(recs)
            got = []
            for i, p in enumerate(pipes):

                def translate(rec, i=i):
                    events[i].append(bytes(rec[6]))
                    return encode_record(KIND_QUEUE_EVENT, 0, 0, 0, rec[5], b"local")

                if i == 0:
                    out = p.replicate(
                        scan_records(body, 100)[0], b"tt-a", b"ny", 9, _noop, translate
                    )
                    got.append((len(scan_records(body, 100)[0]), *out))
                else:
                    got.append(p.replicate_block(body, 100, b"tt-a", b"ny", 9, _noop, translate))
            assert got[0] == got[1]
            assert _pipeline_batch(pipes[0]) == _pipeline_batch(pipes[1])
            assert pipes[0].highest == pipes[1].highest
            if r.random() < 0.3:
                for p in pipes:
                    await _settle(p)
        assert events[0] == events[1]
        for p in pipes:
            await _settle(p)
        assert list(journals[0].raw_batches()) == list(journals[1].raw_batches())
    finally:
        for j in journals:
            j.close()


def _noop(end, err):
    return None


@pytest.mark.skipif(not replicate_scan.ACCELERATED, reason="the C accelerator is not built")
def test_c_refuses_a_row_type_with_fields_it_does_not_fill():
    """A field added to BatchRow without the C filling it stops the import (configure), rather
    than rows one field short."""
    from typing import NamedTuple

    from server import _replicate

    Grown = NamedTuple("Grown", [(f, object) for f in (*BatchRow._fields, "extra")])
    Renamed = NamedTuple(
        "Renamed", [(f.replace("hdr", "header"), object) for f in BatchRow._fields]
    )
    try:
        for bad in (Grown, Renamed):
            with pytest.raises(ValueError, match="teach the C the new fields"):
                _replicate.configure(bad)
    finally:
        _replicate.configure(BatchRow)
    (_, _, msgs, *_), _, _ = run(_c_records, rec(7, 1))
    assert len(msgs[0]) == len(BatchRow._fields)
