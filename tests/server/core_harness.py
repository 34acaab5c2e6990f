"""An in-process server core for tests: the engines and sessions wired by the server's own
`build_core` (server/core.py), over a real Journal in tmp_path and the running event loop, with
no socket.

A `Client` is a Session whose Outbox writes into a `FakeTransport`; commands go in as Header
objects, and what the server sent comes back as frames (`Frame`: header dict, raw header bytes,
body). `core.settle()` waits until every publish so far is committed and delivered.
"""

from __future__ import annotations

import asyncio
import json
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from config.loader import load_config_text
from journal.fileio import FileOps
from journal.journal import Journal
from protocol.headers import Header
from server.admission import Admission
from server.connection import ConnectionEnv, Connections
from server.core import build_core
from server.guard import build_guard
from server.intake import Intake
from server.outbox import Outbox
from server.pipeline_check import CommitChecks
from server.session import Session
from tests.support.proc import make_config


class FakeTransport:
    """What an Outbox writes to: bytes collected, closing and buffer size under test control."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.aborted = False
        self.buffered = 0  # what get_write_buffer_size reports

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True


class Frame:
    def __init__(self, raw_header: bytes, body: bytes) -> None:
        self.raw_header = raw_header
        self.header: dict[str, Any] = json.loads(raw_header)
        self.body = body

    def __getitem__(self, key: str) -> Any:
        return self.header[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(key, default)

    def __repr__(self) -> str:
        return f"Frame({self.raw_header!r}, {self.body!r})"


def split_frames(data: bytes) -> list[Frame]:
    """Frames of a byte stream (docs/protocol.md §1); the header is the leading JSON object."""
    out = []
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        frame = bytes(data[pos + 4 : pos + 4 + n])
        assert len(frame) == n, "a partial frame was written"
        _, end = json.JSONDecoder().raw_decode(frame.decode("utf-8", "surrogateescape"))
        hlen = len(
            frame.decode("utf-8", "surrogateescape")[:end].encode("utf-8", "surrogateescape")
        )
        out.append(Frame(frame[:hlen], frame[hlen:]))
        pos += 4 + n
    return out


class Client:
    def __init__(self, core: Core, max_buffer: int = 1 << 30, offline_at: int = 0) -> None:
        """`offline_at`: <ClientOfflineThreshold> (0: this client never falls back)."""
        self.core = core
        self.transport = FakeTransport()
        self.closes: list[str] = []
        self.out = Outbox(max_buffer, self.closes.append, offline_at)
        self.out.attach(self.transport)
        self.session = Session(self.out, core.services)
        self.session.peer = "test"
        self._seen = 0

    def send(self, c: str, body: bytes | str = b"", **fields: Any) -> None:
        """One command, as the connection hands it over (then the read's flush)."""
        if isinstance(body, str):
            body = body.encode()
        self.session.receive([(Header(c=c, **fields), body)])
        self.out.flush()

    def logon(self, name: str, **fields: Any) -> Frame:
        self.send("logon", client_name=name, a="processed", **fields)
        (ack,) = self.take()
        assert ack["status"] == "success", ack.header
        return ack

    def take(self) -> list[Frame]:
        """The frames sent since the last take."""
        data = bytes(self.transport.data[self._seen :])
        self._seen = len(self.transport.data)
        return split_frames(data)

    def raw(self) -> bytes:
        """The bytes sent since the last take (and takes them)."""
        data = bytes(self.transport.data[self._seen :])
        self._seen = len(self.transport.data)
        return data

    def disconnect(self) -> None:
        self.out.lost()
        self.session.closed()


class Core:
    """The server's parts, built by Server.start's build_core, minus listeners and the tick."""

    def __init__(
        self,
        tmp_path: Any,
        loop: asyncio.AbstractEventLoop,
        extra: str = "",
        topics: tuple[str, ...] = (".*",),
        io: FileOps | None = None,
    ) -> None:
        """`topics`: the <TransactionLog> topic patterns (every topic is recorded by default);
        `io`: the journal's file operations (a FaultyIO fails or holds them)."""
        self.config = load_config_text(
            make_config(str(tmp_path), admin=False, extra=extra, topics=topics)
        )
        tl = self.config.transaction_log
        assert tl is not None
        self.loop = loop
        self.closed = False
        self.journal = Journal(tl.journal_directory, durability="write", io=io)
        self.backlog: list[bool] = []
        self.readers = ThreadPoolExecutor(2, thread_name_prefix="test-reader")
        self.core = build_core(
            self.config,
            self.journal,
            tl.records_topic,
            loop,
            self.readers,
            build_guard(self.config),
            self.backlog.append,
            instance="core",
        )
        # every core test also checks the commit order's invariants (server/pipeline_check.py)
        self.core.pipeline.checks = CommitChecks()
        self.counters, self.fanout, self.pipeline = (
            self.core.counters,
            self.core.fanout,
            self.core.pipeline,
        )
        self.replays, self.queues, self.index = (
            self.core.replays,
            self.core.queues,
            self.core.index,
        )
        self.services = self.core.services
        self.limit_counts = self.core.intake.counts
        self.queues.recover()
        self.core.attach_recovered()

    def client(self, name: str | None = None, **outbox: int) -> Client:
        c = Client(self, **outbox)
        if name is not None:
            c.logon(name)
        return c

    async def settle(self, rounds: int = 2000) -> None:
        """Wait until everything accepted so far is committed and its acks and deliveries are
        out (journal commits finish on the writer thread, then on the loop)."""
        p = self.pipeline
        for _ in range(rounds):
            await asyncio.sleep(0.001)
            if not p.scheduled and not p.inflight_batches:
                await asyncio.sleep(0)
                return
        raise AssertionError("the pipeline did not settle")

    async def until(self, cond: Any, timeout: float = 5.0) -> None:
        """Wait (on the loop) until cond() is true."""
        deadline = self.loop.time() + timeout
        while not cond():
            if self.loop.time() > deadline:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.002)

    async def aclose(self) -> None:
        """As the server shuts down: no more replays or timers, the last commit, then close."""
        if self.closed:
            return
        self.replays.cancel_all()
        self.queues.stop()
        self.pipeline.flush()
        await self.settle()
        self.close()

    def close(self) -> None:
        """Close at once (a test that reopens the journal has settled first)."""
        if self.closed:
            return
        self.closed = True
        self.replays.cancel_all()
        self.queues.stop()
        self.journal.close()
        self.readers.shutdown(wait=True, cancel_futures=True)


def connection_env(core: Any, **over: Any) -> ConnectionEnv:
    """A ConnectionEnv over `core`'s counters and services with its config's limits, as
    server/app.py builds one (`over`: fields to set otherwise)."""
    limits = core.config.limits
    intake = Intake(limits)
    fields: dict[str, Any] = dict(
        registry=Connections(),
        intake=intake,
        counters=core.counters,
        services=core.services,
        max_logon_message_size=limits.max_logon_message_size,
        max_client_buffer=limits.client_max_buffer_size,
        offline_threshold=limits.offline_threshold,
        input_seen=lambda now: None,
        admission=Admission(limits, intake.counts),
    )
    fields.update(over)
    return ConnectionEnv(**fields)
