"""Replication (issue 14) under random faults: up to 50 rounds of kill -9 / restart / link cut
(drop or stall) at random points while an HA publisher (file publish store) and an HA
subscriber (logged bookmark store) keep going. After every round: the subscriber has received
every message exactly once in publisher order, every instance holds its publisher's messages
without gap or duplicate, and every message persisted-acked before the round is on every
instance; and before the next round both destinations are sync again (a round longer than
<DowngradeAfter> downgrades one, and a failover while it is downgraded may lose what its source
acknowledged alone: the documented risk of a downgrade, not a resync fault). Bounded: 50
rounds or 150 s of faults, whichever comes first (at least 20 rounds)."""

import asyncio
import os
import random
import time

import pytest

from client import MOST_RECENT, FilePublishStore, HAClient, LoggedBookmarkStore
from tests.support.cluster import Cluster
from tests.support.proc import TICKERTAPE

pytestmark = pytest.mark.skipif(
    not os.path.exists(TICKERTAPE), reason="the tickertape console script is not installed"
)

ROUNDS = 50
BUDGET = 150.0  # seconds of fault rounds
RATE = 300  # messages a second, so each round's checks stay small


class JournalCheck:
    """Per instance, the newest sequence verified contiguous from 1 (checked incrementally:
    each check replays only what came after the last verified bookmark)."""

    def __init__(self, cl: Cluster, topic: str):
        self.cl = cl
        self.topic = topic
        self.verified = dict.fromkeys(cl.names, 0)
        self.pub: str | None = None

    def check(self, name: str) -> int:
        inst = self.cl[name]
        since = "0" if self.pub is None or not self.verified[name] else (
            f"{self.pub}|{self.verified[name]}|")  # fmt: skip
        last = self.verified[name] if since != "0" else 0
        for bm, _ in inst.replay(self.topic, since=since, timeout=30):
            pub, seq = bm.split("|")[:2]
            self.pub = self.pub or pub
            assert pub == self.pub, f"{name}: a second publisher {pub}"
            assert int(seq) == last + 1, f"{name}: {bm} after seq {last} (gap or duplicate)"
            last = int(seq)
        self.verified[name] = last
        return last


def _mode(inst, dest: str) -> str | None:
    """`dest`'s mode at `inst` (sync, async, downgraded), None while it cannot be read."""
    try:
        repl = inst.admin_get("/stats").get("replication") or {}
    except OSError:
        return None
    return ((repl.get("destinations") or {}).get(dest) or {}).get("mode")


@pytest.mark.slow
async def test_random_faults_keep_every_invariant(tmp_path):
    rnd = random.Random(int(os.environ.get("TT_FAULT_SEED", "14")))
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=True, topics=("rf",),
                 downgrade_after="1s").start()  # fmt: skip
    pstore = FilePublishStore(tmp_path / "pub.store")
    bstore = LoggedBookmarkStore(tmp_path / "sub.bm")
    pub = HAClient("rf-pub", servers=cl.addresses(), publish_store=pstore)
    sub = HAClient("rf-sub", servers=cl.addresses(), bookmark_store=bstore)
    delivered: list[int] = []
    stop = asyncio.Event()
    journals = JournalCheck(cl, "rf")
    rounds = 0
    try:
        await pub.connect_and_logon(timeout=10)
        await sub.connect_and_logon(timeout=10)
        hs = await sub.subscribe("rf", bookmark=MOST_RECENT, sub_id="rf")

        async def produce():
            i = 0
            while not stop.is_set():
                await pub.publish("rf", b'{"i":%d}' % i)
                i += 1
                if i % 30 == 0:
                    await asyncio.sleep(30 / RATE)

        async def consume():
            while True:
                m = await hs.next()
                if m is None:
                    return
                seq = int(m.bookmark.split("|")[1])
                assert seq == len(delivered) + 1, f"delivered {seq} after {len(delivered)}"
                delivered.append(seq)
                hs.discard(m)

        producer = asyncio.ensure_future(produce())
        consumer = asyncio.ensure_future(consume())
        began = time.monotonic()
        while rounds < ROUNDS and time.monotonic() - began < BUDGET:
            rounds += 1
            acked_before = pub.persisted_seq
            fault = rnd.choice(["kill", "drop", "stall"])
            await asyncio.sleep(rnd.uniform(0.05, 0.6))  # a random point of the stream
            if fault == "kill":
                victim = cl[rnd.choice(cl.names)]
                victim.kill()
                await asyncio.sleep(rnd.uniform(0.1, 0.8))
                await asyncio.to_thread(victim.start)
            else:
                cl.cut("tt-a", "tt-b", fault)
                await asyncio.sleep(rnd.uniform(0.1, 1.2))
                cl.heal()
            # invariants at the end of the round
            assert not consumer.done() or consumer.exception() is None
            for name in cl.names:
                deadline = time.monotonic() + 20
                while await asyncio.to_thread(journals.check, name) < acked_before:
                    assert time.monotonic() < deadline, (
                        f"round {rounds} ({fault}): {name} lacks persisted messages up to "
                        f"{acked_before} (has {journals.verified[name]})"
                    )
                    await asyncio.sleep(0.2)
            # a round that outlasted <DowngradeAfter> (1 s) downgraded a destination: its
            # source acknowledged alone meanwhile, which is safe for failover only once the
            # destination has caught up and is sync again (docs/replication.md "Downgrade and
            # upgrade"); the next fault waits for that, or it could kill the only holder
            for name in cl.names:
                other = next(n for n in cl.names if n != name)
                deadline = time.monotonic() + 20
                while await asyncio.to_thread(_mode, cl[name], other) != "sync":
                    assert time.monotonic() < deadline, f"round {rounds}: {other} not sync again"
                    await asyncio.sleep(0.1)
        stop.set()
        await producer
        await pub.publish_flush(timeout=60)
        last = pub.last_seq
        deadline = time.monotonic() + 60
        while len(delivered) < last and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert delivered == list(range(1, last + 1))
        for name in cl.names:
            deadline = time.monotonic() + 60
            while await asyncio.to_thread(journals.check, name) < last:
                assert time.monotonic() < deadline, f"{name} did not converge"
                await asyncio.sleep(0.2)
            assert journals.verified[name] == last
        consumer.cancel()
    finally:
        stop.set()
        await pub.close()
        await sub.close()
        pstore.close()
        bstore.close()
        cl.close()
    assert rounds >= 20, f"only {rounds} rounds in {BUDGET}s"
