"""A tiny scripted server for client tests: raw asyncio TCP on port 0, speaking protocol bytes.

Tests drive it by hand (`await conn.recv()` / `conn.send({...})`), or give it an `auto`
handler that answers some commands by itself (logon, publishes) so CLI subprocesses can run
against it. Frames the server sends are encoded here with msgspec from plain dicts, so the
client is tested against the wire format, not against its own encoder.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

import msgspec
import pytest

from client import Client
from protocol.framing import FrameDecoder
from protocol.headers import Header

_LEN = struct.Struct(">I")

Auto = Callable[["FakeConn", Header, bytes], bool]


def frame(header: dict | bytes, body: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else msgspec.json.encode(header)
    return _LEN.pack(len(raw) + len(body)) + raw + body


class FakeConn(asyncio.Protocol):
    """One accepted connection: received frames queue up; `send` writes raw frames."""

    def __init__(self, server: FakeServer):
        self.server = server
        self.decoder = FrameDecoder()
        self.frames: asyncio.Queue[tuple[Header, bytes]] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()
        self.raw = bytearray()  # every byte received, for framing checks

    def connection_made(self, transport):
        self.transport = transport
        self.server.conns.append(self)
        self.server.accepted.put_nowait(self)

    def data_received(self, data):
        self.raw += data
        for header, body in self.decoder.feed(data):
            auto = self.server.auto
            if auto is not None and auto(self, header, body):
                continue
            self.frames.put_nowait((header, body))

    def connection_lost(self, exc):
        self.closed.set()

    async def recv(self, c: str | None = None, *, timeout: float = 5.0, skip=("heartbeat",)):
        """The next frame (of command `c` if given; frames of other commands are skipped only
        if they are in `skip`)."""
        async with asyncio.timeout(timeout):
            while True:
                header, body = await self.frames.get()
                if c is not None and header.c != c and header.c in skip:
                    continue
                if c is not None:
                    assert header.c == c, f"expected {c!r}, got {header}"
                return header, body

    def send(self, header: dict | bytes, body: bytes = b"") -> None:
        self.transport.write(frame(header, body))

    frame = staticmethod(frame)

    def send_raw(self, data: bytes) -> None:
        self.transport.write(data)

    def ack(self, a: str, **fields) -> None:
        self.send({"c": "ack", "a": a, "status": fields.pop("status", "success"), **fields})

    def deliver(self, topic: str, body: bytes, sub_id: str, **fields) -> None:
        self.send({"c": "p", "t": topic, "sub_id": sub_id, **fields}, body)

    async def logon(self, s: int = 0, bm: str | None = None) -> Header:
        header, _ = await self.recv("logon")
        fields = {"cid": header.cid, "s": s}
        if bm:
            fields["bm"] = bm
        self.ack("processed", **fields)
        return header

    def close(self) -> None:
        self.transport.close()


class FakeServer:
    def __init__(self):
        self.accepted: asyncio.Queue[FakeConn] = asyncio.Queue()
        self.auto: Auto | None = None
        self.conns: list[FakeConn] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> FakeServer:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: FakeConn(self), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def accept(self, timeout: float = 5.0) -> FakeConn:
        async with asyncio.timeout(timeout):
            return await self.accepted.get()

    async def stop(self) -> None:
        self.server.close()
        for conn in self.conns:
            conn.transport.abort()


@pytest.fixture
async def server():
    srv = await FakeServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
async def session(server):
    """A logged-on Client (logon s=0) and the server side of its connection."""
    client = Client("test-client")
    await client.connect(server.address)
    conn = await server.accept()
    logon = asyncio.ensure_future(client.logon(timeout=5))
    await conn.logon()
    await logon
    yield client, conn
    await client.close()


def pytest_asyncio_loop_factories(config, item):
    """Every async client test runs on both loops (CONVENTIONS.md habit 11), except one that
    tests a command-line client (`cli_process`): that runs in a process of its own, on the
    loop the command chooses, whatever loop the test's side runs on; twice was the same test."""
    factories = {"asyncio": asyncio.new_event_loop}
    if item.get_closest_marker("cli_process"):
        return factories
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories
