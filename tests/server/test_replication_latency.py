"""The sync ack path is driven by events, never by a timer: two instances in this process (real
journals, a real loopback link, the SyncGate), every periodic timer of the link and the sender
pushed out of reach, and a hook on the loop that records each timer that fires. A publisher's
`persisted` ack must come back (local commit -> sender -> link -> receiver -> its commit ->
repl_ack -> gate release) with no timer firing in between."""

from __future__ import annotations

import asyncio

import pytest

from config.model import ReplicationAddress, ReplicationDestination, TopicSpec
from journal.journal import Journal
from server.guard import Guard
from server.replication import link as link_mod
from server.replication import sender as sender_mod
from server.replication.receiver import Receiver
from server.replication.sender import Sender
from server.replication.sync import SyncGate
from tests.server.test_pipeline_engine import Publisher, make_pipeline

NEVER = 3600.0  # the periodic timers: far past the test's own 10 s bound


class AwaitedPublisher(Publisher):
    def __init__(self) -> None:
        super().__init__()
        self.acked: asyncio.Future[int] | None = None

    def persisted(self, seq: int) -> None:
        super().persisted(seq)
        if self.acked is not None and not self.acked.done():
            self.acked.set_result(seq)


async def _until(cond, what: str) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_sync_ack_needs_no_timer(tmp_path, monkeypatch):
    monkeypatch.setattr(link_mod, "KEEPALIVE_TICK", NEVER)
    monkeypatch.setattr(sender_mod, "IDLE_RECHECK", NEVER)
    loop = asyncio.get_running_loop()
    ja = Journal(str(tmp_path / "a"), durability="write")
    jb = Journal(str(tmp_path / "b"), durability="write")
    pb = make_pipeline(jb)
    receiver = Receiver("tt-b", pb, jb, Guard())
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pa = make_pipeline(ja)
    gate = SyncGate([("tt-b", True, None)], lambda: pa.delivered_end, loop.call_later)
    pa.attach_gate(gate)
    gate.start()
    dest = ReplicationDestination(
        name="tt-b",
        group="ny",
        sync=True,
        addresses=(ReplicationAddress(host="127.0.0.1", port=port),),
        topics=(TopicSpec(name="orders.*"),),
    )
    sender = Sender(dest, "tt-a", "ny", ja, pa, gate)
    sender.start()
    try:
        await _until(lambda: gate.dests["tt-b"].connected, "the link")
        fired: list[str] = []
        plain_call_at = loop.call_at

        def call_at(when, callback, *args, context=None):
            def fire(*a):
                fired.append(getattr(callback, "__qualname__", repr(callback)))
                callback(*a)

            return plain_call_at(when, fire, *args, context=context)

        monkeypatch.setattr(loop, "call_at", call_at)
        await asyncio.sleep(0.001)
        assert fired, "the hook sees timers (asyncio.sleep's own)"
        pub = AwaitedPublisher()
        for seq in (1, 2, 3):
            fired.clear()
            pub.acked = loop.create_future()
            pa.publish(pub, 7, seq, "orders.x", b'{"n":%d}' % seq)
            assert await asyncio.wait_for(pub.acked, 10) == seq
            assert fired == [], f"a timer fired on the ack path: {fired}"
            # held until the destination acked it, and the destination holds it
            assert gate.dests["tt-b"].acked >= pa.delivered_end and gate.held == 0
            assert jb.locate(7, seq) is not None
        monkeypatch.setattr(loop, "call_at", plain_call_at)
    finally:
        await sender.stop()
        await receiver.stop()
        server.close()
        await server.wait_closed()
        gate.stop()
        ja.close()
        jb.close()


@pytest.mark.parametrize("closing", ["destination", "source"])
async def test_an_idle_sender_sees_its_link_end_at_once(tmp_path, monkeypatch, closing):
    """The streamer idles on the next commit; the link's end wakes it (no backstop timer)."""
    monkeypatch.setattr(link_mod, "KEEPALIVE_TICK", NEVER)
    monkeypatch.setattr(sender_mod, "IDLE_RECHECK", NEVER)
    monkeypatch.setattr(sender_mod, "BACKOFF_MIN", NEVER)  # no reconnect within the test
    loop = asyncio.get_running_loop()
    ja = Journal(str(tmp_path / "a"), durability="write")
    jb = Journal(str(tmp_path / "b"), durability="write")
    receiver = Receiver("tt-b", make_pipeline(jb), jb, Guard())
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pa = make_pipeline(ja)
    gate = SyncGate([("tt-b", True, None)], lambda: pa.delivered_end, loop.call_later)
    dest = ReplicationDestination(
        name="tt-b",
        group="ny",
        sync=True,
        addresses=(ReplicationAddress(host="127.0.0.1", port=port),),
        topics=(TopicSpec(name=".*"),),
    )
    sender = Sender(dest, "tt-a", "ny", ja, pa, gate)
    sender.start()
    try:
        await _until(lambda: sender._idle is not None, "the streamer to idle")
        if closing == "destination":
            await receiver.stop()
        else:
            assert sender.link is not None
            sender.link.end("test")
        await _until(lambda: not gate.dests["tt-b"].connected, "the link's end")
    finally:
        await sender.stop()
        await receiver.stop()
        server.close()
        await server.wait_closed()
        ja.close()
        jb.close()
