"""At-most-once queues never deliver a message twice, kill -9 included (issue 23): a delivery
leaves the server only once the DELIVERED_AT_MOST_ONCE event that makes its message done is
durable. Real server processes; the journal's writes are held on purpose with the fault knob's
`delay` (journal/fileio.py), so a kill lands while an event's commit is in progress."""

import collections
import json
import random
import threading
import time

from tests.support.proc import ServerProcess
from tests.support.raw import Raw

AMO = """<SOW>
  <Queue><Name>amo-q</Name><UnderlyingTopic>amo</UnderlyingTopic><Semantics>at-most-once</Semantics>
         <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
</SOW>"""
HOLD = 2.0  # seconds each journal write is held before it is made
HELD = {"TICKERTAPE_FAULTS": f"ops=write;delay={HOLD};count=0"}


def consumer(port: int, name: str, backlog: int = 100) -> Raw:
    c = Raw(port)
    c.logon(name)
    c.send(
        {
            "c": "subscribe",
            "t": "amo-q",
            "cid": "q",
            "a": "processed",
            "o": f"max_backlog={backlog}",
        }
    )
    assert c.ack("processed", "q", timeout=30)["status"] == "success"
    return c


def publish(c: Raw, seq: int, i: int) -> None:
    c.send({"c": "publish", "t": "amo", "s": seq}, json.dumps({"i": i}))


def deliveries(c: Raw, seconds: float, until: int | None = None) -> list[int]:
    """The ids of the queue deliveries `c` gets within `seconds` (or once it has `until`); stops
    early when the server goes away."""
    out: list[int] = []
    c.sock.settimeout(0.05)
    end = time.monotonic() + seconds
    while time.monotonic() < end and (until is None or len(out) < until):
        try:
            f = c.recv()
        except TimeoutError:
            continue
        except OSError:
            break
        if f is None:
            break
        if f[0].get("c") == "p":
            out.append(json.loads(f[1])["i"])
    return out


def test_a_delivery_waits_for_its_event_and_a_kill_while_it_commits_never_doubles_it(tmp_path):
    """With every journal write held HOLD seconds: the delivery of a message comes one held
    commit (its event's) after the message's own commit, which a live subscriber to the topic
    sees; a kill -9 while that commit is held leaves nothing delivered, and the restarted
    server delivers the message once. Before the fix the delivery went out at once and its
    event was committed after it: the kill made the restarted server deliver it again."""
    srv = ServerProcess(tmp_path / "amo", extra=AMO, env=HELD).start(timeout=60)
    try:
        watch = Raw(srv.port, timeout=30)
        watch.logon("watch")
        watch.subscribe("amo")  # live: a message reaches it when its commit is durable
        c = consumer(srv.port, "amo-c")
        pub = Raw(srv.port)
        pub.logon("amo-pub")

        publish(pub, 1, 1)
        watch.messages(1, timeout=8 * HOLD)
        committed = time.monotonic()
        first = deliveries(c, 4 * HOLD, until=1)
        waited = time.monotonic() - committed

        publish(pub, 2, 2)
        watch.messages(1, timeout=8 * HOLD)
        before = deliveries(c, HOLD / 2)  # its event's commit is held for HOLD: nothing yet
        srv.kill()
        srv.env = None
        srv.start()
        after = deliveries(consumer(srv.port, "amo-c2"), 3.0)
    finally:
        srv.kill()
    got = first + before + after
    assert got.count(2) <= 1, f"message 2 delivered twice: {before} before the kill, {after} after"
    assert got.count(1) == 1, f"message 1: {first} before, {after} after the restart"
    assert first == [1] and waited >= 0.7 * HOLD, (
        f"message 1 delivered {waited:.2f}s after its commit, before its event could be durable"
    )
    assert before == [] and after == [2]


def _consume(c: Raw, seen: list[int], lock: threading.Lock) -> None:
    """Read deliveries and acknowledge them (that frees the backlog) until the server is gone."""
    bms: list[str] = []
    c.sock.settimeout(15)
    try:
        while True:
            f = c.recv()
            if f is None:
                return
            h, b = f
            if h.get("c") != "p":
                continue
            with lock:
                seen.append(json.loads(b)["i"])
            bms.append(h["bm"])
            if len(bms) >= 10:
                c.send({"c": "sow_delete", "t": "amo-q", "bm": ",".join(bms)})
                bms = []
    except OSError:
        return


def _publish(port: int, name: str, base: int, count: int, stop: threading.Event) -> None:
    try:
        c = Raw(port)
        c.logon(name)
        for n in range(count):
            if stop.is_set():
                return
            publish(c, n + 1, base + n)
            if n % 20 == 19:
                time.sleep(0.002)
    except OSError:
        return


def test_kill9_loop_with_consumers_and_a_publisher_never_delivers_twice(tmp_path):
    """Rounds of: two at-most-once consumers consume (and acknowledge) while a publisher
    publishes, and the server is killed -9 at a random moment; then a last consumer drains
    the queue. No message is delivered twice over all the rounds."""
    rng = random.Random(23)
    srv = ServerProcess(tmp_path / "loop", extra=AMO).start()
    seen: list[int] = []
    lock = threading.Lock()
    per_round = []
    try:
        for r in range(4):
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=_consume, args=(consumer(srv.port, f"c{r}-{k}", 20), seen, lock)
                )
                for k in range(2)
            ]
            threads.append(
                threading.Thread(
                    target=_publish, args=(srv.port, f"pub{r}", r * 100_000, 4000, stop)
                )
            )
            n0 = len(seen)
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.4, 0.9))
            srv.kill()
            stop.set()
            for t in threads:
                t.join(20)
            assert not any(t.is_alive() for t in threads)
            per_round.append(len(seen) - n0)
            srv.start()
        last = deliveries(consumer(srv.port, "drain", 100), 2.0)
    finally:
        srv.kill()
    twice = sorted(i for i, n in collections.Counter(seen + last).items() if n > 1)
    assert not twice, f"{len(twice)} messages delivered twice, e.g. {twice[:5]}"
    assert all(per_round), f"a round delivered nothing: {per_round}"


def test_a_sync_destination_that_is_down_holds_the_delivery_until_the_downgrade(tmp_path):
    """tt-a replicates to tt-b in sync: an at-most-once delivery on tt-a waits for its event to
    pass the sync gate like a `persisted` ack (so a sync peer taking over holds the event). With
    tt-b down nothing is delivered; the admin's downgrade releases it. Before the fix it was
    delivered at once."""
    from tests.e2e.test_repl_sync import cli
    from tests.e2e.test_replication_partition import dest_stats
    from tests.support.cluster import Cluster, wait_until

    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=True, topics=("amo", "amo-q"), extra=AMO,
                 queue_owner_failover="30s").start()  # fmt: skip
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        for x, y in ((a, "tt-b"), (b, "tt-a")):
            wait_until(lambda x=x, y=y: dest_stats(x, y).get("connected"), 20, f"link to {y}")
        c = consumer(a.port, "sync-c")
        pub = Raw(a.port)
        pub.logon("sync-pub")
        publish(pub, 1, 1)
        assert deliveries(c, 20, until=1) == [1]  # both up (once tt-a's queues have synced)
        b.kill()
        wait_until(lambda: not dest_stats(a, "tt-b").get("connected"), 20, "tt-b gone")
        publish(pub, 2, 2)
        held = deliveries(c, 1.5)
        done = cli(a, "downgrade", "tt-b")
        assert done.returncode == 0, done.stderr
        released = deliveries(c, 10, until=1)
    finally:
        cl.close()
    assert held == [], "delivered before its event passed the sync gate"
    assert released == [2]
