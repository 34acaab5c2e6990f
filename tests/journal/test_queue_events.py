"""Queue event records (journal/queue_events.py): golden bytes through the recovery parser."""

import array
import struct

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
