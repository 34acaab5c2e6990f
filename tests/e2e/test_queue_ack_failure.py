"""A queue acknowledgement whose commit fails (disk full) against a real server on a small tmpfs.

The ack's reply says `failure`, but the consumer's message has left its lease in memory; the
event must still reach the journal with the next commit once space is back, so the queue's state
in memory and on disk agree: the message is neither stranded (not redelivered while the server
runs, yet delivered again after a restart) nor lost.
"""

import json
import os
import time

from tests.support.disk import fill
from tests.support.proc import FAST_PROBE, ServerProcess
from tests.support.raw import Raw, publish_many

QUEUE = """<SOW><Queue><Name>ackfail-q</Name><UnderlyingTopic>ackfail</UnderlyingTopic>
  <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue></SOW>"""


def consume(port, name, n):
    c = Raw(port)
    c.logon(name)
    c.send(
        {"c": "subscribe", "t": "ackfail-q", "cid": "q", "a": "processed", "o": "max_backlog=1000"}
    )
    assert c.ack("processed", "q")["status"] == "success"
    return c, (c.messages(n) if n else [])


def use_up_the_runway(port) -> None:
    """On a full disk the journal still takes commits into the zeros it wrote ahead of its
    records (its runway, docs/durability.md): publish large messages to a topic outside the
    queue until one needs new space and fails, leaving the journal unavailable."""
    pad = Raw(port)
    pad.logon("af-pad")
    for s in range(1, 500):
        pad.send({"c": "publish", "t": "ackfail-pad", "s": s, "a": "persisted"}, "p" * 60_000)
        if pad.ack("persisted")["status"] == "failure":
            pad.close()
            return
    raise AssertionError("the journal never ran out of space")


def test_an_ack_whose_commit_failed_is_committed_later_not_stranded(small_disk):
    srv = ServerProcess(small_disk / "srv", extra=QUEUE, env=FAST_PROBE)
    srv.start()
    try:
        n = 800  # one ack event of n positions is several pages: it cannot fit in the last page's slack
        publish_many(
            srv.port, "ackfail", [json.dumps({"i": i}) for i in range(1, n + 1)], name="af-pub"
        )
        c, got = consume(srv.port, "af-cons", n)
        assert [json.loads(b)["i"] for _, b in got] == list(range(1, n + 1))
        filler = small_disk / "filler"
        fill(filler)
        use_up_the_runway(srv.port)
        c.send(
            {
                "c": "sow_delete",
                "t": "ackfail-q",
                "bm": ",".join(h["bm"] for h, _ in got[:-1]),
                "cid": "k1",
                "a": "processed",
            }
        )
        a = c.ack("processed", "k1")
        assert a["status"] == "failure" and a["reason"] == "journal unavailable", a
        os.unlink(filler)
        # the next commit (a publish) carries the failed ack event with it
        pub = Raw(srv.port)
        pub.logon("af-pub2")
        deadline = time.monotonic() + 30
        while (
            True
        ):  # the journal comes back by itself (a probe every 50 ms here): resend until then
            pub.send(
                {"c": "publish", "t": "ackfail", "s": 1, "a": "persisted", "cid": "p6"},
                json.dumps({"i": 6}),
            )
            if pub.ack("persisted")["status"] == "success":
                break
            assert time.monotonic() < deadline, "the journal did not recover after space came back"
            time.sleep(0.3)
        ((h6, b6),) = c.messages(1)
        assert json.loads(b6)["i"] == 6
        c.send(
            {
                "c": "sow_delete",
                "t": "ackfail-q",
                "bm": ",".join(h["bm"] for h, _ in [got[-1], (h6, b6)]),
                "cid": "k2",
                "a": "processed",
            }
        )
        assert c.ack("processed", "k2")["status"] == "success"
        c.close()
        assert srv.stop() == 0
        srv.start()
        c2, _ = consume(srv.port, "af-cons2", 0)
        c2.send({"c": "flush", "cid": "f", "a": "completed"})
        left = [
            json.loads(b)["i"]
            for h, b in c2.recv_until(lambda h, b: h.get("cid") == "f")
            if h["c"] == "p"
        ]
        time.sleep(0.5)
        c2.send({"c": "flush", "cid": "f2", "a": "completed"})
        left += [
            json.loads(b)["i"]
            for h, b in c2.recv_until(lambda h, b: h.get("cid") == "f2")
            if h["c"] == "p"
        ]
        # nothing comes back after the restart: the ack that failed went out with the next commit
        assert left == []
    finally:
        srv.kill()
