"""One malformed publish is refused alone (finding: it poisoned its publisher and neighbours),
against a real server: a clear failure ack, the connection stays open, the same client's later
publishes are stored, another client's messages in the same commit are found by bookmark, and
after a restart the logon sequence is right and a resend stores no duplicate.

The tests share one server (a start is most of a test's time): each has its own topic and
client names, and the one that restarts it leaves it running.
"""

import json
import struct

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw

BAD = [
    ({"s": 2**64}, "bad frame"),
    ({"s": -1}, "bad frame"),
    ({"s": 0}, "bad frame"),
    ({"e": "nan"}, "bad frame"),
    ({"e": -5}, "bad frame"),
    ({"x": "x" * 70000}, "bad frame"),
    ({"t": "t" * 70000}, "invalid topic"),
    # a nested value: a well-formed frame, so only this command is refused
    ({"x": {"a": 1}}, "bad frame"),
    ({"x": [1, {"a": "}"}]}, "bad frame"),
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("refusals") / "srv")
    srv.start()
    yield srv
    srv.kill()


@pytest.fixture
def srv(shared):
    """The module's server, started again if a failed test left it stopped."""
    if shared.proc is None or shared.proc.poll() is not None:
        shared.start()
    return shared


def raw_frame(h: dict, body: bytes) -> bytes:
    hb = json.dumps(h).encode()
    return struct.pack(">I", len(hb) + len(body)) + hb + body


@pytest.mark.parametrize(
    "bad,reason", BAD, ids=[next(iter(b)) + "=" + str(next(iter(b.values())))[:10] for b, _ in BAD]
)
def test_a_malformed_publish_is_refused_alone(srv, bad, reason):
    n = BAD.index((bad, reason))
    topic = f"orders-{n}"
    a = Raw(srv.port)
    a.logon(f"pub-a-{n}")
    b = Raw(srv.port)
    b.logon(f"pub-b-{n}")
    # a's good 1..3, a's bad one, a's good 4..6, pipelined; b publishes into the same commits
    frames = [
        raw_frame({"c": "publish", "t": topic, "s": s, "a": "persisted"}, b'{"a":%d}' % s)
        for s in (1, 2, 3)
    ]
    frames.append(
        raw_frame(
            {
                "c": "publish",
                "t": topic,
                "s": 4,
                "a": "processed,persisted",
                "cid": "bad",
                **bad,
            },
            b'{"bad":1}',
        )
    )
    frames += [
        raw_frame({"c": "publish", "t": topic, "s": s, "a": "persisted"}, b'{"a":%d}' % s)
        for s in (4, 5, 6)
    ]
    b.send_raw(
        b"".join(
            raw_frame({"c": "publish", "t": topic, "s": s, "a": "persisted"}, b'{"b":%d}' % s)
            for s in range(1, 21)
        )
    )
    a.send_raw(b"".join(frames))
    refusal = a.ack("processed", "bad")
    assert refusal["status"] == "failure" and refusal["reason"] == reason, refusal
    assert refusal.get("detail")
    a.send({"c": "flush", "cid": "fa", "a": "persisted"})
    assert a.ack("persisted", "fa")["status"] == "success"
    b.send({"c": "flush", "cid": "fb", "a": "persisted"})
    assert b.ack("persisted", "fb")["status"] == "success"
    srv.stop()
    srv.start()
    a2 = Raw(srv.port)
    assert a2.logon(f"pub-a-{n}")["s"] == 6
    # a resend of everything stores nothing twice
    a2.send_raw(
        b"".join(
            raw_frame({"c": "publish", "t": topic, "s": s}, b'{"a":%d}' % s) for s in range(1, 7)
        )
    )
    a2.send({"c": "flush", "cid": "f2", "a": "persisted"})
    a2.ack("persisted", "f2")
    b2 = Raw(srv.port)
    assert b2.logon(f"pub-b-{n}")["s"] == 20
    r = Raw(srv.port)
    r.logon(f"reader-{n}")
    r.subscribe(topic, bm="0")
    got = r.messages(26, timeout=20)
    bodies = [json.loads(body) for _, body in got]
    assert [x["a"] for x in bodies if "a" in x] == [1, 2, 3, 4, 5, 6]
    assert [x["b"] for x in bodies if "b" in x] == list(range(1, 21))
    assert not any("bad" in x for x in bodies)
    # every message of b is found by its bookmark (the index of b's commits is whole)
    for h, _ in got[::5]:
        r2 = Raw(srv.port)
        r2.logon(f"bm-{n}-{h['bm']}")
        r2.subscribe(topic, bm=h["bm"])
        r2.send({"c": "flush", "cid": "x", "a": "completed"})
        r2.ack("completed", "x")
    assert a2.sock.fileno() >= 0


def test_a_field_of_the_wrong_type_keeps_the_connection(srv):
    c = Raw(srv.port)
    c.logon("typed")
    c.send({"c": "publish", "t": "typed", "s": "twelve", "a": "processed", "cid": "t1"}, b"{}")
    a = c.ack("processed", "t1")
    assert (
        a["status"] == "failure" and a["reason"] == "bad frame" and "decimal integer" in a["detail"]
    )
    c.send({"c": "publish", "t": "typed", "s": 1, "a": "persisted"}, b"{}")
    assert c.ack("persisted")["status"] == "success"


UNDECODABLE = [
    b'{"c":"publish","t":"a\xff\xfe","s":1}',
    b'{"c":"publish","s":1,"x":' + b"[" * 50000 + b"]" * 50000 + b"}",
]


@pytest.mark.parametrize("header", UNDECODABLE)
def test_undecodable_headers_get_a_bad_frame_ack_and_a_warning(srv, header):
    n = UNDECODABLE.index(header)
    mark = srv.log_mark()
    c = Raw(srv.port)
    c.logon(f"garbage-{n}")
    c.send_raw(struct.pack(">I", len(header)) + header)
    a = c.ack()
    assert a["status"] == "failure" and a["reason"] == "bad frame"
    assert c.closed()
    srv.wait_for_log(r"WARNING .*bad frame", since=mark)
    other = Raw(srv.port)  # the server is fine
    other.logon(f"after-{n}")
