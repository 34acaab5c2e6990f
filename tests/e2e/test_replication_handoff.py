"""A publisher that moves to another instance of a trio (issue 23, the seams campaign's kill
violation; docs/replication.md "A publisher that moves"), with real server processes.

The publisher's messages 1..10 on tt-c reach tt-a but not tt-b (that link is cut), tt-c dies,
the publisher logs on to tt-a (told 10) and goes on there with 11..20. tt-a sends tt-b its own
11..20; before the fix it never sent 1..10 (they came from tt-c), and when tt-c came back tt-b
dropped them as duplicates of a publisher it had seen up to 20: acknowledged messages that
tt-b never holds. Now tt-a hands 1..10 to tt-b ahead of 11, so tt-b holds the publisher's
messages in its order, whether tt-c comes back or not.
"""

from __future__ import annotations

import json

from server.ids import publisher_id
from tests.support.cluster import Cluster, wait_until
from tests.support.raw import Raw, publish_many

MOVER = "mover"
PUB = str(publisher_id(MOVER))


def bodies(lo: int, hi: int) -> list[str]:
    return [json.dumps({"i": i}) for i in range(lo, hi)]


def seqs(inst) -> list[int]:
    return inst.per_publisher("orders").get(PUB, [])


def test_a_publisher_that_moves_brings_what_a_dead_instance_had_not_sent(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b", "tt-c"], sync=False)
    cl.start()
    try:
        a, b, c = cl["tt-a"], cl["tt-b"], cl["tt-c"]
        cl.link("tt-c", "tt-b").drop()
        publish_many(c.port, "orders", bodies(1, 11), name=MOVER).close()
        wait_until(lambda: seqs(a) == list(range(1, 11)), 20, "tt-a holds 1..10 from tt-c")
        assert seqs(b) == []
        c.kill()
        p = Raw(a.port)
        assert p.logon(MOVER)["s"] == 10  # tt-a says it has them: the publisher goes on
        publish_many(a.port, "orders", bodies(11, 21), conn=p, start_seq=11).close()
        want = list(range(1, 21))
        # >= 20: the handed-off 1..10 arrive first and alone would end a wait for 10 (a race
        # seen once); a tt-b without the handoff holds 10 and times out here
        wait_until(lambda: len(seqs(b)) >= 20, 20, "1..10 and tt-a's 11..20 on tt-b")
        assert seqs(b) == want, "tt-b lacks what the publisher sent on tt-c"
        # tt-c back with its link to tt-b: nothing more, nothing twice
        cl.link("tt-c", "tt-b").pass_()
        c.start()
        wait_until(
            lambda: (b.replication_stats().get("sources", {}).get("tt-c") or {}).get("connected"),
            20,
            "tt-c's link into tt-b",
        )
        assert seqs(b) == want
        assert seqs(a) == want
    finally:
        cl.close()


def test_a_publisher_that_never_moved_hands_nothing_off(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False)
    cl.start()
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        publish_many(a.port, "orders", bodies(1, 6), name=MOVER).close()
        p = Raw(a.port)
        assert p.logon(MOVER)["s"] == 5
        p.close()
        wait_until(lambda: seqs(b) == list(range(1, 6)), 20, "tt-b holds 1..5")
        assert not any("moved here" in line for line in list(a.lines))
    finally:
        cl.close()


def test_a_publisher_that_moves_brings_what_the_sync_gate_still_holds(tmp_path):
    """The seams campaign's lost message (seed 1 round 3, 2 runs in 9): tt-a holds the
    publisher's 1..10 from tt-c in its journal, but its sync gate has not released them (a sync
    destination has not acknowledged), so a logon reports less than the journal holds. The
    handoff took the foreign tail only up to the reported sequence: tt-a's own 11.. then reached
    tt-b without 1..10 before them, and tt-b dropped tt-c's 1..10 later as duplicates. The
    handoff now takes everything of the publisher the journal holds."""
    cl = Cluster(tmp_path, ["tt-a", "tt-b", "tt-c"], sync={("tt-a", "tt-c"): True})
    cl.start()
    try:
        a, b, c = cl["tt-a"], cl["tt-b"], cl["tt-c"]
        cl.link("tt-c", "tt-b").drop()
        cl.link("tt-a", "tt-c").stall()  # tt-a's sync destination: its gate holds what follows
        publish_many(c.port, "orders", bodies(1, 11), name=MOVER).close()

        c_end = c.admin_get("/stats")["journal"]["end_position"]

        def written_from_c() -> bool:  # tt-a's resume point for tt-c: committed with the records
            src = (a.replication_stats().get("sources") or {}).get("tt-c") or {}
            return src.get("resume_position") == c_end

        wait_until(written_from_c, 20, "tt-a wrote 1..10 from tt-c")
        p = Raw(a.port)
        assert p.logon(MOVER)["s"] < 10  # the gate holds them: the logon reports less
        for s, body in zip(range(1, 21), bodies(1, 21), strict=True):
            p.send({"c": "publish", "t": "orders", "s": s}, body)  # acks held by the gate
        wait_until(lambda: 20 in seqs(b), 20, "tt-a's 11..20 on tt-b")
        assert seqs(b) == list(range(1, 21)), "tt-b lacks what tt-a held of tt-c's"
        p.close()
    finally:
        cl.close()
