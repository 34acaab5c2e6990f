"""The origin block (journal/record.py, flag bit 2): golden bytes, round trips through every
reader (decode_records, scan_records, record_columns, the C and Python checks), and the limits."""

import pytest

from journal import record
from journal.record import (
    FLAG_ORIGIN,
    KIND_MESSAGE,
    Origin,
    RecordFieldError,
    decode_records,
    encode_record,
    raw_origin,
    record_columns,
    record_offsets,
    scan_records,
    verified_prefix_py,
)

ORIGIN = (1_700_000_000_000_001, b"tt-1", b"ny")
GOLDEN = encode_record(KIND_MESSAGE, 7, 1, 1_700_000_000_000_000, b"t", b'{"a":1}', origin=ORIGIN)


def test_golden_record_with_origin():
    assert GOLDEN.hex() == (
        "38000000"
        + GOLDEN[4:8].hex()
        + "01"
        + "04"
        + "0100"
        + "0700000000000000"
        + "0100000000000000"
        + "00401e18240a0600"
        + "01401e18240a0600"  # origin receive time
        + "04"
        + "74742d31"  # N, "tt-1"
        + "02"
        + "6e79"  # G, "ny"
        + "74"
        + "7b2261223a317d"
    )  # length, crc, kind, flags, T, pub, seq, time, [origin], topic, body
    assert GOLDEN[4:8].hex() == "c4898101"
    assert verified_prefix_py(GOLDEN) == (len(GOLDEN), -1)


def test_all_optional_fields_in_their_order():
    rec = encode_record(KIND_MESSAGE, 7, 1, 5, b"t", b"B", 30, b',"x":1', (6, b"", b""))
    # [expiration] [header fragment] [origin] topic body
    assert rec[9] == 7
    assert rec[36:] == (
        (30).to_bytes(4, "little")
        + (6).to_bytes(2, "little")
        + b',"x":1'
        + (6).to_bytes(8, "little")
        + b"\x00\x00"
        + b"t"
        + b"B"
    )


@pytest.mark.parametrize("exp,hdr", [(None, b""), (30, b""), (None, b',"x":1'), (5, b',"y":2')])
def test_round_trip_through_every_reader(exp, hdr):
    recs = [
        encode_record(KIND_MESSAGE, 7, 1, 10, b"orders", b"one", exp, hdr),
        encode_record(KIND_MESSAGE, 8, 2, 11, b"orders", b"two", exp, hdr, ORIGIN),
        encode_record(KIND_MESSAGE, 9, 3, 12, b"x", b"", None, b"", (0, b"n" * 255, b"g" * 255)),
    ]
    buf = b"".join(recs)
    decoded, stop = decode_records(buf, 0, len(buf), 100, True)
    assert stop == len(buf)
    assert [r.origin for r in decoded] == [None, Origin(*ORIGIN), Origin(0, b"n" * 255, b"g" * 255)]
    assert [(r.topic, r.body, r.expiration, r.header) for r in decoded[:2]] == [
        ("orders", b"one", exp, hdr),
        ("orders", b"two", exp, hdr),
    ]
    raw, _ = scan_records(buf, 100)
    assert [(r[5], r[6]) for r in raw] == [(b"orders", b"one"), (b"orders", b"two"), (b"x", b"")]
    assert raw[1][7] == (exp, hdr, ORIGIN)
    assert raw[0][7] == (None if exp is None and not hdr else (exp, hdr))
    assert [raw_origin(r[7]) for r in raw] == [None, ORIGIN, (0, b"n" * 255, b"g" * 255)]
    offs, stop = record_offsets(buf)
    cols = record_columns(buf, offs, stop)
    topics = [buf[a:b] for a, b in zip(cols["topic_start"], cols["topic_end"], strict=True)]
    assert topics == [b"orders", b"orders", b"x"]
    assert [buf[a:b] for a, b in zip(cols["topic_end"], cols["body_end"], strict=True)] == [
        b"one",
        b"two",
        b"",
    ]
    assert list(cols["flags"] & FLAG_ORIGIN) == [0, 4, 4]
    assert verified_prefix_py(buf) == (len(buf), -1)
    if record.VERIFY_ACCELERATED:
        assert record.verified_prefix(buf) == (len(buf), -1)


@pytest.mark.parametrize(
    "origin,words",
    [
        ((1, b"n" * 256, b""), "at most 255"),
        ((1, b"", b"g" * 256), "at most 255"),
        ((-1, b"a", b"b"), "origin time"),
        ((2**64, b"a", b"b"), "origin time"),
    ],
)
def test_origin_fields_out_of_range(origin, words):
    with pytest.raises(RecordFieldError, match=words):
        encode_record(KIND_MESSAGE, 1, 1, 1, b"t", b"", origin=origin)


def test_an_origin_block_running_past_the_record_is_damage():
    good = encode_record(KIND_MESSAGE, 1, 1, 1, b"t", b"body", origin=(1, b"ab", b"cd"))
    for at, value in ((36 + 8, 200), (36 + 11, 200)):  # N, then G, claim more than is there
        bad = bytearray(good)
        bad[at] = value
        import zlib

        bad[4:8] = zlib.crc32(bytes(bad[8:])).to_bytes(4, "little")  # the crc is right
        assert verified_prefix_py(bytes(bad)) == (0, 0)
        if record.VERIFY_ACCELERATED:
            assert record.verified_prefix(bytes(bad)) == (0, 0)
    unknown = bytearray(good)
    unknown[9] |= 8
    assert verified_prefix_py(bytes(unknown)) == (0, 0)
