"""`fully_durable` and the periodic `persisted` bookmark ack under sync replication, in-process:
a SyncGate on the core's pipeline, driven by hand as the senders would (no sender, no link)."""

from __future__ import annotations

import json

from server.ids import publisher_id
from server.replication.sync import SyncGate
from server.subscriptions import SubState


def gate_on(core, dests=(("b", True, None),)) -> SyncGate:
    p = core.pipeline
    gate = SyncGate(dests, lambda: p.delivered_end, core.loop.call_later)
    p.attach_gate(gate)
    gate.start()
    gate.link_up("b")
    if gate.has_sync:
        core.replays.durable_end = lambda: gate.durable_end
    return gate


def publish(pub, first: int, last: int) -> None:
    for n in range(first, last + 1):
        pub.send("publish", json.dumps({"n": n}), t="orders", s=n)


def numbers(frames) -> list[int]:
    return [json.loads(f.body)["n"] for f in frames if f["c"] == "p"]


async def collect(core, client, n: int) -> list[int]:
    """The numbers of the next n messages `client` gets (and the frames before them)."""
    got: list = []

    def enough() -> bool:
        got.extend(client.take())
        return len(numbers(got)) >= n

    await core.until(enough)
    return numbers(got)


async def test_fully_durable_delivers_only_what_the_sync_destination_acked(core):
    gate = gate_on(core)
    pub = core.client("pub")
    publish(pub, 1, 5)
    await core.settle()
    first_end = core.pipeline.delivered_end
    publish(pub, 6, 10)
    await core.settle()
    durable = core.client("durable")
    durable.send("subscribe", t="orders", sub_id="d", bm="0", o="fully_durable", a="processed")
    plain = core.client("plain")
    plain.send("subscribe", t="orders", sub_id="p", bm="0", a="processed")
    s_plain = plain.session.table.get("p")
    await core.until(lambda: s_plain.state is SubState.LIVE)
    assert numbers(plain.take()) == list(range(1, 11))  # not held: durable here is enough
    await core.settle()
    assert numbers(durable.take()) == []  # b acked nothing yet
    gate.acked("b", first_end)
    assert await collect(core, durable, 5) == [1, 2, 3, 4, 5]
    # live publishing: still only what b acked, and the subscription never joins the live path
    publish(pub, 11, 12)
    await core.settle()
    assert numbers(durable.take()) == []
    s_durable = durable.session.table.get("d")
    assert s_durable.state is SubState.REPLAYING
    gate.acked("b", core.pipeline.delivered_end)
    assert await collect(core, durable, 7) == list(range(6, 13))
    # a downgrade: the durable end is the local one again
    gate.downgrade("b")
    publish(pub, 13, 13)
    await core.settle()
    assert await collect(core, durable, 1) == [13]


async def test_fully_durable_without_sync_destinations_goes_live(core):
    gate_on(core, (("b", False, None),))
    pub = core.client("pub")
    publish(pub, 1, 3)
    await core.settle()
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="d", bm="0", o="fully_durable", a="processed")
    s = sub.session.table.get("d")
    await core.until(lambda: s.state is SubState.LIVE)
    publish(pub, 4, 4)
    await core.settle()
    assert numbers(sub.take()) == [1, 2, 3, 4]


async def test_the_persisted_bookmark_ack_names_only_what_sync_destinations_have(core):
    gate = gate_on(core)
    pub = core.client("pub")
    pid = publisher_id("pub")
    sub = core.client("sub")
    sub.send("subscribe", t="orders", sub_id="s", bm="0", a="processed,persisted")
    s = sub.session.table.get("s")
    await core.until(lambda: s.state is SubState.LIVE)
    sub.take()
    publish(pub, 1, 3)
    await core.settle()
    end3 = core.pipeline.delivered_end
    publish(pub, 4, 4)
    await core.settle()
    core.index.send_bookmark_acks()
    assert [f for f in sub.take() if f["c"] == "ack"] == []  # b has nothing yet
    gate.acked("b", end3)
    core.index.send_bookmark_acks()
    acks = [f.header for f in sub.take() if f["c"] == "ack"]
    assert acks == [
        {"c": "ack", "a": "persisted", "status": "success", "sub_id": "s", "bm": f"{pid}|3|"}
    ]
    gate.acked("b", core.pipeline.delivered_end)
    core.index.send_bookmark_acks()
    acks = [f.header for f in sub.take() if f["c"] == "ack"]
    assert acks[0]["bm"] == f"{pid}|4|"


async def test_a_replaying_subscription_acks_below_the_durable_end(core):
    gate = gate_on(core)
    pub = core.client("pub")
    pid = publisher_id("pub")
    publish(pub, 1, 3)
    await core.settle()
    end3 = core.pipeline.delivered_end
    publish(pub, 4, 6)
    await core.settle()
    sub = core.client("sub")
    sub.send(
        "subscribe", t="orders", sub_id="s", bm="0", a="processed,persisted", o="fully_durable"
    )
    gate.acked("b", end3)
    assert await collect(core, sub, 3) == [1, 2, 3]
    core.index.send_bookmark_acks()
    acks = [f.header for f in sub.take() if f["c"] == "ack"]
    assert acks[-1]["bm"] == f"{pid}|3|"
