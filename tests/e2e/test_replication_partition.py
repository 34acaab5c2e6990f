"""Replication (issue 14) across a cut link: publishing on both sides of a network cut, then
healing, converges both journals; a sync destination that is down holds `persisted` acks until
it returns or is downgraded (admin command or `<DowngradeAfter>`), and is upgraded once caught
up; `fully_durable` bookmark subscriptions deliver only what the sync destination has too."""

import json
import time

import pytest

from tests.support.cluster import Cluster, wait_until
from tests.support.raw import Raw, publish_many


def dest_stats(inst, dest: str) -> dict:
    """One destination's replication stats from /stats ({} when absent)."""
    repl = inst.replication_stats()
    d = repl.get(dest) or (repl.get("destinations") or {}).get(dest)
    return d or {}


def bodies(lo: int, hi: int):
    return [json.dumps({"i": i}) for i in range(lo, hi)]


def same_everywhere(cl: Cluster, topic: str, expected: dict[str, int]):
    """Every instance holds, per publisher *name* (via its first body's tag), 1..n in order."""
    maps = [inst.per_publisher(topic) for inst in cl]
    if any(m != maps[0] for m in maps[1:]):
        return None
    if sorted(len(v) for v in maps[0].values()) != sorted(expected.values()):
        return None
    if any(v != list(range(1, len(v) + 1)) for v in maps[0].values()):
        return None
    return maps[0]


@pytest.mark.parametrize("how", ["drop", "stall"])
def test_cut_with_publishing_on_both_sides_then_heal_converges(tmp_path, how):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, topics=("orders",)).start()
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        publish_many(a.port, "orders", bodies(0, 500), name="pub-a").close()
        publish_many(b.port, "orders", bodies(0, 500), name="pub-b").close()
        wait_until(lambda: same_everywhere(cl, "orders", {"a": 500, "b": 500}), 30, "before")
        cl.cut("tt-a", "tt-b", how)
        # async destinations: both sides keep acking their own publishers during the cut
        pa = publish_many(a.port, "orders", bodies(500, 3000), name="pub-a", start_seq=501)
        pb = publish_many(b.port, "orders", bodies(500, 2000), name="pub-b", start_seq=501)
        pa.close()
        pb.close()
        time.sleep(0.5)
        assert len(b.per_publisher("orders")) == 2
        assert sorted(len(v) for v in b.per_publisher("orders").values()) == [500, 2000]
        cl.heal()
        # a stalled link is only noticed by the heartbeat timeout (5 s) before it resyncs
        wait_until(lambda: same_everywhere(cl, "orders", {"a": 3000, "b": 2000}), 40, "after")
    finally:
        cl.close()


def _publish_persisted(port, name, seq, topic="orders"):
    c = Raw(port)
    c.logon(name)
    c.send({"c": "publish", "t": topic, "s": seq, "a": "persisted"}, json.dumps({"i": seq}))
    return c


def _no_persisted_ack(c: Raw, wait: float) -> bool:
    try:
        c.recv_until(lambda h, _: h.get("a") == "persisted", timeout=wait)
    except (TimeoutError, OSError):
        return True
    return False


def test_sync_destination_down_holds_acks_and_admin_downgrade_releases_them(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync={("tt-a", "tt-b"): True},
                 topics=("orders",)).start()  # fmt: skip
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "the link up")
        b.kill()
        wait_until(lambda: not dest_stats(a, "tt-b").get("connected"), 20, "the link down")
        c = _publish_persisted(a.port, "held-pub", 1)
        c.sock.settimeout(1.5)
        assert _no_persisted_ack(c, 1.5), "acked while the sync destination is down"
        a.admin_post("/replication/tt-b/downgrade")
        c.sock.settimeout(10)
        assert c.ack("persisted", timeout=10)["s"] == 1
        assert dest_stats(a, "tt-b")["mode"] == "downgraded"
        # the log line is read by the process's reader thread: wait for it, do not race it
        wait_until(lambda: any("downgrad" in line for line in a.lines), 10, "the downgrade logged")
        # downgraded acts as async: the next publish is acked at once
        c.send({"c": "publish", "t": "orders", "s": 2, "a": "persisted"}, "{}")
        assert c.ack("persisted", timeout=5)["s"] == 2
        b.start()
        # caught up: upgraded back to sync automatically, and it has both messages
        wait_until(lambda: dest_stats(a, "tt-b").get("mode") == "sync", 30, "the upgrade")
        assert list(b.per_publisher("orders").values()) == [[1, 2]]
        c.close()
    finally:
        cl.close()


def test_downgrade_after_releases_held_acks_by_itself(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync={("tt-a", "tt-b"): True},
                 topics=("orders",), downgrade_after="1s").start()  # fmt: skip
    try:
        a = cl["tt-a"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "the link up")
        cl.cut("tt-a", "tt-b", "drop")
        wait_until(lambda: not dest_stats(a, "tt-b").get("connected"), 20, "the link down")
        start = time.monotonic()
        c = _publish_persisted(a.port, "timer-pub", 1)
        assert c.ack("persisted", timeout=10)["s"] == 1
        took = time.monotonic() - start
        assert took < 5, took  # released by the 1 s timer (counted from the link loss)
        assert dest_stats(a, "tt-b")["mode"] == "downgraded"
        cl.heal()
        wait_until(lambda: dest_stats(a, "tt-b").get("mode") == "sync", 30, "the upgrade")
        c.close()
    finally:
        cl.close()


def test_sync_acks_wait_for_the_destination_while_the_link_is_stalled(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync={("tt-a", "tt-b"): True},
                 topics=("orders",)).start()  # fmt: skip
    try:
        a = cl["tt-a"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "the link up")
        cl.link("tt-a", "tt-b").stall()
        c = _publish_persisted(a.port, "stall-pub", 1)
        assert _no_persisted_ack(c, 1.0)
        cl.heal()
        c.sock.settimeout(20)
        assert c.ack("persisted", timeout=20)["s"] == 1
        c.close()
    finally:
        cl.close()


def test_fully_durable_delivers_only_what_the_sync_destination_has(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync={("tt-a", "tt-b"): True},
                 topics=("orders",)).start()  # fmt: skip
    try:
        a = cl["tt-a"]
        publish_many(a.port, "orders", bodies(0, 10), name="fd-pub").close()
        durable = Raw(a.port)
        durable.logon("fd-sub")
        durable.subscribe("orders", bm="0", o="fully_durable", sub_id="fd")
        plain = Raw(a.port)
        plain.logon("plain-sub")
        plain.subscribe("orders", bm="0", sub_id="pl")
        assert len(durable.messages(10)) == 10 and len(plain.messages(10)) == 10
        cl.link("tt-a", "tt-b").stall()
        p = Raw(a.port)
        p.logon("fd-pub")
        for s in range(11, 21):
            p.send({"c": "publish", "t": "orders", "s": s}, json.dumps({"i": s}))
        assert len(plain.messages(10)) == 10  # locally durable: the plain one has them
        durable.sock.settimeout(1.0)
        with pytest.raises((TimeoutError, OSError)):
            durable.messages(1, timeout=1.0)
        cl.heal()
        durable.sock.settimeout(20)
        got = durable.messages(10, timeout=20)
        assert [json.loads(b)["i"] for _, b in got] == list(range(11, 21))
        for c in (durable, plain, p):
            c.close()
    finally:
        cl.close()
