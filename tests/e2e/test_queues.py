"""Queues (docs/protocol.md §8) against a real server: leases, backlog, fairness, cancel, expiry,
barriers, dead letters, strict leasing, and state across graceful and kill -9 restarts."""

import json
import os
import signal
import struct
import time
import urllib.request

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

QUEUES = """<SOW>
  <Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>work-q2</Name><UnderlyingTopic>work</UnderlyingTopic></Queue>
  <Queue><Name>jobs</Name><UnderlyingTopic>jobs</UnderlyingTopic><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>lease-q</Name><UnderlyingTopic>lease</UnderlyingTopic><LeasePeriod>400ms</LeasePeriod>
         <MaxDeliveries>2</MaxDeliveries><DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>cancel-q</Name><UnderlyingTopic>cancel</UnderlyingTopic><MaxCancels>1</MaxCancels><DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>exp-q</Name><UnderlyingTopic>exp</UnderlyingTopic><Expiration>500ms</Expiration><DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>msgexp-q</Name><UnderlyingTopic>msgexp</UnderlyingTopic><DeadLetterTopic>dead</DeadLetterTopic></Queue>
  <Queue><Name>barrier-q</Name><UnderlyingTopic>barrier</UnderlyingTopic><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog>
         <BarrierExpression>/barrier = 1</BarrierExpression></Queue>
  <Queue><Name>strict-q</Name><UnderlyingTopic>strict</UnderlyingTopic><Leasing>strict</Leasing></Queue>
  <Queue><Name>prop-q</Name><UnderlyingTopic>prop</UnderlyingTopic><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>rr-q</Name><UnderlyingTopic>rr</UnderlyingTopic><FairnessModel>round-robin</FairnessModel><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>fast-q</Name><UnderlyingTopic>fast</UnderlyingTopic><FairnessModel>fast</FairnessModel><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>amo-q</Name><UnderlyingTopic>amo</UnderlyingTopic><Semantics>at-most-once</Semantics><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>filt-q</Name><UnderlyingTopic>filt</UnderlyingTopic><Filter>/keep = 1</Filter><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>orders</Name><UnderlyingTopic>orders</UnderlyingTopic><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>run-q</Name><UnderlyingTopic>run</UnderlyingTopic><LeasePeriod>400ms</LeasePeriod><MaxDeliveries>2</MaxDeliveries>
         <DeadLetterTopic>dead-run</DeadLetterTopic><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>mb-q</Name><UnderlyingTopic>mb</UnderlyingTopic><MaxBacklog>3</MaxBacklog><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>multi-q1</Name><UnderlyingTopic>multi</UnderlyingTopic></Queue>
  <Queue><Name>multi-q2</Name><UnderlyingTopic>multi</UnderlyingTopic></Queue>
  <Queue><Name>stats-q</Name><UnderlyingTopic>statsq</UnderlyingTopic><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
  <Queue><Name>crash-q</Name><UnderlyingTopic>crash</UnderlyingTopic><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


def make_server(path):
    return ServerProcess(path, extra=QUEUES)


@pytest.fixture(scope="module")
def qs(tmp_path_factory):
    s = make_server(tmp_path_factory.mktemp("queues")).start()
    yield s
    s.stop()


def consumer(port, queue, name, backlog=None, **extra):
    c = Raw(port)
    c.logon(name)
    o = f"max_backlog={backlog}" if backlog else None
    hdr = {"c": "subscribe", "t": queue, "cid": "q", "a": "processed", **extra}
    if o:
        hdr["o"] = o
    c.send(hdr)
    assert c.ack("processed", "q")["status"] == "success"
    return c


def ack(c, queue, bms, opts=None, cid="k"):
    h = {"c": "sow_delete", "t": queue, "bm": ",".join(bms), "cid": cid, "a": "processed"}
    if opts:
        h["o"] = opts
    c.send(h)
    return c.ack("processed", cid)


def nothing_more(c, wait=0.3):
    time.sleep(wait)
    c.send({"c": "flush", "cid": "nm", "a": "completed"})
    return [h for h, _ in c.recv_until(lambda h, b: h.get("cid") == "nm") if h["c"] == "p"] == []


def ids(frames):
    return [json.loads(b)["i"] for _, b in frames]


def body(i, **kw):
    return json.dumps({"i": i, **kw})


def test_at_least_once_backlog_and_acks(qs):
    publish_many(qs.port, "work", [body(i) for i in range(1, 11)], name="w-pub")
    c = consumer(qs.port, "work-q", "w-cons", backlog=3)
    first = c.messages(3)
    assert ids(first) == [1, 2, 3]
    h = first[0][0]
    assert h["bm"].endswith("|1|") and h["lp"].endswith("Z") and h["t"] == "work"
    assert nothing_more(c)  # backlog 3 is full
    a = ack(c, "work-q", [h["bm"] for h, _ in first])
    assert a["status"] == "success" and a["records_deleted"] == 3
    rest = c.messages(3)
    assert ids(rest) == [4, 5, 6]


def test_several_queues_over_one_topic_each_see_every_message(qs):
    publish_many(qs.port, "multi", [body(i) for i in range(100, 103)], name="m-pub")
    for queue in ("multi-q1", "multi-q2"):
        c = consumer(qs.port, queue, f"{queue}-cons", backlog=1)
        got = []
        for _ in range(3):
            ((h, b),) = c.messages(1)
            got.append(json.loads(b)["i"])
            ack(c, queue, [h["bm"]])
        assert got == [100, 101, 102]
        assert nothing_more(c)


def test_queue_with_its_topics_name_takes_subscriptions(qs):
    c = consumer(qs.port, "orders", "orders-cons", backlog=5)
    other = consumer(qs.port, "orders", "orders-cons2", backlog=5)
    publish_many(qs.port, "orders", [body(i) for i in range(1, 5)], name="o-pub")
    time.sleep(0.3)
    a = ids(c.messages(2))
    b = ids(other.messages(2))
    assert sorted(a + b) == [1, 2, 3, 4]  # each message to one consumer only


def test_redelivery_when_the_holder_disconnects(qs):
    c1 = consumer(qs.port, "jobs", "j1", backlog=1)
    publish_many(qs.port, "jobs", [body(1)], name="j-pub")
    ((h, _),) = c1.messages(1)
    c2 = consumer(qs.port, "jobs", "j2", backlog=1)
    assert nothing_more(c2)
    c1.close()
    ((h2, b2),) = c2.messages(1)
    assert h2["bm"] == h["bm"] and json.loads(b2)["i"] == 1
    ack(c2, "jobs", [h2["bm"]])


def test_lease_expiry_then_max_deliveries_to_dead_letter(qs):
    dead = Raw(qs.port)
    dead.logon("dead-watch")
    dead.subscribe("dead")
    c = consumer(qs.port, "lease-q", "lease-cons", backlog=1)
    publish_many(qs.port, "lease", [body(7)], name="l-pub")
    ((h1, _),) = c.messages(1)
    t1 = time.monotonic()  # measured from the delivery: its 400 ms lease started before it arrived
    ((h2, _),) = c.messages(1)  # the lease ran out: offered again
    # not before the lease can have ended; the upper margin is for a busy 2-core machine
    assert h2["bm"] == h1["bm"] and 0.3 < time.monotonic() - t1 < 5.0
    ((dh, db),) = dead.messages(1, timeout=5)  # second lease ran out: past MaxDeliveries
    assert json.loads(db)["i"] == 7
    assert dh["reason"] == "max deliveries" and dh["deliveries"] == 2 and dh["queue"] == "lease-q"
    assert dh["source_bm"] == h1["bm"]
    assert nothing_more(c)


def test_cancel_past_max_cancels(qs):
    dead = Raw(qs.port)
    dead.logon("dead-watch2")
    dead.subscribe("dead", f="/i = 8")
    c = consumer(qs.port, "cancel-q", "cancel-cons", backlog=1)
    publish_many(qs.port, "cancel", [body(8)], name="c-pub")
    ((h, _),) = c.messages(1)
    ack(c, "cancel-q", [h["bm"]], "cancel")
    ((h, _),) = c.messages(1)  # returned at once
    ack(c, "cancel-q", [h["bm"]], "cancel")  # second cancel > MaxCancels 1
    ((dh, _),) = dead.messages(1)
    assert dh["reason"] == "max cancels"
    assert nothing_more(c)


def test_queue_expiration_and_message_expiration(qs):
    dead = Raw(qs.port)
    dead.logon("dead-watch3")
    dead.subscribe("dead", f="/i >= 900")
    publish_many(qs.port, "exp", [body(900)], name="e-pub")
    p = Raw(qs.port)
    p.logon("me-pub")
    p.send({"c": "publish", "t": "msgexp", "s": 1, "e": 0.3}, body(901))
    p.send({"c": "publish", "t": "msgexp", "s": 2}, body(902))
    p.send({"c": "flush", "cid": "f", "a": "persisted"})
    p.ack("persisted", "f")
    got = sorted((json.loads(b)["i"], h["reason"]) for h, b in dead.messages(2, timeout=5))
    assert got == [(900, "expiration"), (901, "expiration")]
    c = consumer(qs.port, "msgexp-q", "me-cons")
    assert ids(c.messages(1)) == [902]
    c2 = consumer(qs.port, "exp-q", "e-cons")
    assert nothing_more(c2)


def test_barrier_waits_for_earlier_acks_then_goes_to_everyone(qs):
    c1 = consumer(qs.port, "barrier-q", "b1", backlog=5)
    c2 = consumer(qs.port, "barrier-q", "b2", backlog=5)
    publish_many(qs.port, "barrier", [body(1), body(2), body(3, barrier=1), body(4)], name="b-pub")
    time.sleep(0.3)
    got = {}
    for c in (c1, c2):
        c.send({"c": "flush", "cid": "f", "a": "completed"})
        got[c] = [
            (h["bm"], json.loads(b)["i"])
            for h, b in c.recv_until(lambda h, b: h.get("cid") == "f")
            if h["c"] == "p"
        ]
    assert sorted(i for c in got for _, i in got[c]) == [1, 2]
    for c, msgs in got.items():
        if msgs:
            ack(c, "barrier-q", [bm for bm, _ in msgs])
    assert ids(c1.messages(1)) == [3] and ids(c2.messages(1)) == [3]
    # then the messages after the barrier flow again
    after = []
    for c in (c1, c2):
        c.send({"c": "flush", "cid": "g", "a": "completed"})
        after += [
            json.loads(b)["i"]
            for h, b in c.recv_until(lambda h, b: h.get("cid") == "g")
            if h["c"] == "p"
        ]
    assert after == [4]


def test_strict_leasing_refuses_a_foreign_ack(qs):
    holder = consumer(qs.port, "strict-q", "holder")
    publish_many(qs.port, "strict", [body(1)], name="s-pub")
    ((h, _),) = holder.messages(1)
    thief = Raw(qs.port)
    thief.logon("thief")
    a = ack(thief, "strict-q", [h["bm"]])
    assert a["status"] == "failure" and a["reason"] == "not entitled" and a["records_deleted"] == 0
    assert ack(holder, "strict-q", [h["bm"]])["records_deleted"] == 1


def test_proportional_fairness_with_unequal_backlogs(qs):
    small = consumer(qs.port, "prop-q", "small", backlog=2)
    big = consumer(qs.port, "prop-q", "big", backlog=6)
    publish_many(qs.port, "prop", [body(i) for i in range(8)], name="p-pub")
    assert len(small.messages(2)) == 2 and len(big.messages(6)) == 6
    assert nothing_more(small) and nothing_more(big)


def test_round_robin_and_fast_fairness(qs):
    a = consumer(qs.port, "rr-q", "rr-a", backlog=10)
    b = consumer(qs.port, "rr-q", "rr-b", backlog=10)
    publish_many(qs.port, "rr", [body(i) for i in range(6)], name="rr-pub")
    assert ids(a.messages(3)) == [0, 2, 4] and ids(b.messages(3)) == [1, 3, 5]
    f1 = consumer(qs.port, "fast-q", "fast-a", backlog=10)
    f2 = consumer(qs.port, "fast-q", "fast-b", backlog=10)
    publish_many(qs.port, "fast", [body(i) for i in range(6)], name="fast-pub")
    assert ids(f1.messages(6)) == list(range(6))
    assert nothing_more(f2)


def test_at_most_once_is_not_redelivered(qs):
    c = consumer(qs.port, "amo-q", "amo1", backlog=2)
    publish_many(qs.port, "amo", [body(1), body(2), body(3)], name="amo-pub")
    assert ids(c.messages(2)) == [1, 2]
    c.close()  # never acked: at-most-once does not redeliver
    c2 = consumer(qs.port, "amo-q", "amo2", backlog=5)
    assert ids(c2.messages(1)) == [3]
    assert nothing_more(c2)


def test_queue_filter_sow_delete_by_filter_and_lease_extend(qs):
    publish_many(
        qs.port,
        "filt",
        [body(1, keep=1), body(2, keep=0), body(3, keep=1), body(4, keep=1)],
        name="f-pub",
    )
    c = Raw(qs.port)
    c.logon("filt-admin")
    c.send({"c": "sow_delete", "t": "filt-q", "f": "/i = 3", "cid": "d", "a": "processed"})
    assert c.ack("processed", "d")["records_deleted"] == 1
    cons = consumer(qs.port, "filt-q", "filt-cons", backlog=5)
    msgs = cons.messages(2)
    assert ids(msgs) == [1, 4]
    a = ack(cons, "filt-q", [msgs[0][0]["bm"]], "lease_extend=10s")
    assert a["records_deleted"] == 1
    assert nothing_more(cons)


def test_bad_sow_delete_input(qs):
    c = Raw(qs.port)
    c.logon("bad-acker")
    c.send({"c": "sow_delete", "t": "jobs", "bm": "garbage", "cid": "1", "a": "processed"})
    assert c.ack("processed", "1")["reason"] == "invalid bookmark"
    c.send({"c": "sow_delete", "t": "jobs", "f": "/a = ", "cid": "2", "a": "processed"})
    assert c.ack("processed", "2")["reason"] == "bad filter"
    c.send(
        {"c": "sow_delete", "t": "jobs", "bm": "1|1|", "o": "explode", "cid": "3", "a": "processed"}
    )
    assert c.ack("processed", "3")["reason"] == "invalid options"
    c.send({"c": "subscribe", "t": "work", "o": "max_backlog=5", "cid": "4", "a": "processed"})
    assert c.ack("processed", "4")["reason"] == "not a queue"  # a queue option (issue 23)


def test_queue_stats_exposed(qs):
    publish_many(qs.port, "statsq", [body(i) for i in range(1, 6)], name="st-pub")
    c = consumer(qs.port, "stats-q", "st-cons", backlog=5)
    got = c.messages(5)
    assert ack(c, "stats-q", [h["bm"] for h, _ in got[:3]])["records_deleted"] == 3
    stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{qs.admin_port}/stats").read())
    q = stats["queues"]["stats-q"]
    for key in ("depth", "leased", "acked", "expired", "redelivered"):
        assert key in q
    assert q["acked"] == 3 and q["leased"] == 2
    text = urllib.request.urlopen(f"http://127.0.0.1:{qs.admin_port}/metrics").read().decode()
    assert 'tickertape_queue_depth{queue="stats-q"}' in text


def test_state_survives_graceful_restart_with_delivery_counts(tmp_path):
    srv = make_server(tmp_path / "g").start()
    try:
        publish_many(srv.port, "jobs", [body(i) for i in range(1, 21)], name="g-pub")
        c = consumer(srv.port, "jobs", "g-cons", backlog=10)
        first = c.messages(10)
        ack(c, "jobs", [h["bm"] for h, _ in first[:6]])  # 7..10 stay leased, unacked
        publish_many(srv.port, "lease", [body(50)], name="g-lpub")
        lc = consumer(srv.port, "lease-q", "g-lcons")
        lc.messages(1)  # delivery 1 of MaxDeliveries 2
        assert srv.stop() == 0
        srv.start()
        dead = Raw(srv.port)
        dead.logon("g-dead")
        dead.subscribe("dead")
        c = consumer(srv.port, "jobs", "g-cons2", backlog=20)  # capped at the queue's 10
        batch = c.messages(10)
        ack(c, "jobs", [h["bm"] for h, _ in batch])
        got = ids(batch) + ids(c.messages(4))
        assert got == list(range(7, 21))  # acked 1..6 never come back; 7..20 do
        assert nothing_more(c)
        lc = consumer(srv.port, "lease-q", "g-lcons2")
        ((h, _),) = lc.messages(1)  # delivery 2 (the count survived the restart)
        ((dh, _),) = dead.messages(1, timeout=5)  # its lease runs out: past MaxDeliveries
        assert dh["deliveries"] == 2
        stats = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats").read()
        )
        assert stats["queue_recovery_s"] >= 0
        srv.wait_for_log("queue jobs: recovered")
    finally:
        srv.stop()


def test_queue_wide_max_backlog_caps_every_subscriber_together(qs):
    publish_many(qs.port, "mb", [body(i) for i in range(1, 11)], name="mb-pub")
    c1 = consumer(qs.port, "mb-q", "mb1", backlog=10)
    first = c1.messages(3)
    assert ids(first) == [1, 2, 3]
    c2 = consumer(qs.port, "mb-q", "mb2", backlog=10)
    assert nothing_more(c1) and nothing_more(c2)  # 3 leased queue-wide: nobody gets a 4th
    ack(c1, "mb-q", [h["bm"] for h, _ in first[:2]])
    c1.close()  # its last lease (3) returns, to be redelivered first
    got = c2.messages(3)
    assert sorted(ids(got)) == [3, 4, 5]
    assert nothing_more(c2)
    ack(c2, "mb-q", [h["bm"] for h, _ in got])
    assert ids(c2.messages(3)) == [6, 7, 8]


def test_runs_cross_segment_boundaries_exactly_once(tmp_path):
    """Runs of deliveries are spliced from one journal block at a time: a run that reaches a
    segment's end continues from the next segment, with nothing skipped or repeated."""
    srv = ServerProcess(tmp_path / "seg", extra=QUEUES, journal_size="64KB").start()
    try:
        n = 3000
        pub = Raw(srv.port)
        pub.logon("seg-pub")
        for k in range(1, n + 1, 200):  # small batches: segments roll at batch boundaries
            publish_many(
                srv.port,
                "work",
                [body(i, pad="p" * 150) for i in range(k, k + 200)],
                conn=pub,
                start_seq=k,
            )
        segments = [f for f in os.listdir(tmp_path / "seg" / "journal") if f.endswith(".seg")]
        assert len(segments) > 3
        c = consumer(srv.port, "work-q", "seg-cons", backlog=100)
        got = []
        while len(got) < n:
            batch = c.messages(min(100, n - len(got)))
            got += ids(batch)
            ack(c, "work-q", [h["bm"] for h, _ in batch])
        assert got == list(range(1, n + 1))
        assert nothing_more(c)
    finally:
        srv.stop()


def test_a_run_of_leases_expires_together_then_goes_to_dead_letter(qs):
    """A backlog's worth of messages goes out as one run of leases (one LEASED_RUN event): they
    all come back when the run's lease ends, then all go past MaxDeliveries together."""
    dead = Raw(qs.port)
    dead.logon("run-dead")
    dead.subscribe("dead-run")
    publish_many(qs.port, "run", [body(i) for i in range(1, 6)], name="run-pub")
    c = consumer(qs.port, "run-q", "run-cons", backlog=5)
    first = c.messages(5)
    again = c.messages(5, timeout=5)  # nothing acked: the whole run is offered again
    assert [h["bm"] for h, _ in again] == [h["bm"] for h, _ in first]
    assert ids(again) == [1, 2, 3, 4, 5]
    dl = dead.messages(5, timeout=5)
    assert ids(dl) == [1, 2, 3, 4, 5] and {h["deliveries"] for h, _ in dl} == {2}
    assert nothing_more(c)


def test_runs_of_leases_and_acks_survive_kill9(tmp_path):
    """Leases and acks written as runs are recovered after kill -9: acked messages stay gone,
    the others come back with their delivery count (so the next lease is their last)."""
    srv = make_server(tmp_path / "r").start()
    try:
        publish_many(srv.port, "run", [body(i) for i in range(1, 7)], name="r-pub")
        c = consumer(srv.port, "run-q", "r-cons", backlog=10)
        got = c.messages(6)
        assert ack(c, "run-q", [h["bm"] for h, _ in got[:2]])["records_deleted"] == 2  # durable
        srv.kill()
        srv.start()
        dead = Raw(srv.port)
        dead.logon("r-dead")
        dead.subscribe("dead-run")
        c = consumer(srv.port, "run-q", "r-cons2", backlog=10)
        assert ids(c.messages(4)) == [3, 4, 5, 6]
        dl = dead.messages(4, timeout=5)  # delivery 2 of MaxDeliveries 2 ran out
        assert ids(dl) == [3, 4, 5, 6] and {h["deliveries"] for h, _ in dl} == {2}
        assert nothing_more(c)
    finally:
        srv.stop()


@pytest.mark.slow
def test_kill9_while_consumers_ack(tmp_path):
    """Consumers ack in batches while the server is killed: after the restart, no message whose
    ack was confirmed comes back, and every other message is delivered."""
    srv = make_server(tmp_path / "k").start()
    total = 3000
    publish_many(srv.port, "crash", [body(i) for i in range(1, total + 1)], name="k-pub")
    c = consumer(srv.port, "crash-q", "k-cons", backlog=100)
    confirmed: set[int] = set()
    inflight: dict[str, list[int]] = {}
    pending: dict[str, int] = {}
    killed = False
    try:
        while True:
            f = c.recv()
            if f is None:
                break
            h, b = f
            if h["c"] == "p":
                pending[h["bm"]] = json.loads(b)["i"]
                if len(pending) >= 50:
                    cid = f"a{len(inflight)}"
                    c.send(
                        {
                            "c": "sow_delete",
                            "t": "crash-q",
                            "bm": ",".join(pending),
                            "cid": cid,
                            "a": "processed",
                        }
                    )
                    inflight[cid] = list(pending.values())
                    pending = {}
            elif h["c"] == "ack" and h.get("cid", "").startswith("a") and h["status"] == "success":
                confirmed.update(inflight[h["cid"]])
                if len(confirmed) >= 1000 and not killed:
                    os.kill(srv.proc.pid, signal.SIGKILL)
                    killed = True
    except (ConnectionError, OSError):
        pass
    if not killed:
        srv.kill()
    srv.proc.wait(10)
    assert killed and len(confirmed) >= 1000
    srv.start()
    c = consumer(srv.port, "crash-q", "k-cons2", backlog=100)
    after = []
    bms = []
    c.sock.settimeout(3)
    try:
        while True:
            f = c.recv()
            if f is None:
                break
            h, b = f
            if h["c"] != "p":
                continue
            after.append(json.loads(b)["i"])
            bms.append(h["bm"])
            if len(bms) == 50:
                c.send(
                    {
                        "c": "sow_delete",
                        "t": "crash-q",
                        "bm": ",".join(bms),
                        "cid": f"z{len(after)}",
                        "a": "processed",
                    }
                )
                bms = []
    except TimeoutError:
        pass  # the queue is drained
    # acks sent but not yet confirmed when the server died may or may not have been durable
    unconfirmed = {i for ids_ in inflight.values() for i in ids_} - confirmed
    assert not confirmed & set(after), "a message whose ack was confirmed came back"
    lost = set(range(1, total + 1)) - confirmed - set(after) - unconfirmed
    assert not lost, f"{len(lost)} messages lost"
    assert len(after) == len(set(after)), "a message was delivered twice after the restart"
    assert len(after) >= total - len(confirmed) - len(unconfirmed)
    srv.stop()


def test_acks_without_a_reply_are_made_durable_soon(tmp_path):
    """An ack that asks for no reply still reaches the journal within milliseconds."""
    srv = make_server(tmp_path / "quiet").start()
    try:
        publish_many(srv.port, "jobs", [body(i) for i in range(1, 6)], name="quiet-pub")
        c = consumer(srv.port, "jobs", "quiet-cons", backlog=10)
        msgs = c.messages(5)
        c.send({"c": "sow_delete", "t": "jobs", "bm": ",".join(h["bm"] for h, _ in msgs[:3])})
        time.sleep(0.3)
        srv.kill()
        srv.start()
        c = consumer(srv.port, "jobs", "quiet-cons2", backlog=10)
        assert ids(c.messages(2)) == [4, 5]
        assert nothing_more(c)
    finally:
        srv.stop()


def test_an_expiration_past_ten_years_is_refused_and_costs_no_other_message(tmp_path):
    """Issue 23, finding 9: `e = 1.7e308` is a legal JSON number. It was accepted, then its
    queue deadline overflowed and the other messages of its commit were dropped from the queue
    (for good once the checkpoint moved past them). It is refused; the messages sent with it in
    one write (one commit) are queued, and a restart keeps what was acked and what was not."""
    srv = make_server(tmp_path / "big-e").start()
    try:
        p = Raw(srv.port)
        p.logon("big-e-pub")
        frames = b""
        for i in range(1, 31):
            h: dict = {"c": "publish", "t": "crash", "s": i}
            if i == 11:
                h.update(e=1.7e308, cid="big", a="processed")
            elif i == 12:
                h["e"] = 3600  # a legal expiration beside it
            hb, bb = json.dumps(h).encode(), body(i).encode()
            frames += struct.pack(">I", len(hb) + len(bb)) + hb + bb
        p.send_raw(frames)
        refused = p.ack("processed", "big")
        assert (refused["status"], refused["reason"]) == ("failure", "bad frame")
        assert "10 years" in json.dumps(refused)
        p.send({"c": "flush", "cid": "f", "a": "persisted"})
        p.ack("persisted", "f")
        c = consumer(srv.port, "crash-q", "big-e-cons", backlog=100)
        got = c.messages(29)
        assert ids(got) == [i for i in range(1, 31) if i != 11]
        ack(c, "crash-q", [h["bm"] for h, _ in got[:20]])  # 1..21 acked, 22..30 leased
        time.sleep(1.2)  # a checkpoint is committed with the next commit after a second
        p.send({"c": "flush", "cid": "f2", "a": "persisted"})
        p.ack("persisted", "f2")
        assert srv.stop() == 0
        srv.start()
        c = consumer(srv.port, "crash-q", "big-e-cons2", backlog=100)
        assert ids(c.messages(9)) == list(range(22, 31))
        assert nothing_more(c)
    finally:
        srv.stop()
