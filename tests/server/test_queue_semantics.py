"""Queue semantics of seed 004 (issue 12, items 1-3 and the queue part of 8), in-process:
sow_delete by filter with every option, expiration when a lease ends, the default lease, and
the options at-most-once queues ignore."""

from __future__ import annotations

import asyncio
import json
import time

from config.model import DEFAULT_LEASE_PERIOD
from server.replay_plan import now_us

QUEUES = """<SOW>
  <Queue><Name>fq</Name><UnderlyingTopic>f</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>
         <DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>expq</Name><UnderlyingTopic>exp</UnderlyingTopic><LeasePeriod>300ms</LeasePeriod>
         <Expiration>150ms</Expiration><DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>eq</Name><UnderlyingTopic>e</UnderlyingTopic><LeasePeriod>300ms</LeasePeriod>
         <DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>longq</Name><UnderlyingTopic>long</UnderlyingTopic>
         <Expiration>100ms</Expiration><DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>amo</Name><UnderlyingTopic>amo</UnderlyingTopic><Semantics>at-most-once</Semantics>
         <MaxPerSubscriptionBacklog>2</MaxPerSubscriptionBacklog>
         <DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>cq</Name><UnderlyingTopic>c</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


def _deliveries(frames):
    return [f for f in frames if f["c"] == "p"]


def _ns(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in _deliveries(frames)]


def _acks(frames):
    return [f for f in frames if f["c"] == "ack"]


async def _setup(make_core, topic: str, count: int, **publish):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, count + 1):
        pub.send("publish", json.dumps({"n": n}), t=topic, s=n, **publish)
    await core.settle()
    dead = core.client("dead-watch")
    dead.send("subscribe", t="dead", sub_id="d")
    return core, pub, dead


# -- item 1: sow_delete by filter does what the option says ----------------------------------------


async def test_cancel_by_filter_returns_the_message(make_core):
    core, _, _ = await _setup(make_core, "f", 3)
    c = core.client("c")
    c.send("subscribe", t="fq", sub_id="q", o="max_backlog=10")
    assert _ns(c.take()) == [1, 2, 3]
    c.send("sow_delete", t="fq", f="/n = 2", o="cancel", a="processed", cid="x")
    await core.settle()
    got = c.take()
    assert [a["records_deleted"] for a in _acks(got)] == [1]
    assert _ns(got) == [2]  # given back: redelivered at once (the backlog has room)
    q = core.queues.get("fq").state
    assert q.stats["acked"] == 0 and q.stats["redelivered"] == 1 and len(q.leased) == 3


async def test_lease_extend_by_filter_keeps_the_lease(make_core):
    core, _, _ = await _setup(make_core, "f", 2)
    c = core.client("c")
    c.send("subscribe", t="fq", sub_id="q", o="max_backlog=10")
    assert _ns(c.take()) == [1, 2]
    q = core.queues.get("fq").state
    before = dict(q.leased)
    c.send("sow_delete", t="fq", f="/n = 1", o="lease_extend=1h", a="processed", cid="x")
    await core.settle()
    assert [a["records_deleted"] for a in _acks(c.take())] == [1]
    assert q.stats["acked"] == 0 and len(q.leased) == 2
    (pos1,) = [p for p, lease in before.items() if lease[2].endswith("|1|")]
    assert q.leased[pos1].gen != before[pos1].gen  # a new lease generation: the extended end


async def test_expire_by_filter_dead_letters_leased_and_waiting(make_core):
    core, _, dead = await _setup(make_core, "f", 3)
    c = core.client("c")
    c.send("subscribe", t="fq", sub_id="q")  # backlog 1: 1 leased, 2 and 3 waiting
    assert _ns(c.take()) == [1]
    c.send("sow_delete", t="fq", f="/n <= 2", o="expire", a="processed", cid="x")
    await core.settle()
    got = c.take()
    assert [a["records_deleted"] for a in _acks(got)] == [2]
    assert _ns(got) == [3]
    reasons = sorted((json.loads(f.body)["n"], f["reason"]) for f in _deliveries(dead.take()))
    assert reasons == [(1, "expired by consumer"), (2, "expired by consumer")]


async def test_cancel_by_filter_leaves_waiting_messages_alone(make_core):
    core, _, _ = await _setup(make_core, "f", 2)
    admin = core.client("admin")
    admin.send("sow_delete", t="fq", f="1=1", o="cancel", a="processed", cid="x")
    await core.settle()
    assert [a["records_deleted"] for a in _acks(admin.take())] == [0]
    assert core.queues.get("fq").state.depth == 2


# -- item 2: a message whose expiration passed while leased expires when the lease ends ----------


async def test_queue_expiration_passed_during_the_lease(make_core):
    core, _, dead = await _setup(make_core, "exp", 1)
    c = core.client("c")
    c.send("subscribe", t="expq", sub_id="q")
    assert _ns(c.take()) == [1]
    q = core.queues.get("expq").state
    await core.until(lambda: not q.leased, timeout=3)
    await core.settle()
    assert _ns(c.take()) == []  # not redelivered
    ((h, _),) = [(f, f.body) for f in _deliveries(dead.take())]
    assert h["reason"] == "expiration" and h["deliveries"] == 1
    assert q.depth == 0 and q.stats["expired"] == 1 and q.stats["redelivered"] == 0


async def test_message_expiration_passed_during_the_lease(make_core):
    core, _, dead = await _setup(make_core, "e", 1, e=0.1)
    c = core.client("c")
    c.send("subscribe", t="eq", sub_id="q")
    assert _ns(c.take()) == [1]
    q = core.queues.get("eq").state
    await core.until(lambda: not q.leased, timeout=3)
    await core.settle()
    assert _ns(c.take()) == []
    assert [f["reason"] for f in _deliveries(dead.take())] == ["expiration"]
    assert q.depth == 0


async def test_a_cancel_after_the_expiration_expires(make_core):
    core, _, dead = await _setup(make_core, "exp", 1)
    c = core.client("c")
    c.send("subscribe", t="expq", sub_id="q")
    (d,) = _deliveries(c.take())
    await asyncio.sleep(0.2)  # past <Expiration> 150ms, within the 300ms lease
    c.send("sow_delete", t="expq", bm=d["bm"], o="cancel", a="processed", cid="x")
    await core.settle()
    assert _ns(c.take()) == []
    assert [f["reason"] for f in _deliveries(dead.take())] == ["expiration"]


async def test_a_returned_message_expires_while_it_waits(make_core):
    core, _, dead = await _setup(make_core, "exp", 1)
    c = core.client("c")
    c.send("subscribe", t="expq", sub_id="q")
    assert _ns(c.take()) == [1]
    c.disconnect()  # returned within its expiration: it waits again
    q = core.queues.get("expq").state
    assert q.depth == 1
    await asyncio.sleep(0.2)
    q.expire_due(now_us())
    await core.settle()
    assert q.depth == 0
    assert [f["reason"] for f in _deliveries(dead.take())] == ["expiration"]


async def test_a_message_expiration_replaces_the_queues(make_core):
    """ExpirationModel default (seed 004): the message's own `e` when it has one."""
    core, pub, dead = await _setup(make_core, "long", 0)
    pub.send("publish", json.dumps({"n": 1}), t="long", s=1, e=30)
    pub.send("publish", json.dumps({"n": 2}), t="long", s=2)
    await core.settle()
    await asyncio.sleep(0.15)
    q = core.queues.get("longq").state
    q.expire_due(now_us())
    await core.settle()
    assert [json.loads(f.body)["n"] for f in _deliveries(dead.take())] == [2]
    c = core.client("c")
    c.send("subscribe", t="longq", sub_id="q")
    assert _ns(c.take()) == [1]


async def test_a_fraction_of_a_second_survives_a_restart(make_core):
    """`e` is stored in whole seconds, rounded up: 0.5 s is 1 s after a restart, never 0."""
    core = make_core(QUEUES)
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="e", s=1, e=0.5)
    await core.settle()
    core.close()
    again = make_core(QUEUES)
    q = again.queues.get("eq").state
    assert q.depth == 1
    q.expire_due(now_us())
    assert q.depth == 1  # not expired at once
    c = again.client("c")
    c.send("subscribe", t="eq", sub_id="q")
    assert _ns(c.take()) == [1]


# -- item 3: the lease of a queue without <LeasePeriod> ---------------------------------------------


async def test_a_queue_without_lease_period_leases_for_the_default(make_core):
    core, _, _ = await _setup(make_core, "c", 1)
    spec = core.config.queue("cq")
    assert spec.lease_period == DEFAULT_LEASE_PERIOD == 30.0  # the configuration says it
    c = core.client("c")
    c.send("subscribe", t="cq", sub_id="q")
    (d,) = _deliveries(c.take())
    assert "lp" in d.header  # the wire contract: every at-least-once delivery says when
    (deadline, _, _), *_ = core.queues.get("cq").state.lease_heap
    assert 29.5 < deadline - time.monotonic() <= 30.0


# -- item 8: at-most-once queues ignore cancel and expire; backlog held until acked ----------------


async def test_at_most_once_ignores_cancel_and_expire(make_core):
    core, _, dead = await _setup(make_core, "amo", 4)
    c = core.client("c")
    c.send("subscribe", t="amo", sub_id="q", o="max_backlog=2")
    assert _ns(c.take()) == []  # sent once their DELIVERED_AT_MOST_ONCE events are durable
    await core.settle()
    first = _deliveries(c.take())
    assert _ns(first) == [1, 2]
    await asyncio.sleep(0.02)
    assert _ns(c.take()) == []  # the backlog is held until acknowledged
    c.send("sow_delete", t="amo", bm=first[0]["bm"], o="cancel", a="processed", cid="a")
    c.send("sow_delete", t="amo", bm=first[1]["bm"], o="expire", a="processed", cid="b")
    await core.settle()
    got = c.take()
    assert _ns(got) == [3, 4]  # the backlog is free; nothing came back
    assert [a["records_deleted"] for a in _acks(got)] == [1, 1]
    assert _deliveries(dead.take()) == []
    q = core.queues.get("amo").state
    assert q.stats["redelivered"] == 0 and q.stats["expired"] == 0
    c.disconnect()
    again = core.client("c2")
    again.send("subscribe", t="amo", sub_id="q", o="max_backlog=2")
    await core.settle()
    assert _ns(again.take()) == []  # at most once: never delivered again


async def test_a_content_filtered_queue_subscription_gets_only_matches(make_core):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, 7):
        pub.send("publish", json.dumps({"n": n, "odd": n % 2}), t="c", s=n)
    await core.settle()
    odd = core.client("odd")
    odd.send("subscribe", t="cq", sub_id="q", f="/odd = 1", o="max_backlog=10")
    assert _ns(odd.take()) == [1, 3, 5]
    even = core.client("even")
    even.send("subscribe", t="cq", sub_id="q", f="/odd = 0", o="max_backlog=10")
    assert _ns(even.take()) == [2, 4, 6]


def test_verify_config_states_the_lease_and_the_expiration(tmp_path):
    from config.loader import load_config_text
    from server.cli import _queue_lines
    from tests.support.proc import make_config

    lines = _queue_lines(load_config_text(make_config(str(tmp_path), extra=QUEUES)))
    assert "  queue cq over c: at-least-once, leases end after 30s; " in lines[-1]
    assert "expire 0.15s after receipt unless their own `e` says otherwise" in lines[1]
    assert "at-most-once (no lease)" in lines[4]


# -- item 7: a queue over a set of topics (a pattern <UnderlyingTopic>) -----------------------------

MD_QUEUE = r"""<SOW>
  <Queue><Name>mdq</Name><UnderlyingTopic>md\..*</UnderlyingTopic>
         <DefaultPublishTarget>md.default</DefaultPublishTarget>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


async def test_a_queue_over_a_pattern_of_recorded_topics(make_core):
    core = make_core(MD_QUEUE, topics=(r"md\.(eq|fx|default)",))
    pub = core.client("pub")
    for n, topic in enumerate(("md.eq", "md.bonds", "chat", "md.fx", "mdq"), 1):
        pub.send("publish", json.dumps({"n": n}), t=topic)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="mdq", sub_id="q", o="max_backlog=10")
    got = _deliveries(c.take())
    # md.bonds matches but is not recorded; a publish to the queue's name went to md.default
    assert [(json.loads(f.body)["n"], f["t"]) for f in got] == [
        (1, "md.eq"),
        (4, "md.fx"),
        (5, "md.default"),
    ]
    c.send("sow_delete", t="mdq", bm=got[0]["bm"], a="processed", cid="a")
    await core.settle()
    core.queues._last_checkpoint = 0.0
    pub.send("publish", json.dumps({"n": 6}), t="md.eq")
    await core.settle()
    core.close()
    again = make_core(MD_QUEUE, topics=(r"md\.(eq|fx|default)",))
    c = again.client("c")
    c.send("subscribe", t="mdq", sub_id="q", o="max_backlog=10")
    assert _ns(c.take()) == [4, 5, 6]  # acked 1 stays acked after a restart
    b = again.client("b")
    b.send("subscribe", t="mdq", sub_id="r", bm="0")  # a replay of the underlying topics
    await again.until(lambda: b.session.table.get("r").state.value == "live")
    assert _ns(b.take()) == [1, 4, 5, 6]


async def test_expire_by_bookmark_dead_letters_and_never_redelivers(make_core):
    core, _, dead = await _setup(make_core, "f", 2)
    c = core.client("c")
    c.send("subscribe", t="fq", sub_id="q")
    (d,) = _deliveries(c.take())
    c.send("sow_delete", t="fq", bm=d["bm"], o="expire", a="processed", cid="x")
    await core.settle()
    got = c.take()
    assert [a["records_deleted"] for a in _acks(got)] == [1]
    assert _ns(got) == [2]  # the next one; 1 is gone
    assert [(f["reason"], f["source_bm"]) for f in _deliveries(dead.take())] == [
        ("expired by consumer", d["bm"])
    ]
    q = core.queues.get("fq").state
    assert q.stats["expired"] == 1 and q.stats["dead_lettered"] == 1 and q.depth == 0


# -- issue 23, finding 9: one message never costs the others of its commit ------------------------


async def _one_commit(core, exps) -> list[int]:
    """Messages n = 1.. on topic `c` (queue cq), the n-th with expiration exps[n-1], straight
    into the pipeline (past the publish checks, as a replicated record or an older peer would
    come) in one batch; returns their positions once committed."""
    for n, exp in enumerate(exps, 1):
        core.pipeline.publish(None, 4242, n, "c", json.dumps({"n": n}).encode(), b"", exp)
    await core.settle()
    return [core.journal.locate(4242, n) for n in range(1, len(exps) + 1)]


async def test_an_expiration_too_large_to_count_still_queues_the_whole_commit(make_core):
    core = make_core(QUEUES)
    q = core.queues.get("cq").state
    positions = await _one_commit(core, [None, 1.7e308, None, 3600, None])
    assert q.depth == 5
    assert q.expiry[positions[1]] > q.expiry[positions[3]]  # bounded, not overflowed
    c = core.client("c")
    c.send("subscribe", t="cq", sub_id="q", o="max_backlog=10")
    assert _ns(c.take()) == [1, 2, 3, 4, 5]


async def test_a_message_that_fails_to_queue_waits_and_the_rest_of_its_commit_is_queued(
    make_core, monkeypatch
):
    core = make_core(QUEUES)
    q = core.queues.get("cq").state

    def broken(ts, exp):  # any fault in one message's bookkeeping
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(q, "deadline_for", broken)
    positions = await _one_commit(core, [None, 9.0, None, None])
    assert q.depth == 4 and q.low_water(core.pipeline.delivered_end) == positions[0]
    c = core.client("c")
    c.send("subscribe", t="cq", sub_id="q", o="max_backlog=10")
    assert _ns(c.take()) == [1, 2, 3, 4]  # 2 without its expiration, rather than lost


async def test_recovery_keeps_a_message_whose_bookkeeping_fails_and_every_other(
    make_core, monkeypatch
):
    from server.queue_state import QueueState
    from server.queues import QueueManager

    core = make_core(QUEUES)
    positions = await _one_commit(core, [None, 9.0, None])

    def broken(self, ts, exp):
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(QueueState, "deadline_for", broken)
    again = QueueManager(core.config.queues, "core", core.journal, core.loop, core.pipeline)
    again.recover()  # a restart over the same journal
    q = again.get("cq").state
    assert [p for p in q.avail_pos if p not in q.gone] == positions
