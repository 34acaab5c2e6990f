"""A publisher's reads in flight (<ClientPublishMemoryLimit>), through a real Connection over the
in-process core (tests/server/core_harness.py): the reads that go into one open batch are freed
together by one callback at that batch's commit, and reading still pauses past the limit and
resumes once half of it is committed; a committed batch is freed at once (its callback does not
keep it in a reference cycle until a garbage collection: 4 MB of batch a read burst)."""

from __future__ import annotations

import gc
import struct

from server.connection import PUBLISH_BACKLOG, Connection
from server.pipeline_batch import Batch
from tests.server.core_harness import FakeTransport, connection_env


class Transport(FakeTransport):
    """What a Connection also asks of its transport: the peer, and reading paused or not."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(header) + len(body)) + header + body


def _publishes(first: int, count: int) -> bytes:
    return b"".join(
        _frame(b'{"c":"publish","t":"orders","s":%d,"a":"persisted"}' % s, b'{"n":%d}' % s)
        for s in range(first, first + count)
    )


def _publisher(core, limit: int = 4 * 1024 * 1024) -> tuple[Connection, Transport]:
    env = connection_env(core, max_publish_inflight=limit)
    conn = Connection(env, "json-tcp", 1 << 20)
    transport = Transport()
    conn.connection_made(transport)
    conn.data_received(_frame(b'{"c":"logon","cid":"l","a":"processed","client_name":"pub"}'))
    return conn, transport


async def test_the_reads_of_one_batch_are_freed_by_one_callback_at_its_commit(core):
    conn, transport = _publisher(core)
    await core.settle()
    reads = [_publishes(1, 2), _publishes(3, 1), _publishes(4, 3)]
    for data in reads:
        conn.data_received(data)
    batch = core.pipeline.batch
    assert len(batch.msgs) == 6
    assert len(batch.after) == 1  # not one a read
    assert conn.publish_inflight == sum(map(len, reads))
    await core.settle()
    assert conn.publish_inflight == 0
    # the next read goes into another batch: a callback of its own
    conn.data_received(_publishes(7, 1))
    assert len(core.pipeline.batch.after) == 1 and core.pipeline.batch is not batch
    await core.settle()
    assert conn.publish_inflight == 0
    assert transport.data.count(b'"persisted"') >= 2 and b'"s":7' in transport.data


async def test_reading_pauses_past_the_limit_and_resumes_at_half_of_it(core):
    two = len(_publishes(1, 2))  # two frames a read: none is a lone publish committed at once
    conn, transport = _publisher(core, limit=3 * two)
    await core.settle()
    for s in range(1, 7, 2):
        conn.data_received(_publishes(s, 2))
    assert transport.reading  # at the limit, not past it
    conn.data_received(_publishes(7, 2))
    assert not transport.reading and PUBLISH_BACKLOG in conn._read_pauses
    assert len(core.pipeline.batch.after) == 1
    await core.settle()
    assert transport.reading and conn.publish_inflight == 0
    assert b'"s":8' in transport.data


async def test_a_committed_batch_is_freed_without_a_garbage_collection(core):
    conn, _transport = _publisher(core)
    await core.settle()
    gc.collect()
    gc.disable()
    try:
        for first in (1, 3, 5):
            conn.data_received(_publishes(first, 2))
        await core.settle()
        alive = [o for o in gc.get_objects() if type(o) is Batch]
        assert alive == [core.pipeline.batch]  # the committed one is gone already
    finally:
        gc.enable()
