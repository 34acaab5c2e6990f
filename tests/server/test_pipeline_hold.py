"""The pipeline holds its open batch while the journal has a batch committing
(Pipeline._flush_soon): reads of a few frames each make one batch per commit, not one batch (a
writer hand-off, a loop wake-up, an ack) per read."""

from __future__ import annotations

import asyncio

from server.fanout import Fanout
from server.pipeline import HOLD_BYTES, Pipeline
from server.router import Router
from tests.server.test_pipeline_engine import Publisher


class GatedJournal:
    """A journal whose commits complete only when the test says so, in submit order."""

    def __init__(self) -> None:
        self.end_position = 0
        self.submitted: list[tuple[bytes, object]] = []

    def publishers(self) -> dict:
        return {}

    def publisher_owners(self) -> dict:
        return {}

    def commit_inline(self, data, entries, done, meta, on_written=None) -> bool:
        return False  # everything goes through submit, like a busy journal

    def submit(self, data, entries, done, meta) -> None:
        self.submitted.append((data, done))

    def fence(self) -> None:
        pass

    def complete(self, err: BaseException | None = None) -> None:
        data, done = self.submitted.pop(0)
        pos, self.end_position = self.end_position, self.end_position + len(data)
        done(pos if err is None else None, err)


def make(journal) -> Pipeline:
    return Pipeline(journal, lambda t: True, asyncio.get_running_loop(), Fanout(Router()), print)


async def _turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def _read(p: Pipeline, pub: Publisher, seq: int) -> None:
    """One read of one publish frame, then the rest of the loop iteration."""
    p.publish(pub, 5, seq, "orders", b'{"n":%d}' % seq)
    p.read_done()
    await _turn()


async def test_reads_behind_a_commit_make_one_batch_and_one_ack():
    journal = GatedJournal()
    p = make(journal)
    pub = Publisher()
    await _read(p, pub, 1)
    assert len(journal.submitted) == 1 and p.inflight_batches == 1
    for seq in range(2, 10):  # eight reads while it commits: held, not submitted
        await _read(p, pub, seq)
    assert len(journal.submitted) == 1 and p.holding and len(p.batch.msgs) == 8
    journal.complete()
    await _turn()
    # the commit's completion hands the held batch on: one batch for the eight reads
    assert pub.persisted_seqs == [1]
    assert len(journal.submitted) == 1 and not p.holding and p.batch.empty()
    assert journal.submitted[0][0].count(b'"n":') == 8
    journal.complete()
    await _turn()
    assert pub.persisted_seqs == [1, 9]  # one ack for the eight
    assert p.inflight_batches == 0 and p.durable[5] == 9


async def test_nothing_in_flight_nothing_held():
    journal = GatedJournal()
    p = make(journal)
    pub = Publisher()
    await _read(p, pub, 1)  # submitted at the end of its iteration, as before
    assert len(journal.submitted) == 1 and not p.holding


async def test_a_held_batch_past_hold_bytes_goes_at_once():
    journal = GatedJournal()
    p = make(journal)
    pub = Publisher()
    await _read(p, pub, 1)
    await _read(p, pub, 2)
    assert p.holding
    p.publish(pub, 5, 3, "orders", b"x" * HOLD_BYTES)
    await _turn()
    assert len(journal.submitted) == 2 and not p.holding and p.batch.empty()


async def test_a_direct_flush_submits_a_held_batch():
    """Shutdown (server/app.py) calls flush() and waits for inflight_batches to drain."""
    journal = GatedJournal()
    p = make(journal)
    pub = Publisher()
    for seq in (1, 2):
        await _read(p, pub, seq)
    assert p.holding
    p.flush()
    assert len(journal.submitted) == 2 and not p.holding


async def test_a_failed_commit_fails_the_held_batch_too():
    journal = GatedJournal()
    p = make(journal)
    pub = Publisher()
    for seq in (1, 2, 3):
        await _read(p, pub, seq)
    assert p.holding and len(p.batch.msgs) == 2
    journal.complete(OSError(28, "No space left on device"))
    await _turn()
    # the open (held) batch was built before the failure was known: it fails with the rest
    assert p.batch.empty() and len(pub.failures) >= 1 and pub.persisted_seqs == []
    assert p.gaps[5] == 1 and p.inflight_batches == 0


async def test_a_flush_marker_alone_is_not_held_and_keeps_its_order():
    """A batch without data (a flush marker) is never held: handed on inside a commit's
    completion it would complete before that commit's own acks."""
    journal = GatedJournal()
    p = make(journal)
    pub = Publisher()
    order: list = []
    pub.persisted = lambda seq: order.append(("persisted", seq))  # type: ignore[method-assign]
    pub.flush_done = lambda cid, acks: order.append(("flush", cid))  # type: ignore[method-assign]
    await _read(p, pub, 1)
    p.add_flush(pub, "f1", ["completed"])
    await _turn()
    assert not p.holding and len(journal.submitted) == 2  # queued behind the commit, as before
    journal.complete()
    journal.complete()
    await _turn()
    assert order == [("persisted", 1), ("flush", "f1")]
