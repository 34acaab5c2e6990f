"""The receiver's batch loop (server/replication/receiver.py) over a fake link: a damaged record or
a truncated batch closes the link with nothing of the batch taken, and the acks of link batches
that share a commit are conflated into one, sent from the commit itself; when a source counts as
synced; and the sender's wait for its logon's answer."""

from __future__ import annotations

import asyncio
import errno
import time

import pytest

from config.model import (
    Entitlement,
    ReplicationAddress,
    ReplicationDestination,
    Rights,
    Role,
    TopicSpec,
)
from journal.fileio import FaultyIO
from journal.journal import Journal
from journal.record import KIND_MESSAGE, encode_record
from protocol.replication import Heartbeat, ReplAck, ReplBatch, encode_ack
from server.guard import Guard
from server.replication import REPL_FROM, U64, NullAckSink
from server.replication import receiver as receiver_mod
from server.replication import sender as sender_mod
from server.replication.link import LinkClosed
from server.replication.receiver import Receiver
from server.replication.sender import Sender
from server.security.authenticator import Identity, LogonChecker
from server.security.entitlements import Entitlements
from tests.server.test_pipeline_engine import _settle, make_pipeline


class FakeLink:
    def __init__(self, then: list | None = None):
        self.sent: list[bytes] = []
        self.reason: str | None = None
        self.then = then or []

    @property
    def closed(self) -> bool:
        return self.reason is not None

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def end(self, reason: str) -> None:
        self.reason = self.reason or reason

    async def read_frames(self):
        if self.then:
            return self.then.pop(0)
        for _ in range(2000):  # until the commit's ack went out, then the link ends
            await asyncio.sleep(0.001)
            if self.sent:
                break
        raise LinkClosed("test over")


def records(pub: int, seqs) -> bytes:
    return b"".join(encode_record(KIND_MESSAGE, pub, s, 10, b"orders", b"x%d" % s) for s in seqs)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda b: b[:-1], id="truncated"),
        pytest.param(lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], id="crc"),
        pytest.param(lambda b: b[:9] + b"\x80" + b[10:], id="flags"),
    ],
)
async def test_a_damaged_batch_closes_the_link_and_takes_nothing(journal, cut):
    p = make_pipeline(journal)
    r = Receiver("tt-b", p, journal, Guard())
    good = records(1, [1, 2])
    body = cut(good + records(1, [3]))
    frames = [(ReplBatch(from_=0, to=len(body)), body)]
    with pytest.raises(LinkClosed, match="damaged record"):
        await r._batches(FakeLink(), "tt-a", "ny", 0, frames)
    assert r.damaged == 1 and r.received == 0 and not p.batch.data and p.highest == {}


async def test_a_gap_closes_the_link(journal):
    r = Receiver("tt-b", make_pipeline(journal), journal, Guard())
    body = records(1, [1])
    with pytest.raises(LinkClosed, match="a gap"):
        await r._batches(FakeLink(), "tt-a", "ny", 0, [(ReplBatch(from_=5, to=9), body)])


async def test_a_source_that_rewinds_is_taken_and_its_repeats_dropped(journal):
    """A batch from before the expected point (a source that found the resume point past its
    journal's end sends from its start) is no gap: what comes again is dropped as duplicates."""
    p = make_pipeline(journal)
    r = Receiver("tt-b", p, journal, Guard())
    body = records(1, [1, 2, 3])
    link = FakeLink()
    with pytest.raises(LinkClosed, match="test over"):
        await r._batches(link, "tt-a", "ny", 5000, [(ReplBatch(from_=0, to=len(body)), body)])
    assert (r.received, r.stored, r.duplicates) == (3, 3, 0)
    assert link.sent == [encode_ack(len(body))]


async def test_batches_of_one_commit_get_one_ack_at_its_end(journal):
    p = make_pipeline(journal)
    r = Receiver("tt-b", p, journal, Guard())
    a, b = records(1, [1, 2]), records(1, [2, 3, 4])  # seq 2 again: a duplicate
    frames = [
        (ReplBatch(from_=0, to=len(a)), a),
        (ReplBatch(from_=len(a), to=len(a) + len(b)), b),
        (ReplBatch(from_=len(a) + len(b), to=len(a) + len(b) + 7), b""),  # all filtered out
    ]
    link = FakeLink()
    with pytest.raises(LinkClosed, match="test over"):
        await r._batches(link, "tt-a", "ny", 0, frames)
    end = len(a) + len(b) + 7
    assert link.sent == [encode_ack(end)]
    assert (r.received, r.stored, r.duplicates) == (5, 4, 1)
    assert r.per_source["tt-a"] == [5, len(a) + len(b), 1]
    assert r.durable_from["tt-a"] == end
    got = [(rec[2], rec[3]) for batch in journal.raw_batches() for rec in batch]
    assert got == [(1, 1), (1, 2), (1, 3), (1, 4)]


class Queues:
    """The queues' door of the receiver, recording what it hears."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    def translate_in(self, queue: bytes, wire: bytes, origin: str, group: str) -> None:
        pass

    def source_up(self, name: str) -> None:
        self.heard.append(("up", name))

    def source_logon(self, name: str, checking: bool) -> None:
        self.heard.append(("logon" if checking else "checked", name))

    def source_synced(self, name: str) -> None:
        self.heard.append(("synced", name))

    def source_down(self, name: str) -> None:
        self.heard.append(("down", name))


async def test_a_source_is_synced_once_every_batch_below_its_logon_end_is_handed_over(journal):
    """Issue 23: a source that publishes without pause never goes idle; it has caught up once
    the batches reach the journal end it named on its logon (said once per link)."""
    q = Queues()
    r = Receiver("tt-b", make_pipeline(journal), journal, Guard(), queues=q)
    a, b, c = records(1, [1]), records(1, [2]), records(1, [3])
    ends = [len(a), len(a) + len(b), len(a) + len(b) + len(c)]
    heard_then: list[int] = []

    class Link(FakeLink):
        async def read_frames(self):
            heard_then.append(len(q.heard))
            return await super().read_frames()

    link = Link(
        then=[
            [(ReplBatch(from_=ends[0], to=ends[1]), b)],  # reaches the end: synced
            [(ReplBatch(from_=ends[1], to=ends[2]), c)],  # published since: nothing more said
        ]
    )
    with pytest.raises(LinkClosed, match="test over"):
        await r._batches(link, "tt-a", "ny", 0, [(ReplBatch(from_=0, to=ends[0]), a)], ends[1])
    assert heard_then[:2] == [0, 1] and q.heard == [("synced", "tt-a")]


async def test_heartbeats_of_a_source_that_named_its_end_do_not_make_it_synced(journal):
    """Issue 23: a heartbeat is silence, and a source is silent while its logon's answer is on
    its way (a slow password check) or while a write is blocked: a source that named its end
    is synced only when its batches reach it. One that did not (an older version) still syncs
    by going idle."""
    q = Queues()
    r = Receiver("tt-b", make_pipeline(journal), journal, Guard(), queues=q)
    a = records(1, [1])
    link = FakeLink(then=[[(Heartbeat(), b"")], [(ReplBatch(from_=0, to=len(a)), a)]])
    with pytest.raises(LinkClosed, match="test over"):
        await r._batches(link, "tt-a", "ny", 0, [(Heartbeat(), b"")], len(a))
    assert q.heard == [("synced", "tt-a")]  # once, at the batch that reached the end
    q.heard.clear()
    with pytest.raises(LinkClosed, match="test over"):
        await r._batches(FakeLink(), "tt-c", "ny", 0, [(Heartbeat(), b"")], None)
    assert q.heard == [("synced", "tt-c")]


async def test_a_sender_passes_over_heartbeats_until_its_logon_is_answered():
    """Issue 23: a destination whose logon check outlasts the heartbeat interval (an older
    version starts its heartbeats at once) sends them ahead of its answer; the link must not
    end for it (it did: `expected the logon's repl_ack, got Heartbeat`)."""
    ack = ReplAck(status="success", pos=7)
    link = FakeLink(then=[[(Heartbeat(), b"")], [(Heartbeat(), b""), (ack, b"")]])
    assert await Sender._answer(link) == [(ack, b"")]  # type: ignore[arg-type]


async def test_a_sender_gives_up_a_silent_destination_and_one_that_never_answers(monkeypatch):
    """The wait for the logon's answer is bounded twice: DEAD_AFTER of silence, as on a running
    link, and LOGON_ANSWER_MAX in all for a destination that only ever sends heartbeats."""
    monkeypatch.setattr(sender_mod, "DEAD_AFTER", 0.2)
    monkeypatch.setattr(sender_mod, "LOGON_ANSWER_MAX", 1.0)

    class Silent(FakeLink):
        async def read_frames(self):
            await asyncio.sleep(10)

    class Beating(FakeLink):
        async def read_frames(self):
            await asyncio.sleep(0.05)
            return [(Heartbeat(), b"")]

    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await Sender._answer(Silent())  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 0.9
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await Sender._answer(Beating())  # type: ignore[arg-type]
    assert 0.9 < time.monotonic() - t0 < 5


class SlowPasswords:
    """A password store whose check takes CHECK_TAKES (on the checker's worker thread, as
    scrypt does): a loaded machine, or checks queued behind client logons."""

    def authenticate(self, user, password, cert):
        time.sleep(CHECK_TAKES)
        return Identity(user or "repl", "password")


CHECK_TAKES = 2.5


async def test_a_link_whose_logon_check_outlasts_the_silence_bound_comes_up(tmp_path, monkeypatch):
    """Issue 23 (seams campaign): a logon check longer than the 5 s a source gave a silent
    destination never brought the link up (each try was given up, and checked again). Scaled
    down here: the silence bound 1 s, the check 2.5 s; the destination's heartbeats during the
    check keep the source waiting, and the link comes up at the first try."""
    monkeypatch.setattr(sender_mod, "DEAD_AFTER", 1.0)
    monkeypatch.setattr(receiver_mod, "CHECK_QUIET", 0.3)
    monkeypatch.setattr(receiver_mod, "HEARTBEAT_IDLE", 0.2)
    ja = Journal(str(tmp_path / "a"), durability="write")
    jb = Journal(str(tmp_path / "b"), durability="write")
    checker = LogonChecker(SlowPasswords(), workers=1)  # type: ignore[arg-type]
    admins = Entitlement(roles=(Role(name="repl", users=("repl",), allow=Rights(admin=True)),))
    guard = Guard(checker=checker, entitlements=Entitlements(admins))
    receiver = Receiver("tt-b", make_pipeline(jb), jb, guard)
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pa = make_pipeline(ja)
    dest = ReplicationDestination(
        name="tt-b",
        group="ny",
        sync=False,
        addresses=(ReplicationAddress(host="127.0.0.1", port=port),),
        topics=(TopicSpec(name=".*"),),
        user="repl",
    )
    sink = NullAckSink()
    sender = Sender(dest, "tt-a", "ny", ja, pa, sink, password=lambda: "secret")
    sender.start()
    try:
        deadline = time.monotonic() + 4 * CHECK_TAKES
        while "tt-a" not in receiver.links and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert "tt-a" in receiver.links, "the link never came up: the source gave up each check"
    finally:
        await sender.stop()
        await receiver.stop()
        server.close()
        await server.wait_closed()
        checker.close()
        ja.close()
        jb.close()


async def test_nothing_of_a_link_is_taken_after_a_commit_of_it_failed(tmp_path):
    """Issue 23, seams round 79: a replication commit failed on a full disk and ended the link,
    but the receiver still handed on the batches it had read before that; the disk was back,
    they were stored, and with them the source's resume point, past the records that failed.
    The next link resumed there: those records were never sent again (37 acknowledged messages
    missing on one instance). Nothing read on a link after one of its commits failed is taken,
    and the resume point stays below the failed records."""
    io = FaultyIO(ops=["write"], errnos=[errno.ENOSPC], count=1)
    j = Journal(str(tmp_path / "j"), durability="fsync", io=io)
    try:
        p = make_pipeline(j)
        r = Receiver("tt-b", p, j, Guard())
        first, later = records(9, [1, 2, 3]), records(9, [4, 5, 6])
        ends = [len(first), len(first) + len(later)]

        class Link(FakeLink):
            """Hands out `later` as it was read off the socket when the failed commit ended
            the link (the disk is back by then), then says the link is closed."""

            async def read_frames(self):
                for _ in range(500):
                    if self.closed and j.available:
                        break
                    await asyncio.sleep(0.01)
                if self.then:
                    return self.then.pop(0)
                raise LinkClosed(self.reason or "test over")

        link = Link(then=[[(ReplBatch(from_=ends[0], to=ends[1]), later)]])
        with pytest.raises(LinkClosed, match="commit failed here"):
            await r._batches(link, "tt-a", "ny", 0, [(ReplBatch(from_=0, to=ends[0]), first)])
        await _settle(p)
        assert io.failures == 1 and link.sent == []
        assert [rec.seq for rec in j.scan()] == []  # nothing past the records that failed
        assert r.resume_point("tt-a") == 0
        assert j.index.get_meta(REPL_FROM + b"tt-a") in (None, U64.pack(0))
        # the next link resumes at 0 and everything is stored, once
        r2 = Receiver("tt-b", p, j, Guard())
        both = first + later
        with pytest.raises(LinkClosed, match="test over"):
            await r2._batches(FakeLink(), "tt-a", "ny", 0, [(ReplBatch(from_=0, to=ends[1]), both)])
        await _settle(p)
        assert [rec.seq for rec in j.scan()] == [1, 2, 3, 4, 5, 6]
        assert j.index.get_meta(REPL_FROM + b"tt-a") == U64.pack(ends[1])
    finally:
        j.close()


async def test_a_link_from_a_destination_ends_the_senders_back_off(tmp_path, monkeypatch):
    """Seams campaign seed 12 round 137: tt-c was killed; tt-a's sender to it, refused at
    each try, backed off; tt-c restarted and, without tt-a's link for its wait, delivered what
    tt-a had taken over. A link from the destination means it is back: the receiver says so
    (`source_back`), and the sender tries again at once instead of at the end of its back-off."""
    monkeypatch.setattr(sender_mod, "BACKOFF_MIN", 30.0)  # one refused try: a long back-off
    ja = Journal(str(tmp_path / "a"), durability="write")
    jb = Journal(str(tmp_path / "b"), durability="write")
    receiver = Receiver("tt-b", make_pipeline(jb), jb, Guard())
    back: list[str] = []
    receiver.source_back = back.append
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens there: the sender's first try is refused
    dest = ReplicationDestination(
        name="tt-b",
        group="ny",
        sync=False,
        addresses=(ReplicationAddress(host="127.0.0.1", port=port),),
        topics=(TopicSpec(name=".*"),),
    )
    tries: list[str | None] = []
    sender = Sender(dest, "tt-a", "ny", ja, make_pipeline(ja), NullAckSink(),
                    answered=lambda name, seen: tries.append(seen))  # fmt: skip
    sender.start()
    server = None
    try:
        for _ in range(200):
            if tries:
                break
            await asyncio.sleep(0.01)
        assert tries == [None], "the first try was not refused"
        server = await asyncio.start_server(receiver.handle, "127.0.0.1", port)
        sender.retry_now()  # as the app does when tt-b's own link reaches tt-a
        for _ in range(300):
            if "tt-a" in receiver.links:
                break
            await asyncio.sleep(0.01)
        assert "tt-a" in receiver.links, "the sender waited out its back-off"
        assert back == ["tt-a"], "the receiver did not say that tt-a's link came up"
    finally:
        await sender.stop()
        await receiver.stop()
        if server is not None:
            server.close()
            await server.wait_closed()
        ja.close()
        jb.close()
