"""Replicated queues (issue 14, docs/replication.md): consumers on both instances, the owner of
the messages killed mid-stream. Only the owner leases its messages; acknowledgements replicate;
after `<QueueOwnerFailover>` the survivor takes the owner's messages over and delivers the
leased-but-unacked ones again (counted). In the end every message is acknowledged, and none
whose acknowledgement succeeded is delivered again."""

import json
import time

from tests.e2e.test_replication_partition import dest_stats
from tests.support.cluster import Cluster, wait_until
from tests.support.raw import Raw, publish_many

BACKLOG = 20  # unacknowledged deliveries a consumer holds at most
QUEUE = f"""<SOW><Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic>
  <LeasePeriod>30s</LeasePeriod><MaxPerSubscriptionBacklog>{BACKLOG}</MaxPerSubscriptionBacklog></Queue></SOW>"""
N = 2000


def consumer(port: int, name: str) -> Raw:
    c = Raw(port)
    c.logon(name)
    sub = {"c": "subscribe", "t": "work-q", "cid": "q", "a": "processed"}
    c.send({**sub, "o": f"max_backlog={BACKLOG}"})
    assert c.ack("processed", "q")["status"] == "success"
    return c


class Consumer:
    """Takes queue deliveries and acknowledges each one (sow_delete), remembering which
    acknowledgements the server confirmed."""

    def __init__(self, port: int, name: str):
        self.c = consumer(port, name)
        self.delivered: list[int] = []
        self.acked: set[int] = set()

    def step(self, limit: int = BACKLOG, timeout: float = 0.2) -> int:
        """Take up to `limit` deliveries (waiting at most `timeout`), ack them; count taken.
        No more than BACKLOG come before an ack: waiting for more would only wait out `timeout`."""
        self.c.sock.settimeout(timeout)
        got = []
        try:
            while len(got) < limit:
                f = self.c.recv()
                if f is None:
                    raise ConnectionError("closed")
                if f[0].get("c") == "p":
                    got.append(f)
        except TimeoutError:
            pass
        if not got:
            return 0
        ids = [json.loads(b)["i"] for _, b in got]
        self.delivered += ids
        self.c.sock.settimeout(10)
        bms = ",".join(h["bm"] for h, _ in got)
        self.c.send({"c": "sow_delete", "t": "work-q", "bm": bms, "cid": "k", "a": "processed"})
        if self.c.ack("processed", "k")["status"] == "success":
            self.acked.update(ids)
        return len(got)


def test_owner_killed_mid_stream_every_message_acked_once_redeliveries_counted(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=True, topics=("work", "work-q"), extra=QUEUE,
                 queue_owner_failover="1s", downgrade_after="1s").start()  # fmt: skip
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        for x, y in ((a, "tt-b"), (b, "tt-a")):  # both links up: no takeover at start
            wait_until(lambda x=x, y=y: dest_stats(x, y).get("connected"), 20, f"link to {y}")
        publish_many(a.port, "work", [json.dumps({"i": i}) for i in range(N)], name="qp").close()
        ca, cb = Consumer(a.port, "qa"), Consumer(b.port, "qb")
        while len(ca.acked) < N // 3:
            ca.step()
            assert cb.step(timeout=0.01) == 0, "tt-b leased a message tt-a owns"
        # a leased, unacknowledged window on the owner when it dies
        ca.c.sock.settimeout(2)
        held = [json.loads(body)["i"] for _, body in ca.c.messages(5)]
        a.kill()
        deadline = time.monotonic() + 60
        while len(ca.acked | cb.acked) < N and time.monotonic() < deadline:
            cb.step()
        acked = ca.acked | cb.acked
        assert acked == set(range(N)), f"{N - len(acked)} never acknowledged"
        assert not (ca.acked & cb.acked), "a message acknowledged on tt-a came again on tt-b"
        assert set(held) <= cb.acked  # leased on the dead owner, delivered again by the taker
        assert len(cb.delivered) == len(set(cb.delivered))
        stats = b.admin_get("/stats")
        assert "redeliver" in json.dumps(stats)
        # the old owner comes back: nothing more is delivered anywhere
        a.start()
        ca2 = Consumer(a.port, "qa2")
        wait_until(lambda: ca2.step(timeout=0.5) == 0, 10, "quiet")
        assert ca2.delivered == [] and cb.step(timeout=0.5) == 0
    finally:
        cl.close()


HEAL_QUEUES = """<SOW>
  <Queue><Name>alo-q</Name><UnderlyingTopic>alo</UnderlyingTopic><LeasePeriod>60s</LeasePeriod>
    <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>amo-q</Name><UnderlyingTopic>amo</UnderlyingTopic><Semantics>at-most-once</Semantics>
    <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue></SOW>"""


def queue_stats(inst, name: str) -> dict:
    return inst.admin_get("/stats")["queues"][name]


def take_now(c: Raw, wait: float = 0.3) -> list[int]:
    """The deliveries that arrive within `wait` seconds, as their `i`."""
    c.sock.settimeout(wait)
    got = []
    try:
        while True:
            f = c.recv()
            if f is None:
                raise ConnectionError("closed")
            if f[0].get("c") == "p":
                got.append(json.loads(f[1])["i"])
    except TimeoutError:
        pass
    finally:
        c.sock.settimeout(10)
    return got


def test_a_healed_partition_delivers_nothing_acknowledged_on_the_other_side(tmp_path):
    """Issue 23, finding 2. The owner (tt-a) acknowledges every message, one commit each,
    while cut off; tt-b takes it over and leases some to its consumer (both sides deliver
    during a partition: the documented case). When the link heals, tt-b applies tt-a's events
    record by record: none may free a lease there that goes to the next message, which tt-a
    acknowledged too (at-least-once: acked, delivered again; at-most-once: delivered twice)."""
    n, k = 40, 5
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, extra=HEAL_QUEUES,
                 topics=("alo", "amo", "alo-q", "amo-q"), queue_owner_failover="3s").start()  # fmt: skip
    queues = (("alo-q", "alo"), ("amo-q", "amo"))
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        for x, y in ((a, "tt-b"), (b, "tt-a")):
            wait_until(lambda x=x, y=y: dest_stats(x, y).get("connected"), 20, f"link to {y}")
        for _, topic in queues:
            docs = [json.dumps({"i": i}) for i in range(n)]
            publish_many(a.port, topic, docs, name=f"pub-{topic}").close()
        for q, _ in queues:
            wait_until(lambda q=q: queue_stats(b, q).get("held_for_others") == n, 20, f"{q} at b")
        cl.cut("tt-a", "tt-b")
        for q, _ in queues:  # tt-a: every message delivered and acked, each ack its own commit
            c = Raw(a.port)
            c.logon(f"qa-{q}")
            c.subscribe(q, o="max_backlog=1")
            for _ in range(n):
                [(h, _body)] = c.messages(1)
                cid = c.next_cid()
                c.send({"c": "sow_delete", "t": q, "bm": h["bm"], "cid": cid, "a": "processed"})
                assert c.ack("processed", cid)["records_deleted"] == 1
            assert take_now(c) == []
            c.close()
        takers = {}
        for q, _ in queues:  # tt-b takes tt-a over and leases k (delivered on both sides)
            wait_until(lambda q=q: queue_stats(b, q).get("taken_over"), 20, f"{q} taken over")
            c = Raw(b.port)
            c.logon(f"qb-{q}")
            c.subscribe(q, o=f"max_backlog={k}")
            assert len(c.messages(k)) == k
            takers[q] = c
        cl.heal()
        for q, _ in queues:
            wait_until(
                lambda q=q: (lambda s: s["depth"] == 0 and s["leased"] == 0)(queue_stats(b, q)),
                30,
                f"{q} done at b",
            )
        late = {q: take_now(c, 1.0) for q, c in takers.items()}
        assert late == {"alo-q": [], "amo-q": []}, "tt-b delivered what tt-a had acknowledged"
        for c in takers.values():
            c.close()
    finally:
        cl.close()
