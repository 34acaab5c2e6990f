"""Replicated queues (issue 14, docs/replication.md): consumers on both instances, the owner of
the messages killed mid-stream. Only the owner leases its messages; acknowledgements replicate;
after `<QueueOwnerFailover>` the survivor takes the owner's messages over and delivers the
leased-but-unacked ones again (counted). In the end every message is acknowledged, and none
whose acknowledgement succeeded is delivered again."""

import json
import os
import threading
import time

from protocol.security.passwords import ScryptParams, set_password
from tests.e2e.test_replication_partition import dest_stats
from tests.security.servers import FAST, admin_get
from tests.support.cluster import Cluster, wait_until
from tests.support.raw import Raw, publish_many

BACKLOG = 20  # unacknowledged deliveries a consumer holds at most
QUEUE = f"""<SOW><Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic>
  <LeasePeriod>30s</LeasePeriod><MaxPerSubscriptionBacklog>{BACKLOG}</MaxPerSubscriptionBacklog></Queue></SOW>"""
N = 2000


def consumer(port: int, name: str, **logon) -> Raw:
    c = Raw(port)
    c.logon(name, **logon)
    sub = {"c": "subscribe", "t": "work-q", "cid": "q", "a": "processed"}
    c.send({**sub, "o": f"max_backlog={BACKLOG}"})
    assert c.ack("processed", "q")["status"] == "success"
    return c


class Consumer:
    """Takes queue deliveries and acknowledges each one (sow_delete), remembering which
    acknowledgements the server confirmed."""

    def __init__(self, port: int, name: str, **logon):
        self.c = consumer(port, name, **logon)
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


RESTART_N = 300
FILL = 1200  # 1 KiB messages tt-b records while tt-a is down: a catch-up of ~1.2 MB
LINK_DELAY = 0.4  # each read of the link tt-b -> tt-a: ~160 KB/s, the catch-up takes ~8 s


def test_a_restarted_instance_delivers_nothing_its_peer_acked_while_its_catch_up_is_slow(
    tmp_path,
):
    """Issue 23 (seams campaign, seed 1 round 2): tt-b takes over tt-a's queue messages while
    tt-a is down and acknowledges every one. tt-a comes back with the link from tt-b delayed,
    so tt-b's catch-up (its journal since, the acks at its end) takes longer than
    <QueueOwnerFailover>. The link is up the whole time: tt-a must lease nothing until it has
    applied what tt-b had when the link logged on, and then nothing is left to deliver."""
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, topics=("work", "work-q", "fill"),
                 extra=QUEUE, queue_owner_failover="4s").start()  # fmt: skip
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        for x, y in ((a, "tt-b"), (b, "tt-a")):
            wait_until(lambda x=x, y=y: dest_stats(x, y).get("connected"), 20, f"link to {y}")
        bodies = [json.dumps({"i": i}) for i in range(RESTART_N)]
        publish_many(a.port, "work", bodies, name="qp").close()
        wait_until(
            lambda: queue_stats(b, "work-q").get("held_for_others") == RESTART_N,
            20,
            "tt-b holds tt-a's messages",
        )
        a.kill()
        pad = "x" * 1000
        fill = [json.dumps({"f": i, "pad": pad}) for i in range(FILL)]
        publish_many(b.port, "fill", fill, name="filler").close()
        cb = Consumer(b.port, "qb")  # leases once tt-b took tt-a over (4 s)
        deadline = time.monotonic() + 60
        while len(cb.acked) < RESTART_N and time.monotonic() < deadline:
            cb.step()
        assert cb.acked == set(range(RESTART_N)), "tt-b did not take over and ack everything"
        cl.link("tt-b", "tt-a").delay(LINK_DELAY)
        ticker = Ticker(b.port)  # tt-b publishes without pause: its link never goes idle
        try:
            a.start()
            ca = Consumer(a.port, "qa")
            deadline = time.monotonic() + 60
            while queue_stats(a, "work-q")["depth"] and time.monotonic() < deadline:
                ca.step(timeout=0.2)
                assert not ca.delivered, f"tt-a delivered {len(ca.delivered)} messages tt-b acked"
            assert queue_stats(a, "work-q")["depth"] == 0, "tt-b's acks never reached tt-a"
            # tt-b has caught up (all it had at the logon) though its link is never idle:
            # tt-a leases again, and only what is new
            publish_many(a.port, "work", [json.dumps({"i": RESTART_N})], name="qp2").close()
            deadline = time.monotonic() + 20
            while not ca.delivered and time.monotonic() < deadline:
                ca.step(timeout=0.2)
            assert ca.delivered == [RESTART_N], f"tt-a delivered {ca.delivered[:5]}..."
            assert ticker.sent > 0 and ticker.error is None, ticker.error
        finally:
            ticker.stop()
    finally:
        cl.close()


class Ticker:
    """Publishes to tt-b's `fill` topic every 0.1 s (at most 60 s, 600 messages) until stopped."""

    def __init__(self, port: int):
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._c = Raw(port)
        self._c.logon("ticker")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self.sent < 600 and not self._stop.wait(0.1):
                self.sent += 1
                self._c.send({"c": "publish", "t": "fill", "s": self.sent}, '{"tick":1}')
        except OSError as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._c.close()


# about 1 s a check here (16 MiB at a time): past the failover time (0.5 s), and far enough
# below a link's logon timeout (5 s) to stay there on a loaded machine
SLOW_CHECK = ScryptParams(n=1 << 14, r=8, p=16)
USERS = {"repl": "repl-secret-9", "ops": "ops-secret-7", "cons": "cons-secret-5",
         "pub": "pub-secret-3"}  # fmt: skip
ROLES = """<Entitlement>
  <Role><Name>admins</Name><Users>repl,ops</Users><Admin>true</Admin></Role>
  <Role><Name>workers</Name><Users>cons</Users><Consume>work-q</Consume></Role>
  <Role><Name>publishers</Name><Users>pub</Users><Publish>work</Publish></Role>
</Entitlement>"""


def test_a_restarted_instance_waits_for_a_peer_whose_link_logon_outlasts_the_failover_bound(
    tmp_path,
):
    """Issue 23 (seams campaign, seed 1 round 2, on a loaded machine): tt-b takes over tt-a's
    queue messages while tt-a is down and acknowledges every one. tt-a restarts, and checking
    the password of tt-b's link takes it longer than <QueueOwnerFailover> (0.5 s), and on a
    loaded machine longer than a link's heartbeat interval (1 s). tt-b is alive and linking the
    whole time: tt-a must lease nothing until tt-b's link is up and has synced (a heartbeat
    sent while the logon is checked must neither end the logon nor count as synced: the unit
    tests in tests/server/test_replication_intake.py pin those), then only what is new."""
    for name, slow in (("users-a.db", True), ("users-b.db", False)):
        for user, password in USERS.items():
            set_password(
                tmp_path / name, user, password, SLOW_CHECK if slow and user == "repl" else FAST
            )
    pw = os.path.join(tmp_path, "repl.pw")
    with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(USERS["repl"] + "\n")
    auth = "<Authentication><PasswordFile>{db}</PasswordFile></Authentication>"
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, topics=("work", "work-q"),
                 extra=QUEUE + auth + ROLES, queue_owner_failover="500ms", link_user=("repl", pw))  # fmt: skip
    for n in cl.names:  # only tt-a checks tt-b's link slowly
        i = cl[n]
        with open(i.config_path) as f:
            xml = f.read()
        with open(i.config_path, "w") as f:
            f.write(xml.replace("{db}", str(tmp_path / f"users-{n[-1]}.db")))
    cl.start()
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        wait_until(lambda: stats(a, "replication", "destinations", "tt-b").get("connected"),
                   20, "link to tt-b")  # fmt: skip
        pub = Raw(a.port)
        assert pub.logon("qp", user_id="pub", pw=USERS["pub"])["status"] == "success"
        bodies = [json.dumps({"i": i}) for i in range(RESTART_N)]
        publish_many(a.port, "work", bodies, name="qp", conn=pub).close()
        wait_until(lambda: stats(b, "queues", "work-q").get("held_for_others") == RESTART_N,
                   20, "tt-b holds tt-a's messages")  # fmt: skip
        a.kill()
        cb = Consumer(b.port, "qb", user_id="cons", pw=USERS["cons"])  # leases after 0.5 s
        deadline = time.monotonic() + 60
        while len(cb.acked) < RESTART_N and time.monotonic() < deadline:
            cb.step()
        assert cb.acked == set(range(RESTART_N)), "tt-b did not take over and ack everything"
        cb.c.close()
        a.start()
        ca = Consumer(a.port, "qa", user_id="cons", pw=USERS["cons"])
        # tt-b's link logs on within about a second of each try and then sends its acks: until
        # they are applied, tt-a must hand out none of the messages they name
        deadline = time.monotonic() + 60
        while stats(a, "queues", "work-q")["depth"] and time.monotonic() < deadline:
            ca.step(timeout=0.2)
            assert not ca.delivered, f"tt-a delivered {len(ca.delivered)} messages tt-b acked"
        assert stats(a, "queues", "work-q")["depth"] == 0, "tt-b's acks never reached tt-a"
        pub = Raw(a.port)
        assert pub.logon("qp2", user_id="pub", pw=USERS["pub"])["status"] == "success"
        publish_many(a.port, "work", [json.dumps({"i": RESTART_N})], name="qp2", conn=pub).close()
        deadline = time.monotonic() + 20
        while not ca.delivered and time.monotonic() < deadline:
            ca.step(timeout=0.2)
        assert ca.delivered == [RESTART_N], f"tt-a delivered {ca.delivered[:5]}..."
        assert "got Heartbeat" not in b.output(), "a heartbeat ended tt-b's logon to tt-a"
    finally:
        cl.close()


def stats(inst, *path: str) -> dict:
    """A part of an instance's /stats, read as the admin user `ops`."""
    status, _, data = admin_get(inst, "/stats", user="ops", password=USERS["ops"])
    assert status == 200, data
    out = json.loads(data)
    for key in path:
        out = out.get(key, {})
    return out
