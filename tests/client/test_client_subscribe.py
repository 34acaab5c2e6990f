"""Subscriptions against the scripted server: the subscribe frame, failure acks, deliveries
(also split at every byte), completed / ranges, unsubscribe, disconnects, bounded buffers."""

import asyncio

import pytest

from client import Client, CommandError, Disconnected, Message


async def subscribe(client, conn, topic="orders", **kw):
    """Subscribe and answer the processed ack; returns (Subscription, subscribe header)."""
    task = asyncio.ensure_future(client.subscribe(topic, **kw))
    header, _ = await conn.recv("subscribe")
    conn.ack("processed", cid=header.cid, sub_id=header.sub_id)
    return await asyncio.wait_for(task, 5), header


async def test_subscribe_frame_and_deliveries(session):
    client, conn = session
    sub, header = await subscribe(
        client, conn, filter="/qty > 1", bookmark="0", options=["timestamp", "rate=2X"]
    )
    assert (header.t, header.f, header.bm, header.o) == (
        "orders",
        "/qty > 1",
        "0",
        "timestamp,rate=2X",
    )
    assert set(header.a.split(",")) == {"processed", "completed"}
    assert header.sub_id == sub.sub_id and header.cid
    conn.deliver(
        "orders", b'{"qty":2}', sub.sub_id, sids=sub.sub_id, bm="9|1|", x="c1",
        ts="20261121T204005.123456Z", l=9,
    )  # fmt: skip
    conn.deliver("orders", b'{"qty":3}', sub.sub_id, bm="9|2|", lp="20261121T204035.000000Z")
    first = await asyncio.wait_for(anext(sub), 5)
    assert isinstance(first, Message)
    assert (first.topic, first.body, first.bookmark, first.sub_id, first.sids) == (
        "orders", b'{"qty":2}', "9|1|", sub.sub_id, sub.sub_id,
    )  # fmt: skip
    assert (first.correlation_id, first.timestamp) == ("c1", "20261121T204005.123456Z")
    assert first.header.l == 9 and first.json() == {"qty": 2}
    second = await sub.next(timeout=5)
    assert (second.bookmark, second.lease_period) == ("9|2|", "20261121T204035.000000Z")
    assert second.timestamp is None and second.correlation_id is None


async def test_server_chosen_sub_id_is_kept_when_given(session):
    client, conn = session
    sub, header = await subscribe(client, conn, sub_id="mine")
    assert sub.sub_id == header.sub_id == "mine"
    with pytest.raises(CommandError) as info:
        await client.subscribe("orders", sub_id="mine")
    assert info.value.reason == "subscription already exists"


@pytest.mark.parametrize(
    "reason",
    ["bad filter", "bad regex topic", "invalid bookmark", "invalid options", "invalid topic"],
)
async def test_failure_ack_raises_command_error(session, reason):
    client, conn = session
    task = asyncio.ensure_future(client.subscribe("orders", filter="/a = "))
    header, _ = await conn.recv("subscribe")
    conn.ack("processed", cid=header.cid, status="failure", reason=reason)
    with pytest.raises(CommandError) as info:
        await asyncio.wait_for(task, 5)
    assert info.value.reason == reason
    assert "subscribe" in str(info.value)
    assert client.subscriptions() == []
    # a delivery for the failed sub_id is dropped, not an error
    conn.deliver("orders", b"{}", header.sub_id)
    await asyncio.sleep(0.05)
    assert client.stray_messages == 1


async def test_deliveries_split_at_every_byte(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)
    data = b"".join(
        conn.frame(
            {"c": "p", "t": "orders", "sub_id": sub.sub_id, "bm": f"1|{i}|"}, b'{"i":%d}' % i
        )
        for i in range(3)
    ) + conn.frame({"c": "heartbeat"})
    for i in range(len(data)):
        conn.send_raw(data[i : i + 1])
        await asyncio.sleep(0)
    got = [await sub.next(timeout=5) for _ in range(3)]
    assert [m.bookmark for m in got] == ["1|0|", "1|1|", "1|2|"]
    header, _ = await conn.recv("heartbeat")  # the client answers the server's heartbeat
    assert header.o == "beat"


async def test_message_for_several_subscriptions_goes_to_each(session):
    client, conn = session
    a, _ = await subscribe(client, conn, "orders")
    b, _ = await subscribe(client, conn, "ord.*")
    conn.deliver("orders", b"{}", a.sub_id, sids=f"{a.sub_id},{b.sub_id}")
    ma = await a.next(timeout=5)
    mb = await b.next(timeout=5)
    assert ma.body == mb.body == b"{}"
    assert (ma.sub_id, mb.sub_id) == (a.sub_id, b.sub_id)


async def test_completed_sets_event_and_range_ends_iteration(session):
    client, conn = session
    live, _ = await subscribe(client, conn, bookmark="0")
    conn.ack("completed", cid="zz", sub_id=live.sub_id)
    await asyncio.wait_for(live.completed.wait(), 5)
    assert live.active  # an EPOCH replay caught up: the subscription goes on live

    rng, header = await subscribe(client, conn, bookmark="[0:20261121T000000]")
    conn.deliver("orders", b"1", rng.sub_id)
    conn.deliver("orders", b"2", rng.sub_id)
    conn.ack("completed", cid=header.cid)  # no sub_id: routed by the subscribe's cid
    bodies = [m.body async for m in rng]
    assert bodies == [b"1", b"2"]
    assert rng.completed.is_set() and not rng.active
    assert rng not in client.subscriptions()


async def test_unsubscribe_ends_iterator_and_sends_command(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)
    reader = asyncio.ensure_future(sub.next())
    await asyncio.sleep(0.01)
    task = asyncio.ensure_future(sub.unsubscribe())
    header, _ = await conn.recv("unsubscribe")
    assert header.sub_id == sub.sub_id
    conn.ack("processed", cid=header.cid)
    await asyncio.wait_for(task, 5)
    assert await asyncio.wait_for(reader, 5) is None
    conn.deliver("orders", b"{}", sub.sub_id)  # in flight when the server removed it
    await asyncio.sleep(0.05)
    assert client.stray_messages == 1


async def test_async_with_subscription_unsubscribes(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)

    async def answer():
        header, _ = await conn.recv("unsubscribe")
        conn.ack("processed", cid=header.cid)

    answering = asyncio.ensure_future(answer())
    async with sub:
        pass
    await answering
    assert not sub.active


async def test_disconnect_ends_iterators_with_disconnected_after_buffered(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)
    pending = asyncio.ensure_future(client.flush(timeout=5))
    await conn.recv("flush")
    conn.deliver("orders", b"last", sub.sub_id)
    await asyncio.sleep(0.05)
    conn.close()
    with pytest.raises(Disconnected):
        await asyncio.wait_for(pending, 5)
    assert (await sub.next(timeout=5)).body == b"last"
    with pytest.raises(Disconnected) as info:
        await sub.next(timeout=5)
    assert info.value.reason == "closed by server"
    with pytest.raises(Disconnected):
        await client.subscribe("orders")
    assert (await client.wait_closed()).reason == "closed by server"


async def test_client_close_stops_iterators_cleanly(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)
    reader = asyncio.ensure_future(sub.next())
    await asyncio.sleep(0.01)
    await client.close()
    assert await asyncio.wait_for(reader, 5) is None
    assert client.closed_reason.reason == "closed by client"


async def test_bad_frame_from_server_disconnects_with_reason(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)
    conn.deliver("orders", b"ok", sub.sub_id)
    conn.send_raw(b"\x00\x00\x00\x05[1,2]")
    assert (await sub.next(timeout=5)).body == b"ok"
    with pytest.raises(Disconnected) as info:
        await sub.next(timeout=5)
    assert info.value.reason == "bad frame"


async def test_full_buffer_pauses_reading_until_drained(server):
    client = Client("slow", max_buffered_messages=5)
    await client.connect(server.address)
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    await conn.logon()
    await task
    sub, _ = await subscribe(client, conn)
    for i in range(40):
        conn.deliver("orders", b"%d" % i, sub.sub_id)
        await asyncio.sleep(0.002)  # separate reads, so the pause can take effect between them
    await asyncio.sleep(0.05)
    assert not client._conn.transport.is_reading()
    assert 5 <= sub.buffered < 40  # bounded (softly: by what one read had already decoded)
    got = [(await sub.next(timeout=5)).body for _ in range(40)]
    assert got == [b"%d" % i for i in range(40)]
    assert client._conn.transport.is_reading()
    await client.close()


async def test_full_buffer_by_bytes(server):
    client = Client("big", max_buffered_bytes=1000)
    await client.connect(server.address)
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    await conn.logon()
    await task
    sub, _ = await subscribe(client, conn)
    conn.deliver("orders", b"x" * 2000, sub.sub_id)
    await asyncio.sleep(0.05)
    assert not client._conn.transport.is_reading()
    await sub.next(timeout=5)
    assert client._conn.transport.is_reading()
    await client.close()


async def test_next_timeout_loses_nothing(session):
    client, conn = session
    sub, _ = await subscribe(client, conn)
    with pytest.raises(TimeoutError):
        await sub.next(timeout=0.02)
    conn.deliver("orders", b"late", sub.sub_id)
    assert (await sub.next(timeout=5)).body == b"late"
