"""Two queue bounds a consumer cannot talk its way past, in-process (docs/protocol.md §8):
`<MaxPerSubscriptionBacklog>` caps what the subscriber's `max_backlog` asks for, and a
`lease_extend` ends the lease that long from now, not after the queue's `<LeasePeriod>`."""

from __future__ import annotations

import asyncio
import json
import time

QUEUES = """<SOW>
  <Queue><Name>capq</Name><UnderlyingTopic>cap</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>2</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>extq</Name><UnderlyingTopic>ext</UnderlyingTopic><LeasePeriod>1s</LeasePeriod>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


def _ns(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames if f["c"] == "p"]


async def _published(make_core, topic: str, count: int):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, count + 1):
        pub.send("publish", json.dumps({"n": n}), t=topic, s=n)
    await core.settle()
    return core


async def test_max_per_subscription_backlog_caps_the_subscribers_max_backlog(make_core):
    """Fails if the queue's cap is ignored (the subscriber would hold 5 leases)."""
    core = await _published(make_core, "cap", 5)
    c = core.client("c")
    c.send("subscribe", t="capq", sub_id="q", o="max_backlog=10")
    await core.settle()
    assert _ns(c.take()) == [1, 2]
    q = core.queues.get("capq").state
    assert len(q.leased) == 2 and core.queues.get("capq").snapshot()["depth"] >= 3
    c.send("sow_delete", t="capq", bm=q.leased[min(q.leased)].bm, a="processed", cid="x")
    await core.settle()
    assert _ns(c.take()) == [3]  # one acked: room for one more, not for the rest


async def test_lease_extend_ends_the_lease_that_long_from_now(make_core):
    """A lease of 1 s extended by 3 s: still leased (not redelivered) 2 s later, back in the
    queue once the 3 s have passed. Fails if the interval is ignored (the lease ends after the
    queue's lease period) or if the lease never ends."""
    core = await _published(make_core, "ext", 1)
    c = core.client("c")
    c.send("subscribe", t="extq", sub_id="q", o="max_backlog=10")
    await core.settle()
    [first] = [f for f in c.take() if f["c"] == "p"]
    c.send("sow_delete", t="extq", bm=first["bm"], o="lease_extend=3s", a="processed",
           cid="x")  # fmt: skip
    extended = time.monotonic()
    await core.settle()
    assert [a["records_deleted"] for a in c.take() if a["c"] == "ack"] == [1]
    await asyncio.sleep(2.0)  # two lease periods: an ignored extension has ended by now
    await core.settle()
    assert _ns(c.take()) == [], "redelivered before the extended lease ended"
    q = core.queues.get("extq").state
    assert len(q.leased) == 1
    await core.until(lambda: q.stats.get("redelivered", 0) >= 1, timeout=5)
    assert time.monotonic() - extended >= 2.9
    await core.settle()
    assert _ns(c.take()) == [1]  # the lease ended: back to its consumer
