"""Replication (issue 14): kill -9 of the instance an HA publisher (file publish store) and an HA
subscriber (logged bookmark store) are connected to, in the middle of 100,000 messages. After
the failover the survivor has every message the publisher had `persisted` acks for, the
subscriber receives every message exactly once in per-publisher order, and the killed instance
restarts, resyncs and ends with the same messages per publisher."""

import asyncio
import os
import time

import pytest

from client import MOST_RECENT, FilePublishStore, HAClient, LoggedBookmarkStore
from tests.support.cluster import Cluster, wait_until
from tests.support.proc import TICKERTAPE

pytestmark = pytest.mark.skipif(
    not os.path.exists(TICKERTAPE), reason="the tickertape console script is not installed"
)

N = 100_000


@pytest.fixture
def pair(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=True, topics=("trades",)).start()
    yield cl
    cl.close()


async def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def converged(cl: Cluster, topic: str, expected: dict[str, list[int]] | None = None):
    """Both instances hold the same sequences per publisher, each in order, no duplicate
    (and `expected` when given); returns the common map, else None."""
    maps = [inst.per_publisher(topic) for inst in cl]
    first = maps[0]
    if any(m != first for m in maps[1:]):
        return None
    if expected is not None and first != expected:
        return None
    return first


@pytest.mark.slow
async def test_kill9_mid_stream_fails_over_exactly_once_and_the_killed_instance_converges(
    pair, tmp_path
):
    a, b = pair["tt-a"], pair["tt-b"]
    pstore = FilePublishStore(tmp_path / "pub.store")
    bstore = LoggedBookmarkStore(tmp_path / "sub.bm")
    servers = pair.addresses()  # both clients start on tt-a
    pub = HAClient("repl-pub", servers=servers, publish_store=pstore)
    sub = HAClient("repl-sub", servers=servers, bookmark_store=bstore)
    delivered: list[int] = []
    acked_at_kill = 0
    try:
        await pub.connect_and_logon(timeout=10)
        await sub.connect_and_logon(timeout=10)
        hs = await sub.subscribe("trades", bookmark=MOST_RECENT, sub_id="s")

        async def consume():
            while len(delivered) < N:
                m = await hs.next(timeout=60)
                delivered.append(int(m.bookmark.split("|")[1]))
                hs.discard(m)

        async def produce():
            for i in range(N):
                await pub.publish("trades", b'{"i":%d}' % i)
            await pub.publish_flush(timeout=120)

        async def kill_a():
            nonlocal acked_at_kill
            await _wait(lambda: pub.persisted_seq >= 40_000 and len(delivered) > 20_000, 120,
                        "40,000 persisted and 20,000 delivered")  # fmt: skip
            acked_at_kill = pub.persisted_seq
            a.kill()
            # logged on to tt-b (its republish may wait: tt-b's acks wait for tt-a, its sync
            # destination, until tt-a is back)
            await _wait(lambda: pub.current_uri == servers[1], 30, "the failover to tt-b")
            # every message persisted-acked before the kill is on the survivor
            on_b = await asyncio.to_thread(b.per_publisher, "trades")
            seqs = next(iter(on_b.values()))
            assert len(on_b) == 1 and seqs[:acked_at_kill] == list(range(1, acked_at_kill + 1))
            await asyncio.sleep(1.0)  # tt-b's acks wait for its sync destination: tt-a
            await asyncio.to_thread(a.start)

        consumer = asyncio.ensure_future(consume())
        await asyncio.gather(produce(), kill_a())
        await asyncio.wait_for(consumer, 120)
    finally:
        await pub.close()
        await sub.close()
        pstore.close()
        bstore.close()
    assert acked_at_kill >= 40_000
    assert pub.reconnects >= 1 and sub.reconnects >= 1
    assert pub.unpersisted_count() == 0
    assert delivered == list(range(1, N + 1)), "not exactly once in publisher order"
    # the restarted instance resyncs: both end with 1..N of the one publisher
    common = await asyncio.to_thread(
        wait_until, lambda: converged(pair, "trades"), 120, "tt-a and tt-b converging"
    )
    assert [list(v) for v in common.values()] == [list(range(1, N + 1))]


@pytest.mark.slow
async def test_three_instances_failover_along_the_chooser_list(tmp_path):
    """Three instances, all sync to each other: kill the first, then the second; the clients
    fail over down the list and the last survivor has everything; both come back and every
    instance converges."""
    cl = Cluster(tmp_path, ["tt-a", "tt-b", "tt-c"], sync=True, topics=("trades",),
                 downgrade_after="1s").start()  # fmt: skip
    n = 6000
    pstore = FilePublishStore(tmp_path / "pub.store")
    pub = HAClient("repl-pub3", servers=cl.addresses(), publish_store=pstore)
    sub = HAClient("repl-sub3", servers=cl.addresses())
    got: list[int] = []
    try:
        await pub.connect_and_logon(timeout=10)
        await sub.connect_and_logon(timeout=10)
        hs = await sub.subscribe("trades", bookmark="0", sub_id="s3")

        async def consume():
            while len(got) < n:
                m = await hs.next(timeout=60)
                got.append(int(m.bookmark.split("|")[1]))
                hs.discard(m)

        async def produce():
            for i in range(n):
                await pub.publish("trades", b'{"i":%d}' % i)
                if i % 200 == 199:
                    await asyncio.sleep(0.01)
            await pub.publish_flush(timeout=60)

        async def faults():
            for victim, share in (("tt-a", 0.3), ("tt-b", 0.6)):
                await _wait(lambda s=share: pub.persisted_seq >= s * n, 60, f"{share:.0%}")
                cl[victim].kill()
            await _wait(lambda: pub.current_uri == cl.addresses()[2], 30, "failover to tt-c")

        consumer = asyncio.ensure_future(consume())
        await asyncio.gather(produce(), faults())
        await asyncio.wait_for(consumer, 60)
    finally:
        await pub.close()
        await sub.close()
        pstore.close()
    try:
        assert got == list(range(1, n + 1))
        cl.start(["tt-a", "tt-b"])
        await asyncio.to_thread(
            wait_until,
            lambda: converged(
                cl,
                "trades",
                {next(iter(cl["tt-c"].per_publisher("trades"))): list(range(1, n + 1))},
            ),
            60,
            "three instances converging",
        )
    finally:
        cl.close()
