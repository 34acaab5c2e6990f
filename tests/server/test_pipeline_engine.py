"""The publish pipeline on its own doors: a real Journal, the running loop, a fan-out, and
publishers that are plain objects (the `Publisher` protocol)."""

from __future__ import annotations

import asyncio
import errno

from journal.fileio import FaultyIO
from journal.journal import Journal
from protocol.options import subscribe_options
from server import frames
from server.fanout import Fanout
from server.outbox import Outbox
from server.pipeline import ABOVE_GAP, DUPLICATE, INLINE_COMMIT_BYTES, STORED, Pipeline
from server.pipeline_check import CommitChecks
from server.router import Router
from server.subscriptions import Subscription, SubState
from tests.server.core_harness import FakeTransport, split_frames


class Publisher:
    def __init__(self, wants_persisted: bool = True) -> None:
        self.wants_persisted = wants_persisted
        self.persisted_seqs: list[int] = []
        self.failures: list[tuple[str, str]] = []
        self.flushes: list = []

    def persisted(self, seq: int) -> None:
        self.persisted_seqs.append(seq)

    def persist_failed(self, reason: str, detail: str) -> None:
        self.failures.append((reason, detail))

    def flush_done(self, cid, acks) -> None:
        self.flushes.append((cid, acks, None))

    def flush_failed(self, cid, acks, reason: str) -> None:
        self.flushes.append((cid, acks, reason))


class Owner:
    def describe(self) -> str:
        return "test"

    def went_live(self, sub) -> None:  # pragma: no cover - no replays here
        raise AssertionError

    def range_done(self, sub) -> None:  # pragma: no cover
        raise AssertionError


def subscriber(fanout: Fanout, topic: str, sub_id: str = "s1", state=SubState.LIVE):
    transport = FakeTransport()
    out = Outbox(1 << 30, lambda reason: None)
    out.attach(transport)
    opts = subscribe_options(None)
    sub = Subscription(Owner(), out, sub_id, topic, None, None, None, opts, frozenset(), None)
    sub.state = state
    fanout.router.add(sub)
    return sub, transport


async def _settle(p: Pipeline) -> None:
    for _ in range(2000):
        await asyncio.sleep(0.001)
        if not p.scheduled and not p.inflight_batches:
            return
    raise AssertionError("no commit")


def make_pipeline(journal, backlog=None, **kw) -> Pipeline:
    p = Pipeline(
        journal,
        lambda topic: topic != "scratch",
        asyncio.get_running_loop(),
        Fanout(Router()),
        (backlog if backlog is not None else []).append,
        **kw,
    )
    p.checks = CommitChecks()  # the commit order's invariants, at every step
    return p


async def test_publish_commit_ack_and_delivery(journal):
    p = make_pipeline(journal)
    sub, transport = subscriber(p.fanout, "orders")
    pub = Publisher()
    assert p.publish(pub, 77, 1, "orders", b'{"n":1}') == (1, STORED)
    assert p.publish(pub, 77, 2, "orders", b'{"n":2}', b',"x":"c"') == (2, STORED)
    assert pub.persisted_seqs == [] and not transport.data  # not durable yet
    start = p.delivered_end
    await _settle(p)
    assert pub.persisted_seqs == [2]
    assert p.durable[77] == 2 and p.last_bm == (77, 2) and p.delivered_end > start
    first, second = split_frames(bytes(transport.data))
    assert first.raw_header == b'{"c":"p","sub_id":"s1","sids":"s1","t":"orders","bm":"77|1|"}'
    assert second.raw_header == (
        b'{"c":"p","sub_id":"s1","sids":"s1","t":"orders","bm":"77|2|","x":"c"}'
    )
    assert second.body == b'{"n":2}'
    # the stored record is where the journal says, with the bookmark's sequence
    recs, _ = journal.read_raw(journal.locate(77, 2), 1 << 16)
    assert recs[0][3] == 2 and recs[0][6] == b'{"n":2}'


async def test_a_duplicate_is_acked_with_the_next_commit_and_not_stored(journal):
    p = make_pipeline(journal)
    pub = Publisher()
    p.publish(pub, 5, 1, "orders", b"{}")
    await _settle(p)
    end = p.delivered_end
    assert p.publish(pub, 5, 1, "orders", b"{}") == (1, DUPLICATE)
    await _settle(p)
    assert pub.persisted_seqs == [1, 1] and p.delivered_end == end and p.duplicates == 1


async def test_server_assigned_sequences_and_unrecorded_topics(journal):
    p = make_pipeline(journal)
    sub, transport = subscriber(p.fanout, "scratch")
    assert p.publish(None, 9, None, "scratch", b"a") == (1, STORED)
    assert p.publish(None, 9, None, "scratch", b"b") == (2, STORED)
    end = p.delivered_end
    await _settle(p)
    assert p.delivered_end == end  # nothing went to the journal
    frames_ = split_frames(bytes(transport.data))
    assert [f.raw_header for f in frames_] == [
        b'{"c":"p","sub_id":"s1","sids":"s1","t":"scratch"}'
    ] * 2


async def test_only_live_subscriptions_get_committed_messages(journal):
    p = make_pipeline(journal)
    live, live_t = subscriber(p.fanout, "orders", "live")
    _, replaying_t = subscriber(p.fanout, "orders", "r", SubState.REPLAYING)
    _, early_t = subscriber(p.fanout, "orders", "e", SubState.LIVE_EARLY)
    p.fanout.early = 1
    p.publish(None, 3, 1, "orders", b"{}")
    assert len(split_frames(bytes(early_t.data))) == 1  # at publish time, before the commit
    assert not live_t.data
    await _settle(p)
    assert len(split_frames(bytes(live_t.data))) == 1
    assert not replaying_t.data
    assert len(split_frames(bytes(early_t.data))) == 1  # not again at the commit


async def test_flush_markers_and_after_commit_run_in_order(journal):
    p = make_pipeline(journal)
    pub = Publisher()
    seen = []
    p.publish(pub, 4, 1, "orders", b"{}")
    p.add_flush(pub, "f1", ["completed"])
    p.after_commit(lambda err: seen.append((err, list(pub.flushes))))
    await _settle(p)
    assert pub.flushes == [("f1", ["completed"], None)]
    assert seen == [(None, [("f1", ["completed"], None)])]


async def test_a_batchs_durable_callbacks_run_after_its_acks_and_before_its_delivery(journal):
    """The SOW store folds a batch in its `durable` callback: the publishers' `persisted` acks
    (durable in the journal) go out first, so that fold is not on their round trip; live
    delivery comes after it (a subscriber never sees a message the store does not hold yet).
    The batch is past INLINE_COMMIT_BYTES: committed on the writer thread, whose acks are not
    sent early."""
    p = make_pipeline(journal)
    sub, transport = subscriber(p.fanout, "orders")
    pub = Publisher()
    seen: list[tuple[int, list[int], int]] = []

    def hook(batch):
        start = p.delivered_end
        batch.durable.append(
            lambda end, err: seen.append(
                (end - start, list(pub.persisted_seqs), len(transport.data))
            )
        )

    p.before_flush.append(hook)
    body = b'{"n":"' + b"x" * 1000 + b'"}'
    n = INLINE_COMMIT_BYTES // len(body) + 2
    for seq in range(1, n + 1):
        p.publish(pub, 77, seq, "orders", body)
    await _settle(p)
    assert pub.persisted_seqs[-1] == n
    size, acked, delivered = seen[0]
    assert size > INLINE_COMMIT_BYTES  # one batch, committed on the writer thread
    assert acked and acked[-1] > 0  # its ack went before the callback
    assert delivered == 0  # its delivery comes after it
    assert len(split_frames(bytes(transport.data))) == n


async def test_backlog_pauses_and_resumes_publishers(journal):
    backlog: list[bool] = []
    p = make_pipeline(journal, backlog, max_inflight=100)
    p.publish(None, 1, None, "orders", b"x" * 200)
    p.flush()
    assert backlog == [True] and p.backlogged
    await _settle(p)
    assert backlog == [True, False] and not p.backlogged


def test_live_frames_are_frames_builds():
    """The live path's bytes come from frames.py: prefix, suffix, tail, `}` and body."""
    buf: list[bytes] = []
    suffix = frames.LIVE_SUFFIX % (frames.topic_member_text("t"), 1, 2, b"")
    frames.write_live(buf, frames.sub_prefix("s"), suffix, frames.timestamp_part(0), b"B")
    (f,) = split_frames(b"".join(buf))
    assert f.header == {
        "c": "p",
        "sub_id": "s",
        "sids": "s",
        "t": "t",
        "bm": "1|2|",
        "ts": "19700101T000000.000000Z",
    }
    assert f.body == b"B"


def _batch_state(p: Pipeline, pub: Publisher):
    b = p.batch
    return (
        bytes(b.data),
        [e[:2] + e[3:] for e in b.entries],  # (pub, seq, offset): the times differ
        [m[:3] + m[4:] for m in b.msgs],
        dict(b.first_seq),
        dict(b.last),
        b.acks.get(pub),
        dict(p.highest),
        p.published,
    )


async def test_publish_run_leaves_what_publish_leaves_per_message(journal, monkeypatch):
    """publish_run is publish() for a run: the same records, entries, acks and sequences."""
    monkeypatch.setattr("server.pipeline.time.time", lambda: 1_700_000_000.0)
    items = [(1, "orders", b'{"n":1}'), (2, "orders", b'{"n":2}'), (5, "fills", b"{}")]
    one, run = make_pipeline(journal), make_pipeline(journal)
    a, b = Publisher(), Publisher()
    for seq, topic, body in items:
        assert one.publish(a, 9, seq, topic, body) == (seq, STORED)
    assert run.publish_run(b, 9, items) == 3
    assert _batch_state(one, a) == _batch_state(run, b)
    await _settle(run)
    assert b.persisted_seqs == [5] and run.durable[9] == 5


async def test_publish_run_stops_where_publish_answers_otherwise(journal):
    p = make_pipeline(journal)
    pub = Publisher()
    p.publish(pub, 3, 4, "orders", b"{}")
    assert p.publish_run(pub, 3, [(4, "orders", b"{}"), (5, "orders", b"{}")]) == 0  # duplicate
    # an unrecorded topic and a duplicate inside the run end it there
    assert p.publish_run(pub, 3, [(5, "orders", b"{}"), (6, "scratch", b"{}")]) == 1
    assert p.publish_run(pub, 3, [(6, "orders", b"{}"), (6, "orders", b"{}")]) == 1
    assert p.highest[3] == 6 and p.published == 3


async def test_a_lone_small_batch_commits_inline_and_a_large_one_on_the_writer(journal):
    p = make_pipeline(journal)
    pub = Publisher()
    p.publish(pub, 8, 1, "orders", b"{}")
    p.flush()
    assert pub.persisted_seqs == [1] and p.inflight_batches == 0  # durable before flush returned
    p.publish(pub, 8, 2, "orders", b"x" * 8192)
    p.flush()
    assert pub.persisted_seqs == [1] and p.inflight_batches == 1  # handed to the writer thread
    await _settle(p)
    assert pub.persisted_seqs == [1, 2]


async def test_an_inline_commit_acks_once_between_its_durable_write_and_its_index_update(
    journal, monkeypatch
):
    """The lone publish's `persisted` ack goes out between the durable write and the index
    transaction (the round trip's last few µs), once; the index still gets the entry."""
    order: list[str] = []
    pub = Publisher()
    pub.persisted = lambda seq: order.append(f"ack {seq}")  # type: ignore[method-assign]
    real_add = journal.index.add

    def add(entries, end, meta):
        order.append("index")
        return real_add(entries, end, meta)

    monkeypatch.setattr(journal.index, "add", add)
    p = make_pipeline(journal)
    p.publish(pub, 8, 1, "orders", b"{}")
    p.flush()
    assert order == ["ack 1", "index"]
    assert journal.locate(8, 1) is not None


async def test_an_inline_commit_on_a_full_disk_keeps_the_gap_rule(tmp_path):
    """The lone publish committed on the loop fails (disk full): its publisher gets the failure,
    the journal is unavailable, later sequences are refused until the failed one is sent again,
    and then it is stored and acked."""
    io = FaultyIO(ops=["write"], errnos=[errno.ENOSPC], count=1)
    io.armed = False
    j = Journal(str(tmp_path / "j"), durability="fsync", io=io)
    try:
        p = make_pipeline(j)
        pub = Publisher()
        p.publish(pub, 8, 1, "orders", b"{}")
        p.flush()
        assert pub.persisted_seqs == [1]  # inline
        io.armed = True
        p.publish(pub, 8, 2, "orders", b"{}")
        p.flush()  # inline, and it fails
        io.armed = False
        assert io.failures == 1 and pub.failures and not j.available
        assert p.gaps == {8: 2} and p.highest[8] == 1
        assert p.publish(pub, 8, 3, "orders", b"{}") == (3, ABOVE_GAP)
        for _ in range(500):  # the writer takes the fence; the probe makes it available
            if j.available:
                break
            await asyncio.sleep(0.01)
        assert j.available
        assert p.publish(pub, 8, 2, "orders", b"{}") == (2, STORED)
        p.flush()
        await _settle(p)
        assert pub.persisted_seqs[-1] == 2
        assert [r.seq for r in j.scan()] == [1, 2]
    finally:
        j.close()
