"""Golden frames, every split point, and malformed input for protocol.framing."""

import struct

import pytest

from protocol.framing import FrameDecoder, FrameError, FrameTooLarge, encode_frame, frame_bytes
from protocol.headers import Header, decode_header, encode_header


def raw(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(header) + len(body)) + header + body


GOLDEN = [
    (
        raw(b'{"c":"publish","t":"orders","s":7}', b'{"px":1}'),
        Header(c="publish", t="orders", s=7),
        b'{"px":1}',
    ),
    (
        raw(b'{"c":"logon","client_name":"pub-1","cid":"1","a":"processed"}'),
        Header(c="logon", client_name="pub-1", cid="1", a="processed"),
        b"",
    ),
    # long names and numbers as strings are normalized to short keys and ints
    (
        raw(b'{"cmd":"publish","topic":"t","seq":"12","cmd_id":5}', b"x"),
        Header(c="publish", t="t", s=12, cid="5"),
        b"x",
    ),
    # a `}` inside a quoted value does not end the header
    (
        raw(b'{"c":"subscribe","t":"a","f":"/x = \'}\'"}', b"b}"),
        Header(c="subscribe", t="a", f="/x = '}'"),
        b"b}",
    ),
    # escaped quote inside a value
    (
        raw(b'{"c":"subscribe","t":"a","f":"/x = \\"}\\""}'),
        Header(c="subscribe", t="a", f='/x = "}"'),
        b"",
    ),
    # unknown fields are ignored
    (raw(b'{"c":"heartbeat","zz":1}'), Header(c="heartbeat"), b""),
    # ... also when nested: the header ends at the brace that closes it, not the first `}`
    (
        raw(b'{"c":"heartbeat","zz":{"a":{"b":"}"}},"cid":"9"}', b"}"),
        Header(c="heartbeat", cid="9"),
        b"}",
    ),
    (raw(b'{"c":"heartbeat","zz":[{"a":1},"]}"]}'), Header(c="heartbeat"), b""),
]


@pytest.mark.parametrize("data,header,body", GOLDEN)
def test_golden(data, header, body):
    frames = FrameDecoder().feed(data)
    assert frames == [(header, body)]


def test_every_split_point():
    stream = b"".join(g[0] for g in GOLDEN) + struct.pack(">I", 0)  # plus a no-op frame
    expected = [(g[1], g[2]) for g in GOLDEN]
    for cut in range(len(stream) + 1):
        dec = FrameDecoder()
        got = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
        assert got == expected, cut
        assert dec.buffered == 0


def test_byte_at_a_time():
    stream = b"".join(g[0] for g in GOLDEN)
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert got == [(g[1], g[2]) for g in GOLDEN]


def test_roundtrip_encode():
    h = Header(c="p", t="orders", sub_id="s1", bm="12|3|", l=4)
    assert FrameDecoder().feed(encode_frame(h, b"body")) == [(h, b"body")]
    assert encode_header(Header(c="ack", s=3)) == b'{"c":"ack","s":3}'
    assert frame_bytes(b"{}", b"") == b"\x00\x00\x00\x02{}"


MALFORMED = [
    (raw(b"not json"), "JSON object"),
    (raw(b'["c","publish"]'), "JSON object"),
    (raw(b'{"t":"x"}'), "no command"),
    (raw(b'{"c":"publish","t":'), "JSON object"),
    (raw(b'{"c":"publish","s":"abc"}'), "decimal integer"),
    (raw(b'{"c":"publish","s":-1.5}'), "integer"),
    # the client's decoder (no refuse_fields): a nested value is a bad frame, said as such
    (raw(b'{"c":"publish","t":{"a":1}}'), "is nested"),
    (raw(b'{"c":"publish"'), "JSON object"),
    (raw(b"\xff\xfe{}"), "JSON object"),
]


@pytest.mark.parametrize("data,words", MALFORMED)
def test_malformed(data, words):
    with pytest.raises(FrameError) as info:
        FrameDecoder().feed(data)
    assert words in str(info.value)
    assert info.value.reason == "bad frame"


def test_good_frames_before_a_bad_one_are_returned():
    good = raw(b'{"c":"heartbeat"}')
    with pytest.raises(FrameError) as info:
        FrameDecoder().feed(good + raw(b"garbage"))
    assert info.value.frames == [(Header(c="heartbeat"), b"")]


def test_oversize_refused_from_prefix_alone():
    dec = FrameDecoder(max_size=1000)
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(struct.pack(">I", 1001))
    assert "exceeds MaxMessageSize 1000" in str(info.value)
    assert "raise <MaxMessageSize>" in str(info.value)


def test_partial_frame_is_bounded_by_max():
    dec = FrameDecoder(max_size=100)
    dec.feed(raw(b'{"c":"publish"}', b"x" * 50)[:40])
    assert dec.buffered == 40


def test_decode_header_direct():
    assert decode_header(b'{"c":"ack","status":"success","s":"9"}') == Header(
        c="ack", status="success", s=9
    )
