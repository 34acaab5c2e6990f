"""Replicated queues (server/queue_repl.py): the ownership rules, the takeover schedule, and the
queue engine applying events from elsewhere. In-process: one core plays this instance ("core");
the other instance ("tt-b") is simulated by the wire bodies it would send."""

from __future__ import annotations

import json
import struct

from config.model import Replication, ReplicationDestination
from journal.queue_events import WIRE_MAGIC, QueueOp, append_owner, to_wire
from protocol.replication import RETRY_MAX
from server.fanout import Message
from server.ids import publisher_id
from server.queue_repl import Failover, QueueReplication
from server.queues import QueueManager

QUEUES = """<SOW>
  <Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""

WIRE = struct.Struct("<BBHQQ")


def _deliveries(frames):
    return [f for f in frames if f["c"] == "p"]


def test_owner_of_follows_takeovers_and_their_cuts():
    r = QueueReplication(None, "a")  # type: ignore[arg-type]
    assert r.owner_of("b", 100) == "b"  # published at b: b owns it
    r.takeovers["b"] = [(150, "a", 0)]  # a took b's messages up to origin time 150
    assert r.owner_of("b", 150) == "a" and r.owner_of("b", 151) == "b"
    r.takeovers["a"] = [(10, "c", 1)]  # later c took a over: what a owned goes to c
    assert r.owner_of("b", 100) == "c"
    assert r.owner_of("a", 5) == "c" and r.owner_of("a", 11) == "a"
    r.takeovers["c"] = [(0, "b", 2)]  # then b took c over: back where it was published
    assert r.owner_of("b", 100) == "b" and r.owner_of("a", 5) == "b"
    r.takeovers["b"].append((0, "a", 3))  # and a took b again: only what b owns by then moves
    assert r.owner_of("b", 100) == "a" and r.owner_of("b", 151) == "b"


def test_failover_lowest_name_among_those_that_see_it_down_first():
    now = [0.0]
    a = Failover("a", ["b", "c"], 10.0, lambda: now[0])
    c = Failover("c", ["a", "b"], 10.0, lambda: now[0])
    for f in (a, c):
        f.source_up("b")
    a.source_up("c")
    c.source_up("a")
    assert a.due() == [] and c.due() == []
    now[0] = 1.0
    a.source_down("b")
    c.source_down("b")
    now[0] = 10.9
    assert a.due() == []
    now[0] = 11.0
    assert a.due() == ["b"] and c.due() == []  # c ranks second among {a, c}: it waits twice
    now[0] = 21.0
    assert c.due() == ["b"]
    a.source_up("b")
    assert a.due() == []
    assert Failover("a", ["b"], 5.0, lambda: now[0]).due() == []  # down from the start
    now[0] += 5.0


async def test_taken_over_then_back_acked_elsewhere_and_redelivered(make_core):
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b"], 30.0, lambda: clock[0])
    qm.source_up("tt-b")
    q = qm.get("work-q").state
    pub = core.client("pub")
    for n in range(1, 6):
        pub.send("publish", json.dumps({"n": n}), t="work", s=n)
    await core.settle()
    assert q.depth == 5  # published here: owned here
    pid = publisher_id("pub")
    # tt-b took this instance over while the link was cut (cut: its newest message here)
    ts = [qm.origin_at(qm.journal.locate(pid, s))[1] for s in range(1, 6)]
    buf = bytearray()
    append_owner(buf, "core", "tt-b", ts[-1])
    wire = WIRE_MAGIC + WIRE.pack(8, 0, len(buf) - 12, ts[-1], 0) + bytes(buf[12:])
    qm.translate_in("work-q", wire, "tt-b")
    assert q.depth == 0 and q.repl.snapshot()["held_for_others"] == 5
    # tt-b leased 1 and 2, acked 1 and delivered 3 at most once: applied by identity
    qm.translate_in(
        "work-q",
        WIRE_MAGIC
        + WIRE.pack(QueueOp.LEASED_RUN, 0, 2, pid, 1)
        + struct.pack("<QQ", pid, 2)
        + WIRE.pack(QueueOp.ACKED, 0, 0, pid, 1)
        + WIRE.pack(QueueOp.DELIVERED_AT_MOST_ONCE, 0, 0, pid, 3),
        "tt-b",
    )
    assert q.repl.snapshot()["held_for_others"] == 3 and q.repl.stats["done_elsewhere"] == 2
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    assert _deliveries(c.take()) == []  # none of them is this instance's to lease
    # tt-b is lost: after the failover time this instance takes its messages over
    qm.source_down("tt-b")
    clock[0] = 29.0
    qm.tick()
    assert q.repl.stats["taken_over"] == 0
    clock[0] = 30.0 + RETRY_MAX  # taken over at 30 s; the start's wait for it ends now
    qm.tick()
    got = sorted(json.loads(f.body)["n"] for f in _deliveries(c.take()))
    assert got == [2, 4, 5]  # 1 acked and 3 delivered at tt-b never come again
    assert q.stats["redelivered"] == 1  # 2 was leased at tt-b, unacked
    # a new publish here after the takeover: owned here (it is this instance's anyway)
    pub.send("publish", json.dumps({"n": 6}), t="work", s=6)
    await core.settle()
    assert [json.loads(f.body)["n"] for f in _deliveries(c.take())] == [6]
    # events of this queue go out by identity (the sender's translation)
    await core.settle()
    assert qm.translate_out(
        struct.pack("<BBHQ", QueueOp.ACKED, 0, 0, qm.journal.locate(pid, 6))
    ) == (WIRE_MAGIC + WIRE.pack(QueueOp.ACKED, 0, 0, pid, 6))


async def test_unknown_messages_wait_for_the_next_commits_then_are_dropped(make_core):
    core = make_core(QUEUES)
    qm = core.queues
    qm.enable_replication(["tt-b"], 30.0)
    q = qm.get("work-q").state
    pid = publisher_id("pub")
    # an ack that arrives (same link batch) before its message is committed here
    qm.translate_in("work-q", WIRE_MAGIC + WIRE.pack(QueueOp.ACKED, 0, 0, pid, 1), "tt-b")
    qm.translate_in("work-q", WIRE_MAGIC + WIRE.pack(QueueOp.ACKED, 0, 0, 999, 1), "tt-b")
    pub = core.client("pub")
    pub.send("publish", b'{"n":1}', t="work", s=1)
    await core.settle()
    assert q.depth == 0 and q.repl.stats["done_elsewhere"] == 1
    for s in (2, 3, 4):
        pub.send("publish", b'{"n":2}', t="work", s=s)
        await core.settle()
    assert qm.repl_stats["unresolved_dropped"] == 1 and not qm._pending


async def test_recovery_rebuilds_ownership_from_the_journal(make_core, tmp_path):
    core = make_core(QUEUES)
    qm = core.queues
    qm.enable_replication(["tt-b"], 30.0)
    pub = core.client("pub")
    for n in range(1, 5):
        pub.send("publish", json.dumps({"n": n}), t="work", s=n)
    await core.settle()
    pid = publisher_id("pub")
    cut = qm.origin_at(qm.journal.locate(pid, 3))[1]
    buf = bytearray()
    append_owner(buf, "core", "tt-b", cut)
    wire, _ = to_wire(bytes(buf), lambda p: None)
    qm.translate_in("work-q", wire, "tt-b")
    qm.translate_in("work-q", WIRE_MAGIC + WIRE.pack(QueueOp.ACKED, 0, 0, pid, 2), "tt-b")
    q = qm.get("work-q").state
    held = q.repl.snapshot()["held_for_others"]
    await core.settle()
    assert held == 2 and q.depth == 1  # 1 and 3 held for tt-b (2 acked there); 4 is past the cut
    core.pipeline.after_commit(lambda err: None)  # the replicated events go with a commit
    await core.settle()
    # a restart: a new manager over the same journal, replication on before recovery
    spec = ReplicationDestination(name="tt-b", group="g", sync=True, addresses=(), topics=())
    again = QueueManager(
        core.config.queues,
        "core",
        core.journal,
        core.loop,
        core.pipeline,
        Replication(destinations=(spec,), queue_owner_failover=30.0),
    )
    again.recover()
    q2 = again.get("work-q").state
    assert q2.repl.takeovers == {"core": [(cut, "tt-b", 0)]}
    assert sorted(q2.repl.held["tt-b"]) == sorted(qm.journal.locate(pid, s) for s in (1, 3))
    assert q2.depth == 1 and [p for p in q2.avail_pos if p not in q2.gone] == [
        qm.journal.locate(pid, 4)
    ]


def _submit(journal, records):
    """Records straight into the journal: [(pub, seq, ts, topic, body, origin or None)]."""
    import threading

    from journal.record import KIND_MESSAGE, encode_record

    data = bytearray()
    entries = []
    for pub, seq, ts, topic, body, origin in records:
        entries.append((pub, seq, ts, len(data)))
        data += encode_record(KIND_MESSAGE, pub, seq, ts, topic, body, origin=origin)
    done = threading.Event()
    journal.submit(bytes(data), entries, lambda pos, err: done.set(), None)
    assert done.wait(10)


async def test_replicated_messages_are_held_for_their_origin_until_taken_over(make_core):
    core = make_core(QUEUES)
    t = 1_700_000_000_000_000
    _submit(
        core.journal,
        [
            (7, 1, t + 1, b"work", b'{"n":1}', (t, b"tt-b", b"ny")),
            (8, 1, t + 2, b"work", b'{"n":2}', None),  # published here
            (7, 2, t + 3, b"work", b'{"n":3}', (t + 5, b"tt-b", b"ny")),
        ],
    )
    clock = [0.0]
    spec = ReplicationDestination(name="tt-b", group="ny", sync=True, addresses=(), topics=())
    qm = QueueManager(
        core.config.queues,
        "core",
        core.journal,
        core.loop,
        core.pipeline,
        Replication(destinations=(spec,), queue_owner_failover=30.0),
    )
    qm.enable_replication(["tt-b"], 30.0, lambda: clock[0])
    qm.recover()
    q = qm.get("work-q").state
    assert q.depth == 1 and sorted(q.repl.held["tt-b"]) == [
        core.journal.locate(7, 1),
        core.journal.locate(7, 2),
    ]
    assert q.repl.cut_for("tt-b") == t + 5
    clock[0] = 59.0  # tt-b never came up since the start: its clock starts after the grace
    qm.tick()
    assert q.depth == 1 and not q.repl.takeovers and not qm.paused  # no longer paused though
    clock[0] = 60.0
    qm.tick()
    assert q.depth == 3 and q.repl.takeovers["tt-b"][0][:2] == (t + 5, "core")
    assert q.events and q.events[0] == QueueOp.OWNER  # journaled with the next commit


def _consumer_beside_tt_b(make_core):
    """A core whose work-q replicates with tt-b (synced, takeover after 1 s of tt-b down) and a
    subscribed consumer: (core, its queue manager, the takeover clock, the consumer)."""
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b"], 1.0, lambda: clock[0])
    qm.source_up("tt-b")
    qm.source_synced("tt-b")
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    return core, qm, clock, c


async def _takeover_delivers(core, qm, clock, c) -> list:
    """tt-b goes down and this core takes its messages over: what the consumer is handed."""
    qm.source_down("tt-b")
    clock[0] = 10.0
    qm.tick()
    await core.settle()
    return _deliveries(c.take())


async def test_an_event_about_a_message_written_but_not_yet_delivered_here_waits_for_it(
    make_core,
):
    """Issue 23 (seams campaign, seed 9 round 38, under a Spark job's load): tt-b's ack came
    while tt-b's message was in this journal (its lookup found it) but its commit had not yet
    been delivered to the queues. Applied then, the ack found nothing to make done; the message,
    held for tt-b afterwards, stayed held, and the takeover of tt-b delivered it again."""
    core, qm, clock, c = _consumer_beside_tt_b(make_core)
    t = 1_700_000_000_000_000
    start = core.journal.end_position
    _submit(core.journal, [(7, 1, t + 1, b"work", b'{"n":1}', (t, b"tt-b", b"ny"))])
    pos = core.journal.locate(7, 1)
    assert pos is not None and pos >= start  # in the journal, not delivered to the queues
    qm.translate_in("work-q", _acked_at_tt_b(1), "tt-b")
    m = Message("work", 7, 1, t + 1, b'{"n":1}', b"", pos, None, origin=(t, b"tt-b", b"ny"))
    qm.on_committed([m], core.journal.end_position)  # its commit reaches the queues now
    q = qm.get("work-q").state
    assert q.repl.snapshot()["held_for_others"] == 0, "tt-b's ack was lost"
    assert await _takeover_delivers(core, qm, clock, c) == [], (
        "the takeover delivered what tt-b acked"
    )


async def test_an_event_waits_for_its_message_behind_any_number_of_commits_in_flight(make_core):
    """Issue 23 (seams campaign, seed 1 round 16 under load): tt-b's message and its
    at-most-once delivery came in one read, the message into the open batch behind three
    commits in flight. The event waited for "the next commits" by count and was dropped at the
    third, before the commit that held its message; the message stayed held for tt-b here,
    and the takeover of tt-b delivered it a second time."""
    from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT

    core, qm, clock, c = _consumer_beside_tt_b(make_core)
    p = core.pipeline
    for n in range(3):  # commits in flight ahead of the open batch
        p.publish(None, publisher_id("other"), n + 1, "elsewhere", b'{"x":%d}' % n)
        p.flush(inline=False)
    assert p.inflight_batches == 3
    t = 1_700_000_000_000_000
    wire = WIRE_MAGIC + WIRE.pack(QueueOp.DELIVERED_AT_MOST_ONCE, 0, 0, 7, 1)
    p.replicate(
        [
            (0, KIND_MESSAGE, 7, 1, t, b"work", b'{"n":1}', None),
            (200, KIND_QUEUE_EVENT, 0, 0, t, b"work-q", wire, None),
        ],
        b"tt-b",
        b"tt-b",
        300,
        lambda end, err: None,
        lambda rec: qm.translate_in(bytes(rec[5]), bytes(rec[6]), "tt-b"),
    )
    await core.settle()
    q = qm.get("work-q").state
    assert qm.repl_stats["unresolved_dropped"] == 0 and not qm._pending
    assert q.repl.snapshot()["held_for_others"] == 0, "tt-b's delivery event was dropped"
    assert await _takeover_delivers(core, qm, clock, c) == [], (
        "the takeover delivered what tt-b delivered"
    )


async def test_after_a_start_nothing_is_leased_until_the_peers_synced(make_core):
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b", "tt-c"], 30.0, lambda: clock[0])
    pub = core.client("pub")
    for n in range(1, 4):
        pub.send("publish", json.dumps({"n": n}), t="work", s=n)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    assert qm.paused and _deliveries(c.take()) == []  # a peer may have taken these over
    qm.source_up("tt-b")
    qm.source_synced("tt-b")
    assert _deliveries(c.take()) == []  # tt-c has not said yet
    qm.source_synced("tt-c")
    assert not qm.paused
    assert sorted(json.loads(f.body)["n"] for f in _deliveries(c.take())) == [1, 2, 3]


async def test_a_peer_that_never_synced_holds_the_queues_for_the_failover_time(make_core):
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b"], 5.0, lambda: clock[0])
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="work", s=1)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    clock[0] = 5.0 + RETRY_MAX - 0.1  # a live peer retries its link within RETRY_MAX
    qm.tick()
    assert _deliveries(c.take()) == []
    clock[0] = 5.0 + RETRY_MAX
    qm.tick()
    assert len(_deliveries(c.take())) == 1 and not qm.paused


async def _tt_b_took_over_and_leased(core, clock):
    """This instance ("core") took over tt-b's 6 messages while cut off and leased 1 and 2 to
    a consumer with a backlog of 2; tt-b's link then comes back (issue 23, finding 2)."""
    qm = core.queues
    qm.enable_replication(["tt-b"], 30.0, lambda: clock[0])
    qm.source_up("tt-b")
    qm.source_synced("tt-b")
    t = 1_700_000_000_000_000
    _submit(core.journal, [(7, s, t + s, b"work", b'{"n":%d}' % s, (t + s, b"tt-b", b"ny"))
                           for s in range(1, 7)])  # fmt: skip
    qm.recover()
    q = qm.get("work-q").state
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=2")
    qm.source_down("tt-b")
    clock[0] = 31.0
    qm.tick()
    assert [json.loads(f.body)["n"] for f in _deliveries(c.take())] == [1, 2]
    return qm, q, c


def _acked_at_tt_b(seq: int) -> bytes:
    return WIRE_MAGIC + WIRE.pack(QueueOp.ACKED, 0, 0, 7, seq)


async def test_a_link_that_comes_back_holds_the_queues_until_it_has_synced(make_core):
    """tt-b acked 1-5 while cut off, one commit each. Its link comes back: while its records
    arrive, one per read, nothing is leased here; once it synced only 6 is left."""
    core = make_core(QUEUES)
    clock = [0.0]
    qm, q, c = await _tt_b_took_over_and_leased(core, clock)
    qm.source_up("tt-b")
    assert qm.paused
    for s in range(1, 6):
        qm.translate_in("work-q", _acked_at_tt_b(s), "tt-b")
        await core.settle()  # the next read of the link: the loop runs in between
        assert _deliveries(c.take()) == [], f"leased after tt-b's record {s}"
    qm.source_synced("tt-b")
    assert not qm.paused
    assert [json.loads(f.body)["n"] for f in _deliveries(c.take())] == [6]


async def test_a_link_that_stays_up_is_waited_for_until_it_syncs_however_long(make_core):
    """Issue 23: a peer's catch-up slower than the failover time (a loaded machine, a delayed
    link) must not let the queues lease what its events still on the way make done."""
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b"], 1.0, lambda: clock[0])
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="work", s=1)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    clock[0] = 0.5
    qm.source_up("tt-b")
    clock[0] = 60.0
    qm.tick()
    await core.settle()
    assert qm.paused and _deliveries(c.take()) == []
    qm.source_synced("tt-b")
    assert not qm.paused and len(_deliveries(c.take())) == 1


async def test_a_peer_whose_link_is_logging_on_is_waited_for_past_the_failover_time(make_core):
    """Issue 23: checking the password of a peer's link can take longer than the failover
    time on a loaded machine; the peer is alive, and its acks are behind that logon. A logon
    only prolongs a wait under way: one that fails, or a logon of a peer not waited for,
    holds nothing."""
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b", "tt-c"], 1.0, lambda: clock[0])
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="work", s=1)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    qm.source_synced("tt-c")
    qm.source_logon("tt-b", True)
    qm.source_logon("tt-b", True)  # a second try while the first is still checked
    qm.source_logon("tt-c", True)  # synced already: nothing to prolong
    clock[0] = 5.0
    qm.tick()
    await core.settle()
    assert qm.paused and _deliveries(c.take()) == []
    qm.source_logon("tt-b", False)
    qm.tick()
    assert qm.paused, "the other try is still being checked"
    qm.source_logon("tt-b", False)  # refused, or up: source_up takes over from here
    qm.tick()
    await core.settle()
    assert not qm.paused and len(_deliveries(c.take())) == 1


async def test_the_wait_for_a_peer_without_a_link_counts_from_when_links_can_come(make_core):
    """Opening the journal and recovery can take longer than the failover time: a peer cannot
    link before this instance listens, so its wait is bounded from there."""
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b"], 1.0, lambda: clock[0])
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="work", s=1)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    clock[0] = 3.0  # recovered, now listening
    qm.links_listening()
    clock[0] = 4.0 + RETRY_MAX - 0.1
    qm.tick()
    await core.settle()
    assert qm.paused and _deliveries(c.take()) == []
    clock[0] = 4.0 + RETRY_MAX
    qm.tick()
    await core.settle()
    assert not qm.paused and len(_deliveries(c.take())) == 1


async def test_a_peer_whose_link_drops_before_it_synced_is_waited_for_the_failover_time(
    make_core,
):
    """Up, then down again before it synced: the bound of its catch-up (from the start, here
    passed while the link was up) applies again; a link that comes back starts a new one."""
    core = make_core(QUEUES)
    qm = core.queues
    clock = [0.0]
    qm.enable_replication(["tt-b"], 1.0, lambda: clock[0])
    pub = core.client("pub")
    pub.send("publish", json.dumps({"n": 1}), t="work", s=1)
    await core.settle()
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o="max_backlog=10")
    qm.source_up("tt-b")
    clock[0] = 5.0
    qm.tick()
    assert qm.paused
    qm.source_down("tt-b")
    qm.tick()
    assert not qm.paused and len(_deliveries(c.take())) == 1


async def test_a_link_that_comes_back_and_goes_again_holds_the_queues_for_the_failover_time(
    make_core,
):
    core = make_core(QUEUES)
    clock = [0.0]
    qm, q, c = await _tt_b_took_over_and_leased(core, clock)
    clock[0] = 40.0
    qm.source_up("tt-b")
    qm.translate_in("work-q", _acked_at_tt_b(1), "tt-b")
    qm.source_down("tt-b")  # before it synced: waited for 30 s from its coming back
    clock[0] = 70.0 + RETRY_MAX - 0.1
    qm.tick()
    await core.settle()
    assert qm.paused and _deliveries(c.take()) == []
    clock[0] = 70.0 + RETRY_MAX
    qm.tick()
    assert not qm.paused
    assert [json.loads(f.body)["n"] for f in _deliveries(c.take())] == [3]


async def test_records_of_one_read_are_applied_before_anything_is_leased(make_core):
    """Outside a catch-up too: a record that frees a lease here (done at tt-b as well) does not
    hand out the next message when the next record of the same read says it is done."""
    core = make_core(QUEUES)
    clock = [0.0]
    qm, q, c = await _tt_b_took_over_and_leased(core, clock)
    for s in (1, 3, 4):  # one read: three records
        qm.translate_in("work-q", _acked_at_tt_b(s), "tt-b")
    await core.settle()
    assert [json.loads(f.body)["n"] for f in _deliveries(c.take())] == [5]


async def test_a_burst_of_single_acks_from_a_peer_costs_few_journal_lookups(make_core, monkeypatch):
    """A peer catching up after a heal sends one record per commit it made, each naming the
    next message. Each lookup of a message in the journal scans up to a few hundred KB: 1,000
    of them held the loop for 12 s. Neighbours are remembered, so a run costs a few."""
    core = make_core(QUEUES)
    qm = core.queues
    qm.enable_replication(["tt-b"], 30.0)
    pub = core.client("pub")
    for n in range(1, 1001):
        pub.send("publish", json.dumps({"n": n, "pad": "x" * 40}), t="work", s=n)
    await core.settle()
    journal = core.journal
    lookups = []
    real = journal.locate
    monkeypatch.setattr(journal, "locate", lambda p, s: lookups.append(s) or real(p, s))
    pid = publisher_id("pub")
    for s in range(1, 1001):
        wire = WIRE.pack(QueueOp.ACKED, 0, 0, pid, s) + WIRE.pack(QueueOp.LEASED, 0, 1, pid, s + 1)
        qm.translate_in("work-q", WIRE_MAGIC + wire, "tt-b")
    q = qm.get("work-q").state
    assert q.depth == 0 and q.repl.stats["done_elsewhere"] == 1000
    assert len(lookups) <= 20, f"{len(lookups)} journal lookups for 1,000 records"
