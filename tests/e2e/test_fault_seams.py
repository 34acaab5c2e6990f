"""The fault campaign at the seams (bench/fault_seams.py, docs/testing.md): its oracle on made-up
rounds (each check must be able to fail), and 50 rounds against a replicated set in CI.

The 50 rounds of one seed run as five tests of ten rounds (rounds 0-9, 10-19, ...: the same
rounds, and the same replay lines, as one run of 50), so xdist's workers share them; a round is
a fresh pair or trio, about 4.5 s on a quiet machine and 8 s on two busy cores (bench/RESULTS.md,
"with the maintenance actions"). Each slice has a --time-limit of 12 s a round,
and then at least 40% of its rounds must have run. The CI rounds leave out `maint` (a local
Spark job per run: the bench runs it on a share of its rounds). TT_SEAMS_FAULTS picks the
classes (default: every other one), TT_FAULT_SEED the seed, TT_SEAMS_ROUNDS the number of rounds.

`kill` is in the default again (issue 23): its violation, a killed instance's unsent messages
dropped as duplicates on a third instance after their publisher moved, is fixed by the handoff
(docs/replication.md, "A publisher that moves"); what async replication loses by design when a
publisher moves past messages its new instance lacks is counted (`lost_async`), not judged,
and only while another instance holds them."""

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(ROOT, "bench"))  # last: its module names shadow nothing

from seams_clients import ALO_QUEUE, AMO_QUEUE, Ledger, body, body_ok, desk_of  # noqa: E402
from seams_oracle import (  # noqa: E402
    check_desks,
    check_ha,
    check_queues,
    check_stored,
    queue_left,
    skipped_ids,
)

from server.ids import publisher_id  # noqa: E402

P = publisher_id("fc-seam-tt-a")


def test_payloads_carry_their_desk_and_check_themselves():
    b = body("fc-seam-tt-a", 7)
    assert body_ok(b) == ("fc-seam-tt-a", 7, desk_of("fc-seam-tt-a", 7))
    assert body_ok(b.replace(b'"s": 7', b'"s": 8')) is None
    assert {desk_of("p", s) for s in range(20)} == {"A", "B"}


def test_stored_oracle_finds_a_message_missing_on_one_instance_and_one_stored_twice():
    from collections import Counter

    acked = {P: 3}
    full = Counter({(P, 1): 1, (P, 2): 1, (P, 3): 1})
    stats, v = check_stored(acked, {"tt-a": (full, set(), []), "tt-b": (full, set(), [])})
    assert v == [] and stats["lost"] == 0
    # tt-b lacks seq 2 in its journal, but its archive has it: kept
    part = Counter({(P, 1): 1, (P, 3): 1})
    assert check_stored(acked, {"tt-b": (part, {(P, 2)}, [])})[1] == []
    stats, v = check_stored(acked, {"tt-a": (full, set(), []), "tt-b": (part, set(), [])})
    assert stats["lost"] == 1 and "tt-b: 1 acknowledged message(s)" in v[0]
    twice = Counter({(P, 1): 2, (P, 2): 1, (P, 3): 1})
    stats, v = check_stored(acked, {"tt-a": (twice, set(), [])})
    assert stats["duplicated"] == 1 and "stored twice" in v[0]


def test_stored_oracle_counts_what_a_publisher_went_past_on_failover_only_while_held():
    from collections import Counter

    # acked 1..3 by tt-a (async), then on tt-b, told 1, it went on at 4: tt-b lacks 2 and 3
    acked = {P: 5}
    skipped = skipped_ids({P: [(1, 3)]})
    assert skipped == {(P, 2), (P, 3)}
    full = Counter({(P, s): 1 for s in range(1, 6)})
    part = Counter({(P, 1): 1, (P, 4): 1, (P, 5): 1})
    stats, v = check_stored(acked, {"tt-a": (full, set(), []), "tt-b": (part, set(), [])}, skipped)
    assert v == [] and (stats["lost"], stats["lost_async"]) == (0, 2)
    # nobody holds them: lost all the same
    stats, v = check_stored(acked, {"tt-a": (part, set(), []), "tt-b": (part, set(), [])}, skipped)
    assert (stats["lost"], stats["lost_async"]) == (4, 0) and len(v) == 2
    # a message missing that the publisher did not go past is lost, skipped or not elsewhere
    gap = Counter({(P, s): 1 for s in (1, 2, 3, 5)})
    stats, v = check_stored(acked, {"tt-a": (full, set(), []), "tt-b": (gap, set(), [])}, skipped)
    assert stats["lost"] == 1 and "tt-b: 1 acknowledged" in v[0]
    # the HA subscriber: missing an excused one is counted apart
    seen = [f"{P}|{s}|" for s in (1, 4, 5)]
    stats, v = check_ha(seen, [], acked, {(P, 2), (P, 3)})
    assert v == [] and (stats["ha_missed"], stats["ha_missed_async"]) == (0, 2)
    stats, v = check_ha(seen, [], acked)
    assert stats["ha_missed"] == 2 and v


def test_archive_oracle_counts_what_a_catalog_lists_and_what_left_the_journal(tmp_path):
    """The archive holds what its catalogs (the commit point) list: a file renamed into place by
    a run that never wrote its catalog holds nothing; `archive_only` counts acknowledged
    messages that are in the archive and no longer in the journal."""
    from collections import Counter

    import pyarrow as pa
    import pyarrow.parquet as pq
    from seams_oracle import archive_ids

    def part(name, seqs):
        d = tmp_path / "topic=fc" / "date=2026-11-27"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"bookmark": [f"{P}|{s}|" for s in seqs], "kind": [1] * len(seqs)}),
                       d / name)  # fmt: skip
        return f"topic=fc/date=2026-11-27/{name}"

    committed = part("0-100.parquet", [1, 2])
    part("100-200.parquet", [3])  # published, but its run died before the catalog
    (tmp_path / "_catalog").mkdir()
    (tmp_path / "_catalog" / "archive-1.json").write_text(
        json.dumps({"files": [{"path": committed}]})
    )
    assert archive_ids(str(tmp_path)) == {(P, 1), (P, 2)}
    stats, v = check_stored(
        {P: 3}, {"tt-a": (Counter({(P, 2): 1, (P, 3): 1}), {(P, 1), (P, 2)}, [])}
    )
    assert v == [] and stats["archive_only"] == 1 and stats["archived"] == 2
    stats, v = check_stored(
        {P: 3}, {"tt-a": (Counter({(P, 2): 1}), archive_ids(str(tmp_path)), [])}
    )
    assert stats["lost"] == 1 and "(P, 3)" not in v[0] and str((P, 3)) in v[0]


def _ledger(delivered, acked=()):
    lg = Ledger(t0=0.0)
    lg.delivered += delivered
    lg.acked += list(acked)
    return lg


def test_queue_oracle_redelivery_after_ack_and_at_most_once_twice():
    bm = f"{P}|5|"
    # at-least-once: delivered on tt-a, acked at 1.0, delivered again on tt-b at 2.0
    lg = _ledger([(0.5, "tt-a", ALO_QUEUE, bm), (2.0, "tt-b", ALO_QUEUE, bm)],
                 [(1.0, "tt-a", ALO_QUEUE, bm)])  # fmt: skip
    stats, v = check_queues(lg, [])
    assert stats["queue_again"] == 1 and "delivered again after its acknowledgement" in v[0]
    # the same during a partition of the link (healed at 1.5, within the grace): allowed
    stats, v = check_queues(lg, [{"kind": "drop", "start": 0.2, "end": 1.5}])
    assert v == [] and stats["queue_excused"] == 1
    # ... but not on the same instance, partition or not
    lg = _ledger([(0.5, "tt-a", ALO_QUEUE, bm), (2.0, "tt-a", ALO_QUEUE, bm)],
                 [(1.0, "tt-a", ALO_QUEUE, bm)])  # fmt: skip
    assert check_queues(lg, [{"kind": "drop", "start": 0.2, "end": 1.5}])[0]["queue_again"] == 1
    # at-most-once twice; allowed when the first instance was killed just after delivering
    lg = _ledger([(0.5, "tt-a", AMO_QUEUE, bm), (3.0, "tt-b", AMO_QUEUE, bm)])
    stats, v = check_queues(lg, [])
    assert stats["queue_again"] == 1 and "at-most-once message delivered twice" in v[0]
    kill = {"kind": "kill", "target": "tt-a", "start": 0.6, "end": 2.0}
    assert check_queues(lg, [kill])[1] == []
    late = {"kind": "kill", "target": "tt-a", "start": 9.0, "end": 10.0}
    assert check_queues(lg, [late])[0]["queue_again"] == 1
    # at-most-once again on the killed instance itself, restarted, never: its delivery left
    # only once its event was durable there; nor at-least-once after a confirmed ack
    lg = _ledger([(0.5, "tt-a", AMO_QUEUE, bm), (3.0, "tt-a", AMO_QUEUE, bm)])
    assert check_queues(lg, [kill])[0]["queue_again"] == 1
    assert check_queues(lg, [])[0]["queue_again"] == 1
    assert check_queues(lg, [{"kind": "drop", "start": 0.2, "end": 1.5}])[0]["queue_again"] == 1
    lg = _ledger([(0.5, "tt-a", ALO_QUEUE, bm), (3.0, "tt-a", ALO_QUEUE, bm)],
                 [(0.55, "tt-a", ALO_QUEUE, bm)])  # fmt: skip
    assert check_queues(lg, [kill])[0]["queue_again"] == 1


def _commit(j, data: bytes, entries: list) -> int:
    """Commit `data` to journal `j` and wait for it: the position of its first byte."""
    import threading

    done, got = threading.Event(), []
    j.submit(data, entries, lambda pos, err: (got.append((pos, err)), done.set()))
    assert done.wait(10) and got[0][1] is None
    return got[0][0]


def _journal(jdir: str, items: list) -> None:
    """A journal of `items`, each its own commit, in order: ("m", seq, origin) a message of P
    on the topic; ("e", op, [seq, ...], origin) the at-most-once queue's events about them,
    ("q", ...) the at-least-once queue's. origin: None (here) or the instance it came from."""
    import array

    from seams_clients import TOPIC

    from journal.journal import Journal
    from journal.queue_events import append_event, append_run
    from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record

    j = Journal(jdir)
    try:
        at: dict[int, int] = {}
        for kind, *rest in items:
            origin = None if rest[-1] is None else (10, rest[-1].encode(), rest[-1].encode())
            if kind == "m":
                rec = encode_record(KIND_MESSAGE, P, rest[0], 10, TOPIC.encode(), body("p", 1),
                                    origin=origin)  # fmt: skip
                at[rest[0]] = _commit(j, rec, [(P, rest[0], 10, 0)])
                continue
            op, seqs = rest[0], rest[1]
            ev = bytearray()
            if len(seqs) > 1:
                append_run(ev, op, array.array("Q", [at[s] for s in seqs]))
            else:
                append_event(ev, op, at[seqs[0]])
            queue = AMO_QUEUE if kind == "e" else ALO_QUEUE
            rec = encode_record(KIND_QUEUE_EVENT, 0, 0, 0, queue.encode(), bytes(ev),
                                origin=origin)  # fmt: skip
            _commit(j, rec, [])
    finally:
        j.close()


def test_at_most_once_twice_is_judged_by_what_each_journal_had_when_it_delivered(tmp_path):
    """seed 1 round 36 under load: an at-most-once message delivered on tt-a and on tt-b
    seconds after any fault window (a publisher that moved sent it again to tt-b before
    tt-a's copy got there: both own it). The journals say tt-b delivered it before tt-a's
    event reached it: excused whatever the clock says. A planted duplicate (tt-b's journal had
    a done event from elsewhere first, or tt-a's later events, or no event of its own) is
    still a violation, and so is the same instance twice."""
    import shutil

    from seams_oracle import queue_journal

    from journal.queue_events import QueueOp

    d = QueueOp.DELIVERED_AT_MOST_ONCE

    def judged(a_items, b_items, ledger=None):
        for name, items in (("tt-a", a_items), ("tt-b", b_items)):
            _journal(str(tmp_path / name), items)
        journals = {q: {n: queue_journal(str(tmp_path / n), q) for n in ("tt-a", "tt-b")}
                    for q in (ALO_QUEUE, AMO_QUEUE)}  # fmt: skip
        for n in ("tt-a", "tt-b"):
            shutil.rmtree(tmp_path / n)
        # both deliveries more than GRACE after the stall healed: the windows do not excuse it
        lg = ledger or _ledger(
            [(5.0, "tt-a", AMO_QUEUE, f"{P}|1|"), (9.0, "tt-b", AMO_QUEUE, f"{P}|1|")]
        )
        return check_queues(lg, [{"kind": "stall", "start": 0.1, "end": 0.3}], journals)

    a = [("m", 1, None), ("e", d, [1], None), ("m", 2, None), ("e", d, [2], None)]
    # tt-b's own copy (the publisher moved), delivered; tt-a's events arrive after it
    b = [("m", 1, None), ("e", d, [1], None), ("m", 2, "tt-a"), ("e", d, [1], "tt-a"),
         ("e", d, [2], "tt-a")]  # fmt: skip
    stats, v = judged(a, b)
    assert v == [] and (stats["queue_excused"], stats["queue_again"]) == (1, 0)
    # planted: tt-b delivered after tt-a's event of it was in its journal
    b_late = [("m", 1, "tt-a"), ("e", d, [1], "tt-a"), ("e", d, [1], None)]
    stats, v = judged(a, b_late)
    assert stats["queue_again"] == 1 and "done event of it from elsewhere" in v[0]
    # planted: tt-a's later events (its delivery of seq 2) reached tt-b first, not seq 1's
    b_past = [("m", 1, None), ("m", 2, "tt-a"), ("e", d, [2], "tt-a"), ("e", d, [1], None)]
    stats, v = judged(a, b_past)
    assert stats["queue_again"] == 1 and "tt-a's later events" in v[0]
    # planted: tt-b holds it and has no delivery event of its own (it left before durable)
    stats, v = judged(a, [("m", 1, "tt-a")])
    assert stats["queue_again"] == 1 and "no delivery event of its own" in v[0]
    # the same instance twice, whatever its journal says
    twice = _ledger([(0.5, "tt-b", AMO_QUEUE, f"{P}|1|"), (9.0, "tt-b", AMO_QUEUE, f"{P}|1|")])
    assert judged(a, b, twice)[0]["queue_again"] == 1
    # a journal that no longer holds the message: the fault windows decide
    stats, v = judged(a, [("m", 2, "tt-a")])
    assert stats["queue_again"] == 1 and "(" not in v[0].split("twice")[1]
    in_window = _ledger([(0.2, "tt-a", AMO_QUEUE, f"{P}|1|"), (0.4, "tt-b", AMO_QUEUE, f"{P}|1|")])
    stats = judged(a, [("m", 2, "tt-a")], in_window)[0]
    assert (stats["queue_excused"], stats["queue_excused_journal"]) == (1, 0)
    # at least once (seed 1 round 36 again): acknowledged on tt-a, delivered on tt-b seconds
    # later, where tt-b's lease is journaled before tt-a's acknowledgement arrived
    lq, ak = QueueOp.LEASED, QueueOp.ACKED
    alo = _ledger([(9.0, "tt-b", ALO_QUEUE, f"{P}|1|")], [(5.0, "tt-a", ALO_QUEUE, f"{P}|1|")])
    a = [("m", 1, None), ("q", lq, [1], None), ("q", ak, [1], None)]
    b = [("m", 1, None), ("q", lq, [1], None), ("q", ak, [1], "tt-a")]
    stats, v = judged(a, b, alo)
    assert v == [] and stats["queue_excused"] == 1
    # planted: leased on tt-b after tt-a's acknowledgement was in its journal
    stats, v = judged(a, [("m", 1, "tt-a"), ("q", ak, [1], "tt-a"), ("q", lq, [1], None)], alo)
    assert stats["queue_again"] == 1 and "done event of it from elsewhere" in v[0]
    # no lease of its own in tt-b's journal (lost with a kill): the fault windows decide
    stats, v = judged(a, [("m", 1, "tt-a"), ("q", ak, [1], "tt-a")], alo)
    assert stats["queue_again"] == 1 and "(" not in v[0].split("confirmed")[1]


def test_queue_left_reads_what_a_journal_still_has_to_deliver(tmp_path):
    """A message is left on an instance when its journal has it on the topic at or after the
    queue's checkpoint and no done event of that queue names it."""
    import array

    from seams_clients import TOPIC

    from journal.journal import Journal
    from journal.queue_events import QueueOp, append_event, append_run
    from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record

    jdir = str(tmp_path / "journal")
    j = Journal(jdir)
    try:
        data, entries, offsets = bytearray(), [], []
        for s in (1, 2, 3, 4):
            offsets.append(len(data))
            entries.append((P, s, 10, len(data)))
            data += encode_record(KIND_MESSAGE, P, s, 10, TOPIC.encode(), b"{}")
        base = _commit(j, bytes(data), entries)
        pos = [base + o for o in offsets]
        ev, other = bytearray(), bytearray()
        append_run(ev, QueueOp.ACKED_RUN, array.array("Q", [pos[0], pos[2]]))
        append_event(ev, QueueOp.ACKED, pos[1])
        append_event(other, QueueOp.ACKED, pos[3])  # another queue's ack: not this one's
        events = encode_record(KIND_QUEUE_EVENT, 0, 0, 0, ALO_QUEUE.encode(), bytes(ev))
        _commit(j, events + encode_record(KIND_QUEUE_EVENT, 0, 0, 0, AMO_QUEUE.encode(),
                                         bytes(other)), [])  # fmt: skip
    finally:
        j.close()
    assert queue_left(jdir, ALO_QUEUE) == {(P, 4)}
    assert queue_left(str(tmp_path / "none"), ALO_QUEUE) == set()


def test_ha_oracle_twice_and_missed():
    stats, v = check_ha([f"{P}|1|", f"{P}|2|"], [], {P: 2})
    assert v == [] and stats["ha_delivered"] == 2
    stats, v = check_ha([f"{P}|1|", f"{P}|1|"], [], {P: 2})
    assert stats["ha_twice"] == 1 and stats["ha_missed"] == 1 and len(v) == 2


def test_desk_oracle_flags_the_other_desk():
    class Sub:
        got, wrong, foreign = 3, ["alice@tt-a (desk A) got 1|2| of desk B"], []

    class Cons:
        queue, instance, user, desks = AMO_QUEUE, "tt-b", "bob", {"A", "B"}

    stats, v = check_desks([Sub()], [(Cons(), "B")])
    assert stats["entitlement_breaches"] == 2 and len(v) == 2


SEED = int(os.environ.get("TT_FAULT_SEED", "1"))
ROUNDS = int(os.environ.get("TT_SEAMS_ROUNDS", "50"))
FAULTS = os.environ.get("TT_SEAMS_FAULTS", "drop,stall,delay,kill,disk-full,filter-delete")
SLICES = 5  # tests of ROUNDS / SLICES rounds each: xdist's workers share them


def _slice(part: int) -> tuple[int, int]:
    """(first round, rounds) of one slice of the CI rounds 0 .. ROUNDS-1 of SEED."""
    lo, hi = ROUNDS * part // SLICES, ROUNDS * (part + 1) // SLICES
    return lo, hi - lo


def test_the_ci_rounds_draw_every_fault_class():
    """The slices are the rounds of one seed, so their draws are fixed: together they give
    every enabled class at least once (each slice alone need not)."""
    import random

    from campaign_runner import round_seed
    from fault_seams import pick

    faults = FAULTS.split(",")
    drawn = {
        f
        for r in range(ROUNDS)
        for f in pick(random.Random(round_seed(SEED, r)), faults).split("+")
    }
    assert drawn == set(faults), sorted(set(faults) - drawn)  # fmt: skip
    assert [_slice(k) for k in range(SLICES)][-1][0] + _slice(SLICES - 1)[1] == ROUNDS


@pytest.mark.slow
@pytest.mark.parametrize("part", range(SLICES))
def test_seams_rounds_keep_the_promise(tmp_path, part):
    first, rounds = _slice(part)
    out = tmp_path / "totals.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "fault_campaign.py"), "--seams",
         "--first-round", str(first), "--rounds", str(rounds), "--seed", str(SEED),
         "--faults", FAULTS, "--json", str(out), "--time-limit", str(12 * rounds)],
        capture_output=True, text=True, timeout=60 + 40 * rounds,
    )  # fmt: skip
    # 3: stopped by --time-limit on a slow machine; the rounds that ran are judged all the same
    assert proc.returncode in (0, 1, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    totals = json.loads(out.read_text())
    report = "\n".join(
        f"round {v['round']} ({v['fault']}): {x}\n  replay: {v['replay']}"
        for v in totals["violations"]
        for x in v["violations"]
    )
    assert totals["violations"] == [], report[:8000]
    took = time.monotonic() - started
    assert totals["rounds"] == rounds or (proc.returncode == 3 and totals["rounds"] >= 0.4 * rounds), (
        f"{totals['rounds']} of rounds {first}..{first + rounds - 1} in {took:.0f}s"
    )  # fmt: skip
    assert totals["acked"] > 100 * totals["rounds"] and totals["queue_acked"] > 0
    assert totals["ha_delivered"] > 0 and totals["desk_delivered"] > 0


def test_desk_oracle_flags_a_delete_by_filter_past_the_content_filter():
    class Deleter:
        user, other, instance, deleted = "alice", "B", "tt-a", 0

    d = Deleter()
    assert check_desks([], [], d)[1] == []
    d.deleted = 4
    stats, v = check_desks([], [], d)
    assert stats["entitlement_breaches"] == 4 and "deleted 4 message(s)" in v[0]


def test_a_moved_publisher_makes_two_owners_and_the_journals_say_so(tmp_path):
    """The double delivery of seed 1 round 36, made on purpose: the link tt-a -> tt-b stalls,
    a publisher stores seq 1..5 on tt-a (delivered there at most once) and moves to tt-b, which
    lacks them, and sends them again: tt-b stores its own copies and delivers them too
    (replication.md, "Semantics": both own them). Once the link heals tt-a's events make them
    done on tt-b. The oracle, reading the two real journals, excuses the five long after any
    fault window, and still flags a delivery on tt-b that its journal has no event of."""
    from seams_clients import TOPIC
    from seams_oracle import queue_journal

    from tests.e2e.test_replication_partition import dest_stats
    from tests.support.cluster import Cluster, wait_until
    from tests.support.raw import Raw, publish_many

    queue = (f"<SOW><Queue><Name>{AMO_QUEUE}</Name><UnderlyingTopic>{TOPIC}</UnderlyingTopic>"
             "<Semantics>at-most-once</Semantics><MaxPerSubscriptionBacklog>10"
             "</MaxPerSubscriptionBacklog></Queue></SOW>")  # fmt: skip
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, topics=(TOPIC, AMO_QUEUE), extra=queue,
                 queue_owner_failover="30s").start()  # fmt: skip
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        for x, y in ((a, "tt-b"), (b, "tt-a")):
            wait_until(lambda x=x, y=y: dest_stats(x, y).get("connected"), 20, f"link to {y}")
        consumers = {}
        for inst in (a, b):
            c = consumers[inst.name] = Raw(inst.port)
            c.logon(f"amo-{inst.name}")
            c.subscribe(AMO_QUEUE, o="max_backlog=10")
        cl.link("tt-a", "tt-b").stall()
        docs = [body("fc-seam-tt-a", s) for s in range(1, 6)]
        publish_many(a.port, TOPIC, docs, name="fc-seam-tt-a").close()
        got = {"tt-a": [h["bm"] for h, _ in consumers["tt-a"].messages(5)]}
        p = Raw(b.port)
        assert p.logon("fc-seam-tt-a")["s"] == 0  # tt-b has none of them
        publish_many(b.port, TOPIC, docs, name="fc-seam-tt-a", conn=p).close()
        got["tt-b"] = [h["bm"] for h, _ in consumers["tt-b"].messages(5)]
        assert got["tt-a"] == got["tt-b"]  # delivered on both: two owners
        cl.heal()
        # seq 6 on tt-a, delivered there only: its event makes it done on tt-b
        publish_many(
            a.port, TOPIC, [body("fc-seam-tt-a", 6)], name="fc-seam-tt-a", start_seq=6
        ).close()
        [(six, _)] = consumers["tt-a"].messages(1)
        wait_until(lambda: b.admin_get("/stats")["queues"][AMO_QUEUE]["done_elsewhere"] == 6, 20,
                   "tt-a's events done on tt-b")  # fmt: skip
        for c in (*consumers.values(), p):
            c.close()
        a.stop()
        b.stop()
        journals = {AMO_QUEUE: {n: queue_journal(os.path.join(cl[n].directory, "journal"), AMO_QUEUE)
                                for n in cl.names}}  # fmt: skip
    finally:
        cl.close()
    # read long after the stall (the windows would not excuse it): the journals do
    lg = _ledger([(5.0, n, AMO_QUEUE, bm) for n in ("tt-a", "tt-b") for bm in got[n]])
    stall = [{"kind": "stall", "start": 0.0, "end": 0.1}]
    assert check_queues(lg, stall)[0]["queue_again"] == 5
    stats, v = check_queues(lg, stall, journals)
    assert v == [] and (stats["queue_again"], stats["queue_excused"]) == (0, 5)
    assert stats["queue_excused_journal"] == 5
    # planted: tt-b delivering one of them again; and seq 6, which only tt-a delivered (tt-b's
    # journal has tt-a's event of it and no delivery of its own)
    planted = [(6.0, "tt-b", AMO_QUEUE, got["tt-b"][0]), (6.0, "tt-a", AMO_QUEUE, six["bm"]),
               (7.0, "tt-b", AMO_QUEUE, six["bm"])]  # fmt: skip
    stats, v = check_queues(_ledger(lg.delivered + planted), stall, journals)
    assert (stats["queue_again"], stats["queue_excused"]) == (2, 5), v
    assert "again on tt-b at +6.00s" in v[0] and "no delivery event of its own" in v[1]
