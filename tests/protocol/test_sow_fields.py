"""State of the World header fields and options (docs/protocol.md §14): golden bytes in and
out, long names, ranges, and the options of the sow family (protocol/headers.py, options.py)."""

import pytest

from protocol.headers import FieldError, Header, check_fields, decode_header, encode_header
from protocol.options import InvalidOptions, SowOptions, sow_options, subscribe_options


def test_sow_fields_decode_from_short_and_long_names():
    short = decode_header(
        b'{"c":"sow","t":"prices","k":"a1","sow_keys":"a1,b2","query_id":"q7","top_n":5,'
        b'"order_by":"/px DESC","bs":10}'
    )
    long = decode_header(
        b'{"cmd":"sow","topic":"prices","sow_key":"a1","sow_keys":"a1,b2","query_id":"q7",'
        b'"top_n":"5","order_by":"/px DESC","batch_size":"10"}'
    )
    assert short == long
    assert (short.k, short.sow_keys, short.query_id, short.top_n, short.order_by, short.bs) == (
        "a1",
        "a1,b2",
        "q7",
        5,
        "/px DESC",
        10,
    )
    assert check_fields(short) is None


def test_sow_frames_encode_to_golden_bytes():
    assert encode_header(Header(c="sow", t="prices", k="a1", bm="1|2|")) == (
        b'{"c":"sow","t":"prices","bm":"1|2|","k":"a1"}'
    )
    assert encode_header(Header(c="group_begin", query_id="q7")) == (
        b'{"c":"group_begin","query_id":"q7"}'
    )
    assert encode_header(
        Header(c="ack", a="stats", cid="9", status="success", records_returned=2, topic_matches=3)
    ) == (
        b'{"c":"ack","cid":"9","a":"stats","status":"success",'
        b'"records_returned":2,"topic_matches":3}'
    )


@pytest.mark.parametrize(
    "raw,reason,words",
    [
        (b'{"c":"publish","t":"a","k":"' + b"k" * 1025 + b'"}', "bad sow key", "sow key k"),
        (b'{"c":"sow","t":"a","order_by":"' + b"o" * 4097 + b'"}', "bad order by", "order_by"),
        (b'{"c":"sow","t":"a","top_n":-1}', "bad frame", "top_n=-1 is out of range"),
        (b'{"c":"sow","t":"a","bs":2147483648}', "bad frame", "bs=2147483648"),
        (b'{"c":"sow","t":"a","query_id":"' + b"q" * 1025 + b'"}', "bad frame", "query_id"),
    ],
)
def test_out_of_range_sow_fields_are_refused(raw, reason, words):
    problem = check_fields(decode_header(raw))
    assert isinstance(problem, FieldError)
    assert problem.reason == reason and words in problem.detail


def test_sow_options():
    assert sow_options(None) == SowOptions()
    assert sow_options("skip_n=10,top_n=5,timestamp,no_sowkey,send_keys") == SowOptions(
        skip_n=10, top_n=5, timestamp=True, no_sowkey=True, send_keys=True
    )
    with pytest.raises(InvalidOptions, match="unknown option 'live' for sow"):
        sow_options("live")
    with pytest.raises(InvalidOptions, match="'skip_n' is '-1'; expected a whole number"):
        sow_options("skip_n=-1")


def test_sow_and_subscribe_options():
    opts = subscribe_options("oof,no_sowkey,top_n=3,skip_n=1,replace", "sow_and_subscribe")
    assert (opts.oof, opts.no_sowkey, opts.top_n, opts.skip_n, opts.replace) == (
        True,
        True,
        3,
        1,
        True,
    )
    assert subscribe_options("oof,send_keys,no_empties").no_empties
    with pytest.raises(InvalidOptions, match="unknown option 'top_n' for subscribe"):
        subscribe_options("top_n=3")
