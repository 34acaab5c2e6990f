"""Publishing against the scripted server: numbering, conflated persisted acks, failures,
duplicates, and the in-flight window."""

import asyncio

import msgspec
import pytest

from client import Client, ClientError, CommandTimeout, Disconnected, PublishFailed
from client.publish import Flushes


async def test_logon_frame_and_result(server):
    client = Client("pub-1", user_id="alice", password="pw")
    await client.connect(f"tcp://{server.address}/json")
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    header, _ = await conn.recv("logon")
    assert (header.client_name, header.user_id, header.pw) == ("pub-1", "alice", "pw")
    assert header.cid and "processed" in header.a.split(",")
    conn.ack("processed", cid=header.cid, s=41, bm="123|41|")
    result = await task
    assert (result.seq, result.bookmark) == (41, "123|41|")
    assert client.persisted_seq == 41
    assert await client.publish("orders", b'{"a":1}') == 42
    header, body = await conn.recv("publish")
    assert (header.t, header.s, header.a, body) == ("orders", 42, "persisted", b'{"a":1}')
    assert header.cid is None  # publishes are tracked by sequence, not by command id
    await client.close()


async def test_sequence_numbers_and_body_types(session):
    client, conn = session
    assert await client.publish("t", {"x": 1}) == 1
    assert await client.publish("t", "text") == 2
    assert await client.publish("t", bytearray(b"[1]")) == 3
    assert await client.publish("t", b"{}", seq=10) == 10
    assert await client.publish("t", b"{}") == 11  # numbering continues after an explicit seq
    got = [await conn.recv("publish") for _ in range(5)]
    assert [h.s for h, _ in got] == [1, 2, 3, 10, 11]
    assert msgspec.json.decode(got[0][1]) == {"x": 1}
    assert got[1][1] == b"text"
    with pytest.raises(TypeError):
        await client.publish("t", 3.5)


async def test_correlation_id_and_expiration(session):
    client, conn = session
    await client.publish("t", b"{}", correlation_id="corr-7", expiration=2.5)
    header, _ = await conn.recv("publish")
    assert (header.x, header.e, header.s, header.a) == ("corr-7", 2.5, 1, "persisted")


async def test_topic_with_quotes_is_escaped(session):
    client, conn = session
    await client.publish('a"b\\c', b"{}")
    header, _ = await conn.recv("publish")
    assert header.t == 'a"b\\c'


async def test_conflated_ack_covers_every_earlier_sequence(session):
    client, conn = session
    for _ in range(5):
        await client.publish("t", b"{}")
    assert client.unpersisted_count() == 5
    flush = asyncio.ensure_future(client.publish_flush(timeout=5))
    conn.ack("persisted", s=3)
    await asyncio.sleep(0.05)
    assert client.persisted_seq == 3
    assert client.unpersisted_count() == 2
    assert not flush.done()
    conn.ack("persisted", s="5")  # numbers may arrive as decimal strings (docs/protocol.md §1)
    await flush
    assert client.persisted_seq == 5 and client.unpersisted_count() == 0


async def test_flush_only_waits_for_what_was_published_before_it(session):
    client, conn = session
    await client.publish("t", b"{}")
    flush = asyncio.ensure_future(client.publish_flush(timeout=5))
    await asyncio.sleep(0)
    await client.publish("t", b"{}")
    conn.ack("persisted", s=1)
    await flush
    assert client.unpersisted_count() == 1


async def test_publish_flush_with_nothing_in_flight_returns(session):
    client, _ = session
    await client.publish_flush(timeout=1)


async def test_publish_flush_timeout(session):
    client, _ = session
    await client.publish("t", b"{}")
    with pytest.raises(CommandTimeout, match="publish_flush"):
        await client.publish_flush(timeout=0.05)
    assert isinstance(CommandTimeout("x", 1), TimeoutError)


async def test_flushes_settle_in_order_fail_and_keep_a_failure_nobody_waited_for():
    """client/publish.py's Flushes, which a connection's tracker and the HAClient's publisher
    both wait on."""
    flushes = Flushes()
    first = asyncio.ensure_future(flushes.wait(1, None, lambda: "x"))
    second = asyncio.ensure_future(flushes.wait(3, None, lambda: "x"))
    await asyncio.sleep(0)
    flushes.settle(2)
    await first
    assert not second.done()
    failure = PublishFailed("journal unavailable", 3, 1)
    flushes.fail(failure, keep=True)
    with pytest.raises(PublishFailed):
        await second
    flushes.raise_unreported()  # a flush was waiting: nothing is kept
    flushes.fail(failure, keep=True)
    with pytest.raises(PublishFailed):
        flushes.raise_unreported()
    flushes.raise_unreported()  # raised once
    with pytest.raises(CommandTimeout, match=r"publish_flush \(2 unpersisted\)"):
        await flushes.wait(5, 0.01, lambda: "publish_flush (2 unpersisted)")
    flushes.settle(10)  # the timed-out wait left nothing behind
    assert not flushes._waiters


async def test_failure_ack_raises_from_publish_flush(session):
    client, conn = session
    errors = []
    client.on_error = errors.append
    for _ in range(3):
        await client.publish("t", b"{}")
    flush = asyncio.ensure_future(client.publish_flush(timeout=5))
    conn.ack("persisted", s=3, status="failure", reason="journal unavailable")
    with pytest.raises(PublishFailed) as info:
        await flush
    exc = info.value
    assert exc.reason == "journal unavailable" and exc.seq == 3 and exc.count == 3
    assert "republish" in str(exc)
    assert errors == [exc]
    assert client.persisted_seq == 0  # nothing counted as success
    assert client.failed_count == 3 and client.unpersisted_count() == 0


async def test_failure_without_waiter_is_raised_by_next_flush(session):
    client, conn = session
    await client.publish("t", b"{}")
    await client.publish("t", b"{}")
    conn.ack("persisted", s=1)
    conn.ack("persisted", s=2, status="failure", reason="journal unavailable")
    await asyncio.sleep(0.05)
    with pytest.raises(PublishFailed) as info:
        await client.publish_flush(timeout=1)
    assert info.value.count == 1 and client.persisted_seq == 1
    await client.publish_flush(timeout=1)  # reported once; nothing else outstanding


async def test_duplicates_are_counted(server):
    seen = []
    client = Client("dup", track_duplicates=True, on_duplicate=seen.append)
    await client.connect(server.address)
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    await conn.logon(s=5)
    await task
    await client.publish("t", b"{}", seq=4)
    header, _ = await conn.recv("publish")
    assert set(header.a.split(",")) == {"processed", "persisted"}
    conn.ack("processed", s=4, reason="duplicate")
    conn.ack("persisted", s=5)
    await client.publish_flush(timeout=5)
    assert client.duplicate_count == 1 and seen == [4]
    await client.close()


async def test_inflight_window_applies_back_pressure(server):
    client = Client("win", max_inflight=3)
    await client.connect(server.address)
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    await conn.logon()
    await task
    for _ in range(3):
        await client.publish("t", b"{}")
    fourth = asyncio.ensure_future(client.publish("t", b"{}"))
    await asyncio.sleep(0.05)
    assert not fourth.done()
    conn.ack("persisted", s=1)
    assert await asyncio.wait_for(fourth, 5) == 4
    await client.close()


async def test_write_buffer_pause_blocks_publish(session):
    client, _ = session
    proto = client._conn.transport.get_protocol()
    proto.pause_writing()
    pending = asyncio.ensure_future(client.publish("t", b"{}"))
    await asyncio.sleep(0.05)
    assert not pending.done()
    proto.resume_writing()
    assert await asyncio.wait_for(pending, 5) == 1


async def test_many_publishes_are_coalesced_and_framed(session):
    client, conn = session
    for i in range(2000):
        await client.publish("t", b'{"i":%d}' % i)
    got = [await conn.recv("publish") for _ in range(2000)]
    assert [h.s for h, _ in got] == list(range(1, 2001))
    assert got[-1][1] == b'{"i":1999}'
    conn.ack("persisted", s=2000)
    await client.publish_flush(timeout=5)


async def test_publish_before_logon_and_after_close(server):
    client = Client("early")
    with pytest.raises(ClientError, match="connect"):
        await client.publish("t", b"{}")
    await client.connect(server.address)
    with pytest.raises(ClientError, match="logon"):
        await client.publish("t", b"{}")
    await client.close()
    with pytest.raises(Disconnected):
        await client.publish("t", b"{}")


async def test_disconnect_fails_flush_and_blocked_publishers(server):
    client = Client("gone", max_inflight=1)
    await client.connect(server.address)
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    await conn.logon()
    await task
    await client.publish("t", b"{}")
    blocked = asyncio.ensure_future(client.publish("t", b"{}"))
    flush = asyncio.ensure_future(client.publish_flush())
    await asyncio.sleep(0.05)
    conn.close()
    for fut in (blocked, flush):
        with pytest.raises(Disconnected) as info:
            await asyncio.wait_for(fut, 5)
        assert info.value.reason == "closed by server"


def test_tracker_out_of_order_sequence_settles_behind_the_earlier_one():
    from client.publish import PublishTracker

    t = PublishTracker(max_inflight=10)
    t.sent(10)
    t.sent(5)  # an explicit lower sequence, sent after 10
    t.persisted(5)
    assert (t.persisted_seq, len(t._inflight), t.settled) == (5, 2, 0)
    t.persisted(10)
    assert (t.persisted_seq, len(t._inflight), t.settled) == (10, 0, 2)
    exc = t.failed("journal unavailable", None)  # no `s`: settles whatever is in flight
    assert exc.count == 0 and exc.seq is None
