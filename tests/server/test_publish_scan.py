"""The publish fast path (server/publish_scan.py, server/_publish.c): golden records, the frames
it leaves to the ordinary path, the C version equal to the pure-Python reference on random
input, and a session that stores the same journal and sends the same acks with it, without the
C accelerator, and without either."""

from __future__ import annotations

import json
import random
import struct

import pytest

from journal.record import KIND_MESSAGE, encode_record
from protocol.framing import RAW_RUN, FrameDecoder, FrameError, RawFrames, expand, frame_bytes
from server import publish_scan
from server.batch_row import BatchRow
from server.publish_scan import publish_records_py, publish_span_py
from server.sow.keys import KeyMaker, k_fragment

RECORDS = [pytest.param(publish_records_py, id="python")]
SPANS = [pytest.param(publish_span_py, id="python")]
if publish_scan.ACCELERATED:
    from server._publish import publish_records as _c_records
    from server._publish import publish_span as _c_span

    RECORDS.append(pytest.param(_c_records, id="c"))
    SPANS.append(pytest.param(_c_span, id="c"))
else:  # pragma: no cover - a build without a compiler
    _c_records = _c_span = None

KNOWN = {b"orders": "orders", b"t/2": "t/2"}


def pub(seq: int, topic: bytes = b"orders", body: bytes = b'{"px":1}', extra: bytes = b"") -> bytes:
    return frame_bytes(b'{"c":"publish","t":"%s","s":%d%s}' % (topic, seq, extra), body)


@pytest.mark.parametrize("impl", RECORDS)
def test_golden_records_entries_and_rows(impl):
    raw = (
        pub(1)
        + frame_bytes(b'{"c":"publish","s":2,"cid":"k}","a":"persisted","t":"t/2"}', b"}body{")
        + pub(3, body=b"")
        + frame_bytes(b'{"t":"orders","s":9223372036854775807,"c":"publish"}', b"x" * 300)
    )
    records, entries, msgs, stop, highest, asked, unknown = impl(raw, 0, 7, 1000, 0, KNOWN, 50)
    want = [
        encode_record(KIND_MESSAGE, 7, 1, 1000, b"orders", b'{"px":1}'),
        encode_record(KIND_MESSAGE, 7, 2, 1000, b"t/2", b"}body{"),
        encode_record(KIND_MESSAGE, 7, 3, 1000, b"orders", b""),
        encode_record(KIND_MESSAGE, 7, (1 << 63) - 1, 1000, b"orders", b"x" * 300),
    ]
    assert records == b"".join(want)
    offs = [50 + sum(len(r) for r in want[:i]) for i in range(4)]
    seqs = [1, 2, 3, (1 << 63) - 1]
    assert entries == [(7, s, 1000, o) for s, o in zip(seqs, offs, strict=True)]
    bodies = [b'{"px":1}', b"}body{", b"", b"x" * 300]
    topics = ["orders", "t/2", "orders", "orders"]
    assert msgs == [
        (t, 7, s, 1000, b, o, b"", None)
        for t, s, b, o in zip(topics, seqs, bodies, offs, strict=True)
    ]
    assert {type(m) for m in msgs} == {tuple}  # BatchRow's shape as a plain tuple, C and Python
    named = [BatchRow._make(m) for m in msgs]
    assert [(m.topic, m.seq, m.offset) for m in named] == list(zip(topics, seqs, offs, strict=True))
    assert (stop, highest, asked, unknown) == (len(raw), (1 << 63) - 1, True, None)


@pytest.mark.skipif(not publish_scan.ACCELERATED, reason="the C accelerator is not built")
def test_c_refuses_a_row_type_with_fields_it_does_not_fill():
    """A field added to BatchRow without the C filling it stops the import (configure), rather
    than rows one field short."""
    from typing import NamedTuple

    from protocol.headers import MAX_CID_BYTES, MAX_SEQ, MAX_TOPIC_BYTES
    from server import _publish

    Grown = NamedTuple("Grown", [(f, object) for f in (*BatchRow._fields, "extra")])
    args = (MAX_TOPIC_BYTES, MAX_CID_BYTES, MAX_SEQ, publish_scan._ACK, publish_scan.MEMBERS)
    try:
        with pytest.raises(ValueError, match="teach the C the new fields"):
            _publish.configure(*args, Grown)
        with pytest.raises(TypeError, match="NamedTuple"):
            _publish.configure(*args, dict)
    finally:
        _publish.configure(*args, BatchRow)
    assert len(_c_records(pub(1), 0, 7, 1000, 0, KNOWN, 0)[2][0]) == len(BatchRow._fields)


# headers the fast path leaves to the ordinary path (each at the stop)
UNUSUAL = [
    b'{"c":"publish","t":"orders","s":5,"x":"corr"}',  # a member it does not take
    b'{"c":"publish","t":"orders","s":5,"e":10}',
    b'{"c":"publish","t":"orders","s":5,"a":"processed"}',
    b'{"c":"publish","t":"orders","s":5,"a":"persisted,processed"}',
    b'{"c":"publish", "t":"orders","s":5}',  # white space
    b'{"c":"publish","t":"ord\\u0065rs","s":5}',  # an escape
    b'{"c":"publish","t":"\xc3\xa9t\xc3\xa9","s":5}',  # not ASCII
    b'{"c":"publish","t":"orders","s":"5"}',  # a number as a string
    b'{"c":"publish","t":"orders","s":05}',
    b'{"c":"publish","t":"orders","s":5.0}',
    b'{"c":"publish","t":"orders","s":0}',
    b'{"c":"publish","t":"orders","s":9223372036854775808}',
    b'{"c":"publish","t":"orders","s":12345678901234567890}',
    b'{"c":"publish","t":"orders"}',  # no sequence
    b'{"c":"publish","s":5}',
    b'{"c":"publish","t":"","s":5}',
    b'{"c":"publish","t":"orders","s":5,"t":"orders"}',  # twice
    b'{"c":"publish","t":"orders","s":5,"cid":"' + b"k" * 1025 + b'"}',
    b'{"c":"publishx","t":"orders","s":5}',
    b'{"c":"publish","t":"orders","s":5',  # no closing brace in the frame
    b'{"c":"publish","t":"orders","s":5,}',
    b'{"c":"publish","t":"orders","s":4}',  # a duplicate of the one before
    b'{"c":"publish","t":"scratch","s":5}',  # a topic not in `known`
]


@pytest.mark.parametrize("impl", RECORDS)
@pytest.mark.parametrize("header", UNUSUAL)
def test_the_first_unusual_frame_stops_the_walk(impl, header):
    raw = pub(3) + pub(4) + frame_bytes(header, b"body") + pub(6)
    records, entries, _msgs, stop, highest, _asked, unknown = impl(raw, 0, 7, 1, 0, KNOWN, 0)
    assert [e[1] for e in entries] == [3, 4]
    assert stop == len(pub(3) + pub(4))
    assert highest == 4
    assert unknown == (b"scratch" if b"scratch" in header else None)
    # from the stop on, nothing is taken: that frame is the ordinary path's
    assert impl(raw, stop, 7, 1, 4, KNOWN, 0)[3] == stop


@pytest.mark.parametrize("impl", RECORDS)
def test_partial_frames_and_the_highest_sequence(impl):
    raw = pub(10) + pub(11)
    got = impl(raw[:-1], 0, 7, 1, 0, KNOWN, 0)
    assert (len(got[1]), got[3]) == (1, len(pub(10)))
    got = impl(raw, 0, 7, 1, 10, KNOWN, 0)  # 10 is stored already
    assert (len(got[1]), got[3], got[4]) == (0, 0, 10)
    assert impl(b"", 0, 7, 1, 0, KNOWN, 0)[3:] == (0, 0, False, None)


@pytest.mark.parametrize("span", SPANS)
def test_span_of_publish_frames(span):
    a, b = pub(1), pub(2)
    other = frame_bytes(b'{"c":"subscribe","t":"orders"}')
    assert span(a + b + other + a, 0, 1 << 20) == len(a + b)
    assert span(a + b + other, len(a + b), 1 << 20) == len(a + b)
    assert span(a + b[:-1], 0, 1 << 20) == len(a)  # whole frames only
    assert span(a + b, 0, len(a) - 5) == 0  # above the frame limit: the decoder refuses it
    assert span(b"\0\0\0\0" + a, 0, 1 << 20) == 0  # a no-op frame is the decoder's


def _random_frame(rng: random.Random, seq: int) -> bytes:
    topic = rng.choice([b"orders", b"t/2", b"scratch", b"o}r", b"x" * rng.randint(1, 40)])
    members = [b'"c":"publish"', b'"t":"%s"' % topic, b'"s":%d' % seq]
    if rng.random() < 0.3:
        members.append(b'"a":"persisted"')
    if rng.random() < 0.3:
        members.append(b'"cid":"%d"' % rng.randint(0, 99))
    rng.shuffle(members)
    header = b"{" + b",".join(members) + b"}"
    if rng.random() < 0.1:  # a damaged byte somewhere
        i = rng.randrange(len(header))
        header = header[:i] + bytes([rng.randrange(256)]) + header[i + 1 :]
    body = rng.randbytes(rng.choice([0, 1, 10, 100, 1000]))
    return frame_bytes(header, body)


@pytest.mark.skipif(not publish_scan.ACCELERATED, reason="no C accelerator built")
def test_c_equals_python_on_random_runs():
    rng = random.Random(15)
    for _ in range(300):
        seq = rng.randint(1, 5)
        frames = []
        for _ in range(rng.randint(0, 30)):
            seq += rng.choice([1, 1, 1, 2, 0, -1])
            frames.append(_random_frame(rng, max(seq, 0)))
        raw = b"".join(frames)
        raw = raw[: rng.randint(len(raw) // 2, len(raw))] if rng.random() < 0.3 else raw
        known = dict(KNOWN, **({"xx": "xx"} if rng.random() < 0.5 else {}))
        known = {k.encode() if isinstance(k, str) else k: v for k, v in known.items()}
        highest = rng.randint(0, 3)
        pos = 0
        while True:
            want = publish_records_py(raw, pos, 9, 77, highest, known, len(raw))
            assert _c_records(raw, pos, 9, 77, highest, known, len(raw)) == want
            assert _c_span(raw, pos, 2000) == publish_span_py(raw, pos, 2000)
            if want[3] >= len(raw) or len(raw) - want[3] < 4:
                break
            (length,) = struct.unpack_from(">I", raw, want[3])
            pos = want[3] + 4 + length  # past the frame it left, as the session does
            highest = want[4]
            if pos > len(raw):
                break


# -- SOW topics: frames keyed in the scan (server/sow/keys.py) --------------------------------

SOW_MAKER = KeyMaker(("/sym", "/venue/id"))
SOW_KNOWN = {b"px": ("px", SOW_MAKER.steps, SOW_MAKER), b"orders": "orders"}


@pytest.mark.parametrize("impl", RECORDS)
def test_golden_sow_records_carry_their_key_fragment(impl):
    bodies = [
        b'{"sym":"IBM","venue":{"id":7},"px":1.5}',
        b' { "venue" : { "id" : -12 } , "sym" : "\xc3\xa9" , "n" : [1, {"a": "\\n"}] } ',
        b'{"sym":true,"venue":{"id":123456789012345678901234567890}}',
    ]
    raw = pub(1, b"px", bodies[0]) + pub(2, b"orders") + pub(3, b"px", bodies[1])
    raw += pub(4, b"px", bodies[2])
    records, entries, msgs, stop, highest, _asked, unknown = impl(raw, 0, 7, 1000, 0, SOW_KNOWN, 0)
    # the key: base64url of the JSON array of the values, unpadded (golden: ["IBM",7])
    k1 = b',"k":"WyJJQk0iLDdd"'
    assert k1 == k_fragment(SOW_MAKER.key(bodies[0], None))
    hdrs = [k1, b"", *(k_fragment(SOW_MAKER.key(b, None)) for b in bodies[1:])]
    assert hdrs[2] == b',"k":"WyLDqSIsLTEyXQ"'  # ["é",-12]
    want = [
        encode_record(KIND_MESSAGE, 7, 1, 1000, b"px", bodies[0], header=hdrs[0]),
        encode_record(KIND_MESSAGE, 7, 2, 1000, b"orders", b'{"px":1}'),
        encode_record(KIND_MESSAGE, 7, 3, 1000, b"px", bodies[1], header=hdrs[2]),
        encode_record(KIND_MESSAGE, 7, 4, 1000, b"px", bodies[2], header=hdrs[3]),
    ]
    assert records == b"".join(want)
    assert [m[6] for m in msgs] == hdrs
    assert [m[0] for m in msgs] == ["px", "orders", "px", "px"]
    assert [e[3] for e in entries] == [sum(len(r) for r in want[:i]) for i in range(4)]
    assert (stop, highest, unknown) == (len(raw), 4, None)


# bodies of a SOW publish the scan leaves to the ordinary path (which keys or refuses them);
# the first group the C scan leaves although KeyMaker keys them (its text is not the key's)
SOW_ORDINARY = [
    b'{"sym":-0,"venue":{"id":1}}',  # decoded as 0
    b'{"sym":1.5,"venue":{"id":1}}',  # a float
    b'{"sym":1e3,"venue":{"id":1}}',
    b'{"sym":"a\\"b","venue":{"id":1}}',  # an escape in the key value
    b'{"\\u0073ym":"A","venue":{"id":1}}',  # an escaped member name
    b'{"sym":"A","venue":{"id":1},"sym":"B"}',  # a duplicate: the decoder keeps the last
    b'{"sym":"A","venue":{"id":1},"n":1e5}',  # an exponent anywhere
]
SOW_REFUSED = [
    b'{"sym":"A"}',  # no value at /venue/id
    b'{"sym":null,"venue":{"id":1}}',
    b'{"sym":[1],"venue":{"id":1}}',
    b'{"sym":"A","venue":{"id":{}}}',
    b'{"sym":"A","venue":{"id":1},"venue":5}',  # the last venue has no id
    b'{"sym":"A","venue":{"id":1}} x',  # not JSON
    b'{"sym":"A","venue":{"id":1},"s":"\\ud800"}',
    b'{"sym":"A","venue":{"id":1},"s":"\xff"}',
    b'{"sym":"A","venue":{"id":01}}',
    b"[1]",
    b"",
]


@pytest.mark.parametrize("impl", RECORDS)
@pytest.mark.parametrize("body", SOW_ORDINARY + SOW_REFUSED)
def test_a_sow_body_without_a_scanned_key_stops_the_walk(impl, body):
    raw = pub(1, b"px", b'{"sym":"A","venue":{"id":1}}') + pub(2, b"px", body) + pub(3, b"px")
    got = impl(raw, 0, 7, 1, 0, SOW_KNOWN, 0)
    refused = body in SOW_REFUSED
    if impl is publish_records_py and not refused:
        assert [e[1] for e in got[1]] == [1, 2]  # the reference keys what KeyMaker keys
        assert got[2][1][6] == k_fragment(SOW_MAKER.key(body, None))
    else:
        assert [e[1] for e in got[1]] == [1]
        assert got[3] == len(pub(1, b"px", b'{"sym":"A","venue":{"id":1}}'))
        assert got[6] is None


def _random_json(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 3 and r < 0.25:
        return {
            rng.choice(["sym", "venue", "id", "x", "é"]): _random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 4))
        }
    if depth < 3 and r < 0.35:
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice([None, True, False, 0, -7, 10**20, 1.25, "A", "é", 'q"', "\\", "\n"])


@pytest.mark.skipif(not publish_scan.ACCELERATED, reason="no C accelerator built")
def test_c_keys_a_subset_of_python_with_the_same_bytes():
    rng = random.Random(25)
    took = 0
    for _ in range(3000):
        doc = _random_json(rng)
        if rng.random() < 0.7 and isinstance(doc, dict):
            doc["sym"] = rng.choice([1, "A", True, "é", -3, 2.5, None])
            doc["venue"] = {"id": rng.choice([7, "v", False, 0])}
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 1]))
        body = text.encode()
        if rng.random() < 0.05:  # a damaged byte
            i = rng.randrange(len(body) or 1)
            body = body[:i] + bytes([rng.randrange(256)]) + body[i + 1 :]
        raw = pub(1, b"px", body)
        c = _c_records(raw, 0, 7, 1, 0, SOW_KNOWN, 0)
        py = publish_records_py(raw, 0, 7, 1, 0, SOW_KNOWN, 0)
        if c[1]:  # what C takes, Python takes, to the byte
            took += 1
            assert c == py
        else:
            assert c[3] == 0 and c[6] is None
    assert took > 200  # the generator makes plenty the C scan keys


@pytest.mark.skipif(not publish_scan.ACCELERATED, reason="no C accelerator built")
@pytest.mark.parametrize("member", ["sym", "pad"])
def test_c_strings_with_one_unusual_byte_at_every_offset(member):
    """The C key scan steps over 8 plain string bytes at a time (plain8 in server/_sowkey.h):
    one byte that is not plain text (a quote or backslash escape, a control character, UTF-8,
    a byte that is not UTF-8, DEL) at every offset of a long string, in the key and in another
    member, is keyed as the Python path keys it, or left to it; never taken wrongly."""
    unusual = {
        b'\\"': member == "pad",  # an escape: fine in a member, not in a scanned key value
        b"\\\\": member == "pad",
        b"\\u00e9": member == "pad",
        b"\x01": False,  # a raw control character: not JSON
        b"\x1f": False,
        "é".encode(): True,
        "€".encode(): True,
        b"\xff": False,  # not UTF-8
        b"\xc3": False,  # a cut UTF-8 sequence
        b"\x7f": True,
        b" ": True,
        b"~": True,
    }
    for special, taken in unusual.items():
        for at in range(0, 26):
            text = b"a" * at + special + b"b" * (25 - at)
            values = {"sym": b'"A"', "pad": b'"z"'}
            values[member] = b'"' + text + b'"'
            body = b'{"sym":%s,"venue":{"id":1},"pad":%s}' % (values["sym"], values["pad"])
            raw = pub(1, b"px", body)
            c = _c_records(raw, 0, 7, 1, 0, SOW_KNOWN, 0)
            assert bool(c[1]) == taken, (special, at)
            if taken:
                assert c == publish_records_py(raw, 0, 7, 1, 0, SOW_KNOWN, 0), (special, at)


def test_decoder_runs_expand_to_the_frames_at_every_split():
    stream = (
        pub(1)
        + frame_bytes(b'{"c":"sow_delete","t":"orders"}')
        + pub(2)
        + pub(3, extra=b',"x":"y"')
        + frame_bytes(b"")[:4]
        + pub(4)
    )
    want = FrameDecoder(refuse_fields=True).feed(stream)
    for cut in range(len(stream) + 1):
        dec = FrameDecoder(refuse_fields=True, group=publish_span_py)
        got = []
        for item in dec.feed(stream[:cut]) + dec.feed(stream[cut:]):
            if item[0] is RAW_RUN:
                assert type(item[1]) is RawFrames
                got += expand(item[1].data)
            else:
                got.append(item)
        assert got == want, cut


STREAM = [
    pub(1, extra=b',"a":"persisted"'),
    pub(2),
    pub(2),  # a duplicate
    pub(3, topic=b"scratch"),  # not recorded: delivered, not stored
    pub(4, topic=b"t/.*", extra=b',"cid":"bad","a":"persisted"'),  # a pattern: refused
    pub(5, extra=b',"x":"corr-1"'),
    frame_bytes(b'{"c":"publish","t":"orders","s":6,"a":"processed","cid":"p6"}', b"six"),
    pub(7, topic=b"t/2"),
    pub(8, extra=b',"e":30'),
    frame_bytes(b'{"c":"publish","t":"orders","s":"9"}', b"nine"),
    *(pub(s, topic=b"orders" if s % 3 else b"t/2") for s in range(10, 60)),
    frame_bytes(b'{"c":"publish","t":"orders","s":60,"s":61}', b"twice"),
    frame_bytes(b'{"c":"publish","t":"orders","s":7}', b"old"),
    pub(62, extra=b',"cid":"c62"'),
]


async def _publish_through(core, group, cut: int) -> tuple[list, list, list]:
    """STREAM from one publisher read in pieces of `cut` bytes: the acks it got, what a
    subscriber to every topic got, and the journal's records (time left out)."""
    sub = core.client("sub")
    sub.send("subscribe", t=".*", sub_id="all")
    sub.take()
    c = core.client("p")
    dec = FrameDecoder(1 << 20, refuse_fields=True, group=group)
    data = b"".join(STREAM)
    for i in range(0, len(data), cut):
        c.session.receive(dec.feed(data[i : i + cut]))
        c.out.flush()
        await core.settle()
    await core.settle()
    sub.out.flush()
    acks = [f.header for f in c.take()]
    got = [(f.raw_header, f.body) for f in sub.take()]
    recs = [r._replace(timestamp_us=0, position=0) for r in core.journal.records()]
    return acks, got, recs


@pytest.mark.parametrize("cut", [7, 300, 1 << 20])
async def test_a_session_stores_and_acks_the_same_with_and_without_the_fast_path(
    make_core, monkeypatch, cut
):
    topics = ("orders", "t/.*")  # scratch is not recorded
    plain = await _publish_through(make_core(sub="plain", topics=topics), None, cut)
    assert plain[0] and len(plain[2]) > 50  # the stream did store and ack
    fast = await _publish_through(
        make_core(sub="fast", topics=topics), publish_scan.publish_span, cut
    )
    assert fast == plain
    # the accelerator disabled: the pure-Python reference, as a server without a compiler runs
    monkeypatch.setattr("server.pipeline_publish.publish_records", publish_records_py)
    pure = await _publish_through(make_core(sub="pure", topics=topics), publish_span_py, cut)
    assert pure == plain


@pytest.mark.parametrize("group", [None, publish_span_py], ids=["ordinary", "fast"])
async def test_a_header_that_is_not_json_in_a_run_closes_as_before(make_core, group):
    """A frame that starts like a publish but does not decode: the publishes before it are
    stored, it gets the `bad frame` failure and the connection closes; nothing after it is
    handled."""
    core = make_core(sub="x" if group is None else "y")
    c = core.client("p")
    dec = FrameDecoder(1 << 20, refuse_fields=True, group=group)
    data = pub(1) + frame_bytes(b'{"c":"publish","t":"orders","s":2,}', b"x") + pub(3)
    try:
        got = dec.feed(data)
        error = None
    except FrameError as exc:  # the ordinary decoder refuses it while decoding
        got, error = exc.frames, exc
    c.session.receive(got)
    if error is not None:
        c.session.bad_input(error)
    c.out.flush()
    await core.settle()
    (ack,) = c.take()
    assert (ack["status"], ack["reason"]) == ("failure", "bad frame")
    assert c.closes == ["bad frame"]
    assert [r.seq for r in core.journal.records()] == [1]
