"""Record checks on read (journal/record.py, journal/_verify.c): golden bytes, and the C and
Python versions agree on every single-byte flip of a small segment."""

import pytest

from journal import record
from journal.record import KIND_MESSAGE, encode_record, resync_py, verified_prefix_py

GOLDEN = encode_record(KIND_MESSAGE, 7, 1, 1_700_000_000_000_000, b"t", b'{"a":1}')


def test_golden_record():
    assert GOLDEN.hex() == (
        "28000000"
        "1d03c97c"
        "01"
        "00"
        "0100"
        "0700000000000000"
        "0100000000000000"
        "00401e18240a0600" + "74" + "7b2261223a317d"
    )  # length, crc, kind, flags, T, pub, seq, time, topic, body
    assert verified_prefix_py(GOLDEN) == (len(GOLDEN), -1)


def records():
    out = b""
    for i in range(1, 8):
        out += encode_record(
            KIND_MESSAGE,
            7,
            i,
            5 + i,
            b"topic",
            b"body-%d" % i,
            30 if i % 2 else None,
            b',"x":"c%d"' % i if i % 3 == 0 else b"",
            (1_700_000_000_000_000 + i, b"tt-%d" % i, b"g" * (i % 3)) if i % 2 == 0 else None,
        )
    return out


IMPLS = [(verified_prefix_py, resync_py)]
if record.VERIFY_ACCELERATED:
    from journal import _verify

    IMPLS.append((_verify.verified_prefix, _verify.resync))


@pytest.mark.parametrize(
    "prefix,resync", IMPLS, ids=[f"{i}" for i in ("python", "c")[: len(IMPLS)]]
)
def test_every_flip_is_caught_and_resync_finds_the_next_record(prefix, resync):
    buf = records()
    starts = [0]
    while starts[-1] < len(buf):
        starts.append(starts[-1] + record.record_length_at(buf, starts[-1]))
    assert prefix(buf) == (len(buf), -1)
    for at in range(len(buf)):
        bad = bytearray(buf)
        bad[at] ^= 0x41
        k = max(i for i, s in enumerate(starts) if s <= at)  # the damaged record
        stop, where = prefix(bytes(bad))
        assert stop == starts[k], at
        assert where in (starts[k], -1)
        nxt = resync(bytes(bad), starts[k] + 1)
        assert nxt == (starts[k + 1] if starts[k + 1] < len(buf) else -1), at


def test_a_partial_record_is_not_damage():
    buf = records()
    cut = buf[: len(buf) - 5]
    stop, bad = verified_prefix_py(cut)
    assert bad == -1 and stop < len(cut)


def test_c_and_python_agree_on_random_garbage():
    if not record.VERIFY_ACCELERATED:
        pytest.skip("the C accelerator is not built here")
    import random

    from journal import _verify

    rng = random.Random(5)
    for _ in range(300):
        buf = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300))) + records()
        assert _verify.verified_prefix(buf) == verified_prefix_py(buf)
        assert _verify.resync(buf, 0) == resync_py(buf, 0)
