"""Replication link frames (protocol/replication.py): golden bytes, every frame split at every
byte boundary, and malformed frames that must each fail with a named error."""

import struct

import pytest

from protocol.replication import (
    BadLinkFrame,
    Heartbeat,
    LinkDecoder,
    LinkFrameTooLarge,
    ReplAck,
    ReplBatch,
    ReplLogon,
    ReplOwners,
    encode_ack,
    encode_batch,
    encode_failure,
    encode_heartbeat,
    encode_logon,
    encode_owners,
)


def raw(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(header) + len(body)) + header + body


GOLDEN = [
    (
        encode_logon("tt-1", "ny", "tt-2"),
        raw(b'{"c":"repl_logon","name":"tt-1","group":"ny","dest":"tt-2","v":1}'),
        ReplLogon(name="tt-1", group="ny", dest="tt-2", v=1),
    ),
    (
        encode_logon("tt-1", "ny", "tt-2", "repl", "s3cret"),
        raw(
            b'{"c":"repl_logon","name":"tt-1","group":"ny","dest":"tt-2","v":1,'
            b'"user":"repl","pw":"s3cret"}'
        ),
        ReplLogon(name="tt-1", group="ny", dest="tt-2", v=1, user="repl", pw="s3cret"),
    ),
    (  # the journal's end at the logon (issue 23): the destination is synced once it has it
        encode_logon("tt-1", "ny", "tt-2", end=4096),
        raw(b'{"c":"repl_logon","name":"tt-1","group":"ny","dest":"tt-2","v":1,"end":4096}'),
        ReplLogon(name="tt-1", group="ny", dest="tt-2", v=1, end=4096),
    ),
    (
        encode_ack(123, resume=True),
        raw(b'{"c":"repl_ack","status":"success","pos":123}'),
        ReplAck(pos=123, status="success"),
    ),
    (
        encode_ack(2**64 - 1),
        raw(b'{"c":"repl_ack","pos":18446744073709551615}'),
        ReplAck(pos=2**64 - 1),
    ),
    (
        encode_failure("destination name mismatch"),
        raw(b'{"c":"repl_ack","status":"failure","reason":"destination name mismatch"}'),
        ReplAck(status="failure", reason="destination name mismatch"),
    ),
    (encode_heartbeat(), raw(b'{"c":"heartbeat"}'), Heartbeat()),
]


@pytest.mark.parametrize("encoded,expected,header", GOLDEN)
def test_golden_frames(encoded, expected, header):
    assert encoded == expected
    assert LinkDecoder().feed(encoded) == [(header, b"")]


def test_batch_golden_and_body():
    body = b"\x01\x02}{" * 10
    f = encode_batch(100, 140, body)
    assert f == raw(b'{"c":"repl_batch","from":100,"to":140}', body)
    ((h, b),) = LinkDecoder().feed(f)
    assert (h, b) == (ReplBatch(from_=100, to=140), body)
    # an all-filtered range: an empty body, the end still moves
    assert LinkDecoder().feed(encode_batch(140, 500)) == [(ReplBatch(from_=140, to=500), b"")]
    # a handoff: records of an empty range (a publisher that moved to the sender)
    f = encode_batch(500, 500, body)
    assert f == raw(b'{"c":"repl_batch","from":500,"to":500}', body)
    assert LinkDecoder().feed(f) == [(ReplBatch(from_=500, to=500), body)]


def test_owners_golden():
    f = encode_owners([(7, "alice"), ((1 << 64) - 1, 'b}"o')])
    assert f == raw(b'{"c":"repl_owners","owners":[[7,"alice"],[18446744073709551615,"b}\\"o"]]}')
    assert LinkDecoder().feed(f) == [
        (ReplOwners(owners=[(7, "alice"), ((1 << 64) - 1, 'b}"o')]), b"")
    ]
    with pytest.raises(BadLinkFrame):
        encode_owners([(1, "u")] * 1001)


def test_every_split_of_a_stream():
    stream = b"".join(g[0] for g in GOLDEN) + encode_batch(5, 9, b"abcd") + b"\x00\x00\x00\x00"
    whole = LinkDecoder().feed(stream)
    assert len(whole) == len(GOLDEN) + 1
    for cut in range(len(stream) + 1):
        d = LinkDecoder()
        got = d.feed(stream[:cut]) + d.feed(stream[cut:])
        assert got == whole, cut
        assert d.buffered == 0
    d = LinkDecoder()
    one_by_one = []
    for i in range(len(stream)):
        one_by_one += d.feed(stream[i : i + 1])
    assert one_by_one == whole


def test_a_brace_inside_a_quoted_value():
    f = raw(b'{"c":"repl_ack","status":"failure","reason":"a } b"}')
    assert LinkDecoder().feed(f) == [(ReplAck(status="failure", reason="a } b"), b"")]


BAD = [
    (raw(b'{"c":"publish","t":"x"}'), BadLinkFrame, "not a replication command"),
    (raw(b'{"c":"repl_logon","name":"a","group":"g","v":1}'), BadLinkFrame, "dest"),
    (raw(b'{"c":"repl_logon","name":"","group":"g","dest":"b","v":1}'), BadLinkFrame, "`name`"),
    (
        raw(b'{"c":"repl_logon","name":"%s","group":"g","dest":"b","v":1}' % (b"n" * 256)),
        BadLinkFrame,
        "1..255 bytes",
    ),
    (raw(b'{"c":"repl_logon","name":"a","group":"g","dest":"b","v":0}'), BadLinkFrame, "version"),
    (raw(b'{"c":"repl_logon","name":"a","group":"g","dest":"b","v":"1"}'), BadLinkFrame, "int"),
    (raw(b'{"c":"repl_logon","name":"a","group":"g","dest":"b","v":1,"x":2}'), BadLinkFrame, "x"),
    (
        raw(b'{"c":"repl_logon","name":"a","group":"g","dest":"b","v":1,"end":-1}'),
        BadLinkFrame,
        "`end` -1 is not a journal position",
    ),
    (raw(b'{"c":"repl_ack"}'), BadLinkFrame, "no `pos`"),
    (raw(b'{"c":"repl_ack","pos":-1}'), BadLinkFrame, "not a journal position"),
    (raw(b'{"c":"repl_ack","pos":18446744073709551616}'), BadLinkFrame, "pos|int"),
    (raw(b'{"c":"repl_ack","status":"maybe","pos":1}'), BadLinkFrame, "success or failure"),
    (raw(b'{"c":"repl_ack","status":"failure"}'), BadLinkFrame, "no `reason`"),
    (raw(b'{"c":"repl_batch","from":5}'), BadLinkFrame, "to"),
    (raw(b'{"c":"repl_batch","from":9,"to":5}'), BadLinkFrame, "before `from`"),
    (raw(b'{"c":"repl_owners","owners":[]}'), BadLinkFrame, "1..1000 bindings"),
    (raw(b'{"c":"repl_owners","owners":[[-1,"alice"]]}'), BadLinkFrame, "not a u64"),
    (raw(b'{"c":"repl_owners","owners":[[1,""]]}'), BadLinkFrame, "1..1024 bytes"),
    (raw(b'{"c":"repl_owners","owners":[[1,"a","b"]]}'), BadLinkFrame, "not a replication"),
    (raw(b'{"c":"repl_owners","owners":[[1,"a"]]}', b"x"), BadLinkFrame, "carries a body"),
    (raw(b'{"c":"heartbeat"}', b"x"), BadLinkFrame, "carries a body"),
    (raw(b'{"c":"repl_ack","pos":1}', b"x"), BadLinkFrame, "carries a body"),
    (raw(b"[1,2]"), BadLinkFrame, "JSON object"),
    (raw(b'{"c":"repl_ack","pos":1'), BadLinkFrame, "JSON object"),
    (raw(b'{"c":"repl_ack",pos:1}'), BadLinkFrame, "not JSON"),
    (struct.pack(">I", 64 * 1024 * 1024 + 1), LinkFrameTooLarge, "exceeds the link limit"),
]


@pytest.mark.parametrize("frame,error,words", BAD)
def test_malformed_frames_fail_with_a_named_error(frame, error, words):
    good = encode_heartbeat()
    d = LinkDecoder()
    with pytest.raises(error, match=words) as info:
        d.feed(good + frame)
    assert info.value.frames == [(Heartbeat(), b"")]
    assert d.buffered == 0


def test_encoders_refuse_what_the_decoder_would():
    with pytest.raises(BadLinkFrame):
        encode_batch(9, 5)
    with pytest.raises(BadLinkFrame):
        encode_ack(-1)
    with pytest.raises(BadLinkFrame):
        encode_logon("", "g", "b")
