"""Replication at the seams, with real server processes: a sync destination whose disk is full
(downgraded after `<DowngradeAfter>` however often it reconnects), a replica that lost its
journal (rebuilt from its peer, nothing acknowledged that exists only on it), a subscriber that
fails over to an instance with another order of publishers, and a link cut in the middle of a
stream (docs/replication.md)."""

from __future__ import annotations

import asyncio
import json
import os
import time

from client import MOST_RECENT, HAClient, MemoryBookmarkStore
from tests.e2e.test_replication_partition import dest_stats
from tests.support.cluster import Cluster, wait_until
from tests.support.disk import fill, small_disk  # noqa: F401  (a fixture)
from tests.support.raw import Raw, publish_many


def bodies(lo: int, hi: int) -> list[str]:
    return [json.dumps({"i": i}) for i in range(lo, hi)]


def flush_within(c: Raw, wait: float) -> bool:
    """A `persisted` flush: True when its ack comes within `wait` seconds."""
    cid = c.next_cid()
    c.send({"c": "flush", "cid": cid, "a": "persisted"})
    try:
        c.ack("persisted", cid, timeout=wait)
        return True
    except TimeoutError:
        return False


def test_a_sync_destination_with_a_full_disk_is_downgraded_though_it_reconnects(
    tmp_path,
    small_disk,  # noqa: F811
):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], links=[("tt-a", "tt-b")], downgrade_after="2s")
    b = cl["tt-b"]
    with open(b.config_path) as f:
        xml = f.read()
    # tt-b's journal on the small disk, in small segments (a new one is needed soon)
    xml = xml.replace(
        f"<JournalDirectory>{tmp_path}/tt-b/journal</JournalDirectory>",
        f"<JournalDirectory>{small_disk}/journal</JournalDirectory><JournalSize>64KB</JournalSize>",
    )
    with open(b.config_path, "w") as f:
        f.write(xml)
    cl.start()
    try:
        a = cl["tt-a"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "link a -> b")
        pub = publish_many(a.port, "orders", bodies(0, 20), name="pub")  # both have them
        # tt-b may have started after tt-a's first <DowngradeAfter>: back to sync first
        wait_until(lambda: dest_stats(a, "tt-b").get("mode") == "sync", 20, "tt-b in sync")
        before = dest_stats(a, "tt-b")["downgrades"]
        fill(small_disk / "filler")
        big = json.dumps({"pad": "x" * 2000})
        for s in range(21, 121):  # past what is left of tt-b's segment: its commits fail
            pub.send({"c": "publish", "t": "orders", "s": s}, big)
        b.wait_for_log("commit failed|journal unavailable|No space", 20)
        started = time.monotonic()
        assert flush_within(pub, 15), "publishers held past <DowngradeAfter>"
        waited = time.monotonic() - started
        assert waited < 12, waited
        assert a.wait_for_log(r"tt-b downgraded to async \(silent for", 5)
        snap = dest_stats(a, "tt-b")
        assert snap["mode"] == "downgraded" and snap["downgrades"] == before + 1, snap
        os.unlink(small_disk / "filler")
        pub.close()
    finally:
        cl.close()


def logon_when_served(inst, name: str, timeout: float = 30.0) -> tuple[Raw, dict]:
    """Log on to `inst`, again while it refuses logons (`catching up`): (connection, ack)."""
    deadline = time.monotonic() + timeout
    refused = None
    while time.monotonic() < deadline:
        c = Raw(inst.port)
        try:
            ack = c.logon(name)
        except (ConnectionError, TimeoutError) as exc:
            refused = exc
            c.close()
            time.sleep(0.1)
            continue
        if ack.get("status") == "success":
            return c, ack
        refused = ack
        c.close()
        time.sleep(0.1)
    raise AssertionError(f"{inst.name} never accepted a logon: {refused}")


def test_a_replica_that_lost_its_journal_is_rebuilt_and_acks_nothing_only_it_holds(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"]).start()  # sync both ways
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "link a -> b")
        wait_until(lambda: dest_stats(b, "tt-a").get("connected"), 20, "link b -> a")
        publish_many(a.port, "orders", bodies(0, 300), name="pa").close()
        publish_many(b.port, "orders", bodies(1000, 1300), name="pb").close()
        both = a.replay("orders")
        assert len(both) == 600
        wait_until(lambda: len(b.replay("orders")) == 600, 20, "tt-b has all 600")
        assert b.stop() == 0
        os.rename(tmp_path / "tt-b" / "journal", tmp_path / "tt-b" / "journal.lost")
        b.start()
        # tt-a knew another journal of tt-b: tt-b serves no client before it has it all back,
        # including the 300 first published on it
        pb, ack = logon_when_served(b, "pb")
        problems = []
        if ack["s"] != 300:  # pb's highest is known again: no sequence is reused
            problems.append(f"tt-b told pb its highest sequence is {ack['s']}, not 300")
        got_b = b.replay("orders")
        if sorted(got_b) != sorted(both):
            problems.append(f"tt-b holds {len(got_b)} of the 600 messages after its restart")
        # what tt-b acknowledges now is on tt-a too, under the same bookmarks
        publish_many(b.port, "orders", bodies(1300, 1500), name="pb", start_seq=301, conn=pb)
        on_a = dict(a.replay("orders"))
        on_b = dict(b.replay("orders"))
        missing = {bm for bm in on_b if on_a.get(bm) != on_b[bm]}
        if missing:
            problems.append(f"{len(missing)} messages acknowledged on tt-b are not on tt-a")
        assert not problems, problems
        assert len(on_b) == 800
        assert b.wait_for_log("knew another journal of this instance", 1)
        pb.close()
    finally:
        cl.close()


async def test_a_subscriber_that_fails_over_gets_every_publisher_once(tmp_path):
    """After a partition tt-a holds X 1..300 then Y 1..300, tt-b Y's then X's. A subscriber
    that processed X 1..150 on tt-a resumes on tt-b: it gets Y 1..300 (which lie before X|150
    there) and X 151..300, each once (after the client's per-publisher dedup)."""
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False).start()
    sub = None
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "link a -> b")
        wait_until(lambda: dest_stats(b, "tt-a").get("connected"), 20, "link b -> a")
        cl.cut("tt-a", "tt-b")
        publish_many(a.port, "orders", bodies(0, 300), name="X").close()
        publish_many(b.port, "orders", bodies(1000, 1300), name="Y").close()
        cl.heal()
        for inst in (a, b):
            wait_until(lambda i=inst: len(i.replay("orders")) == 600, 30, f"{inst.name}: 600")
        order_a = [bm for bm, _ in a.replay("orders")]
        order_b = [bm for bm, _ in b.replay("orders")]
        x150 = order_a[149]
        assert order_b.index(x150) > 300  # on tt-b every Y message lies before X|150
        sub = HAClient("sub", servers=cl.addresses(), bookmark_store=MemoryBookmarkStore())
        await sub.connect_and_logon(timeout=10)
        # paced, so that what tt-a sends past X|150 before it dies is a handful, not all
        hs = await sub.subscribe("orders", bookmark=MOST_RECENT, sub_id="s", options="rate=100")
        processed: list[str] = []
        while len(processed) < 150:
            m = await hs.next(timeout=10)
            processed.append(m.bookmark)
            hs.discard(m)
        assert processed == order_a[:150]
        await asyncio.to_thread(a.kill)
        while len(processed) < 600:
            m = await hs.next(timeout=30)
            processed.append(m.bookmark)
            hs.discard(m)
        assert sub.current_uri == cl.addresses()[1]
        assert sorted(processed) == sorted(order_a), "not every message once"
        with_a_duplicate = await _more(hs)
        assert not with_a_duplicate, with_a_duplicate
    finally:
        if sub is not None:
            await sub.close()
        cl.close()


async def _more(hs, wait: float = 1.0) -> list[str]:
    """What else the subscription delivers within `wait` seconds (nothing is expected)."""
    got = []
    try:
        while True:
            m = await hs.next(timeout=wait)
            got.append(m.bookmark)
    except TimeoutError:
        return got


def test_resync_after_a_cut_and_a_kill_sends_exactly_what_is_missing(tmp_path):
    """A link cut, then a kill -9 of the destination: each time the sender resumes where the
    destination durably is, so the destination ends with every message once and receives none
    twice (a resync from too early shows as duplicates, one from too late as missing ones)."""
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], links=[("tt-a", "tt-b")], sync=False).start()
    try:
        a, b = cl["tt-a"], cl["tt-b"]

        def source() -> dict:
            return b.admin_get("/stats")["replication"]["sources"].get("tt-a", {})

        def has(n: int) -> bool:
            return source().get("received_messages", 0) >= n

        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "link a -> b")
        pub = publish_many(a.port, "orders", bodies(0, 200), name="pa")
        wait_until(lambda: has(200), 10, "200 on tt-b")
        cl.link("tt-a", "tt-b").drop()
        publish_many(a.port, "orders", bodies(200, 500), name="pa", start_seq=201, conn=pub)
        cl.link("tt-a", "tt-b").pass_()
        wait_until(lambda: has(500), 10, "500 on tt-b after the cut")
        src = source()
        assert (src["received_messages"], src["duplicates"]) == (500, 0), src
        assert dest_stats(a, "tt-b")["sent_messages"] == 500
        b.kill()
        publish_many(a.port, "orders", bodies(500, 600), name="pa", start_seq=501, conn=pub)
        b.start()
        wait_until(lambda: has(100), 10, "the 100 missing after the restart")
        time.sleep(0.3)  # anything sent twice would arrive now
        src = source()
        assert (src["received_messages"], src["duplicates"]) == (100, 0), src
        assert dest_stats(a, "tt-b")["sent_messages"] == 600
        seqs = b.per_publisher("orders")
        assert list(seqs.values()) == [list(range(1, 601))]
        pub.close()
    finally:
        cl.close()
