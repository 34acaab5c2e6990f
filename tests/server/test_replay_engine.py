"""Bookmark replay in-process: a Session's bookmark subscription replayed by the ReplayEngine
from a real Journal on the running loop, then handed to live delivery. No sockets."""

from __future__ import annotations

import asyncio
import json

import pytest

from server.ids import publisher_id
from server.subscriptions import SubState

BODY_PAD = "x" * 400  # bodies big enough that a replay takes several journal reads


def _publish(pub, first: int, last: int) -> None:
    for n in range(first, last + 1):
        pub.send("publish", json.dumps({"n": n, "pad": BODY_PAD}), t="orders", s=n)


def _numbers(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames if f["c"] == "p"]


@pytest.mark.parametrize(
    "extra",
    [
        {},  # plain: frames spliced from the journal's bytes
        {"f": "/n > 0"},  # a filter: records decoded one by one
        {"o": "timestamp"},  # a timestamp: frames built, not spliced
    ],
    ids=["spliced", "filtered", "timestamp"],
)
async def test_replay_joins_live_without_gap_or_duplicate(core, extra):
    pub = core.client("pub")
    _publish(pub, 1, 60)
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm="0", a="processed,completed", **extra)
    s = sub.session.table.get("r")
    assert s.state is SubState.REPLAYING
    got = []
    # publishes race the replay: some commit before it catches up, some after
    for first in range(61, 121, 10):
        _publish(pub, first, first + 9)
        await asyncio.sleep(0)
        got += sub.take()
    await core.until(lambda: s.state is SubState.LIVE)
    _publish(pub, 121, 130)
    await core.settle()
    got += sub.take()
    assert _numbers(got) == list(range(1, 131))
    acks = [f.header for f in got if f["c"] == "ack"]
    assert acks[0] == {"c": "ack", "a": "processed", "status": "success", "sub_id": "r"}
    assert acks[1] == {"c": "ack", "a": "completed", "status": "success", "sub_id": "r"}
    pid = publisher_id("pub")
    assert [f["bm"] for f in got if f["c"] == "p"][:2] == [f"{pid}|1|", f"{pid}|2|"]
    if "o" in extra:
        assert all("ts" in f.header for f in got if f["c"] == "p")
    assert not core.replays.replays


async def test_pause_and_resume(core):
    pub = core.client("pub")
    _publish(pub, 1, 5)
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm="0", o="pause")
    s = sub.session.table.get("r")
    assert s.state is SubState.PAUSED
    await asyncio.sleep(0.05)
    assert _numbers(sub.take()) == []
    sub.send("subscribe", sub_id="r", o="resume", a="processed")
    assert s.state is SubState.REPLAYING
    await core.until(lambda: s.state is SubState.LIVE)
    assert _numbers(sub.take()) == [1, 2, 3, 4, 5]
    # paused while live: it keeps its place and gets what was published meanwhile
    sub.send("subscribe", sub_id="r", o="pause")
    assert s.state is SubState.PAUSED
    _publish(pub, 6, 8)
    await core.settle()
    await asyncio.sleep(0.02)
    assert _numbers(sub.take()) == []
    sub.send("subscribe", sub_id="r", o="resume")
    await core.until(lambda: s.state is SubState.LIVE)
    _publish(pub, 9, 9)
    await core.settle()
    assert _numbers(sub.take()) == [6, 7, 8, 9]


async def test_a_range_ends_with_completed_and_removes_the_subscription(core):
    pub = core.client("pub")
    _publish(pub, 1, 10)
    await core.settle()
    pid = publisher_id("pub")
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm=f"[0:{pid}|5|]", a="completed", cid="q")
    s = sub.session.table.get("r")
    await core.until(lambda: s.state is SubState.REMOVED)
    got = sub.take()
    assert _numbers(got) == [1, 2, 3, 4, 5]
    assert got[-1].header == {
        "c": "ack",
        "a": "completed",
        "cid": "q",
        "status": "success",
        "sub_id": "r",
    }
    assert "r" not in sub.session.table and core.fanout.router.count == 0
    _publish(pub, 11, 11)
    await core.settle()
    assert sub.take() == []


async def test_live_option_joins_at_publish_time(core):
    pub = core.client("pub")
    _publish(pub, 1, 2)
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm="0", o="live")
    s = sub.session.table.get("r")
    await core.until(lambda: s.state is SubState.LIVE_EARLY)
    assert core.fanout.early == 1
    assert _numbers(sub.take()) == [1, 2]
    _publish(pub, 3, 3)
    assert _numbers(sub.take()) == [3]  # before the commit
    sub.send("subscribe", sub_id="r", o="pause")
    assert core.fanout.early == 0 and s.state is SubState.PAUSED
    sub.disconnect()
    await core.settle()
    assert core.fanout.early == 0 and not core.replays.replays


_MIXED = [
    {"n": 1, "s": "ab"},
    {"n": "12", "s": "abc"},
    {"n": [3, 40], "s": "x"},
    {"s": "\u00e9t\u00e9", "n": 20},
    {"s": 'a"b', "n": 30},
    {"n": None},
    {"n": {"deep": 1}, "s": ["ab"]},
    {"n": 2.5e1, "s": ""},
    {"n": True},
]


@pytest.mark.parametrize(
    "text",
    ["/n > 10", "/s = 'ab' OR /n IN (1, '12', 3)", "/s LIKE '^a' AND /n IS NOT NULL", "/n % 2 = 0"],
)
async def test_filtered_replay_delivers_what_live_delivery_does(core, text):
    live = core.client("live")
    live.send("subscribe", t="orders", sub_id="l", f=text)
    pub = core.client("pub")
    bodies = [json.dumps(d, ensure_ascii=i % 2 == 0) for i in range(6) for d in _MIXED]
    bodies += ["not json", '{"n": 50, "s": "ab"} x', '{"n": 60, "pad": 1e400}']
    for i, b in enumerate(bodies, 1):
        pub.send("publish", b, t="orders", s=i)
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="r", bm="0", a="completed", f=text)
    s = sub.session.table.get("r")
    await core.until(lambda: s.state is SubState.LIVE)
    replayed = [f.body for f in sub.take() if f["c"] == "p"]
    delivered = [f.body for f in live.take() if f["c"] == "p"]
    assert replayed == delivered
    assert 0 < len(replayed) < len(bodies)


@pytest.mark.parametrize(
    "extra",
    [{}, {"f": "/n > 0"}, {"o": "timestamp"}, {"o": "rate=100000"}],
    ids=["spliced", "filtered", "timestamp", "paced"],
)
async def test_a_list_leaves_out_per_publisher_what_it_names(core, extra):
    """`X|15|,0`: from EPOCH (the oldest), without X's messages up to 15; Y (not named) all."""
    x, y = core.client("x"), core.client("y")
    _publish(x, 1, 10)
    await core.settle()
    _publish(y, 101, 120)
    await core.settle()
    _publish(x, 11, 20)
    await core.settle()
    sub = core.client("sub")
    pid = publisher_id("x")
    sub.send("subscribe", t="orders", sub_id="r", bm=f"{pid}|15|,0", a="processed", **extra)
    s = sub.session.table.get("r")
    await core.until(lambda: s.state is SubState.LIVE)
    _publish(x, 21, 22)  # live: past the list's publishers' points
    await core.settle()
    assert _numbers(sub.take()) == list(range(101, 121)) + list(range(16, 23))
