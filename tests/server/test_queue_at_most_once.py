"""At-most-once deliveries wait for their DELIVERED_AT_MOST_ONCE event (server/queue_state.py
server/queue_held.py, server/queues.py `_events_committed`): nothing is sent before the event's commit
is durable; a commit that fails sends nothing and the messages wait again; a delivery whose
holder went away, or whose message was acknowledged by filter, before that commit is not sent.
The kill -9 side is tests/e2e/test_queue_at_most_once.py."""

from __future__ import annotations

import asyncio
import errno
import json

from journal.fileio import FaultyIO
from server.queues import RETRY_DELAY

AMO = """<SOW>
  <Queue><Name>amo</Name><UnderlyingTopic>a</UnderlyingTopic><Semantics>at-most-once</Semantics>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


def _ns(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames if f["c"] == "p"]


async def _published(make_core, count: int, **core):
    c = make_core(AMO, **core)
    pub = c.client("pub")
    for n in range(1, count + 1):
        pub.send("publish", json.dumps({"n": n}), t="a", s=n)
    await c.settle()
    return c, c.queues.get("amo").state


async def test_a_failed_commit_sends_nothing_and_the_messages_wait_again(make_core):
    io = FaultyIO(ops=["write"], errnos=[errno.EIO], count=1)
    io.armed = False
    core, st = await _published(make_core, 2, io=io)
    c = core.client("c")
    io.armed = True
    c.send("subscribe", t="amo", sub_id="q", o="max_backlog=5")
    await core.settle()  # the commit of the two DELIVERED_AT_MOST_ONCE events fails
    io.armed = False
    assert io.failures == 1
    assert _ns(c.take()) == []  # nothing sent
    assert not st.leased and not st.amo.unsent and st.depth == 2
    assert st.stats["delivered"] == 0 and st.stats["redelivered"] == 0
    # offered again RETRY_DELAY later, once the journal's probe made it available again
    await core.until(lambda: core.journal.available, timeout=5)
    got: list[int] = []
    for _ in range(100):
        await asyncio.sleep(RETRY_DELAY)
        await core.settle()
        got += _ns(c.take())
        if len(got) >= 2:
            break
    assert got == [1, 2]
    assert st.stats["delivered"] == 2 and st.stats["redelivered"] == 0


async def test_a_holder_that_leaves_before_the_commit_gets_nothing_and_the_next_gets_it(
    make_core,
):
    core, st = await _published(make_core, 2)
    c = core.client("c")
    c.send("subscribe", t="amo", sub_id="q", o="max_backlog=5")
    assert len(st.amo.frames) == 2 and _ns(c.take()) == []  # held for their events' commit
    c.send("unsubscribe", sub_id="q")
    other = core.client("other")
    other.send("subscribe", t="amo", sub_id="q", o="max_backlog=5")
    await core.settle()
    assert _ns(c.take()) == []
    assert _ns(other.take()) == [1, 2]  # never sent to `c`: delivered once, to `other`
    assert st.stats["delivered"] == 2 and st.depth == 0 and not st.amo.unsent


async def test_a_message_acknowledged_by_filter_before_the_commit_is_not_sent(make_core):
    core, st = await _published(make_core, 2)
    c = core.client("c")
    c.send("subscribe", t="amo", sub_id="q", o="max_backlog=5")
    c.send("sow_delete", t="amo", f="/n = 1", a="processed", cid="x")
    await core.settle()
    assert _ns(c.take()) == [2]
    assert not st.amo.unsent and len(st.leased) == 1


BARRIER = """<SOW>
  <Queue><Name>amob</Name><UnderlyingTopic>b</UnderlyingTopic><Semantics>at-most-once</Semantics>
         <BarrierExpression>/barrier = 1</BarrierExpression>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


async def test_a_barrier_message_waits_for_its_events_too_and_a_failed_commit_sends_nothing(
    make_core,
):
    io = FaultyIO(ops=["write"], errnos=[errno.EIO], count=1)
    io.armed = False
    core = make_core(BARRIER, io=io)
    st = core.queues.get("amob").state
    a, b = core.client("a"), core.client("b")
    for c in (a, b):
        c.send("subscribe", t="amob", sub_id="q", o="max_backlog=5")
    pub = core.client("pub")
    io.after, io.armed = io.seen + 1, True  # the message's write is made, the next fails
    pub.send("publish", json.dumps({"n": 1, "barrier": 1}), t="b", s=1)
    await core.settle()  # the message's commit, then that of its two held deliveries' entries
    io.armed = False
    assert _ns(a.take()) == [] and _ns(b.take()) == []  # nothing before its entries' commit
    assert io.failures == 1
    assert st.depth == 1 and st.stats["delivered"] == 0 and not st.amo.barriers
    got_a: list[int] = []
    got_b: list[int] = []
    for _ in range(100):
        await asyncio.sleep(RETRY_DELAY)
        await core.settle()
        got_a += _ns(a.take())
        got_b += _ns(b.take())
        if got_a and got_b:
            break
    assert got_a == [1] and got_b == [1]  # once each, after its events were durable
    assert st.depth == 0 and st.stats["delivered"] == 1 and not st.amo.unsent
