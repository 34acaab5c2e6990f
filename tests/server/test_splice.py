"""Replay frames spliced from journal bytes: golden frames, and the C version byte-equal to the
pure-Python reference on every cut of a mixed block."""

import os

import pytest

from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record
from protocol.framing import FrameDecoder
from server import splice
from server.splice import splice_frames_py

IMPLS = [pytest.param(splice_frames_py, id="python")]
if splice.ACCELERATED:
    from server._splice import splice_frames as _c

    IMPLS.append(pytest.param(_c, id="c"))

HEAD = b'{"c":"p","sub_id":"s1","t":"orders"'
BASE = 5000


def block():
    recs = [
        encode_record(KIND_MESSAGE, 7, 1, 100, b"orders", b'{"px":1}'),
        encode_record(KIND_MESSAGE, 7, 2, 101, b"other", b'{"px":2}'),
        encode_record(KIND_QUEUE_EVENT, 0, 0, 102, b"orders", b"event"),
        encode_record(KIND_MESSAGE, 2**64 - 1, 10**15, 103, b"orders", b"", expiration=30),
        encode_record(KIND_MESSAGE, 9, 3, 104, b"orders", b"body}", header=b',"x":"c-1"'),
        encode_record(KIND_MESSAGE, 9, 4, 105, b"orderz", b"no", origin=(9, b"a", b"")),
        # replicated (an origin block): delivered exactly like the original
        encode_record(
            KIND_MESSAGE,
            9,
            5,
            106,
            b"orders",
            b"b" * 300,
            expiration=1,
            header=b',"k":1',
            origin=(2**64 - 1, b"tt-1", b"ny"),
        ),
    ]
    offs = []
    o = 0
    for r in recs:
        offs.append(o)
        o += len(r)
    return b"".join(recs), offs


def test_python_golden_frames():
    buf, offs = block()
    frames, sent, stop, pub, seq, at_end = splice_frames_py(buf, BASE, 0, 1 << 60, b"orders", HEAD)
    assert (sent, stop, pub, seq, at_end) == (4, len(buf), 9, 5, False)
    dec = FrameDecoder()
    got = dec.feed(frames)
    assert [b for _, b in got] == [b'{"px":1}', b"", b"body}", b"b" * 300]
    assert frames.startswith(
        b'\x00\x00\x00\x38{"c":"p","sub_id":"s1","t":"orders","bm":"7|1|"}{"px":1}'
    )
    assert b'"t":"orders","bm":"18446744073709551615|1000000000000000|"}\x00' in frames
    assert b'"t":"orders","x":"c-1","bm":"9|3|"}body}' in frames
    assert [h.bm for h, _ in got] == [
        "7|1|",
        "18446744073709551615|1000000000000000|",
        "9|3|",
        "9|5|",
    ]
    assert got[2][0].sub_id == "s1"


@pytest.mark.parametrize("impl", IMPLS)
def test_start_end_and_partial_records(impl):
    buf, offs = block()
    # start after the first record, end at the sixth: records 2..5 are gone through
    frames, sent, stop, pub, seq, at_end = impl(
        buf, BASE, BASE + offs[1], BASE + offs[5], b"orders", HEAD
    )
    assert (sent, stop, pub, seq, at_end) == (2, offs[5], 9, 3, True)
    # a cut inside a record stops before it
    frames, sent, stop, pub, seq, at_end = impl(
        buf[: offs[2] + 10], BASE, 0, 1 << 60, b"orders", HEAD
    )
    assert (sent, stop, pub, seq, at_end) == (1, offs[2], 7, 2, False)
    # nothing whole: nothing gone through
    assert impl(buf[:20], BASE, 0, 1 << 60, b"orders", HEAD) == (b"", 0, 0, None, None, False)
    assert impl(b"", BASE, 0, 1 << 60, b"orders", HEAD) == (b"", 0, 0, None, None, False)
    # end before the first record
    assert impl(buf, BASE, 0, BASE, b"orders", HEAD) == (b"", 0, 0, None, None, True)


@pytest.mark.skipif(not splice.ACCELERATED, reason="the C accelerator was not built (no compiler)")
def test_c_equals_python_on_every_cut_and_window():
    buf, offs = block()
    rnd = os.urandom(64)
    for cut in range(len(buf) + 1):
        part = buf[:cut]
        for start, end in [(0, 1 << 60), (BASE + offs[3], 1 << 60), (0, BASE + offs[4])]:
            for topic in (b"orders", b"other", b"", b"orderz"):
                args = (part, BASE, start, end, topic, HEAD)
                assert _c(*args) == splice_frames_py(*args), (cut, start, end, topic)
    assert _c(bytearray(buf), BASE, 0, 1 << 60, b"orders", rnd) == splice_frames_py(
        buf, BASE, 0, 1 << 60, b"orders", rnd
    )


@pytest.mark.skipif(not splice.ACCELERATED, reason="the C accelerator was not built (no compiler)")
def test_c_refuses_a_record_whose_fields_overrun_it():
    good = encode_record(KIND_MESSAGE, 1, 1, 1, b"orders", b"x", header=b',"x":1')
    # claim a header fragment longer than the record
    bad = bytearray(good)
    bad[36:38] = (60000).to_bytes(2, "little")
    with pytest.raises(ValueError, match="bad record at offset 0"):
        _c(bytes(bad), 0, 0, 1 << 60, b"orders", HEAD)


AT_IMPLS = [pytest.param(splice.splice_at_py, id="python")]
if splice.ACCELERATED:
    from server._splice import splice_at as _c_at

    AT_IMPLS.append(pytest.param(_c_at, id="c"))


@pytest.mark.parametrize("impl", AT_IMPLS)
def test_splice_at_golden_frames_and_bookmarks(impl):
    import array

    buf, offs = block()
    want = array.array("Q", [BASE + offs[i] for i in (0, 3, 4, 6)])
    frames, bms, n = impl(buf, BASE, want, b'{"c":"p","sub_id":"q","t":"orders"', b',"lp":"L"')
    assert n == 4
    assert bms == ["7|1|", "18446744073709551615|1000000000000000|", "9|3|", "9|5|"]
    got = FrameDecoder().feed(frames)
    assert [b for _, b in got] == [b'{"px":1}', b"", b"body}", b"b" * 300]
    assert frames.startswith(
        b'\x00\x00\x00\x40{"c":"p","sub_id":"q","t":"orders","bm":"7|1|","lp":"L"}{"px":1}'
    )
    assert b'"t":"orders","x":"c-1","bm":"9|3|","lp":"L"}body}' in frames
    # a position past the block stops the run; the ones before it are done
    short = buf[: offs[6] + 5]
    assert impl(short, BASE, want, b"{", b"")[1:] == (
        ["7|1|", "18446744073709551615|1000000000000000|", "9|3|"],
        3,
    )
    assert impl(buf, BASE + offs[1], want, b"{", b"") == (b"", [], 0)  # below the block
    with pytest.raises(ValueError, match="no message record at position"):
        impl(buf, BASE, array.array("Q", [BASE + offs[2]]), b"{", b"")
    # the output is sized for each stored byte copied once: a repeated or backward position
    # is refused, not written past the buffer
    for bad in ([offs[6], offs[6]], [offs[3], offs[0]], [offs[0], offs[0] + 1]):
        with pytest.raises(ValueError, match="positions must ascend"):
            impl(buf, BASE, array.array("Q", [BASE + o for o in bad]), b"{", b"")


@pytest.mark.skipif(not splice.ACCELERATED, reason="the C accelerator was not built (no compiler)")
def test_splice_at_c_equals_python_on_every_cut():
    import array

    buf, offs = block()
    want = array.array("Q", [BASE + offs[i] for i in (0, 1, 3, 4, 5, 6)])
    for cut in range(len(buf) + 1):
        args = (buf[:cut], BASE, want, b'{"c":"p","t":"orders"', b',"lp":"x"')
        assert _c_at(*args) == splice.splice_at_py(*args), cut
