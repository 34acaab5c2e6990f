"""A destination's queue of handed-off records (server/replication/handoff.py `Handoffs`): what
goes on the link as [pos, pos) batches, what an ack retires, what a new link sends again, and
the bound while a link is down."""

from __future__ import annotations

from journal.record import KIND_MESSAGE, encode_record, scan_records
from protocol.replication import MAX_BATCH_BODY, LinkDecoder, ReplBatch
from server.replication import handoff
from server.replication.handoff import Handoffs


def recs(n: int, size: int = 100, origin=(1, b"tt-c", b"tt-c")):
    raw = b"".join(
        encode_record(KIND_MESSAGE, 7, s, 1000 + s, b"orders", b"x" * size, origin=origin)
        for s in range(1, n + 1)
    )
    return scan_records(raw, 0)[0]


def test_sent_ahead_as_empty_range_batches_and_kept_until_an_ack_past_them():
    h = Handoffs("tt-b")
    assert h.add(recs(3), lambda r: r[3] != 2)  # the destination does not carry seq 2
    out: list[bytes] = []
    assert h.send(out.append, 500) == [len(h.pending[0][0])]
    ((hdr, body),) = LinkDecoder().feed(out[0])
    assert hdr == ReplBatch(from_=500, to=500)
    assert [r[3] for r in scan_records(body, 500)[0]] == [1, 3]
    assert h.send(out.append, 600) == [] and len(out) == 1  # not twice on one link
    h.acked(500)  # an ack that does not pass where they were sent: maybe an earlier batch's
    assert h.pending
    h.new_link()  # a new link before that: sent again
    assert h.send(out.append, 400) and len(out) == 2
    h.acked(401)
    assert not h.pending and h.size == 0


def test_large_handoffs_are_split_at_the_batch_limit():
    h = Handoffs("tt-b")
    h.add(recs(30, size=100_000), lambda r: True)
    assert len(h.pending) == 3 and all(len(b) <= MAX_BATCH_BODY for b, _ in h.pending)


def test_the_queue_is_bounded_while_a_link_is_down(monkeypatch, caplog):
    monkeypatch.setattr(handoff, "PENDING_MAX_BYTES", 250_000)
    h = Handoffs("tt-b")
    for _ in range(4):
        h.add(recs(1, size=100_000), lambda r: True)
    assert h.size <= 250_000 and len(h.pending) == 2
    assert "are not sent" in caplog.text
