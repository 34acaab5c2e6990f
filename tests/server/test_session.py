"""A Session driven in-process (tests/server/conftest.py): header objects in, the Outbox's bytes
out, a real Journal underneath. Logon rules, publish acks, live delivery bytes, refusals."""

from __future__ import annotations

from protocol.headers import Header
from server.ids import publisher_id
from server.reasons import Disconnect, Failure
from server.session_publish import PublishCommands
from server.subscriptions import SubState


async def test_logon_acks_the_last_stored_sequence(core):
    c = core.client()
    ack = c.logon("alice")
    assert ack.header == {
        "c": "ack",
        "a": "processed",
        "status": "success",
        "s": 0,
        "bm": "",
        "client_name": "alice",
    }
    c.send("publish", b'{"n":1}', t="orders", s=1)
    await core.settle()
    again = core.client()
    c.disconnect()
    ack = again.logon("alice")
    assert ack["s"] == 1 and ack["bm"] == f"{publisher_id('alice')}|1|"


async def test_the_first_command_must_be_logon(core):
    c = core.client()
    c.send("publish", b"{}", t="orders", a="processed", cid="7")
    (ack,) = c.take()
    assert ack["status"] == "failure" and ack["reason"] == Failure.LOGON_REQUIRED
    assert c.closes == [Disconnect.LOGON_REQUIRED] and c.transport.closed
    assert core.counters.refused == 1


async def test_an_unknown_command_closes_the_connection(core):
    c = core.client("bob")
    c.send("frobnicate", a="processed")
    (ack,) = c.take()
    assert ack["reason"] == "unknown command"
    assert c.closes == ["unknown command"]


async def test_name_in_use(core):
    first = core.client()
    first.logon("carol", user_id="u1")
    other_user = core.client()
    other_user.send("logon", client_name="carol", user_id="u2", a="processed")
    (ack,) = other_user.take()
    assert ack["status"] == "failure" and ack["reason"] == "name in use"
    assert other_user.closes == ["name in use"] and not first.closes
    # the same user id takes the name over: the older connection is closed
    second = core.client()
    second.logon("carol", user_id="u1")
    assert first.closes == ["name in use"]
    assert core.services.names["carol"] is second.session


async def test_persisted_ack_only_after_the_commit(core, monkeypatch):
    c = core.client("pub")
    acks: list = []
    # when an ack is written, its sequence is in the journal already
    monkeypatch.setattr(
        PublishCommands,
        "persisted",
        lambda self, seq: acks.append((seq, [r.seq for r in core.journal.scan()])),
    )
    c.send("publish", b'{"a":1}', t="orders", s=1, a="persisted")
    c.send("publish", b'{"a":2}', t="orders", s=2, a="persisted")
    await core.settle()
    assert acks and all(seq in stored for seq, stored in acks) and acks[-1][0] == 2
    assert core.pipeline.durable[publisher_id("pub")] == 2


async def test_one_ack_for_the_publishes_of_one_read(core):
    c = core.client("pub")
    c.session.receive(
        [(Header(c="publish", t="orders", s=s, a="persisted"), b'{"a":%d}' % s) for s in (1, 2)]
    )
    c.out.flush()
    await core.settle()
    ack = b'{"c":"ack","a":"persisted","status":"success","s":2}'
    assert c.raw() == len(ack).to_bytes(4, "big") + ack


async def test_a_duplicate_is_acked_and_not_delivered(core):
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="s1")
    pub = core.client("pub")
    pub.send("publish", b'{"a":1}', t="orders", s=1)
    await core.settle()
    assert len(sub.take()) == 1
    pub.send("publish", b'{"a":1}', t="orders", s=1, a="processed", cid="c9")
    (ack,) = pub.take()
    assert ack.header == {
        "c": "ack",
        "a": "processed",
        "cid": "c9",
        "status": "success",
        "reason": "duplicate",
        "s": 1,
    }
    await core.settle()
    assert sub.take() == []
    assert core.pipeline.duplicates == 1


async def test_live_delivery_bytes(core):
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="s1", a="processed")
    assert sub.take()[0].header == {
        "c": "ack",
        "a": "processed",
        "status": "success",
        "sub_id": "s1",
    }
    assert sub.session.table.get("s1").state is SubState.LIVE
    pub = core.client("pub")
    pub.send("publish", b'{"px":10}', t="orders", s=1, x="corr-1")
    await core.settle()
    pid = publisher_id("pub")
    header = b'{"c":"p","sub_id":"s1","sids":"s1","t":"orders","bm":"%d|1|","x":"corr-1"}' % pid
    body = b'{"px":10}'
    assert sub.raw() == (len(header) + len(body)).to_bytes(4, "big") + header + body
    assert sub.out.sent == 1 and core.fanout.delivered == 1


async def test_one_delivery_names_every_matching_subscription(core):
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="a")
    sub.send("subscribe", t="ord.*", sub_id="b", f="/px > 5")
    sub.send("subscribe", t="orders", sub_id="c", f="/px > 50")
    pub = core.client("pub")
    pub.send("publish", b'{"px":10}', t="orders")
    await core.settle()
    (frame,) = sub.take()
    assert frame["sub_id"] == "a" and frame["sids"] == "a,b"
    assert frame.body == b'{"px":10}'


async def test_refusals_leave_no_subscription(core):
    c = core.client("sub")
    c.send("subscribe", t="orders", sub_id="s1", f="/a = ")
    c.send("subscribe", t="orders(", sub_id="s2")
    c.send("subscribe", t="orders", sub_id="s3", bm="not a bookmark")
    c.send("subscribe", t="orders", sub_id="s4", o="max_backlog=3")
    reasons = [f["reason"] for f in c.take()]
    assert reasons == [
        Failure.BAD_FILTER,
        Failure.BAD_REGEX_TOPIC,
        Failure.INVALID_BOOKMARK,
        Failure.NOT_A_QUEUE,  # a queue option on a topic that is not a queue (issue 23)
    ]
    assert len(c.session.table) == 0 and core.fanout.router.count == 0


async def test_unsubscribe_and_disconnect_remove_subscriptions(core):
    c = core.client("sub")
    for sid in ("a", "b", "c"):
        c.send("subscribe", t="orders", sub_id=sid)
    subs = {s.sub_id: s for s in c.session.table}
    c.send("unsubscribe", sub_id="a,a,zz", a="processed")
    assert c.take()[0]["status"] == "success"
    assert subs["a"].state is SubState.REMOVED and core.fanout.router.count == 2
    c.disconnect()
    assert core.fanout.router.count == 0 and "sub" not in core.services.names


async def test_a_slow_client_is_closed(core):
    c = core.client("sub")
    c.send("subscribe", t="orders", sub_id="s1")
    c.out._max_buffer = 100
    c.transport.buffered = 101  # the client does not read
    pub = core.client("pub")
    pub.send("publish", b"{}", t="orders")
    await core.settle()
    assert c.closes == [Disconnect.SLOW_CLIENT] and c.transport.aborted


async def test_flush_completes_after_earlier_publishes(core):
    c = core.client("pub")
    c.send("publish", b"{}", t="orders", s=1)
    c.send("flush", cid="f1", a="completed")
    assert c.take() == []
    await core.settle()
    (ack,) = c.take()
    assert ack.header == {"c": "ack", "a": "completed", "cid": "f1", "status": "success"}


async def test_heartbeat_start_sets_the_interval(core):
    c = core.client("hb")
    c.send("heartbeat", o="start,5", a="processed")
    assert c.take()[0]["status"] == "success"
    assert c.session.hb_interval == 5.0


async def test_conflated_acks_lead_the_interval(core):
    """With ack_conflation a lone publish is acked when durable; what becomes durable in the
    interval its ack opened is acked once, at the interval's end."""
    c = core.client()
    c.logon("conflating", o="ack_conflation=200ms")
    c.send("publish", b"{}", t="orders", s=1, a="persisted")
    await core.settle()
    assert [f["s"] for f in c.take()] == [1]  # no timer for a lone publish
    c.send("publish", b"{}", t="orders", s=2, a="persisted")
    c.send("publish", b"{}", t="orders", s=3, a="persisted")
    await core.settle()
    assert c.take() == []  # inside the interval the first ack opened
    await core.until(lambda: bool(c.transport.data[c._seen :]), timeout=2)
    assert [f["s"] for f in c.take()] == [3]
