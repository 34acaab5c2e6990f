"""Live fan-out of a committed batch in runs (one buffer per connection per run of messages on
one topic) sends the same bytes as a frame per message and subscription, in the same order."""

from __future__ import annotations

import re

from protocol.options import subscribe_options
from server import frames
from server.fanout import Fanout, Message
from server.outbox import Outbox
from server.router import Router
from server.subscriptions import Subscription, SubState
from tests.server.core_harness import FakeTransport, split_frames


class Owner:
    def describe(self) -> str:
        return "test"


def build() -> tuple[Fanout, list[FakeTransport]]:
    """Connections with every kind of subscription the run path must tell apart."""
    fanout = Fanout(Router())
    transports: list[FakeTransport] = []

    def conn() -> Outbox:
        t = FakeTransport()
        out = Outbox(1 << 30, lambda reason: None)
        out.attach(t)
        transports.append(t)
        return out

    def sub(out, sub_id, topic, opts=None, filt=None, regex=None, bm=None, state=SubState.LIVE):
        s = Subscription(
            Owner(),
            out,
            sub_id,
            topic,
            regex,
            filt,
            None,
            subscribe_options(opts),
            frozenset(),
            None,
            bm,
        )
        s.state = state
        fanout.router.add(s)

    a = conn()  # two on one connection (sids), one of them with timestamps
    sub(a, "a1", "t")
    sub(a, "a2", "t", opts="timestamp")
    sub(conn(), "b", "t")  # plain: a prefix length shared with others
    sub(conn(), "c", "t")
    sub(conn(), "a-longer-id", "t")  # plain, another prefix length
    sub(conn(), "ts", "t", opts="timestamp")
    sub(conn(), "f", "t", filt=lambda doc: doc.get("n", 0) % 2 == 0)  # filtered
    # a bookmark subscription over a pattern: recorded topics only
    sub(conn(), "r", "t|u", regex=re.compile("t|u"), bm="0")
    sub(conn(), "any", "t|u", regex=re.compile("t|u"))
    sub(conn(), "early", "t", state=SubState.LIVE_EARLY)  # not for committed messages
    return fanout, transports


def message(topic: str, n: int, recorded: bool = True, hdr: bytes = b"") -> Message:
    tj = frames.topic_member_text(topic)
    body = b'{"n":%d}' % n
    ts = 1_700_000_000_000_000 + n
    if recorded:
        suffix = frames.LIVE_SUFFIX % (tj, 7, n, hdr)
        return Message(topic, 7, n, ts, body, suffix, 1000 + n, None, hdr)
    return Message(topic, 7, n, ts, body, tj + hdr, -1, None, hdr)


def batch() -> list[Message]:
    return [
        *(message("t", n) for n in range(1, 6)),
        message("u", 6),
        message("t", 7, hdr=b',"x":"k"'),
        message("t", 8),
        message("t", 9, recorded=False),  # a run mixing recorded and not
        message("t", 10),
        message("u", 11, recorded=False),
        message("u", 12, recorded=False),
        message("t", 13),
    ]


def per_message(fanout: Fanout, msgs: list[Message]) -> None:
    """The reference: every message on its own, a frame per connection."""
    touched: set[Outbox] = set()
    for m in msgs:
        fanout._each([m], SubState.LIVE, touched)
    for out in touched:
        out.flush()


def test_runs_send_the_bytes_of_a_frame_per_message() -> None:
    fanout, got = build()
    fanout.deliver(batch())
    ref_fanout, want = build()
    per_message(ref_fanout, batch())
    assert [bytes(t.data) for t in got] == [bytes(t.data) for t in want]
    assert fanout.delivered > 0
    # the subscriptions that take everything got every message, in order, in one run each
    bodies = [f.body for f in split_frames(bytes(got[1].data))]
    assert bodies == [b'{"n":%d}' % n for n in (1, 2, 3, 4, 5, 7, 8, 9, 10, 13)]
    sids = {f.header["sids"] for f in split_frames(bytes(got[0].data))}
    assert sids == {"a1,a2"}
    assert not got[-1].data  # LIVE_EARLY gets committed messages no second time


def test_a_run_with_unrecorded_messages_only() -> None:
    fanout, got = build()
    msgs = [message("u", n, recorded=False) for n in range(1, 4)]
    fanout.deliver(msgs)
    ref_fanout, want = build()
    per_message(ref_fanout, msgs)
    assert [bytes(t.data) for t in got] == [bytes(t.data) for t in want]
    assert not got[6].data  # the bookmark pattern subscription: recorded topics only
    assert len(split_frames(bytes(got[7].data))) == 3


def test_live_separators_join_to_write_live() -> None:
    parts = [(b',"t":"t"', b""), (b',"t":"t","bm":"1|2|"', b"x"), (b',"t":"u"', b"y" * 300)]
    rests = [suffix + b"}" + body for suffix, body in parts]
    for prefix in (frames.sub_prefix("s"), frames.group_prefix(["a", "bb"])):
        ref: list[bytes] = []
        for suffix, body in parts:
            frames.write_live(ref, prefix, suffix, b"", body)
        assert prefix.join(frames.live_separators(len(prefix), rests)) == b"".join(ref)
        one = frames.live_separators(len(prefix), rests[:1])
        assert prefix.join(one) == b"".join(ref[:5])
