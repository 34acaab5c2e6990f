"""Queue event records (journal/queue_events.py): golden bytes through the recovery parser, and
the replication wire form (to_wire / from_wire)."""

import array
import struct

import pytest

from journal.queue_events import (
    WIRE_MAGIC,
    QueueOp,
    WireEventError,
    append_owner,
    from_wire,
    iter_events,
    to_wire,
)
from journal.queue_events import apply_events as _apply_events

EV = struct.Struct("<BBHQ")


def test_single_entries_and_runs():
    body = (
        EV.pack(7, 0, 3, 100)
        + array.array("Q", [200, 300]).tobytes()  # LEASED_RUN 100,200,300
        + EV.pack(1, 0, 4, 400)  # LEASED, 4th delivery
        + EV.pack(4, 0, 1, 400)  # CANCELLED once
        + EV.pack(6, 0, 2, 100)
        + array.array("Q", [300]).tobytes()  # ACKED_RUN 100,300
        + EV.pack(3, 0, 2, 500)  # EXPIRED (max deliveries)
        + EV.pack(6, 0, 1, 600)  # a run of one
    )
    assert body[:12] == b"\x07\x00\x03\x00d\x00\x00\x00\x00\x00\x00\x00"
    done, counts = set(), {}
    _apply_events(body, done, counts)
    assert done == {100, 300, 500, 600}
    assert counts == {200: [1, 0], 400: [4, 1]}


def test_a_truncated_entry_is_ignored():
    done, counts = set(), {}
    _apply_events(EV.pack(2, 0, 0, 9) + b"\x02\x00", done, counts)
    assert done == {9} and counts == {}


# -- ownership and the replication wire form ----------------------------------------------------

WIRE = struct.Struct("<BBHQQ")


def test_owner_entry_golden_bytes_and_recovery():
    buf = bytearray()
    append_owner(buf, "tt-a", "tt-b", 1_700_000_000_000_000)
    assert bytes(buf) == (
        b"\x08\x00\x0a\x00" + struct.pack("<Q", 1_700_000_000_000_000) + b"\x04tt-a\x04tt-b"
    )
    body = bytes(buf) + EV.pack(2, 0, 0, 77)  # an entry after it is still read
    done, counts, owners = set(), {}, []
    _apply_events(body, done, counts, lambda a, b, cut: owners.append((a, b, cut)))
    assert owners == [("tt-a", "tt-b", 1_700_000_000_000_000)] and done == {77}
    got = [(op, v, list(ps), names) for op, v, ps, names in iter_events(body + body[:5])]
    assert got == [(8, 10, [1_700_000_000_000_000], ("tt-a", "tt-b")), (2, 0, [77], None)]
    _apply_events(body, set(), {})  # without a callback the entry is skipped


IDS = {100: (5, 1), 200: (5, 2), 300: (6, 9), 400: (7, 3)}


def test_to_wire_golden_bytes():
    body = (
        EV.pack(7, 0, 3, 100)
        + array.array("Q", [200, 300]).tobytes()
        + EV.pack(1, 0, 4, 400)
        + EV.pack(2, 0, 0, 999)  # a position the source cannot name: left out
    )
    buf = bytearray(body)
    append_owner(buf, "a", "b", 42)
    wire, dropped = to_wire(bytes(buf), IDS.get)
    assert dropped == 1
    assert wire == (
        WIRE_MAGIC
        + WIRE.pack(7, 0, 3, 5, 1)
        + struct.pack("<QQ", 5, 2)
        + struct.pack("<QQ", 6, 9)
        + WIRE.pack(1, 0, 4, 7, 3)
        + WIRE.pack(8, 0, 4, 42, 0)
        + b"\x01a\x01b"
    )


def test_from_wire_round_trip_and_unknown_messages_kept_aside():
    body = EV.pack(6, 0, 3, 100) + array.array("Q", [200, 300]).tobytes() + EV.pack(4, 0, 2, 400)
    buf = bytearray(body)
    append_owner(buf, "a", "b", 42)
    wire, _ = to_wire(bytes(buf), IDS.get)
    here = {(5, 1): 1100, (6, 9): 1300, (7, 3): 1400}  # (5, 2) not here yet
    local, left = from_wire(wire, lambda p, s: here.get((p, s)))
    assert local == (
        EV.pack(6, 0, 2, 1100)
        + struct.pack("<Q", 1300)
        + EV.pack(4, 0, 2, 1400)
        + EV.pack(8, 0, 4, 42)
        + b"\x01a\x01b"
    )
    assert left == WIRE_MAGIC + WIRE.pack(6, 0, 1, 5, 2)
    here[(5, 2)] = 1200
    local2, left2 = from_wire(left, lambda p, s: here.get((p, s)))
    assert local2 == EV.pack(6, 0, 1, 1200) and left2 is None
    done, counts = set(), {}
    _apply_events(local + local2, done, counts)
    assert done == {1100, 1200, 1300} and counts == {1400: [0, 2]}


@pytest.mark.parametrize(
    ("wire", "why"),
    [
        (b"TQW\x02", "magic"),
        (WIRE_MAGIC + WIRE.pack(2, 0, 0, 1, 1)[:-1], "cut"),
        (WIRE_MAGIC + WIRE.pack(9, 0, 0, 1, 1), "unknown op 9"),
        (WIRE_MAGIC + WIRE.pack(6, 0, 3, 1, 1) + struct.pack("<QQ", 1, 2), "run of 3"),
        (WIRE_MAGIC + WIRE.pack(6, 0, 0, 1, 1), "run of 0"),
        (WIRE_MAGIC + WIRE.pack(8, 0, 4, 0, 0) + b"\x05a", "OWNER payload"),
    ],
)
def test_from_wire_refuses_malformed_bodies(wire, why):
    with pytest.raises(WireEventError, match=why):
        from_wire(wire, lambda p, s: 1)


def test_every_wire_body_split_is_refused_or_whole():
    wire, _ = to_wire(EV.pack(2, 0, 0, 100) + EV.pack(3, 0, 1, 200), IDS.get)
    for cut in range(len(wire)):
        if cut in (len(WIRE_MAGIC), len(WIRE_MAGIC) + WIRE.size):
            from_wire(wire[:cut], lambda p, s: 1)  # ends between entries: a shorter body
            continue
        with pytest.raises(WireEventError):
            from_wire(wire[:cut], lambda p, s: 1)
    assert QueueOp.OWNER == 8
