"""A replication link whose transport closed under it (server/replication/link.py): the receiver
acks from a commit's callback, and a write to a closed uvloop transport raises RuntimeError
there. Seen in the seams campaign (issue 23): the exception left the pipeline's commit
half-processed (no `persisted` acks, no durable sequences, no waiters woken for that batch).
Now the write ends the link, and the caller sees it closed."""

from __future__ import annotations

import asyncio

import pytest

from server.replication.link import Link, LinkClosed


class ClosedTransportWriter:
    """What asyncio's StreamWriter does over a uvloop transport whose handle is closed."""

    def __init__(self, error: BaseException):
        self.error = error
        self.closed = False

    def write(self, data: bytes) -> None:
        raise self.error

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError(
            "unable to perform operation on <TCPTransport closed=True>; the handler is closed"
        ),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_a_write_to_a_closed_transport_ends_the_link_without_raising(error):
    async def main() -> None:
        writer = ClosedTransportWriter(error)
        link = Link(asyncio.StreamReader(), writer, "peer")  # type: ignore[arg-type]
        link.send(b"ack")  # from a commit's callback: must not raise
        assert link.closed and "write failed" in (link.reason or "")
        assert writer.closed
        with pytest.raises(LinkClosed):  # an ended link still says so to its owner
            link.send(b"more")

    asyncio.run(main())


def test_frames_that_arrive_as_the_link_ends_are_not_handed_out():
    """Issue 23, seams round 79: a read that completed just before the link was ended (by a
    failed commit's callback) still returned its frames, and the receiver stored batches that
    came after the failed one. An ended link hands out nothing more."""
    from protocol.replication import encode_batch

    class Writer:
        def close(self) -> None:
            pass

    async def main() -> None:
        reader = asyncio.StreamReader()
        link = Link(reader, Writer(), "peer")  # type: ignore[arg-type]
        read = asyncio.ensure_future(link.read_frames())
        await asyncio.sleep(0)  # the read waits for data
        reader.feed_data(encode_batch(0, 5, b"abcde"))  # arrives, and the read is woken...
        link.end("commit failed here: disk full")  # ...but the link ends before it runs
        with pytest.raises(LinkClosed, match="commit failed here"):
            await read

    asyncio.run(main())
