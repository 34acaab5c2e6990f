"""An HAClient's sow_and_subscribe across a failover (client/haplace.py; docs/client.md): a real
replicated pair, the server under the subscriber killed with kill -9 while a publisher keeps
updating records (it fails over too); the subscriber ends with exactly the state of the topic,
having seen every change after its answer once, in order, none twice."""

import asyncio
import json

import pytest

from client import FilePublishStore, HAClient, MemoryBookmarkStore
from tests.support.cluster import Cluster

SOW = "<SOW><Topic><Name>book</Name><Key>/sym</Key></Topic></SOW>"
SYMS = 10
N = 1500  # updates after the first state


@pytest.fixture
def pair(tmp_path):
    # A -> B sync (what A acknowledged, B has), B -> A async (B goes on alone once A is dead)
    sync = {("tt-a", "tt-b"): True, ("tt-b", "tt-a"): False}
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=sync, extra=SOW).start()
    yield cl
    cl.close()


async def test_sow_and_subscribe_fails_over_without_a_lost_or_repeated_change(pair, tmp_path):
    servers = pair.addresses()
    pub = HAClient("sow-pub", servers=servers, publish_store=FilePublishStore(tmp_path / "p"))
    sub = HAClient("sow-sub", servers=servers, bookmark_store=MemoryBookmarkStore())
    answer: dict[str, int] = {}
    changes: dict[str, list[int]] = {f"S{i}": [] for i in range(SYMS)}
    state: dict[str, int] = {}
    try:
        await pub.connect_and_logon()
        for i in range(SYMS):
            await pub.publish("book", {"sym": f"S{i}", "v": i})
        await pub.publish_flush(timeout=20)
        await sub.connect_and_logon()
        hs = await sub.sow_and_subscribe("book", sub_id="book-1")

        async def consume():
            while any(state.get(f"S{i}") != N + i for i in range(SYMS)):
                msg = await hs.next(timeout=30)
                assert msg is not None
                doc = json.loads(msg.body)
                if msg.header.c == "sow":
                    answer[doc["sym"]] = doc["v"]
                else:
                    changes[doc["sym"]].append(doc["v"])
                    hs.discard(msg)
                state[doc["sym"]] = doc["v"]

        async def produce():
            for v in range(SYMS, N + SYMS):
                await pub.publish("book", {"sym": f"S{v % SYMS}", "v": v})
                if v % 50 == 0:
                    await asyncio.sleep(0.02)
                if v == N // 3:
                    await pub.publish_flush(timeout=20)
                    pair["tt-a"].kill()  # under both clients, mid-stream
            await pub.publish_flush(timeout=30)

        await asyncio.wait_for(asyncio.gather(consume(), produce()), 90)
    finally:
        await pub.close()
        await sub.close()
    assert sub.current_uri == servers[1]
    assert sorted(answer) == sorted(changes)  # the answer had every record
    for sym, seen in changes.items():
        published = list(range(int(sym[1:]), N + SYMS, SYMS))
        after = [v for v in published if v > answer[sym]]
        assert seen == after, f"{sym}: changes lost, repeated or out of order"
    assert state == {f"S{i}": N + i for i in range(SYMS)}
