"""Lagging subscribers (issue 12): past <ClientOfflineThreshold> a live subscription to a recorded
topic reads the journal from the last message it was sent, then rejoins the live stream with no
gap and no duplicate; what the journal cannot feed is still bounded by <ClientMaxBufferSize>.

In-process: the FakeTransport's `buffered` plays the client's unread bytes, and
`pause_writing` / `resume_writing` the transport's flow control."""

from __future__ import annotations

import json

from server.reasons import Disconnect
from server.subscriptions import SubState

KB = 1024


def _ns(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames if f["c"] == "p"]


def _publish(pub, topic: str, first: int, last: int) -> None:
    for n in range(first, last + 1):
        pub.send("publish", json.dumps({"n": n}), t=topic)


async def _lag(core, sub, pub, topic: str = "orders") -> None:
    """Make `sub` lag: its unread output passes the threshold while messages 1..5 go out."""
    sub.transport.buffered = 200 * KB
    sub.out.pause_writing()  # the transport is above its high-water mark
    _publish(pub, topic, 1, 5)
    await core.settle()


async def test_a_lagging_subscriber_reads_the_journal_then_rejoins(make_core):
    core = make_core()
    sub = core.client("sub", offline_at=100 * KB)
    sub.send("subscribe", t="orders", sub_id="s", a="completed")
    s = sub.session.table.get("s")
    pub = core.client("pub")
    await _lag(core, sub, pub)
    assert s.state is SubState.REPLAYING  # no longer queued in memory
    assert core.replays.fallbacks == 1 and len(core.replays.replays) == 1
    _publish(pub, "orders", 6, 20)
    await core.settle()
    got = sub.take()
    assert _ns(got) == [1, 2, 3, 4, 5]  # the rest waits in the journal, not in memory
    sub.transport.buffered = 0
    sub.out.resume_writing()  # the client read what it had
    await core.until(lambda: s.state is SubState.LIVE)
    _publish(pub, "orders", 21, 25)
    await core.settle()
    got += sub.take()
    assert _ns(got) == list(range(1, 26))  # in order, no gap, no duplicate
    assert [f for f in got if f["c"] == "ack"] == []  # no `completed`: it asked for no replay
    assert core.replays.rejoins == 1 and sub.closes == []


async def test_several_subscriptions_of_a_connection_share_one_pass(make_core):
    core = make_core()
    sub = core.client("sub", offline_at=100 * KB)
    sub.send("subscribe", t="orders", sub_id="a")
    sub.send("subscribe", t="trades", sub_id="b", f="/n > 2")
    pub = core.client("pub")
    sub.transport.buffered = 200 * KB
    sub.out.pause_writing()
    _publish(pub, "orders", 1, 2)
    await core.settle()
    assert core.replays.fallbacks == 2 and len(core.replays.replays) == 1
    _publish(pub, "trades", 3, 4)
    _publish(pub, "orders", 5, 6)
    await core.settle()
    sub.transport.buffered = 0
    sub.out.resume_writing()
    table = sub.session.table
    await core.until(lambda: all(s.state is SubState.LIVE for s in table))
    assert _ns(sub.take()) == [1, 2, 3, 4, 5, 6]
    assert core.replays.rejoins == 2


async def test_pausing_one_lagging_bookmark_subscription_leaves_the_others(make_core):
    core = make_core()
    sub = core.client("sub", offline_at=100 * KB)
    sub.send("subscribe", t="orders", sub_id="bm", bm="0|1|")
    sub.send("subscribe", t="trades", sub_id="plain")
    pub = core.client("pub")
    await _lag(core, sub, pub)
    _publish(pub, "trades", 6, 7)
    await core.settle()
    sub.take()
    sub.send("subscribe", sub_id="bm", o="pause")
    table = sub.session.table
    assert table.get("bm").state is SubState.PAUSED and table.get("bm").replay.paused
    sub.transport.buffered = 0
    sub.out.resume_writing()
    await core.until(lambda: table.get("plain").state is SubState.LIVE)
    assert _ns(sub.take()) == [6, 7]  # trades, while orders waits paused
    sub.send("subscribe", sub_id="bm", o="resume")
    await core.until(lambda: table.get("bm").state is SubState.LIVE)
    assert _ns(sub.take()) == []  # orders 1-5 went out before the pause


async def test_a_topic_that_is_not_recorded_is_bounded_by_the_buffer(make_core):
    core = make_core(topics=("orders",))
    sub = core.client("sub", offline_at=100 * KB, max_buffer=300 * KB)
    sub.send("subscribe", t="chat", sub_id="c")
    sub.send("subscribe", t="chat.*", sub_id="p")  # a pattern over topics not all recorded
    pub = core.client("pub")
    await _lag(core, sub, pub, "chat")
    table = sub.session.table
    assert table.get("c").state is SubState.LIVE and table.get("p").state is SubState.LIVE
    assert core.replays.fallbacks == 0 and sub.closes == []
    sub.transport.buffered = 301 * KB
    _publish(pub, "chat", 6, 6)
    await core.settle()
    assert sub.closes == [Disconnect.SLOW_CLIENT]


async def test_a_plain_pattern_falls_back_when_every_topic_is_recorded(make_core):
    core = make_core()  # records .*
    sub = core.client("sub", offline_at=100 * KB)
    sub.send("subscribe", t="ord.*", sub_id="p")
    pub = core.client("pub")
    await _lag(core, sub, pub)
    assert sub.session.table.get("p").state is SubState.REPLAYING


async def test_live_option_and_conflated_subscriptions_do_not_fall_back(make_core):
    core = make_core()
    sub = core.client("sub", offline_at=100 * KB)
    sub.send("subscribe", t="orders", sub_id="l", bm="0", o="live")
    sub.send("subscribe", t="orders", sub_id="c", o="conflation=1s")
    table = sub.session.table
    await core.until(lambda: table.get("l").state is SubState.LIVE_EARLY)
    pub = core.client("pub")
    await _lag(core, sub, pub)
    assert table.get("l").state is SubState.LIVE_EARLY
    assert table.get("c").state is SubState.LIVE
    assert core.replays.fallbacks == 0
