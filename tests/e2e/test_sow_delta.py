"""Delta subscriptions (`delta_subscribe`, `sow_and_delta_subscribe`; docs/sow.md) against a real
server: a change to a record the subscriber was sent arrives as only the fields that changed
(with `k`), a new record whole; `send_keys`, `no_empties`, and a filter's "was sent"."""

import json

import pytest

from server.sow.delta import delta_body
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

SOW = """<SOW>
  <Topic><Name>px</Name><Key>/sym</Key></Topic>
  <Topic><Name>deep</Name><Key>/id/a</Key></Topic>
</SOW>"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("delta"), extra=SOW).start()
    yield s
    s.stop()


def pub(c: Raw, topic: str, body: dict, cmd: str = "publish") -> None:
    c.send({"c": cmd, "t": topic}, json.dumps(body))


def flush(c: Raw) -> None:
    cid = c.next_cid()
    c.send({"c": "flush", "cid": cid, "a": "completed"})
    c.ack("completed", cid)


def subscriber(srv, name: str, cmd: str, **extra) -> tuple[Raw, list[dict]]:
    """A connection with one delta subscription; the bodies of its answer (sow frames)."""
    c = Raw(srv.port)
    c.logon(name)
    acks = "completed" if cmd.startswith("sow_and") else "processed"
    c.send({"c": cmd, "t": "px", "cid": "s", "sub_id": name, "a": acks, **extra})
    frames = c.recv_until(lambda h, _b: h.get("c") == "ack" and h.get("cid") == "s")
    assert frames[-1][0]["status"] == "success", frames[-1][0]
    return c, [json.loads(b) for h, b in frames if h.get("c") == "sow"]


def test_the_delta_of_two_bodies():
    old = b'{"sym":"A","px":1,"q":{"a":1,"b":2},"arr":[1],"n":1}'
    new = b'{"sym":"A","px":2,"q":{"a":1,"b":3},"arr":[1],"n":1.0,"new":true}'
    assert json.loads(delta_body(old, new)) == {"px": 2, "q": {"b": 3}, "n": 1.0, "new": True}
    assert json.loads(delta_body(old, new, ("/sym",))) == {
        "px": 2, "q": {"b": 3}, "n": 1.0, "new": True, "sym": "A"
    }  # fmt: skip
    assert delta_body(old, old) is None
    assert delta_body(old, b"[1]") == b"[1]"  # not an object: whole


def test_changes_arrive_as_deltas_new_records_whole(srv):
    c = Raw(srv.port)
    c.logon("dp")
    pub(c, "px", {"sym": "A", "px": 1, "q": {"a": 1, "b": 2}, "v": "x"})
    flush(c)
    s1, answer = subscriber(srv, "sd1", "sow_and_delta_subscribe", o="send_keys")
    assert answer == [{"sym": "A", "px": 1, "q": {"a": 1, "b": 2}, "v": "x"}]  # whole
    s2, _ = subscriber(srv, "sd2", "delta_subscribe", f="/px < 5")
    s3, _ = subscriber(srv, "sd3", "delta_subscribe", o="no_empties")
    pub(c, "px", {"sym": "A", "px": 2, "q": {"a": 1, "b": 2}, "v": "x"})  # px changed
    pub(c, "px", {"sym": "B", "px": 7})  # a new record: whole
    pub(c, "px", {"sym": "A", "q": {"b": 3}}, cmd="delta_publish")  # merged: q.b changed
    pub(c, "px", {"sym": "A", "px": 2, "q": {"a": 1, "b": 3}, "v": "x"})  # nothing changed
    pub(c, "px", {"sym": "A", "px": 10, "q": {"a": 1, "b": 3}, "v": "x"})  # out of sd2's filter
    pub(c, "px", {"sym": "A", "px": 3, "q": {"a": 1, "b": 3}, "v": "x"})  # back: whole for sd2
    flush(c)
    got1 = [(h["k"], json.loads(b)) for h, b in s1.messages(6)]
    ka = got1[0][0]
    assert got1 == [
        (ka, {"px": 2, "sym": "A"}),
        (got1[1][0], {"sym": "B", "px": 7}),
        (ka, {"q": {"b": 3}, "sym": "A"}),
        (ka, {}),
        (ka, {"px": 10, "sym": "A"}),
        (ka, {"px": 3, "sym": "A"}),
    ]
    got2 = [json.loads(b) for _, b in s2.messages(4)]
    assert got2 == [
        {"px": 2},
        {"q": {"b": 3}},
        {},
        {"sym": "A", "px": 3, "q": {"a": 1, "b": 3}, "v": "x"},  # A at px 10 was not sent
    ]
    got3 = [json.loads(b) for _, b in s3.messages(5)]
    assert got3 == [{"px": 2}, {"sym": "B", "px": 7}, {"q": {"b": 3}}, {"px": 10}, {"px": 3}]


def test_refusals(srv):
    c = Raw(srv.port)
    c.logon("dr")
    c.send({"c": "delta_subscribe", "t": "plain", "cid": "1", "a": "processed"})
    assert c.ack("processed", "1")["reason"] == "invalid topic"
    c.send({"c": "delta_subscribe", "t": "px", "cid": "2", "a": "processed", "bm": "0"})
    assert c.ack("processed", "2")["reason"] == "invalid bookmark"
    c.send({"c": "delta_subscribe", "t": "px", "cid": "3", "a": "processed", "o": "conflation=1s"})
    assert c.ack("processed", "3")["reason"] == "invalid options"
