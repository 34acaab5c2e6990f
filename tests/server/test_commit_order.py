"""The commit order under random interleavings: a real Journal in tmp_path, the real Pipeline
and SyncGate on the running loop, driven by a seeded random schedule of publishes (one at a
time, runs, large ones that go to the writer thread), read ends (inline commits), forced
threaded commits, flush markers, `after_commit` callbacks, loop turns, a sync destination's
acks (the gate holds and releases) and a lagging replica that is downgraded, falls behind and
rejoins. The pipeline's own `CommitChecks` (server/pipeline_check.py) runs at every step, and
the test checks from the outside, at every ack, delivery and callback:

- `persisted` acks of a publisher never go back, and an acked sequence is durable then (in the
  journal's index) and, while the sync destination is active, below what it has acked;
- a flush marker or an `after_commit` callback comes after everything accepted before it is
  durable (acked, for the marker's own publisher);
- live delivery gets each message once, only once it is durable, in journal order;
- after a reopen, the journal holds every acked message, in the order it was delivered.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from journal.journal import Journal
from journal.record import KIND_MESSAGE, R_KIND, R_POSITION, R_PUBLISHER, R_SEQ
from server.pipeline import INLINE_COMMIT_BYTES, STORED, Pipeline
from server.pipeline_check import CommitChecks
from server.replication.sync import SyncGate
from tests.server.test_pipeline_engine import make_pipeline

SEEDS = range(12)
STEPS = 300


class World:
    """What the test knows independently of the pipeline, and the checks at each callback."""

    def __init__(self, journal: Journal, p: Pipeline, gate: SyncGate | None) -> None:
        self.journal = journal
        self.p = p
        self.gate = gate
        self.errors: list[str] = []
        # (pub, seq) -> (replica's acked position, destination active) when it was acked
        self.acked_at: dict[tuple[int, int], tuple[int, bool]] = {}
        self.delivered: list[tuple[int, int]] = []  # (pub, seq), in delivery order
        self.accepted: dict[int, int] = {}  # pub -> highest seq the pipeline STORED

    def durable(self, pub: int, seq: int) -> bool:
        return self.journal.locate(pub, seq) is not None

    def replica(self) -> tuple[int, bool]:
        if self.gate is None:
            return 0, False
        d = self.gate.dests["b"]
        return d.acked, d.active

    def on_deliver(self, msgs: list[Any], end: int) -> None:
        for m in msgs:
            if m.position >= end or not self.durable(m.pub, m.seq):
                self.errors.append(f"delivered {m.pub}:{m.seq} before it is durable")
            self.delivered.append((m.pub, m.seq))


class Pub:
    """A publishing client (the pipeline's `Publisher`) that checks each answer it gets."""

    def __init__(self, world: World, pub: int, gated: bool) -> None:
        self.world = world
        self.pub = pub
        self.gated = gated  # the index lags inline early acks: checked after the reopen
        self.wants_persisted = True
        self.next_seq = 1
        self.acked = 0
        self.flushes: list[Any] = []

    def persisted(self, seq: int) -> None:
        w = self.world
        if seq < self.acked:
            w.errors.append(f"publisher {self.pub}: ack {seq} after {self.acked}")
        if self.gated and not w.durable(self.pub, seq):
            w.errors.append(f"publisher {self.pub}: ack {seq} before it is durable")
        for s in range(self.acked + 1, seq + 1):
            w.acked_at[(self.pub, s)] = w.replica()
        self.acked = max(self.acked, seq)

    def persist_failed(self, reason: str, detail: str) -> None:
        self.world.errors.append(f"publisher {self.pub}: a commit failed: {detail}")

    def flush_done(self, cid: Any, acks: list[str]) -> None:
        if self.acked < cid:  # cid: the highest seq accepted before the marker
            self.world.errors.append(f"publisher {self.pub}: flush after {cid} before its ack")
        self.flushes.append(cid)

    def flush_failed(self, cid: Any, acks: list[str], reason: str) -> None:
        self.world.errors.append(f"publisher {self.pub}: flush failed: {reason}")


def after_check(world: World, owed: dict[int, int]) -> Any:
    def done(err: BaseException | None) -> None:
        if err is not None:
            world.errors.append(f"after_commit failed: {err}")
        for pub, seq in owed.items():
            if seq and not world.durable(pub, seq):
                world.errors.append(f"after_commit before {pub}:{seq} is durable")

    return done


async def run_schedule(tmp_path: Any, seed: int, gated: bool, checks: bool = True) -> World:
    rng = random.Random(seed)
    journal = Journal(str(tmp_path / "journal"), durability="write")
    loop = asyncio.get_running_loop()
    loop_errors: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(repr(ctx.get("exception"))))
    p = make_pipeline(journal)
    p.checks = CommitChecks() if checks else None  # off: only the test's own checks
    gate = None
    if gated:
        gate = SyncGate((("b", True, None),), lambda: p.delivered_end, loop.call_later)
        p.attach_gate(gate)
        gate.start()
        gate.link_up("b")
    world = World(journal, p, gate)
    p.on_deliver.append(world.on_deliver)
    pubs = [Pub(world, pub, gated) for pub in (11, 12, 13)]

    def publish(c: Pub, size: int) -> None:
        seq, outcome = p.publish(c, c.pub, c.next_seq, "t", b"x" * size)
        if outcome == STORED:
            world.accepted[c.pub] = seq
            c.next_seq += 1

    try:
        for _ in range(STEPS):
            op = rng.random()
            c = rng.choice(pubs)
            if op < 0.30:  # small publishes, then the end of the read (an inline commit)
                for _ in range(rng.randint(1, 4)):
                    publish(c, rng.randint(1, 200))
                if rng.random() < 0.5:
                    p.read_done()
            elif op < 0.36:  # a large one: the writer thread, and holding behind it
                publish(c, rng.randint(INLINE_COMMIT_BYTES, 4 * INLINE_COMMIT_BYTES))
            elif op < 0.42:  # a run from one read
                items = [(c.next_seq + i, "t", b"r" * rng.randint(1, 300)) for i in range(3)]
                took = p.publish_run(c, c.pub, items)
                if took:
                    c.next_seq += took
                    world.accepted[c.pub] = c.next_seq - 1
            elif op < 0.46 and c.next_seq > 1:  # a re-send of the last: a duplicate, acked again
                p.publish(c, c.pub, c.next_seq - 1, "t", b"dup")
            elif op < 0.51:
                p.add_flush(c, world.accepted.get(c.pub, 0), ["persisted"])
            elif op < 0.55:
                p.after_commit(after_check(world, dict(world.accepted)))
            elif op < 0.62:
                p.flush(inline=rng.random() < 0.5)
            elif op < 0.80:
                await asyncio.sleep(0 if rng.random() < 0.6 else 0.001)
            elif gate is not None:
                d = gate.dests["b"]
                if op < 0.95 and d.connected:  # the replica acks part of what it has
                    gate.acked("b", rng.randint(d.acked, p.delivered_end))
                elif op < 0.96 and d.connected:  # it lags: the link drops, it is downgraded
                    gate.link_down("b")
                    gate.downgrade("b", by="the test")
                elif op < 0.99 and not d.connected:  # it rejoins, acking its way back
                    gate.link_up("b")
                elif rng.random() < 0.2:  # the admin upgrades it, caught up or not
                    gate.upgrade("b", by="the test")
            assert not world.errors, world.errors
            assert not loop_errors, loop_errors
        # the end: the replica catches up, everything commits and is acked
        for _ in range(2000):
            if gate is not None:
                gate.link_up("b")
                gate.acked("b", p.delivered_end)
            if not p.scheduled and not p.inflight_batches and not (gate and gate.held):
                break
            p.flush(inline=False)
            await asyncio.sleep(0.001)
        assert not world.errors, world.errors
        assert not loop_errors, loop_errors
        for c in pubs:
            assert c.acked == world.accepted.get(c.pub, 0), (c.pub, c.acked)
    finally:
        loop.set_exception_handler(None)
        journal.close()
    reopened_check(tmp_path, world)
    return world


def reopened_check(tmp_path: Any, world: World) -> None:
    """After a reopen: every acked message is there, delivered once each in journal order, and
    what was acked while the replica was active ends below what it had acked."""
    journal = Journal(str(tmp_path / "journal"), durability="write")
    try:
        order: list[tuple[int, int]] = []
        ends: dict[tuple[int, int], int] = {}
        last: tuple[int, int] | None = None
        for batch in journal.raw_batches():
            for r in batch:
                if last is not None:
                    ends[last] = r[R_POSITION]
                if r[R_KIND] == KIND_MESSAGE:
                    last = (r[R_PUBLISHER], r[R_SEQ])
                    order.append(last)
        if last is not None:
            ends[last] = journal.end_position
    finally:
        journal.close()
    assert world.delivered == order, "live delivery is not the journal's order, once each"
    for key, (replica, active) in world.acked_at.items():
        assert key in ends, f"acked {key} is not in the journal after a reopen"
        if active:
            assert ends[key] <= replica, f"acked {key} before the sync destination had it"


@pytest.mark.parametrize("seed", SEEDS)
async def test_commit_order_with_a_sync_gate_and_a_lagging_replica(tmp_path, seed):
    await run_schedule(tmp_path, seed, gated=True)


@pytest.mark.parametrize("seed", SEEDS)
async def test_commit_order_without_a_gate(tmp_path, seed):
    """No gate: small lone commits ack early, inline (before the index update)."""
    await run_schedule(tmp_path, seed, gated=False)
