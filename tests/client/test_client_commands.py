"""Connection, logon, generic commands, flush, sow_delete and heartbeats against the scripted
server; address parsing."""

import asyncio
import socket

import pytest

from client import (
    Client,
    ClientError,
    CommandError,
    CommandTimeout,
    ConnectFailed,
    Disconnected,
)
from client.address import parse_server
from protocol.headers import Header


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connection_refused_names_address_and_serve():
    port = free_port()
    client = Client("x")
    with pytest.raises(ConnectFailed) as info:
        await client.connect(f"127.0.0.1:{port}")
    text = str(info.value)
    assert f"127.0.0.1:{port}" in text and "refused" in text and "tickertape serve" in text
    assert isinstance(info.value, ConnectionError)


async def test_logon_failure_raises_and_server_close_is_reported(server):
    client = Client("x", user_id="mallory")
    await client.connect(server.address)
    conn = await server.accept()
    task = asyncio.ensure_future(client.logon(timeout=5))
    header, _ = await conn.recv("logon")
    conn.ack("processed", cid=header.cid, status="failure", reason="auth failure")
    with pytest.raises(CommandError) as info:
        await task
    assert info.value.reason == "auth failure" and "user_id" in str(info.value)
    conn.close()
    assert (await client.wait_closed()).reason == "auth failure"


async def test_unattributed_failure_becomes_disconnect_reason(server):
    errors = []
    client = Client("x", on_error=errors.append)
    await client.connect(server.address)
    conn = await server.accept()
    conn.ack("processed", status="failure", reason="logon required")  # no cid
    await asyncio.sleep(0.05)
    conn.close()
    closed = await client.wait_closed()
    assert closed.reason == "logon required"
    assert [e.reason for e in errors] == ["logon required"]


async def test_logon_timeout(server):
    client = Client("x")
    await client.connect(server.address)
    with pytest.raises(CommandTimeout, match="logon"):
        await client.logon(timeout=0.05)
    await client.close()


async def test_async_with_connects_and_logs_on(server):
    async def serve():
        conn = await server.accept()
        await conn.logon(s=7)
        return conn

    serving = asyncio.ensure_future(serve())
    async with Client("x", server=server.address) as client:
        assert client.logon_result.seq == 7
        assert client.connected
        await serving
    assert not client.connected
    with pytest.raises(ClientError):
        await client.connect(server.address)  # one Client is one connection


async def test_flush_waits_for_completed(session):
    client, conn = session
    await client.publish("t", b"{}")
    task = asyncio.ensure_future(client.flush(timeout=5))
    await conn.recv("publish")
    header, _ = await conn.recv("flush")  # after the publish: order is kept
    assert header.a == "completed" and header.cid
    conn.ack("processed", cid=header.cid)  # other ack types for the cid are not the answer
    await asyncio.sleep(0.02)
    assert not task.done()
    conn.ack("completed", cid=header.cid)
    await task


async def test_sow_delete_returns_records_deleted(session):
    client, conn = session
    task = asyncio.ensure_future(
        client.sow_delete("queue.work", ["1|2|", "1|3|"], options="cancel")
    )
    header, _ = await conn.recv("sow_delete")
    assert (header.t, header.bm, header.o) == ("queue.work", "1|2|,1|3|", "cancel")
    assert set(header.a.split(",")) == {"processed", "stats"}
    conn.ack("processed", cid=header.cid)
    conn.ack("stats", cid=header.cid, records_deleted=2, matches=2)
    assert await asyncio.wait_for(task, 5) == 2

    task = asyncio.ensure_future(client.sow_delete("orders", filter="/a = 1"))
    header, _ = await conn.recv("sow_delete")
    assert header.f == "/a = 1" and header.bm is None
    conn.ack("processed", cid=header.cid, status="failure", reason="not a queue")
    with pytest.raises(CommandError) as info:
        await asyncio.wait_for(task, 5)
    assert info.value.reason == "not a queue"
    with pytest.raises(ValueError):
        await client.sow_delete("q")


async def test_execute_generic_command(session):
    client, conn = session
    task = asyncio.ensure_future(client.execute(Header(c="unsubscribe", sub_id="all"), timeout=5))
    header, _ = await conn.recv("unsubscribe")
    assert header.a == "processed" and header.cid
    conn.ack("processed", cid=header.cid, sub_id="all")
    ack = await task
    assert ack.sub_id == "all" and ack.status == "success"

    task = asyncio.ensure_future(client.execute(Header(c="bogus", cid="mine", a="received")))
    header, _ = await conn.recv("bogus")
    assert header.cid == "mine" and header.a == "received,processed"
    conn.ack("processed", cid="mine", status="failure", reason="unknown command")
    with pytest.raises(CommandError, match="unknown command"):
        await task

    with pytest.raises(CommandTimeout) as info:
        await client.execute(Header(c="flush"), ack="completed", timeout=0.05)
    assert "flush" in str(info.value) and "larger timeout" in str(info.value)


async def test_heartbeats_start_beat_and_answer(session):
    client, conn = session
    client.start_heartbeat(0.1)
    header, _ = await conn.recv()
    assert (header.c, header.o) == ("heartbeat", "start,0.1")
    header, _ = await conn.recv(timeout=1)  # a periodic beat
    assert (header.c, header.o) == ("heartbeat", "beat")
    conn.send({"c": "heartbeat"})
    await conn.recv("heartbeat", skip=())
    await client.send_heartbeat()
    header, _ = await conn.recv("heartbeat", skip=())
    assert header.o == "beat"


async def test_silent_server_closes_with_heartbeat_reason(session):
    client, _ = session
    sub_task = asyncio.ensure_future(client.flush())
    client.start_heartbeat(0.05)
    with pytest.raises(Disconnected) as info:
        await asyncio.wait_for(sub_task, 5)
    assert info.value.reason == "heartbeat"
    assert "no bytes from the server" in str(info.value)


async def test_talking_server_keeps_heartbeat_connection(session):
    client, conn = session
    client.start_heartbeat(0.05)
    for _ in range(8):
        conn.send({"c": "heartbeat"})
        await asyncio.sleep(0.04)
    assert client.connected


def test_parse_address():
    assert parse_server("host:1")[:2] == ("host", 1)
    assert parse_server("tcp://10.0.0.1:9008/amps/json")[:2] == ("10.0.0.1", 9008)
    assert parse_server("[::1]:9007")[:2] == ("::1", 9007)
    assert parse_server("example")[:2] == ("example", 9007)
    assert parse_server(":9009")[:2] == ("127.0.0.1", 9009)
    for bad in ("http://x:1", "x:0", "x:99999", "x:port", "::1:9", "[::1"):
        with pytest.raises(ValueError, match="expected"):
            parse_server(bad)
