"""encode_record refuses what the record format cannot hold, before building anything."""

import pytest

from journal.record import KIND_MESSAGE, RecordFieldError, decode_records, encode_record


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"seq": 2**64}, r"0\.\.2\^64-1"),
        ({"seq": -1}, r"0\.\.2\^64-1"),
        ({"publisher_id": 2**64}, r"0\.\.2\^64-1"),
        ({"topic": b"t" * 65536}, "at most 65535"),
        ({"header": b"," + b"x" * 65535}, "at most 65535"),
        ({"expiration": float("nan")}, "not a finite"),
        ({"expiration": float("inf")}, "not a finite"),
    ],
)
def test_fields_out_of_range(kw, words):
    args = {
        "kind": KIND_MESSAGE,
        "publisher_id": 1,
        "seq": 1,
        "ts_us": 5,
        "topic": b"t",
        "body": b"{}",
    } | kw
    with pytest.raises(RecordFieldError, match=words):
        encode_record(**args)


def test_largest_fields_round_trip():
    rec = encode_record(KIND_MESSAGE, 2**64 - 1, 2**64 - 1, 7, b"t" * 65535, b"{}", 30, b',"x":"1"')
    (r,), _ = decode_records(rec, 0, len(rec), 0, True)
    assert (r.publisher_id, r.seq, len(r.topic), r.expiration) == (2**64 - 1, 2**64 - 1, 65535, 30)
