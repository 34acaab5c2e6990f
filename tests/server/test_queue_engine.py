"""Queues in-process: leases, acks after the commit, redelivery after cancel and disconnect,
sow_delete with a filter, and recovery from the journal. Sessions over the QueueManager, a
real Journal, the running loop; no sockets."""

from __future__ import annotations

import json

from journal.queue_events import checkpoint_key, decode_checkpoint
from server.ids import publisher_id
from server.subscriptions import SubState

QUEUES = """<SOW>
  <Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic></Queue>
  <Queue><Name>batch-q</Name><UnderlyingTopic>batch</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


def _deliveries(frames):
    return [f for f in frames if f["c"] == "p"]


async def test_lease_ack_and_redelivery_after_cancel(make_core):
    core = make_core(QUEUES)
    consumer = core.client("worker")
    consumer.send("subscribe", t="work-q", sub_id="w", a="processed")
    assert consumer.take()[0]["status"] == "success"
    assert consumer.session.table.get("w").state is SubState.QUEUED
    pub = core.client("pub")
    pub.send("publish", b'{"job":1}', t="work", s=1)
    pub.send("publish", b'{"job":2}', t="work", s=2)
    await core.settle()
    (first,) = _deliveries(consumer.take())  # backlog 1: one at a time
    pid = publisher_id("pub")
    assert first["bm"] == f"{pid}|1|" and first["t"] == "work" and "lp" in first.header
    assert first.raw_header.startswith(b'{"c":"p","sub_id":"w","sids":"w","t":"work","bm":"')
    # cancel: the message goes back to the front and comes again, counted
    consumer.send("sow_delete", t="work-q", bm=first["bm"], o="cancel", a="processed", cid="c1")
    await core.settle()
    got = consumer.take()
    ack = next(f for f in got if f["c"] == "ack")
    assert ack.header == {
        "c": "ack",
        "a": "processed",
        "cid": "c1",
        "status": "success",
        "records_deleted": 1,
    }
    (again,) = _deliveries(got)
    assert again["bm"] == f"{pid}|1|" and again.body == b'{"job":1}'
    q = core.queues.get("work-q").state
    assert q.stats["redelivered"] == 1
    # ack: the next message goes out at once; the ack's reply waits for its event to be durable
    consumer.send("sow_delete", t="work-q", bm=again["bm"], a="processed", cid="c2")
    got = consumer.take()
    assert [f for f in got if f["c"] == "ack"] == []
    (second,) = _deliveries(got)
    assert second["bm"] == f"{pid}|2|"
    await core.settle()
    assert [f["records_deleted"] for f in consumer.take()] == [1]
    assert q.stats["acked"] == 1 and q.depth == 0 and len(q.leased) == 1


async def test_a_disconnected_consumer_returns_its_leases(make_core):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, 6):
        pub.send("publish", json.dumps({"n": n}), t="batch", s=n)
    await core.settle()
    a = core.client("a")
    a.send("subscribe", t="batch-q", sub_id="q", o="max_backlog=3")
    assert [json.loads(f.body)["n"] for f in _deliveries(a.take())] == [1, 2, 3]
    b = core.client("b")
    b.send("subscribe", t="batch-q", sub_id="q", o="max_backlog=10")
    assert [json.loads(f.body)["n"] for f in _deliveries(b.take())] == [4, 5]
    a.disconnect()
    assert [json.loads(f.body)["n"] for f in _deliveries(b.take())] == [1, 2, 3]


async def test_sow_delete_with_a_filter(make_core):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, 7):
        pub.send("publish", json.dumps({"n": n, "keep": n % 2}), t="batch", s=n)
    await core.settle()
    q = core.queues.get("batch-q").state
    assert q.depth == 6
    admin = core.client("admin")
    admin.send("sow_delete", t="batch-q", f="/keep = 0", a="processed", cid="d")
    await core.settle()
    (ack,) = admin.take()
    assert ack["status"] == "success" and ack["records_deleted"] == 3
    assert q.depth == 3
    consumer = core.client("c")
    consumer.send("subscribe", t="batch-q", sub_id="c", o="max_backlog=10")
    assert [json.loads(f.body)["n"] for f in _deliveries(consumer.take())] == [1, 3, 5]
    admin.send("sow_delete", t="orders", f="1=1", a="processed")
    assert admin.take()[0]["reason"] == "not a queue"


async def test_queue_state_survives_a_restart(make_core):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, 4):
        pub.send("publish", json.dumps({"n": n}), t="work", s=n)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w")
    (d,) = _deliveries(c.take())
    c.send("sow_delete", t="work-q", bm=d["bm"], a="processed")
    await core.settle()
    # checkpoints go at most once a second, with the next commit: one now
    core.queues._last_checkpoint = 0.0
    pub.send("publish", json.dumps({"n": 4}), t="work", s=4)
    await core.settle()
    raw = core.journal.index.get_meta(checkpoint_key("work-q"))
    assert decode_checkpoint(raw) == core.journal.locate(publisher_id("pub"), 2)
    core.close()
    again = make_core(QUEUES)  # the same directory, a new core: recovery from the journal
    q = again.queues.get("work-q").state
    assert q.depth == 3 and list(q.counts.values()) == [[1, 0]]  # 2 was delivered once
    c = again.client("c")
    c.send("subscribe", t="work-q", sub_id="w")
    (d,) = _deliveries(c.take())
    assert json.loads(d.body)["n"] == 2  # 1 was acked; 2 was leased: delivered again


async def test_an_idle_empty_queue_moves_its_checkpoint_with_the_journal(make_core):
    """A drained queue that nothing changes any more: its checkpoint still follows the journal
    (every message of it below the end is done), so it pins no segment for remove-journal."""
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, 4):
        pub.send("publish", json.dumps({"n": n}), t="work", s=n)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w")
    for _ in range(3):  # backlog 1: one at a time
        (d,) = _deliveries(c.take())
        c.send("sow_delete", t="work-q", bm=d["bm"], a="processed")
        await core.settle()
    assert core.queues.get("work-q").state.depth == 0
    core.queues._last_checkpoint = 0.0  # checkpoints go at most once a second
    pub.send("publish", json.dumps({"n": 0}), t="other", s=4)
    await core.settle()
    drained = decode_checkpoint(core.journal.index.get_meta(checkpoint_key("work-q")))
    # the queue is empty and idle from here on; only other topics are published
    for s in range(5, 25):
        pub.send("publish", json.dumps({"n": s}), t="other", s=s)
        await core.settle()
    # then the server goes quiet: within a second or so the checkpoint is the journal's end
    # (committed alone, with no record, into the index)
    end = core.journal.end_position
    assert end > drained

    def checkpoint():
        return decode_checkpoint(core.journal.index.get_meta(checkpoint_key("work-q")))

    await core.until(lambda: checkpoint() == end, timeout=5.0)
    assert core.journal.end_position == end
    await core.aclose()
