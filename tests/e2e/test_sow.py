"""State of the World (docs/sow.md; docs/protocol.md §14) against a real server: keys, queries
and their options, sow_delete, refusals, and the store across a restart."""

import json
import time

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

SOW = """<SOW>
  <Topic><Name>prices</Name><Key>/sym</Key></Topic>
  <Topic><Name>pairs</Name><Key>/a</Key><Key>/b</Key></Topic>
  <Topic><Name>free</Name></Topic>
  <Topic><Name>md\\..*</Name><Key>/id</Key></Topic>
</SOW>"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("sow"), extra=SOW).start()
    yield s
    s.stop()


def query(c: Raw, topic: str, acks="completed,stats", **extra):
    """Send a sow query; returns (records as (header, body dict), completed ack, stats ack,
    every frame in order)."""
    cid = c.next_cid()
    c.send({"c": "sow", "t": topic, "cid": cid, "a": acks, **extra})
    want = set(acks.split(","))

    def last(h, _body):
        if h.get("c") != "ack" or h.get("cid") != cid:
            return False
        want.discard(h.get("a"))
        return not want or h.get("status") == "failure"

    frames = c.recv_until(last)
    recs = [(h, json.loads(b)) for h, b in frames if h.get("c") == "sow"]
    acks_by = {h["a"]: h for h, _ in frames if h.get("c") == "ack"}
    return recs, acks_by.get("completed"), acks_by.get("stats"), frames


def pub(c: Raw, topic: str, body: dict, **extra) -> None:
    c.send({"c": "publish", "t": topic, **extra}, json.dumps(body))


def flush(c: Raw) -> None:
    cid = c.next_cid()
    c.send({"c": "flush", "cid": cid, "a": "completed"})
    c.ack("completed", cid)


def test_latest_message_per_key(srv):
    c = Raw(srv.port)
    c.logon("p1")
    for i in range(3):
        pub(c, "prices", {"sym": "A", "px": i})
    pub(c, "prices", {"sym": "B", "px": 10}, x="corr")
    flush(c)
    recs, completed, stats, frames = query(c, "prices")
    assert [f[0]["c"] for f in frames[:1]] == ["group_begin"]
    assert [h["c"] for h, _ in frames].index("group_end") == len(recs) + 1
    assert sorted((b["sym"], b["px"]) for _, b in recs) == [("A", 2), ("B", 10)]
    h_b = next(h for h, b in recs if b["sym"] == "B")
    assert h_b["t"] == "prices" and h_b["x"] == "corr" and h_b["bm"].count("|") == 2 and h_b["k"]
    assert completed["status"] == "success" and completed["bm"].count("|") == 2
    assert (stats["records_returned"], stats["topic_matches"]) == (2, 2)


def test_filter_top_n_order_by_skip_n_and_keys(srv):
    c = Raw(srv.port)
    c.logon("p2")
    for i in range(10):
        pub(c, "pairs", {"a": i % 5, "b": i // 5, "v": i})
    flush(c)
    recs, *_ = query(c, "pairs", f="/v >= 4")
    assert sorted(b["v"] for _, b in recs) == [4, 5, 6, 7, 8, 9]
    recs, _, stats, _ = query(c, "pairs", order_by="/v DESC", top_n=3)
    assert [b["v"] for _, b in recs] == [9, 8, 7]
    assert stats["topic_matches"] == 10 and stats["records_returned"] == 3
    recs, *_ = query(c, "pairs", order_by="/b DESC, /a", o="skip_n=2,top_n=3")
    assert [b["v"] for _, b in recs] == [7, 8, 9]
    k7 = next(h["k"] for h, b in recs if b["v"] == 7)
    recs, *_ = query(c, "pairs", sow_keys=k7, o="no_sowkey")
    assert [b["v"] for _, b in recs] == [7] and "k" not in recs[0][0]


def test_same_key_values_same_k(srv):
    c = Raw(srv.port)
    c.logon("p3")
    pub(c, "pairs", {"a": "x", "b": 1, "v": 1})
    pub(c, "pairs", {"b": 1, "a": "x", "v": 2})
    pub(c, "pairs", {"a": "x", "b": "1", "v": 3})
    flush(c)
    recs, *_ = query(c, "pairs", f="/a = 'x'")
    assert sorted(b["v"] for _, b in recs) == [2, 3]
    assert len({h["k"] for h, _ in recs}) == 2


def test_publisher_given_keys_and_bad_sow_key(srv):
    c = Raw(srv.port)
    c.logon("p4")
    pub(c, "free", {"v": 1}, k="one")
    pub(c, "free", {"v": 2}, k="one")
    c.send({"c": "publish", "t": "free", "cid": "nokey", "a": "processed"}, b'{"v":3}')
    ack = c.ack("processed", "nokey")
    assert ack["status"] == "failure" and ack["reason"] == "bad sow key"
    c.send({"c": "publish", "t": "prices", "cid": "nosym", "a": "processed"}, b'{"px":3}')
    ack = c.ack("processed", "nosym")
    assert ack["reason"] == "bad sow key" and "/sym" in ack["detail"]
    flush(c)
    recs, *_ = query(c, "free")
    assert [(h["k"], b["v"]) for h, b in recs] == [("one", 2)]


def test_deliveries_of_a_sow_topic_carry_k(srv):
    sub = Raw(srv.port)
    sub.logon("s5")
    sub.subscribe("prices")
    c = Raw(srv.port)
    c.logon("p5")
    pub(c, "prices", {"sym": "Z", "px": 1})
    ((h, _),) = sub.messages(1)
    assert h["k"]


def test_regex_topics_and_refusals(srv):
    c = Raw(srv.port)
    c.logon("p6")
    pub(c, "md.a", {"id": 1})
    pub(c, "md.b", {"id": 1})
    pub(c, "other", {"id": 1})
    flush(c)
    recs, *_ = query(c, "md\\..*")
    assert sorted(h["t"] for h, _ in recs) == ["md.a", "md.b"]
    for topic, extra, reason in [
        ("other", {}, "invalid topic"),
        ("prices", {"order_by": "/px SIDEWAYS"}, "bad order by"),
        ("prices", {"f": "/px >"}, "bad filter"),
        ("prices", {"o": "live"}, "invalid options"),
    ]:
        _, completed, _, _ = query(c, topic, **extra)
        assert completed["status"] == "failure" and completed["reason"] == reason, completed


def test_an_empty_answer_still_has_its_group(srv):
    c = Raw(srv.port)
    c.logon("p7")
    recs, completed, stats, frames = query(c, "prices", f="/sym = 'nothing'", query_id="q1")
    assert recs == []
    assert [h["c"] for h, _ in frames[:2]] == ["group_begin", "group_end"]
    assert frames[0][0]["query_id"] == "q1"
    assert stats["records_returned"] == 0


def test_sow_delete_by_keys_filter_and_body(srv):
    c = Raw(srv.port)
    c.logon("p8")
    for s in "CDEFG":
        pub(c, "prices", {"sym": s, "px": ord(s)})
    flush(c)
    recs, *_ = query(c, "prices", f="/sym IN ('C','D','E','F','G')")
    keys = {b["sym"]: h["k"] for h, b in recs}
    c.send({"c": "sow_delete", "t": "prices", "cid": "d1", "a": "stats", "sow_keys": keys["C"]})
    assert c.ack("stats", "d1")["records_deleted"] == 1
    c.send({"c": "sow_delete", "t": "prices", "cid": "d2", "a": "stats", "f": "/px >= 70"})
    assert c.ack("stats", "d2")["records_deleted"] == 2
    c.send({"c": "sow_delete", "t": "prices", "cid": "d3", "a": "stats"}, b'{"sym":"D"}')
    assert c.ack("stats", "d3")["records_deleted"] == 1
    recs, *_ = query(c, "prices", f="/sym IN ('C','D','E','F','G')")
    assert [b["sym"] for _, b in recs] == ["E"]


def test_sow_delete_of_everything(srv):
    c = Raw(srv.port)
    c.logon("p8b")
    for s in "VWXYZ":
        pub(c, "md.all", {"id": s})
    flush(c)
    c.send({"c": "sow_delete", "t": "md.all", "cid": "all", "a": "stats", "f": "1=1"})
    assert c.ack("stats", "all")["records_deleted"] == 5
    recs, *_ = query(c, "md.all")
    assert recs == []


def test_the_store_survives_a_restart_and_a_kill(tmp_path):
    s = ServerProcess(tmp_path, extra=SOW).start()
    try:
        c = publish_many(
            s.port, "prices", [json.dumps({"sym": f"S{i % 50}", "px": i}) for i in range(500)]
        )
        c.send({"c": "sow_delete", "t": "prices", "cid": "d", "a": "stats", "f": "/sym = 'S0'"})
        assert c.ack("stats", "d")["records_deleted"] == 1
        c.close()
        s.restart()
        c = Raw(s.port)
        c.logon("after")
        recs, *_ = query(c, "prices")
        assert len(recs) == 49 and min(b["px"] for _, b in recs) == 451
        publish_many(s.port, "prices", [json.dumps({"sym": "S1", "px": -1})], name="p2").close()
        s.kill()
        s.start()
        s.wait_for_log("SOW store at journal position")
        c = Raw(s.port)
        c.logon("after2")
        recs, *_ = query(c, "prices", f="/sym = 'S1'")
        assert [b["px"] for _, b in recs] == [-1]
    finally:
        s.stop()


def test_delta_publish_merges_into_the_record(srv):
    sub = Raw(srv.port)
    sub.logon("s9")
    sub.subscribe("prices", f="/sym = 'D1'")
    c = Raw(srv.port)
    c.logon("p9")
    pub(c, "prices", {"sym": "D1", "px": 1, "q": {"a": 1, "b": 2}, "arr": [1, 2]})
    # at once, before the first is durable: it merges into the accepted message
    c.send({"c": "delta_publish", "t": "prices"}, b'{"sym":"D1","q":{"b":3},"arr":[9]}')
    c.send({"c": "delta_publish", "t": "prices"}, b'{"sym":"D2","px":7}')  # no record: inserted
    c.send({"c": "delta_publish", "t": "plain", "cid": "np", "a": "processed"}, b"[1]")
    assert c.ack("processed", "np")["status"] == "success"  # not a SOW topic: a plain publish
    c.send({"c": "delta_publish", "t": "prices", "cid": "bad", "a": "processed"}, b"[1]")
    assert c.ack("processed", "bad")["reason"] == "bad frame"
    flush(c)
    merged = {"sym": "D1", "px": 1, "q": {"a": 1, "b": 3}, "arr": [9]}
    recs, *_ = query(c, "prices", f="/sym IN ('D1','D2')", order_by="/sym")
    assert [b for _, b in recs] == [merged, {"sym": "D2", "px": 7}]
    (_, first), (_, second) = sub.messages(2)
    assert json.loads(second) == merged


def test_records_expire_after_their_topic_expiration(tmp_path):
    extra = "<SOW><Topic><Name>ttl</Name><Key>/k</Key><Expiration>1s</Expiration></Topic></SOW>"
    s = ServerProcess(tmp_path, extra=extra).start()
    try:
        c = Raw(s.port)
        c.logon("e1")
        pub(c, "ttl", {"k": 1})
        pub(c, "ttl", {"k": 2})
        flush(c)
        assert len(query(c, "ttl")[0]) == 2
        time.sleep(0.7)
        pub(c, "ttl", {"k": 2, "v": "again"})  # an update restarts its clock
        flush(c)
        time.sleep(0.7)
        recs, *_ = query(c, "ttl")
        assert [b for _, b in recs] == [{"k": 2, "v": "again"}]
        time.sleep(0.8)
        assert query(c, "ttl")[0] == []
        c.close()
        s.restart()  # the expirations were journaled: nothing comes back
        c = Raw(s.port)
        c.logon("e2")
        assert query(c, "ttl")[0] == []
    finally:
        s.stop()


def test_out_of_focus_notices(srv):
    c = Raw(srv.port)
    c.logon("p10")
    pub(c, "prices", {"sym": "O1", "px": 10})
    pub(c, "prices", {"sym": "O2", "px": 20})
    flush(c)
    sub = Raw(srv.port)
    sub.logon("s10")
    sub.send({"c": "sow_and_subscribe", "t": "prices", "cid": "o", "sub_id": "oo",
              "f": "/sym LIKE '^O' AND /px > 5", "o": "oof", "a": "completed"})  # fmt: skip
    got = sub.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == "o")
    assert sorted(json.loads(b)["sym"] for h, b in got if h["c"] == "sow") == ["O1", "O2"]
    k1 = next(h["k"] for h, b in got if h["c"] == "sow" and json.loads(b)["sym"] == "O1")
    time.sleep(0.2)  # the subscription joins the live stream
    pub(c, "prices", {"sym": "O1", "px": 1})  # out of the filter: oof match, body = new
    c.send({"c": "sow_delete", "t": "prices", "cid": "d", "a": "stats"}, b'{"sym":"O2"}')
    c.ack("stats", "d")
    frames = sub.recv_until(lambda h, b: h.get("c") == "oof" and h.get("reason") == "deleted")
    oofs = [(h["reason"], h["k"], json.loads(b)) for h, b in frames if h["c"] == "oof"]
    assert oofs[0] == ("match", k1, {"sym": "O1", "px": 1})
    assert oofs[1][0] == "deleted" and oofs[1][2] == {"sym": "O2", "px": 20}
    assert all(h["sub_id"] == "oo" for h, _ in frames if h["c"] == "oof")
    assert not [h for h, _ in frames if h["c"] == "p"]  # the update did not match: no delivery
