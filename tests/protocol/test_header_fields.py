"""Header field checks (protocol/headers.py): types at the decoder, ranges and sizes in
check_fields, and frames the server refuses one by one (FrameDecoder(refuse_fields=True))."""

import struct
import sys

import msgspec
import pytest

from protocol.framing import FrameDecoder, FrameError
from protocol.headers import (
    _SIZED,
    MAX_COUNT,
    MAX_EXPIRATION,
    MAX_SEQ,
    FieldError,
    Header,
    check_fields,
    decode_header,
)


def frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(header) + len(body)) + header + body


@pytest.mark.parametrize(
    "raw,reason,words",
    [
        (b'{"c":"publish","t":"a","s":18446744073709551616}', "bad frame", "out of range"),
        (b'{"c":"publish","t":"a","s":0}', "bad frame", "out of range"),
        (b'{"c":"publish","t":"a","s":-1}', "bad frame", "out of range"),
        (b'{"c":"publish","t":"a","s":9223372036854775808}', "bad frame", "out of range"),
        (b'{"c":"publish","t":"a","e":"nan"}', "bad frame", "above 0 and at most"),
        (b'{"c":"publish","t":"a","e":"inf"}', "bad frame", "above 0 and at most"),
        (b'{"c":"publish","t":"a","e":-3}', "bad frame", "above 0 and at most"),
        (b'{"c":"publish","t":"a","e":0}', "bad frame", "above 0 and at most"),
        # legal JSON numbers that overflow a deadline in microseconds (issue 23, finding 9)
        (b'{"c":"publish","t":"a","e":1.7e308}', "bad frame", "(10 years)"),
        (b'{"c":"publish","t":"a","e":"1e300"}', "bad frame", "(10 years)"),
        (b'{"c":"publish","t":"a","e":315360001}', "bad frame", "(10 years)"),
        (b'{"c":"publish","t":"' + b"t" * 65536 + b'"}', "invalid topic", "longer than 65535"),
        (b'{"c":"publish","t":"a","x":"' + b"x" * 40000 + b'"}', "bad frame", "correlation id"),
        (
            b'{"c":"subscribe","t":"a","f":"' + b"f" * 70000 + b'"}',
            "bad filter",
            "filter is longer",
        ),
        (b'{"c":"subscribe","t":"a","cid":"' + b"c" * 2000 + b'"}', "bad frame", "command id"),
    ],
)
def test_out_of_range_fields_are_refused(raw, reason, words):
    problem = check_fields(decode_header(raw))
    assert isinstance(problem, FieldError)
    assert problem.reason == reason and words in problem.detail


def test_in_range_fields_pass():
    for raw in (
        b'{"c":"publish","t":"a","s":1,"e":0.5,"x":"c"}',
        b'{"c":"publish","t":"a","s":%d}' % MAX_SEQ,
        b'{"c":"publish","t":"a","s":1,"e":%d}' % MAX_EXPIRATION,
        b'{"c":"publish","t":"' + b"t" * 65535 + b'"}',
    ):
        assert check_fields(decode_header(raw)) is None


def test_a_field_of_the_wrong_type_refuses_that_command_only():
    d = FrameDecoder(refuse_fields=True)
    frames = d.feed(
        frame(b'{"c":"publish","cid":"7","t":"a","s":"abc"}', b"body")
        + frame(b'{"c":"publish","t":"a","s":2}', b"next")
    )
    (h1, bad), (h2, body2) = frames
    assert isinstance(bad, FieldError) and h1.c == "publish" and h1.cid == "7"
    assert "must be a decimal integer" in bad.detail
    assert h2.s == 2 and body2 == b"next"


# every sized text field over its limit: the reason and the whole message the client is told
OVERSIZED = [
    ("t", 65535, "invalid topic", "topic is longer than 65535 bytes"),
    ("x", 32768, "bad frame", "correlation id x is longer than 32768 bytes"),
    ("f", 65536, "bad filter", "filter is longer than 65536 bytes"),
    ("cid", 1024, "bad frame", "command id cid is longer than 1024 bytes"),
    ("sub_id", 16384, "bad frame", "sub_id is longer than 16384 bytes"),
    ("bm", 65536, "invalid bookmark", "bm is longer than 65536 bytes"),
    ("o", 4096, "invalid options", "options o are longer than 4096 bytes"),
    ("k", 1024, "bad sow key", "sow key k is longer than 1024 bytes"),
    ("sow_keys", 1048576, "bad sow key",
     "sow_keys is longer than 1048576 bytes; query or delete in parts"),
    ("query_id", 1024, "bad frame", "query_id is longer than 1024 bytes"),
    ("order_by", 4096, "bad order by", "order_by is longer than 4096 bytes"),
    ("client_name", 1024, "bad frame", "client_name and user_id are at most 1024 bytes"),
    ("user_id", 1024, "bad frame", "client_name and user_id are at most 1024 bytes"),
]  # fmt: skip


@pytest.mark.parametrize("name,limit,reason,detail", OVERSIZED)
def test_each_sized_field_is_refused_past_its_limit_with_its_message(name, limit, reason, detail):
    at_limit = msgspec.structs.replace(Header(c="x"), **{name: "é" * (limit // 2)})
    assert check_fields(at_limit) is None  # bytes are counted, not characters
    problem = check_fields(msgspec.structs.replace(Header(c="x"), **{name: "a" * (limit + 1)}))
    assert isinstance(problem, FieldError) and (problem.reason, problem.detail) == (reason, detail)


NUMERIC = ("s", "l", "matches", "records_deleted", "max_backlog", "top_n", "bs",
           "records_returned", "topic_matches")  # fmt: skip


@pytest.mark.parametrize("name", NUMERIC)
def test_a_number_in_a_string_is_taken_for_every_integer_field(name):
    # the lenient decoder (a header the typed one refuses) converts Header's integer fields
    h = decode_header(b'{"c":"publish","%s":"7","x":8}' % name.encode())
    assert getattr(h, name) == 7 and h.x == "8"
    h = decode_header(b'{"c":"publish","e":"2.5","t":5}')
    assert h.e == 2.5 and h.t == "5"


def test_the_client_side_decoder_still_treats_a_bad_field_as_a_bad_frame():
    with pytest.raises(FrameError, match="decimal integer"):
        FrameDecoder().feed(frame(b'{"c":"publish","s":"abc"}'))


@pytest.mark.parametrize(
    "raw,words",
    [
        (b'{"c":"publish","t":"a\xff\xfe"}', "not valid JSON"),
        (b'{"c":"publish","x":' + b"[" * 100000 + b"]" * 100000 + b"}", "nested"),
    ],
)
def test_invalid_utf8_and_deep_nesting_are_bad_frames(raw, words):
    with pytest.raises(FrameError, match=words):
        FrameDecoder(refuse_fields=True).feed(frame(raw))


@pytest.mark.parametrize(
    "raw,field",
    [
        (b'{"c":"publish","cid":"7","t":"a","x":{"a":1}}', "x"),
        (b'{"c":"publish","cid":"7","t":"a","x":{"a":{"b":"}"}}}', "x"),
        (b'{"c":"publish","cid":"7","t":"a","correlation_id":[1,{"a":2}]}', "correlation_id"),
        (b'{"c":"publish","cid":"7","x":["}"],"t":"a"}', "x"),
    ],
)
def test_a_nested_value_refuses_that_command_only(raw, field):
    """A header with a nested object or array is a well-formed frame: that command is refused
    (the field is named) and the frames after it are read."""
    stream = frame(raw, b"body}") + frame(b'{"c":"publish","t":"a","s":2}', b"next")
    for cut in range(len(stream) + 1):
        d = FrameDecoder(refuse_fields=True)
        frames = d.feed(stream[:cut]) + d.feed(stream[cut:])
        (h1, bad), (h2, body2) = frames
        assert isinstance(bad, FieldError) and h1.c == "publish" and h1.cid == "7"
        assert bad.reason == "bad frame"
        assert f"header field {field!r} is nested" in bad.detail
        assert h2.s == 2 and body2 == b"next"
        assert d.buffered == 0


def _profiled_check(header: Header) -> list[tuple[str, str, str]]:
    """check_fields(header), which must pass, under sys.setprofile: (event, the called
    function's name, its file) for each Python call and C call it made."""
    calls: list[tuple[str, str, str]] = []

    def record(frame, event, arg):
        if event == "call":
            calls.append((event, frame.f_code.co_name, frame.f_code.co_filename))
        elif event == "c_call":
            calls.append((event, arg.__name__, ""))

    sys.setprofile(record)
    try:
        assert check_fields(header) is None
    finally:
        sys.setprofile(None)
    return calls


def test_a_command_of_short_fields_is_checked_without_a_call_per_sized_field():
    """check_fields runs for every command that is not a plain publish (each queue ack, a
    sow_delete of bookmarks): the sized fields absent or too short to be too long cost no call
    (the size is measured only where it could pass its limit), and a long one is still refused."""
    ack = decode_header(b'{"c":"sow_delete","t":"work-q","bm":"1|2|,1|3|","cid":"7"}')
    calls = _profiled_check(ack)
    assert [
        name for event, name, file in calls if event == "call" and file.endswith("headers.py")
    ] == ["check_fields"]
    long_bm = decode_header(b'{"c":"sow_delete","t":"q","bm":"%s"}' % (b"1|2|," * 20000))
    problem = check_fields(long_bm)
    assert problem is not None and problem.reason == "invalid bookmark"


def test_a_queue_ack_is_checked_without_a_getattr_per_field():
    """A queue ack at backlog 1 is one sow_delete per message: its check fetches the sized
    fields in one call (operator.attrgetter), not a getattr per field (15 of them: the loop was
    some 175 of the 2,000 bytecodes of the server's whole ack round trip)."""
    ack = decode_header(b'{"c":"sow_delete","t":"work-q","bm":"1|2|","cid":"7"}')
    c_calls = [name for event, name, _file in _profiled_check(ack) if event == "c_call"]
    assert "getattr" not in c_calls
    assert len(c_calls) <= len(_SIZED) + 1


@pytest.mark.parametrize("name,limit,reason", [(n, lim, r) for n, lim, r, _ in _SIZED])
def test_every_sized_field_of_a_command_that_is_not_a_publish_is_checked(name, limit, reason):
    """The ack's short cut passes only fields that cannot be too long: each sized field one
    byte over its limit is still refused, with its own reason, and at its limit it passes."""
    over = msgspec.structs.replace(Header(c="sow_delete", bm="1|2|"), **{name: "é" * limit})
    problem = check_fields(over)
    assert isinstance(problem, FieldError) and problem.reason == reason
    fits = msgspec.structs.replace(Header(c="sow_delete", bm="1|2|"), **{name: "a" * limit})
    assert check_fields(fits) is None


@pytest.mark.parametrize("name", ["top_n", "bs"])
@pytest.mark.parametrize("value", [-1, MAX_COUNT + 1])
def test_counts_out_of_range_are_refused_on_any_command(name, value):
    h = msgspec.structs.replace(Header(c="sow", t="a", bm="1|2|"), **{name: value})
    problem = check_fields(h)
    assert isinstance(problem, FieldError) and f"{name}={value}" in problem.detail
