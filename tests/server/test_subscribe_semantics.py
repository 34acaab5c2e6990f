"""Subscription semantics of seed 001 (issue 12, items 4-6 and the subscription part of 8),
in-process: pause at NOW, what a regex bookmark subscription sees after the join, conflated
live subscriptions on any topic, and the untested corners (pause then disconnect, `persisted`
acks outside the log, byte rates)."""

from __future__ import annotations

import asyncio
import json
import time

from server.subscriptions import SubState

RECORDED = ("orders.*",)  # orders* is in the transaction log; chat* is not


def _ns(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames if f["c"] == "p"]


def _topics(frames) -> list[str]:
    return [f["t"] for f in frames if f["c"] == "p"]


# -- item 4: pause means paused for every start point ----------------------------------------------


async def test_pause_on_a_new_subscription_at_now(make_core):
    core = make_core()
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 0}), t="orders", s=1)
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm="0|1|", o="pause", a="completed")
    s = sub.session.table.get("r")
    assert s.state is SubState.PAUSED
    for n in (1, 2, 3):
        pub.send("publish", json.dumps({"n": n}), t="orders", s=n + 1)
    await core.settle()
    await asyncio.sleep(0.02)
    assert sub.take() == []  # paused: nothing, not even `completed`
    sub.send("subscribe", sub_id="r", o="resume")
    await core.until(lambda: s.state is SubState.LIVE)
    got = sub.take()
    assert _ns(got) == [1, 2, 3]  # from NOW at the subscribe, not from the resume
    assert [f["a"] for f in got if f["c"] == "ack"] == ["completed"]
    pub.send("publish", json.dumps({"n": 4}), t="orders", s=5)
    await core.settle()
    assert _ns(sub.take()) == [4]


async def test_pause_at_now_on_a_topic_that_is_not_recorded(make_core):
    core = make_core(topics=RECORDED)
    sub = core.client("sub")
    sub.send("subscribe", t="chat", sub_id="r", bm="0|1|", o="pause")
    s = sub.session.table.get("r")
    assert s.state is SubState.PAUSED
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="chat")
    await core.settle()
    assert sub.take() == []
    sub.send("subscribe", sub_id="r", o="resume")
    await core.until(lambda: s.state is SubState.LIVE)
    pub.send("publish", json.dumps({"n": 2}), t="chat")
    await core.settle()
    assert _ns(sub.take()) == [2]  # nothing was recorded while it was paused


async def test_a_paused_subscription_is_removed_when_its_client_disconnects(make_core):
    core = make_core()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm="0", o="pause")
    s = sub.session.table.get("r")
    assert s.state is SubState.PAUSED and core.fanout.router.count == 1
    await asyncio.sleep(0.01)
    sub.disconnect()
    assert s.state is SubState.REMOVED and core.fanout.router.count == 0
    await core.until(lambda: not core.replays.replays)


# -- item 5: a regex bookmark subscription sees only recorded topics, before and after the join ----


async def test_a_regex_bookmark_subscription_stays_on_recorded_topics(make_core):
    core = make_core(topics=RECORDED)
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="orders.a")
    pub.send("publish", json.dumps({"n": 2}), t="chat.a")
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="(orders|chat)\\..*", sub_id="r", bm="0")
    s = sub.session.table.get("r")
    await core.until(lambda: s.state is SubState.LIVE)
    pub.send("publish", json.dumps({"n": 3}), t="chat.b")
    pub.send("publish", json.dumps({"n": 4}), t="orders.b")
    await core.settle()
    got = sub.take()
    assert _ns(got) == [1, 4] and _topics(got) == ["orders.a", "orders.b"]
    # a plain regex subscription still sees every topic that matches
    live = core.client("live")
    live.send("subscribe", t="(orders|chat)\\..*", sub_id="l")
    pub.send("publish", json.dumps({"n": 5}), t="chat.c")
    await core.settle()
    assert _ns(live.take()) == [5]


async def test_a_regex_live_option_subscription_stays_on_recorded_topics(make_core):
    core = make_core(topics=RECORDED)
    pub = core.client("pub")
    sub = core.client("sub")
    sub.send("subscribe", t="(orders|chat)\\..*", sub_id="r", bm="0", o="live")
    s = sub.session.table.get("r")
    await core.until(lambda: s.state is SubState.LIVE_EARLY)
    pub.send("publish", json.dumps({"n": 1}), t="chat.b")
    pub.send("publish", json.dumps({"n": 2}), t="orders.b")
    await core.settle()
    assert _ns(sub.take()) == [2]


# -- item 6: conflated live subscriptions on any topic ----------------------------------------------


async def test_conflation_on_a_topic_that_is_not_recorded(make_core):
    core = make_core(topics=RECORDED)
    sub = core.client("sub")
    sub.send(
        "subscribe",
        t="chat",
        sub_id="c",
        o="conflation=100ms,conflation_key=/k",
        a="processed",
    )
    (ack,) = sub.take()
    assert ack["status"] == "success", ack.header
    pub = core.client("pub")
    for n, k in ((1, "a"), (2, "b"), (3, "a"), (4, "a")):
        pub.send("publish", json.dumps({"n": n, "k": k}), t="chat")
    await core.settle()
    assert sub.take() == []  # held until the window ends
    await asyncio.sleep(0.2)
    got = sub.take()
    assert sorted(_ns(got)) == [2, 4]  # the latest per key
    assert all("bm" not in f.header for f in got)  # not recorded: no bookmark
    pub.send("publish", json.dumps({"n": 5, "k": "a"}), t="chat")
    await core.settle()
    await asyncio.sleep(0.2)
    assert _ns(sub.take()) == [5]


async def test_live_conflation_on_a_recorded_topic_carries_the_first_bookmark(make_core):
    core = make_core(topics=RECORDED)
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="c", o="conflation=100ms")
    pub = core.client("pub")
    for n in (1, 2, 3):
        pub.send("publish", json.dumps({"n": n}), t="orders", s=n)
    await core.settle()
    await asyncio.sleep(0.2)
    (only,) = [f for f in sub.take() if f["c"] == "p"]
    assert json.loads(only.body)["n"] == 3 and only["bm"].endswith("|1|")
    sub.send("unsubscribe", sub_id="c")
    pub.send("publish", json.dumps({"n": 4}), t="orders", s=4)
    await core.settle()
    await asyncio.sleep(0.2)
    assert sub.take() == []


# -- item 8: persisted acks outside the log; rates in bytes -----------------------------------------


async def test_persisted_acks_for_a_topic_outside_the_log(make_core):
    core = make_core(topics=RECORDED)
    pub = core.client("pub")
    pub.send("publish", b"{}", t="chat", s=1, a="persisted")
    pub.send("publish", b"{}", t="orders", s=2, a="persisted")
    pub.send("publish", b"{}", t="chat", s=3, a="persisted")
    await core.settle()
    acks = [f.header for f in pub.take() if f["c"] == "ack"]
    assert acks and all(a["a"] == "persisted" and a["status"] == "success" for a in acks)
    assert acks[-1]["s"] == 3  # "processed in order": it covers the recorded one before it


async def test_a_byte_rate_paces_by_bytes(make_core):
    core = make_core()
    pub = core.client("pub")
    pad = "x" * 1000
    for n in range(1, 5):  # about 1 KB each at 2 KB/s: one every half second
        pub.send("publish", json.dumps({"n": n, "pad": pad}), t="orders", s=n)
    await core.settle()
    sub = core.client("sub")
    started = time.monotonic()
    sub.send("subscribe", t="orders", sub_id="r", bm="0", o="rate=2KB")
    s = sub.session.table.get("r")
    got = []
    await asyncio.sleep(0.3)
    got += sub.take()
    assert _ns(got) == [1]  # the bucket starts nearly empty; a message costs its bytes
    await core.until(lambda: s.state is SubState.LIVE, timeout=5)
    got += sub.take()
    assert _ns(got) == [1, 2, 3, 4]
    assert 1.2 < time.monotonic() - started < 3.0  # 3 KB more at 2 KB/s (2000/s would be 2 ms)
