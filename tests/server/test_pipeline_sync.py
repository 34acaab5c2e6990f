"""The pipeline with a sync gate and a real journal: `persisted` acks, flush markers and
after_commit callbacks wait for the sync destination's ack, in order; live delivery does not;
a failed local commit still fails at once."""

from __future__ import annotations

import asyncio

from journal.errors import JournalError
from server.pipeline import Pipeline
from server.replication.sync import SyncGate
from tests.server.core_harness import split_frames
from tests.server.test_pipeline_engine import Publisher, _settle, make_pipeline, subscriber


def gated(journal, dests=(("b", True, None),)) -> tuple[Pipeline, SyncGate]:
    p = make_pipeline(journal)
    loop = asyncio.get_running_loop()
    gate = SyncGate(dests, lambda: p.delivered_end, loop.call_later)
    p.attach_gate(gate)
    gate.start()
    return p, gate


async def test_acks_wait_for_the_sync_destination_and_go_out_in_order(journal):
    p, gate = gated(journal)
    gate.link_up("b")
    sub, transport = subscriber(p.fanout, "orders")
    pub = Publisher()
    done: list = []
    p.publish(pub, 7, 1, "orders", b"{}")
    await _settle(p)
    first_end = p.delivered_end
    p.publish(pub, 7, 2, "orders", b"{}")
    p.add_flush(pub, "f1", ["persisted"])
    p.after_commit(done.append)
    await _settle(p)
    # durable here and delivered live, but not acked: the destination has not acked
    assert len(split_frames(bytes(transport.data))) == 2
    assert pub.persisted_seqs == [] and pub.flushes == [] and done == []
    assert gate.held == 2
    gate.acked("b", first_end)
    assert pub.persisted_seqs == [1] and pub.flushes == [] and done == []
    gate.acked("b", p.delivered_end)
    assert pub.persisted_seqs == [1, 2]
    assert pub.flushes == [("f1", ["persisted"], None)] and done == [None]
    # the journal holds them whatever the destination does
    assert journal.locate(7, 2) is not None


async def test_a_duplicate_ack_waits_behind_the_held_original(journal):
    p, gate = gated(journal)
    pub = Publisher()
    p.publish(pub, 7, 1, "orders", b"{}")
    await _settle(p)
    p.publish(pub, 7, 1, "orders", b"{}")  # re-sent before the ack: a duplicate
    await _settle(p)
    assert pub.persisted_seqs == [] and gate.held == 2
    gate.acked("b", p.delivered_end)
    assert pub.persisted_seqs == [1, 1]


async def test_downgrade_releases_and_async_destinations_never_hold(journal):
    p, gate = gated(journal, (("b", True, None), ("c", False, None)))
    pub = Publisher()
    p.publish(pub, 7, 1, "orders", b"{}")
    await _settle(p)
    assert pub.persisted_seqs == []
    gate.downgrade("b")
    assert pub.persisted_seqs == [1]
    p.publish(pub, 7, 2, "orders", b"{}")
    await _settle(p)
    assert pub.persisted_seqs == [1, 2]  # only an async destination (c) and a downgraded one


async def test_no_sync_destination_acks_at_commit(journal):
    p, gate = gated(journal, (("c", False, None),))
    pub = Publisher()
    p.publish(pub, 7, 1, "orders", b"{}")
    await _settle(p)
    assert pub.persisted_seqs == [1] and gate.held == 0


async def test_a_failed_local_commit_fails_at_once_while_earlier_acks_are_held(journal):
    p, gate = gated(journal)
    pub = Publisher()
    p.publish(pub, 7, 1, "orders", b"{}")
    await _settle(p)
    assert gate.held == 1

    def refuse(*args, **kwargs):
        raise JournalError("closed")

    # both ways a batch reaches the journal: the writer thread, and the inline commit of a
    # lone small batch when nothing is in flight
    journal.submit, real = refuse, journal.submit
    journal.commit_inline, real_inline = refuse, journal.commit_inline
    try:
        p.publish(pub, 7, 2, "orders", b"{}")
        await _settle(p)
    finally:
        journal.submit = real
        journal.commit_inline = real_inline
    assert pub.failures and pub.persisted_seqs == []
    gate.acked("b", p.delivered_end)
    assert pub.persisted_seqs == [1]  # the earlier, committed one; never 2


async def test_the_logon_sequence_follows_the_sync_destination_not_the_local_commit(journal):
    p, gate = gated(journal)
    gate.link_up("b")
    pub = Publisher()
    p.publish(pub, 7, 1, "orders", b"{}")
    await _settle(p)
    first_end = p.delivered_end
    p.publish(pub, 7, 2, "orders", b"{}")
    await _settle(p)
    # both durable here; a publisher reconnecting now is told neither is stored
    assert journal.locate(7, 2) is not None and p.durable.get(7, 0) == 0
    gate.acked("b", first_end)
    assert p.durable[7] == 1
    gate.acked("b", p.delivered_end)
    assert p.durable[7] == 2
    # downgraded: the local commit is enough again
    gate.downgrade("b")
    p.publish(pub, 7, 3, "orders", b"{}")
    await _settle(p)
    assert p.durable[7] == 3 and pub.persisted_seqs == [1, 2, 3]
