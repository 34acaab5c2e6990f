"""Filters at memory speed held to the reference evaluator.

Three evaluators must give one answer: the predicate on the fully decoded body (the reference),
``match_raw`` (decodes only the fields the filter reads) and the C block scanner
(server/_filterscan.c), which answers for the bodies it can decide and hands the rest back.
Random documents (missing fields, wrong types, numbers as strings, arrays, nested objects,
unicode, escapes, duplicate keys, malformed JSON) against random filters of the shapes the
scanner takes and some it does not.
"""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest

from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record
from protocol.filters import compile_body_filter, compile_filter, compiled
from server import filter_scan as scanmod
from server.filter_scan import filter_frames, scan_py
from server.matching import Body, body_matches
from server.splice import splice_frames_py

FIELDS = ["a", "b", "qty", "s"]
VALUES = [
    "0", "1", "-3", "50", "51", "100", "7", "1152921504606846976", "1180591620717411303424",
    "1.5", "-0.0", "50.0", "2.5e1", "1E2", "1e-5", "9007199254740993",
    '"ab"', '"abc"', '""', '"b"', '"12"', '"50"', '"-1.5e3"', '"x y"', '"\\u00e9"', '"a\\"b"',
    '"caf\u00e9"', '"ab\u00e9"', "true", "false", "null", "[1, 60]", "[]", '["ab", 2]',
    '{"a": 1}', "{}", '{"b": [1, {"c": "x"}]}',
]  # fmt: skip
CONSTS = [
    "0", "1", "50", "-3", "1.5", "50.0", "100", "1180591620717411303424", "'ab'", "'abc'",
    "''", "'12'", "'50'", "'b'", "TRUE", "FALSE", "NULL", "'caf\u00e9'",
]  # fmt: skip
OPS = ["=", "!=", "<", "<=", ">", ">="]
LIKES = ["'^ab'", "'b'", "'^'", "''", "'^a.c'", "'^caf'", "'x y'"]


def random_doc(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.04:
        return rng.choice([b"", b"[1, 2]", b"5", b"null", b'"s"', b"{", b'{"a":1,}', b"nope"])
    members = []
    for _ in range(rng.randrange(0, 6)):
        key = rng.choice(FIELDS + ["pad", "q\\u0074y", "z"])
        sep = rng.choice([":", " : ", ":\n"])
        members.append(f'"{key}"{sep}{rng.choice(VALUES)}')
    text = "{" + rng.choice([",", ", "]).join(members) + "}"
    if roll > 0.97:
        text = text[:-1] + rng.choice(["", "]", "}}", ",}"])  # malformed
    elif roll > 0.95:
        text += rng.choice([" ", "\n", " x"])
    data = text.encode("utf-8")
    if rng.random() < 0.02:
        data = data.replace(b"ab", b"a\xff")  # invalid UTF-8
    return data


def random_leaf(rng: random.Random) -> str:
    f = "/" + rng.choice(FIELDS)
    kind = rng.randrange(8)
    if kind == 0:
        return f"{f} {rng.choice(OPS)} {rng.choice(CONSTS)}"
    if kind == 1:
        return f"{rng.choice(CONSTS)} {rng.choice(OPS)} {f}"
    if kind == 2:
        items = ", ".join(rng.choice(CONSTS) for _ in range(rng.randrange(1, 4)))
        return f"{f} {rng.choice(['', 'NOT '])}IN ({items})"
    if kind == 3:
        lo, hi = rng.choice(CONSTS), rng.choice(CONSTS)
        return f"{f} {rng.choice(['', 'NOT '])}BETWEEN {lo} AND {hi}"
    if kind == 4:
        return f"{f} IS {rng.choice(['', 'NOT '])}NULL"
    if kind == 5:
        return f"{f} {rng.choice(['', 'NOT '])}LIKE {rng.choice(LIKES)}"
    if kind == 6:
        return f"{f}/c = 'x'"  # a nested path: no program
    return f"{f} {rng.choice(OPS)} /{rng.choice(FIELDS)}"  # field against field: no program


def random_filter(rng: random.Random, depth: int = 0) -> str:
    if depth >= 3 or rng.random() < 0.45:
        return random_leaf(rng)
    roll = rng.random()
    if roll < 0.2:
        return f"NOT ({random_filter(rng, depth + 1)})"
    joiner = " AND " if roll < 0.6 else " OR "
    return joiner.join(f"({random_filter(rng, depth + 1)})" for _ in range(rng.randrange(2, 4)))


def reference(text: str, body: bytes) -> bool:
    """The predicate on the fully decoded body; a body that is not JSON matches nothing."""
    try:
        doc = msgspec.json.decode(body)
    except (ValueError, RecursionError):
        return False
    return bool(compile_filter(text)(doc))


def test_match_raw_agrees_with_the_reference_on_random_documents():
    rng = random.Random(15)
    for _ in range(300):
        text = random_filter(rng)
        match = compile_body_filter(text)
        for _ in range(40):
            body = random_doc(rng)
            assert match(body) == reference(text, body), (text, body)


def _positions(raw: bytes) -> list[int]:
    a = array("Q")
    a.frombytes(raw)
    return a.tolist()


@pytest.mark.skipif(not scanmod.ACCELERATED, reason="the C scanner is not built")
def test_c_scanner_agrees_with_match_raw_on_random_documents():
    rng = random.Random(1515)
    with_program = 0
    decided = 0
    for _ in range(400):
        text = random_filter(rng)
        info = compiled(compile_filter(text))
        if info is None or info.program is None:
            continue
        with_program += 1
        bodies = [random_doc(rng) for _ in range(40)]
        recs = [encode_record(KIND_MESSAGE, 1, i, i, b"t", b) for i, b in enumerate(bodies)]
        buf = b"".join(recs)
        positions = [sum(len(r) for r in recs[:i]) for i in range(len(recs))]
        hits, unsure, stop, lp, ls, at_end = scanmod.scan(buf, 0, 0, 1 << 60, b"t", info.program)
        hit_set = set(_positions(hits))
        unsure_set = set(_positions(unsure))
        assert (stop, lp, ls, at_end) == (len(buf), 1, len(bodies) - 1, False)
        for pos, body in zip(positions, bodies, strict=True):
            want = info.match_raw(body)
            assert want == reference(text, body), (text, body)
            if pos in unsure_set:
                continue
            decided += 1
            assert (pos in hit_set) == want, (text, body)
    assert with_program > 150 and decided > 3000  # the scanner really decides most of them


def test_programs_cover_the_simple_forms():
    for text in [
        "/qty > 50",
        "50 < /qty",
        "/a = 'x' AND NOT /b IN (1, 2, NULL)",
        "/s LIKE '^ab'",
        "/s NOT LIKE 'b'",
        "/a BETWEEN 1 AND 5 OR /b IS NULL",
        "/a IS NOT NULL",
    ]:
        assert compiled(compile_filter(text)).program is not None, text
    for text in ["/x/y = 1", "/a + 1 > 2", "/a = /b", "/s LIKE 'a.c'", "/flag"]:
        assert compiled(compile_filter(text)).program is None, text


def test_compiled_filter_names_fields_and_equalities():
    info = compiled(compile_filter("/sym = 'IBM'"))
    assert info.fields == frozenset({"sym"})
    assert info.equals == ("sym", "IBM")
    assert compiled(compile_filter("5 = /n")).equals == ("n", 5)
    assert compiled(compile_filter("/n > 5")).equals is None
    assert compiled(compile_filter("/a/b = 1 AND /c < 2")).fields == frozenset({"a", "c"})
    assert compiled(compile_filter("1 = 1")) is None  # constant filters need no evaluator


def _block(bodies, topics=None):
    recs = []
    for i, b in enumerate(bodies):
        topic = topics[i] if topics else b"t"
        kind = KIND_QUEUE_EVENT if topic == b"q" else KIND_MESSAGE
        extra = {"header": b',"x":1'} if i % 3 == 0 else {}
        recs.append(encode_record(kind, 9, i + 1, 100 + i, topic, b, **extra))
    return b"".join(recs)


@pytest.mark.skipif(not scanmod.ACCELERATED, reason="the C scanner is not built")
def test_c_scanner_walks_the_block_as_the_reference_on_every_cut_and_window():
    """The C walk (journal/_record.h's walk_next) stops where scan_py stops, passes the same
    last record and says at_end alike, on every partial block and window; what it decides is
    what the reference matches."""
    rng = random.Random(11)
    buf = _block([random_doc(rng) for _ in range(12)], [b"t", b"u", b"q"] * 4)
    program = compiled(compile_filter("/qty > 50")).program
    base = 500
    for cut in range(0, len(buf) + 1, 7):
        part = buf[:cut]
        for start, end in [(0, 1 << 60), (base + 200, 1 << 60), (0, base + 400), (0, base)]:
            got = scanmod.scan(part, base, start, end, b"t", program)
            want = scan_py(
                part, base, start, end, b"t", compiled(compile_filter("/qty > 50")).match_raw
            )
            assert got[2:] == want[2:], (cut, start, end)
            hits, unsure = set(_positions(got[0])), set(_positions(got[1]))
            assert hits <= set(_positions(want[0])) <= hits | unsure, (cut, start, end)


@pytest.mark.skipif(not scanmod.ACCELERATED, reason="the C scanner is not built")
def test_c_walks_refuse_a_length_that_cannot_hold_the_header_even_past_the_end():
    """No record ends at a length shorter than the header: the C walks refuse it wherever it
    is, even at or past `end`, rather than report a clean stop there."""
    from server._splice import splice_frames as c_splice

    good = encode_record(KIND_MESSAGE, 1, 1, 1, b"t", b"{}")
    short = (8).to_bytes(4, "little") + bytes(40)  # a length of 8: shorter than the header
    program = compiled(compile_filter("/qty > 50")).program
    with pytest.raises(ValueError, match=f"bad record at offset {len(good)}"):
        scanmod.scan(good + short, 0, 0, len(good), b"t", program)
    with pytest.raises(ValueError, match=f"bad record at offset {len(good)}"):
        c_splice(good + short, 0, 0, len(good), b"t", b'{"c":"p"')
    # a whole record at `end` is a clean stop
    got = scanmod.scan(good + good, 0, 0, len(good), b"t", program)
    assert got[2:] == (len(good), 1, 1, True)


@pytest.mark.parametrize("accelerated", [False, True])
def test_filter_frames_are_the_spliced_frames_of_the_matches(monkeypatch, accelerated):
    if accelerated and not scanmod.ACCELERATED:
        pytest.skip("the C scanner is not built")
    if not accelerated:
        monkeypatch.setattr(scanmod, "scan", None)
    rng = random.Random(7)
    bodies = [random_doc(rng) for _ in range(300)]
    topics = [rng.choice([b"t", b"t", b"t", b"u", b"q"]) for _ in bodies]
    buf = _block(bodies, topics)
    head = b'{"c":"p","sub_id":"s","t":"t"'
    for text in ["/qty > 50", "/s = 'ab' OR /a IS NULL", "/a/c = 1", "/s LIKE '^ab'"]:
        info = compiled(compile_filter(text))
        base, start, end = 1000, 1000 + len(buf) // 5, 1000 + len(buf) * 4 // 5
        got = filter_frames(buf, base, start, end, b"t", head, info)
        # the reference: splice_frames_py over the records that match, one at a time
        want_frames = []
        for pos, kind, pub, seq, ts, tb, body, extra in __import__(
            "journal.record", fromlist=["scan_records"]
        ).scan_records(buf, base)[0]:
            if start <= pos < end and kind == KIND_MESSAGE and tb == b"t" and reference(text, body):
                rec = encode_record(
                    kind, pub, seq, ts, tb, body, **({"header": extra[1]} if extra else {})
                )
                want_frames.append(splice_frames_py(rec, pos, 0, 1 << 60, b"t", head)[0])
        plain = splice_frames_py(buf, base, start, end, b"t", head)
        assert got[0] == b"".join(want_frames), text
        assert got[1] == len(want_frames)
        assert got[2:] == plain[2:]  # stop, last bookmark and at_end as splice_frames
        assert got[2:] == scan_py(buf, base, start, end, b"t", info.match_raw)[2:]


def test_bodies_that_are_not_json_match_nothing_and_never_raise():
    f = compile_filter("/a IS NULL")
    deep = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for body in [b"", b"{", b'{"a":"\xff"}', b'{"b":"\xed\xa0\x80"}', deep, b"[1]x"]:
        assert body_matches(f, body) is False
        assert Body(body).matches(f) is False
        assert compiled(f).match_raw(body) is False
    assert body_matches(f, b"[1]")  # JSON, not an object: no field is there


@pytest.mark.skipif(not scanmod.ACCELERATED, reason="the C scanner is not built")
def test_c_scanner_survives_mutated_bodies():
    """Bytes inserted, dropped or changed anywhere in a body (cut strings, numbers, nesting):
    the scanner never reads past the record and never decides against match_raw."""
    rng = random.Random(99)
    texts = ["/qty > 50", "/s LIKE 'b' OR /a IS NULL", "/a IN (1, 'ab', TRUE) AND NOT /b = 2.5"]
    infos = [compiled(compile_filter(t)) for t in texts]
    alphabet = b'{}[]",:.-+eE0123456789 \\tnulrfa\x00\x80\xff'
    bodies = []
    for _ in range(3000):
        body = bytearray(random_doc(rng))
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(body) + 1)
            roll = rng.random()
            if roll < 0.4:
                body[at:at] = bytes([rng.choice(alphabet)])
            elif roll < 0.7 and at < len(body):
                del body[at]
            elif at < len(body):
                body[at] = rng.choice(alphabet)
        bodies.append(bytes(body))
    recs = [encode_record(KIND_MESSAGE, 1, i, i, b"t", b) for i, b in enumerate(bodies)]
    buf = b"".join(recs)
    positions = []
    o = 0
    for r in recs:
        positions.append(o)
        o += len(r)
    for info in infos:
        hits, unsure, *_ = scanmod.scan(buf, 0, 0, 1 << 60, b"t", info.program)
        hit_set, unsure_set = set(_positions(hits)), set(_positions(unsure))
        for pos, body in zip(positions, bodies, strict=True):
            if pos not in unsure_set:
                assert (pos in hit_set) == info.match_raw(body), (info.text, body)


@pytest.mark.skipif(not scanmod.ACCELERATED, reason="the C scanner is not built")
def test_c_scanner_reads_records_with_every_optional_field():
    """Replicated records carry an origin block, some an expiration and a header fragment: the
    C walk finds their topic and body where the reference does (it once skipped the origin
    block, so a filtered replay on a replication destination missed every replicated match)."""
    options = [
        {},
        {"expiration": 30},
        {"header": b',"x":1'},
        {"origin": (123, b"tt-b", b"grp")},
        {"expiration": 5, "header": b',"y":2', "origin": (7, b"a" * 255, b"")},
        {"expiration": 9, "origin": (8, b"", b"g" * 255)},
    ]
    recs = [
        encode_record(KIND_MESSAGE, 4, i + 1, 50 + i, b"t", b'{"qty":%d}' % (40 + 5 * i), **o)
        for i, o in enumerate(options * 3)
    ]
    buf = b"".join(recs)
    info = compiled(compile_filter("/qty > 50"))
    got = scanmod.scan(buf, 1000, 0, 1 << 60, b"t", info.program)
    assert got == scan_py(buf, 1000, 0, 1 << 60, b"t", info.match_raw)
    assert len(_positions(got[0])) == sum(40 + 5 * i > 50 for i in range(len(recs)))
