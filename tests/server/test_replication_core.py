"""Replication's pieces on their own doors: the sender's filter (topics, loop prevention,
pass-through), Pipeline.replicate's dedup and origin block, and the resume point stored through
the journal's API across a restart."""

from __future__ import annotations

import asyncio
import errno

from config.model import ReplicationAddress, ReplicationDestination, TopicSpec
from journal.fileio import FaultyIO
from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record, raw_origin, scan_records
from journal.writer import PROBE_INTERVAL_ENV
from server.guard import Guard
from server.pipeline import REPL_FROM
from server.replication import U64
from server.replication.receiver import Receiver
from server.replication.sender import Filter, select
from tests.server.test_pipeline_engine import _settle, make_pipeline


def dest(pass_through=None, topics=("orders.*",)):
    return ReplicationDestination(
        name="tt-b",
        group="ny",
        sync=False,
        addresses=(ReplicationAddress(host="127.0.0.1", port=1),),
        topics=tuple(TopicSpec(name=t) for t in topics),
        pass_through=pass_through,
    )


def block():
    recs = [
        encode_record(KIND_MESSAGE, 1, 1, 10, b"orders", b"local"),
        encode_record(KIND_MESSAGE, 1, 2, 11, b"quotes", b"other topic"),
        encode_record(KIND_MESSAGE, 2, 1, 12, b"orders.x", b"from b", origin=(5, b"tt-b", b"ny")),
        encode_record(KIND_MESSAGE, 3, 1, 13, b"orders", b"from c", origin=(6, b"tt-c", b"ldn")),
        encode_record(KIND_QUEUE_EVENT, 0, 0, 14, b"orders", b"event"),
        encode_record(KIND_MESSAGE, 1, 3, 15, b"orders", b"local 2", 30, b',"x":1'),
    ]
    return recs, b"".join(recs)


def test_filter_topics_loop_prevention_and_pass_through():
    recs, buf = block()
    # no pass-through: local records on a carried topic only
    body, stop, count = select(buf, 1000, Filter(dest()), "tt-b")
    assert stop == len(buf)
    assert body == recs[0] + recs[5] and count == 2
    # pass-through of ldn: tt-c's record too; tt-b's own record never goes back to it
    body, _, count = select(buf, 1000, Filter(dest(pass_through="ldn|tokyo")), "tt-b")
    assert body == recs[0] + recs[3] + recs[5] and count == 3
    body, _, _ = select(buf, 1000, Filter(dest(pass_through=".*")), "tt-b")
    assert body == recs[0] + recs[3] + recs[5]
    # everything carried: the block as read, not a copy
    only_local = recs[0] + recs[5]
    body, _, count = select(only_local, 0, Filter(dest()), "tt-b")
    assert body == only_local and count == 2
    # a partial record at the end is left for the next read
    body, stop, _ = select(buf[:-3], 0, Filter(dest(topics=(".*",))), "tt-b")
    assert stop == len(buf) - len(recs[5])


async def test_replicate_dedups_adds_the_origin_and_stores_the_resume_point(journal):
    p = make_pipeline(journal)
    p.publish(None, 7, 2, "orders", b"here already")
    recs, buf = block()
    raw = scan_records(b"".join(recs[:4] + recs[5:]), 0)[0]
    seen = []
    stored, dups = p.replicate(raw, b"tt-a", b"ny", 5000, lambda end, err: seen.append((end, err)))
    assert (stored, dups) == (5, 0)
    again = scan_records(encode_record(KIND_MESSAGE, 7, 1, 1, b"orders", b"old"), 0)[0]
    assert p.replicate(again, b"tt-a", b"ny", 6000, lambda end, err: None) == (0, 1)
    await _settle(p)
    assert seen == [(journal.end_position, None)]
    got = [r for batch in journal.raw_batches() for r in batch]
    assert [(r[2], r[3], r[6]) for r in got] == [
        (7, 2, b"here already"),
        (1, 1, b"local"),
        (1, 2, b"other topic"),
        (2, 1, b"from b"),
        (3, 1, b"from c"),
        (1, 3, b"local 2"),
    ]
    # no origin: the source's; an origin: kept; the receive time is this instance's
    assert raw_origin(got[0][7]) is None
    assert raw_origin(got[1][7]) == (10, b"tt-a", b"ny")
    assert raw_origin(got[3][7]) == (5, b"tt-b", b"ny")
    assert raw_origin(got[4][7]) == (6, b"tt-c", b"ldn")
    assert got[5][7][:2] == (30, b',"x":1')
    assert all(r[4] >= got[0][4] for r in got)
    assert journal.index.get_meta(REPL_FROM + b"tt-a") == U64.pack(6000)
    assert p.highest[1] == 3 and p.replicated == 5 and p.replicated_duplicates == 1


async def test_resume_point_survives_a_restart(tmp_path):
    path = str(tmp_path / "journal")
    j = Journal(path, durability="write")
    p = make_pipeline(j)
    recs = scan_records(encode_record(KIND_MESSAGE, 1, 1, 10, b"orders", b"x"), 0)[0]
    p.replicate(recs, b"tt-a", b"ny", 777, lambda end, err: None)
    await _settle(p)
    j.close()
    j = Journal(path, durability="write")
    try:
        r = Receiver("tt-b", make_pipeline(j), j, Guard())
        assert r.resume_point("tt-a") == 777
        assert r.resume_point("tt-new") == 0
        # dedup state comes back from the journal too: the same record is a duplicate
        p2 = make_pipeline(j)
        assert p2.replicate(recs, b"tt-a", b"ny", 800, lambda end, err: None) == (0, 1)
        await _settle(p2)
    finally:
        j.close()
    await asyncio.sleep(0)


def test_queue_events_go_in_the_wire_form_and_never_back_to_where_they_happened():
    from journal.queue_events import WIRE_MAGIC

    qdest = dest(topics=("work-q",))
    local = encode_record(KIND_QUEUE_EVENT, 0, 0, 14, b"work-q", b"local event")
    from_b = encode_record(
        KIND_QUEUE_EVENT, 0, 0, 15, b"work-q", b"b's event", origin=(5, b"tt-b", b"ny")
    )
    from_c = encode_record(
        KIND_QUEUE_EVENT, 0, 0, 16, b"work-q", b"c's event", origin=(6, b"tt-c", b"ny")
    )
    empty = encode_record(KIND_QUEUE_EVENT, 0, 0, 17, b"work-q", b"")
    other = encode_record(KIND_QUEUE_EVENT, 0, 0, 18, b"other-q", b"not carried")
    buf = local + from_b + from_c + empty + other
    seen = []

    def translate(body: bytes) -> bytes:
        seen.append(body)
        return WIRE_MAGIC + body if body else WIRE_MAGIC  # nothing it can name: left out

    # without the queues' translation queue events are left out
    assert select(buf, 0, Filter(qdest), "tt-b") == (b"", len(buf), 0)
    body, stop, count = select(
        buf, 0, Filter(dest(topics=("work-q",), pass_through="ny")), "tt-b", translate
    )
    assert stop == len(buf) and seen == [b"local event", b"c's event", b""] and count == 2
    got = scan_records(body, 0)[0]
    assert [(r[1], r[5], r[6], raw_origin(r[7])) for r in got] == [
        (KIND_QUEUE_EVENT, b"work-q", WIRE_MAGIC + b"local event", None),
        (KIND_QUEUE_EVENT, b"work-q", WIRE_MAGIC + b"c's event", (6, b"tt-c", b"ny")),
    ]


async def test_replicated_messages_reach_the_queues_with_their_origin(journal):
    p = make_pipeline(journal)
    got = []
    p.on_deliver.append(lambda msgs, end: got.extend((m.pub, m.origin) for m in msgs))
    p.publish(None, 7, 1, "orders", b"here")
    recs, _ = block()
    raw = scan_records(recs[0] + recs[2], 0)[0]
    p.replicate(raw, b"tt-a", b"ny", 100, lambda end, err: None)
    await _settle(p)
    assert got == [(7, None), (1, (10, b"tt-a", b"ny")), (2, (5, b"tt-b", b"ny"))]


def test_the_sender_reads_compacted_segments_as_the_records_they_hold(tmp_path):
    """Compacted segments (read_block gives None there): the sender re-encodes each kept record
    to its original bytes, through the filter, and still covers every source position once."""
    from journal import maintenance as jm
    from journal import maintenance_apply as jma
    from server.replication import NullAckSink
    from server.replication.sender import Sender
    from tests.support.journal_data import all_raw, build, run_without_spark

    j = build(str(tmp_path / "j"), batches=20, per_batch=80)
    try:
        before = all_raw(j)
        req = jm.make_request(j, "compact")
        assert req is not None
        jm.write_request(j.directory, req)
        run_without_spark(req)
        assert jma.apply_result(j, req["id"])["status"] == "applied"
        assert any(s.kind == "compacted" for s in j.sealed_segments())
        for topics, want in (
            ((".*",), [r for r in before if r[1] == KIND_MESSAGE]),
            (("orders/.*",), [r for r in before if r[5].startswith(b"orders/")]),
        ):
            s = Sender(dest(topics=topics), "tt-a", "ny", j, None, NullAckSink())  # type: ignore[arg-type]
            pos, sent = j.start_position, []
            while pos < j.end_position:
                body, nxt, _ = s._read(pos)
                assert nxt > pos
                sent += scan_records(body, 0)[0]
                pos = nxt
            assert pos == j.end_position
            assert [r[1:] for r in sent] == [
                (r[1], r[2], r[3], r[4], r[5], r[6], r[7]) for r in want
            ]
    finally:
        j.close()


def test_sow_deletes_are_sent_as_stored_but_not_expirations():
    from journal.record import KIND_SOW_DELETE
    from server.sow.records import BY_EXPIRY, BY_FILTER, BY_KEYS, encode_delete

    msg = encode_record(KIND_MESSAGE, 7, 1, 5, b"orders.x", b"{}")
    by_keys = encode_record(KIND_SOW_DELETE, 0, 0, 6, b"orders.x", encode_delete(BY_KEYS, "k1"))
    by_filter = encode_record(
        KIND_SOW_DELETE, 0, 0, 6, b"orders.x", encode_delete(BY_FILTER, "1=1")
    )
    expired = encode_record(KIND_SOW_DELETE, 0, 0, 6, b"orders.x", encode_delete(BY_EXPIRY, "k1"))
    other = encode_record(KIND_SOW_DELETE, 0, 0, 6, b"elsewhere", encode_delete(BY_KEYS, "k1"))
    buf = msg + by_keys + expired + by_filter + other + msg
    body, stop, count = select(buf, 0, Filter(dest()), "tt-b")
    assert stop == len(buf)
    assert body == msg + by_keys + by_filter + msg
    assert count == 4


async def test_the_resume_point_of_a_link_batch_whose_commit_failed_is_never_written(
    tmp_path, monkeypatch
):
    """Issue 23 (seams round 79, by reading): a link batch that adds no record (all filtered or
    duplicates) parks its resume point until a batch with records carries it. When the commit
    it waited behind failed, the parked point outlived the failure and was written with the next
    link's records: the source's resume point passed records that were never stored."""
    monkeypatch.setenv(PROBE_INTERVAL_ENV, "0.05")
    io = FaultyIO(ops=["write"], errnos=[errno.ENOSPC], count=1)
    j = Journal(str(tmp_path / "j"), durability="fsync", io=io)
    try:
        p = make_pipeline(j)
        seen: list[tuple[str, BaseException | None]] = []
        from_a = scan_records(encode_record(KIND_MESSAGE, 1, 1, 10, b"orders", b"a1"), 0)[0]
        p.replicate(from_a, b"tt-a", b"ny", 100, lambda end, err: seen.append(("a1", err)))
        p.flush(inline=False)  # in flight, and it will fail
        # tt-a's next batch carries nothing for this instance (filtered at the source)
        p.replicate([], b"tt-a", b"ny", 200, lambda end, err: seen.append(("a2", err)))
        await _settle(p)
        assert [name for name, err in seen if err is not None] == ["a1", "a2"]
        for _ in range(200):
            if j.available:
                break
            await asyncio.sleep(0.01)
        # another source's records, stored once the disk is back
        from_c = scan_records(encode_record(KIND_MESSAGE, 3, 1, 11, b"orders", b"c1"), 0)[0]
        p.replicate(from_c, b"tt-c", b"ny", 50, lambda end, err: seen.append(("c1", err)))
        await _settle(p)
        assert seen[-1] == ("c1", None)
        assert [(r.publisher_id, r.seq) for r in j.scan()] == [(3, 1)]
        assert j.index.get_meta(REPL_FROM + b"tt-c") == U64.pack(50)
        assert j.index.get_meta(REPL_FROM + b"tt-a") is None  # not 200: tt-a resends from 0
    finally:
        j.close()
