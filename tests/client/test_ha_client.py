"""The HAClient against the scripted server (tests/client/conftest.py): the reconnect sequence
step by step on the wire, heartbeats, giving up; and the server chooser and delay strategies."""

import asyncio
import threading

import msgspec
import pytest

from client import (
    EPOCH,
    MOST_RECENT,
    CommandError,
    DefaultServerChooser,
    ExponentialDelayStrategy,
    FileSubscriptionManager,
    FixedDelayStrategy,
    HAClient,
    NoServerAvailable,
    PublishFailed,
    ReconnectGaveUp,
    StoreFull,
    SubscriptionSpec,
)
from client.pubstore import MemoryPublishStore

# ---------------------------------------------------------------------------------- chooser, delay


def test_default_chooser_rotates_on_failure_and_stays_on_success():
    c = DefaultServerChooser(["a:1", "tcp://b:2/"])
    assert c.current_uri() == "a:1"
    c.report_success("a:1")
    assert c.current_uri() == "a:1"
    c.report_failure(ConnectionError("refused"), "a:1")
    assert c.current_uri() == "tcp://b:2/"
    c.report_failure(ConnectionError("timed out"), "tcp://b:2/")
    assert c.current_uri() == "a:1"
    assert c.error() == "a:1: refused; tcp://b:2/: timed out"
    empty = DefaultServerChooser()
    assert empty.current_uri() is None and "no server" in empty.error()
    with pytest.raises(ValueError, match="scheme"):
        DefaultServerChooser(["http://x:1"])


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_delay_strategies():
    f = FixedDelayStrategy(0.2)
    assert [f.next_delay("a") for _ in range(3)] == [0.0, 0.2, 0.2]
    assert f.next_delay("b") == 0.0  # per URI
    e = ExponentialDelayStrategy(initial=0.05, multiplier=2, maximum=0.3)
    assert [e.next_delay("a") for _ in range(6)] == [0.0, 0.05, 0.1, 0.2, 0.3, 0.3]
    e.reset()
    assert e.next_delay("a") == 0.0
    clock = Clock()
    g = FixedDelayStrategy(1.0, give_up_after=2.5, clock=clock)
    for t in (0, 1, 2):
        clock.t = t
        g.next_delay("a")
    clock.t = 2.6
    with pytest.raises(ReconnectGaveUp, match="give-up time 2.5s"):
        g.next_delay("a")
    with pytest.raises(ValueError):
        ExponentialDelayStrategy(initial=1, maximum=0.5)


def test_default_strategy_reaches_a_restarted_server_within_a_quarter_second():
    e = ExponentialDelayStrategy()
    delays = [e.next_delay("a") for _ in range(30)]
    assert max(delays) == 0.25 and delays[:4] == [0.0, 0.05, 0.1, 0.2]


# ---------------------------------------------------------------------------------- scripted server


async def logon(conn, s=0):
    header, _ = await conn.recv("logon")
    conn.ack("processed", cid=header.cid, s=s)
    return header


async def subscribed(conn):
    header, _ = await conn.recv("subscribe")
    conn.ack("processed", cid=header.cid, sub_id=header.sub_id)
    return header


async def connected(server, name="ha", **kw):
    kw.setdefault("delay_strategy", FixedDelayStrategy(0.01))
    ha = HAClient(name, servers=[server.address], **kw)
    task = asyncio.ensure_future(ha.connect_and_logon())
    conn = await server.accept()
    await logon(conn)
    await task
    return ha, conn


async def test_reconnect_sequence_on_the_wire(server):
    ha, conn = await connected(server)
    assert [await ha.publish("t", {"i": i}) for i in range(3)] == [1, 2, 3]
    got = [await conn.recv("publish") for _ in range(3)]
    assert [h.s for h, _ in got] == [1, 2, 3] and all(h.a == "persisted" for h, _ in got)
    conn.ack("persisted", s=1)
    live = asyncio.ensure_future(ha.subscribe("news"))
    plain = await subscribed(conn)
    await live
    replay = asyncio.ensure_future(ha.subscribe("t", bookmark=MOST_RECENT, sub_id="r1"))
    first = await subscribed(conn)
    hs = await replay
    assert (first.bm, first.o) == (EPOCH, "bookmark_not_found=epoch")
    assert "persisted" in first.a.split(",")  # periodic acks feed the bookmark store
    conn.deliver("t", b"{}", "r1", bm="9|1|")
    conn.deliver("t", b"{}", "r1", bm="9|2|")
    m1 = await hs.next(timeout=5)
    hs.discard(m1)
    await asyncio.sleep(0.05)
    assert ha.unpersisted_count() == 2

    conn.close()  # the server goes away
    await asyncio.sleep(0.05)
    assert ha.state == "reconnecting"
    assert await ha.publish("t", {"i": 3}) == 4  # stored while disconnected, returns at once
    conn2 = await server.accept()
    header = await logon(conn2, s=2)  # the server stored through 2
    assert header.client_name == "ha"
    frames = [await conn2.recv() for _ in range(2)]
    # step 7: republish after the logon's s, in order; then step 8: resubscribe, one by one
    assert [(h.c, h.s) for h, _ in frames] == [("publish", 3), ("publish", 4)]
    again = {}
    for _ in range(2):
        h = await subscribed(conn2)
        again[h.sub_id] = h
    assert again[plain.sub_id].bm is None and again[plain.sub_id].t == "news"
    assert again["r1"].bm == "9|1|" and again["r1"].o == "bookmark_not_found=epoch"
    # the replay after 9|1| brings 9|2| again: it was already delivered (buffered before the
    # drop), so the application sees it once, then 9|3|
    conn2.deliver("t", b"{}", "r1", bm="9|2|")
    conn2.deliver("t", b"{}", "r1", bm="9|3|")
    assert [(await hs.next(timeout=5)).bookmark for _ in range(2)] == ["9|2|", "9|3|"]
    assert hs.duplicates == 1
    await ha.wait_connected(5)
    assert ha.reconnects == 1 and ha.republished == 2
    flush = asyncio.ensure_future(ha.publish_flush(timeout=5))
    await asyncio.sleep(0.02)
    assert not flush.done()
    conn2.ack("persisted", s=4)
    await flush
    assert ha.unpersisted_count() == 0
    await ha.close()


async def test_marks_and_discards_move_the_resume_point(server):
    ha, conn = await connected(server)
    task = asyncio.ensure_future(ha.subscribe("t", bookmark=EPOCH, sub_id="s"))
    await subscribed(conn)
    hs = await task
    conn.deliver("t", b"{}", "s", bm="5|1|")
    conn.ack("persisted", sub_id="s", bm="7|40|")  # in stream order, after 5|1|
    m = await hs.next(timeout=5)
    assert ha.bookmark_store.most_recent("s") == EPOCH  # 5|1| not discarded yet
    hs.discard(m)
    await asyncio.sleep(0.05)
    conn.deliver("t", b"{}", "s", bm="5|2|")
    assert (await hs.next(timeout=5)).bookmark == "5|2|"  # the mark was consumed on the way
    # after the mark, and 5|1| as publisher 5's own point (for a failover to another instance)
    assert ha.bookmark_store.most_recent("s") == "7|40|,5|1|"
    await ha.close()


async def test_refused_resubscribe_fails_only_that_subscription(server):
    ha, conn = await connected(server)
    tasks = [asyncio.ensure_future(ha.subscribe(t, sub_id=t)) for t in ("a", "b")]
    for _ in tasks:
        await subscribed(conn)
    a, b = [await t for t in tasks]
    conn.close()
    conn2 = await server.accept()
    await logon(conn2)
    for _ in range(2):
        h, _ = await conn2.recv("subscribe")
        if h.sub_id == "a":
            conn2.ack("processed", cid=h.cid, status="failure", reason="not entitled")
        else:
            conn2.ack("processed", cid=h.cid, sub_id=h.sub_id)
    with pytest.raises(CommandError, match="not entitled"):
        await a.next(timeout=5)
    conn2.deliver("b", b'{"ok":1}', "b")
    assert (await b.next(timeout=5)).json() == {"ok": 1}
    assert [s.sub_id for s in ha.subscription_manager.specs()] == ["b"]
    await ha.close()


async def test_heartbeat_timeout_detects_a_silent_server(server):
    ha, conn = await connected(server, heartbeat=0.1, heartbeat_timeout=0.3)
    header, _ = await conn.recv("heartbeat", skip=())
    assert header.o == "start,0.1"
    # the server neither beats nor closes (a hung host): after 0.3 s the client gives up on it
    conn2 = await server.accept(timeout=3)
    await logon(conn2)
    await ha.wait_connected(5)
    assert ha.reconnects == 1
    await ha.close()


async def test_gives_up_and_fails_everything(server):
    ha, conn = await connected(server, delay_strategy=FixedDelayStrategy(0.05, give_up_after=0.3))
    task = asyncio.ensure_future(ha.subscribe("t"))
    await subscribed(conn)
    hs = await task
    server.server.close()  # stop listening
    conn.close()
    with pytest.raises(ReconnectGaveUp, match="gave up reconnecting"):
        await hs.next(timeout=5)
    assert ha.state == "failed"
    with pytest.raises(ReconnectGaveUp):
        await ha.publish("t", b"{}")
    await ha.close()


async def test_no_server_and_publish_before_logon():
    ha = HAClient("x")
    with pytest.raises(NoServerAvailable, match="no server"):
        await ha.connect_and_logon()
    with pytest.raises(Exception, match="connect_and_logon"):
        await ha.publish("t", b"{}")


async def test_publish_waits_for_room_and_rejects_what_never_fits(server):
    store = MemoryPublishStore(max_messages=2)
    ha, conn = await connected(server, publish_store=store)
    await ha.publish("t", b"1")
    await ha.publish("t", b"2")
    third = asyncio.ensure_future(ha.publish("t", b"3"))
    await asyncio.sleep(0.05)
    assert not third.done()  # the store is full: wait for the server to persist
    conn.ack("persisted", s=1)
    assert await asyncio.wait_for(third, 5) == 3
    tiny = MemoryPublishStore(max_bytes=100)
    ha2 = HAClient("y", servers=[server.address], publish_store=tiny)
    t = asyncio.ensure_future(ha2.connect_and_logon())
    await logon(await server.accept())
    await t
    with pytest.raises(StoreFull):
        await ha2.publish("t", b"x" * 1000)
    await ha.close()
    await ha2.close()


async def test_failover_to_the_next_server(server):
    from tests.client.conftest import FakeServer

    second = await FakeServer().start()
    ha = HAClient("f", servers=[server.address, second.address],
                  delay_strategy=FixedDelayStrategy(0.01))  # fmt: skip
    task = asyncio.ensure_future(ha.connect_and_logon())
    await logon(await server.accept())
    await task
    await ha.publish("t", {"n": 1})
    server.server.close()
    server.conns[0].close()
    conn = await second.accept(timeout=5)
    await logon(conn, s=0)  # a fresh instance: everything unpersisted goes there
    header, body = await conn.recv("publish")
    assert (header.s, msgspec.json.decode(body)) == (1, {"n": 1})
    assert ha.current_uri == second.address
    await ha.close()
    await second.stop()


async def test_refused_publishes_fail_the_flush_and_are_sent_again(server):
    ha, conn = await connected(server)
    await ha.publish("t", b"{}")
    await conn.recv("publish")
    conn.ack("persisted", s=1, status="failure", reason="journal unavailable")
    with pytest.raises(PublishFailed, match="journal unavailable"):
        await ha.publish_flush(timeout=5)
    assert ha.unpersisted_count() == 1  # kept
    conn.close()
    conn2 = await server.accept()
    await logon(conn2, s=0)
    header, _ = await conn2.recv("publish")
    assert header.s == 1
    conn2.ack("persisted", s=1)
    await ha.publish_flush(timeout=5)
    await ha.close()


async def test_subscriptions_restored_from_a_file_manager(server, tmp_path):
    manager = FileSubscriptionManager(tmp_path / "subs.json")
    ha, conn = await connected(server, subscription_manager=manager)
    task = asyncio.ensure_future(ha.subscribe("orders", bookmark=EPOCH, sub_id="o", filter="/a>1"))
    await subscribed(conn)
    await task
    await ha.close()
    # a new process: the manager's file lists the subscription, the store resumes it
    again = FileSubscriptionManager(tmp_path / "subs.json")
    assert again.specs() == [SubscriptionSpec("o", "orders", "/a>1", None, EPOCH)]
    ha2, conn2 = await connected(server, subscription_manager=again)
    task = asyncio.ensure_future(ha2.restore_subscriptions())
    header = await subscribed(conn2)
    (hs,) = await task
    assert (header.sub_id, header.t, header.f, header.bm) == ("o", "orders", "/a>1", EPOCH)
    assert hs.sub_id == "o"
    await ha2.close()


async def test_async_with_ends_an_ha_subscription_whatever_its_unsubscribe_meets(server):
    """`async with` an HASubscription unsubscribes at its end; a refused unsubscribe (a
    ClientError) is let go: the subscription is over for the HAClient either way."""
    ha, conn = await connected(server)
    task = asyncio.ensure_future(ha.subscribe("news", sub_id="n"))
    await subscribed(conn)
    hs = await task

    async def refuse():
        header, _ = await conn.recv("unsubscribe")
        conn.ack("processed", cid=header.cid, status="failure", reason="invalid options")

    answering = asyncio.ensure_future(refuse())
    async with hs:
        assert hs.active
    await answering
    assert not hs.active and ha.subscription_manager.specs() == []
    await ha.close()


async def test_bookmark_window_bound_waits_for_discards(server):
    ha, conn = await connected(server, max_window=100)
    task = asyncio.ensure_future(ha.subscribe("t", bookmark=EPOCH, sub_id="w"))
    await subscribed(conn)
    hs = await task
    for n in range(1, 301):
        conn.deliver("t", b"{}", "w", bm=f"3|{n}|")
    got = []
    with pytest.raises(TimeoutError):
        while True:
            got.append(await asyncio.wait_for(hs.next(), 0.3))
    assert 100 <= len(got) < 300  # held back once 100 are undiscarded (checked every 64)
    for m in got:
        hs.discard(m)
    rest = []
    for _ in range(300 - len(got)):
        rest.append(await hs.next(timeout=5))
        hs.discard(rest[-1])
    assert [m.bookmark for m in got + rest] == [f"3|{n}|" for n in range(1, 301)]  # none lost
    await ha.close()


def test_a_subscribe_on_a_connection_just_lost_waits_for_the_next_one():
    """The connection is gone (the Client has seen it) but the supervisor has not had its turn:
    subscribe() must yield until the reconnect, not retry the dead Client in a loop that never
    awaits (the whole event loop stalled: found by the seams campaign). Run on a loop of its own
    in a thread, so a spin fails the test instead of hanging it."""
    from tests.client.conftest import FakeServer

    outcome: list[object] = []

    async def scenario():
        srv = await FakeServer().start()
        ha, conn = await connected(srv)
        client = ha.client
        assert client is not None
        client._conn.transport.abort()  # connection_lost runs on the next turn of the loop
        await asyncio.sleep(0)  # ... this one; the supervisor's wake-up comes a turn later
        assert not client.connected and ha.client is client
        task = asyncio.ensure_future(ha.subscribe("t", sub_id="s"))
        conn2 = await srv.accept(timeout=5)
        await logon(conn2)
        await subscribed(conn2)
        hs = await asyncio.wait_for(task, 5)
        outcome.append(hs.sub_id)
        await ha.close()
        await srv.stop()

    def run():
        try:
            asyncio.run(scenario())
        except BaseException as exc:  # reported by the test thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(15)
    assert not thread.is_alive(), (
        "subscribe() spun on the lost connection: the loop never ran again"
    )
    assert outcome == ["s"]
