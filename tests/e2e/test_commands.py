"""Every command of docs/protocol.md §3 against a real server process, over raw frames."""

import json
import struct
import time
import urllib.request

import pytest

from tests.support.raw import Raw


def pub(c: Raw, topic, body, **extra):
    c.send({"c": "publish", "t": topic, **extra}, body)


def test_logon_must_be_first(shared_server):
    c = Raw(shared_server.port)
    c.send({"c": "subscribe", "t": "orders", "cid": "1", "a": "processed"})
    ack = c.ack("processed")
    assert ack["status"] == "failure" and ack["reason"] == "logon required"
    assert c.closed()
    shared_server.wait_for_log("reason=logon required")


def test_logon_without_client_name_is_refused(shared_server):
    c = Raw(shared_server.port)
    c.send({"c": "logon", "cid": "1", "a": "processed"})
    ack = c.ack("processed")
    assert ack["reason"] == "logon required" and "client_name" in ack["detail"]
    assert c.closed()


def test_publish_subscribe_persisted_and_bookmarks(shared_server):
    s = Raw(shared_server.port)
    s.logon("ps-sub")
    sub_ack = s.subscribe("orders", sub_id="mine")
    assert sub_ack["sub_id"] == "mine"
    p = Raw(shared_server.port)
    assert p.logon("ps-pub")["s"] == 0
    for i in range(1, 11):
        pub(p, "orders", json.dumps({"i": i}), s=i, a="persisted", x=f"corr-{i}")
    acks = [p.ack("persisted")]
    while acks[-1]["s"] < 10:
        acks.append(p.ack("persisted"))
    assert all(a["status"] == "success" and "cid" not in a for a in acks)
    msgs = s.messages(10)
    assert [json.loads(b)["i"] for _, b in msgs] == list(range(1, 11))
    h = msgs[0][0]
    assert h["sub_id"] == "mine" and h["t"] == "orders" and h["x"] == "corr-1"
    pid, seq, tail = h["bm"].split("|")
    assert int(pid) > 0 and seq == "1" and tail == ""


def test_server_assigned_sequence_and_processed_ack(shared_server):
    p = Raw(shared_server.port)
    p.logon("noseq-pub")
    pub(p, "orders", "{}", cid="a", a="processed")
    a1 = p.ack("processed", "a")
    pub(p, "orders", "{}", cid="b", a="processed")
    a2 = p.ack("processed", "b")
    assert a2["s"] == a1["s"] + 1 and a1["status"] == "success"


def test_duplicate_publish_is_acked_not_stored(shared_server):
    s = Raw(shared_server.port)
    s.logon("dup-sub")
    s.subscribe("orders", f="/dup = 1")
    p = Raw(shared_server.port)
    p.logon("dup-pub")
    pub(p, "orders", '{"dup":1,"n":1}', s=1, a="persisted")
    pub(p, "orders", '{"dup":1,"n":2}', s=2, a="persisted")
    assert p.ack("persisted")["s"] in (1, 2)
    pub(p, "orders", '{"dup":1,"n":99}', s=2, cid="d", a="processed,persisted")
    ack = p.ack("processed", "d")
    assert ack["status"] == "success" and ack["reason"] == "duplicate" and ack["s"] == 2
    persisted = p.ack("persisted")
    assert persisted["s"] >= 2
    pub(p, "orders", '{"dup":1,"n":3}', s=3)
    got = [json.loads(b)["n"] for _, b in s.messages(3)]
    assert got == [1, 2, 3]


def test_regex_subscription_and_sids(shared_server):
    s = Raw(shared_server.port)
    s.logon("rx-sub")
    s.subscribe("md\\..*", sub_id="all-md")
    s.subscribe("md.eq", sub_id="eq")
    p = Raw(shared_server.port)
    p.logon("rx-pub")
    pub(p, "md.eq", '{"a":1}')
    pub(p, "md.fx", '{"a":2}')
    pub(p, "mdXfx", '{"a":3}')  # md.eq's '.' would match this literally, but md\\..* does not
    msgs = s.messages(2)
    first, second = msgs[0][0], msgs[1][0]
    assert first["t"] == "md.eq" and set(first["sids"].split(",")) == {"all-md", "eq"}
    assert second["t"] == "md.fx" and second["sids"] == "all-md"


def test_content_filter(shared_server):
    s = Raw(shared_server.port)
    s.logon("f-sub")
    s.subscribe("orders", f="/px > 100 AND /sym IN ('A', 'B')")
    p = Raw(shared_server.port)
    p.logon("f-pub")
    for body in (
        '{"px":50,"sym":"A"}',
        '{"px":150,"sym":"C"}',
        '{"px":150,"sym":"B"}',
        "not json",
        '{"px":101,"sym":"A"}',
    ):
        pub(p, "orders", body)
    got = [json.loads(b) for _, b in s.messages(2)]
    assert got == [{"px": 150, "sym": "B"}, {"px": 101, "sym": "A"}]


def test_unsubscribe(shared_server):
    s = Raw(shared_server.port)
    s.logon("u-sub")
    s.subscribe("t.unsub", sub_id="x")
    s.subscribe("t.unsub2", sub_id="y")
    s.send({"c": "unsubscribe", "sub_id": "x", "cid": "u", "a": "processed"})
    assert s.ack("processed", "u")["status"] == "success"
    p = Raw(shared_server.port)
    p.logon("u-pub")
    pub(p, "t.unsub", "{}")
    pub(p, "t.unsub2", '{"y":1}')
    ((h, b),) = s.messages(1)
    assert h["sub_id"] == "y"
    s.send({"c": "unsubscribe", "sub_id": "all", "cid": "v", "a": "processed"})
    s.ack("processed", "v")
    pub(p, "t.unsub2", "{}")
    s.send({"c": "flush", "cid": "f", "a": "completed"})
    frames = s.recv_until(lambda h, b: h.get("a") == "completed")
    assert [h for h, _ in frames if h["c"] == "p"] == []


def test_flush_waits_for_persistence(shared_server):
    p = Raw(shared_server.port)
    p.logon("fl-pub")
    for i in range(1, 201):
        pub(p, "orders", "{}", s=i)
    p.send({"c": "flush", "cid": "f1", "a": "persisted"})
    ack = p.ack("persisted", "f1")
    assert ack["status"] == "success"
    # logon from another connection with the same name sees all 200 as stored
    q = Raw(shared_server.port)
    assert q.logon("fl-pub")["s"] == 200


def test_name_in_use(shared_server):
    a = Raw(shared_server.port)
    a.logon("twin", user_id="alice")
    b = Raw(shared_server.port)
    b.send(
        {"c": "logon", "cid": "1", "client_name": "twin", "user_id": "mallory", "a": "processed"}
    )
    ack = b.ack("processed")
    assert ack["status"] == "failure" and ack["reason"] == "name in use"
    assert b.closed()
    c = Raw(shared_server.port)
    assert c.logon("twin", user_id="alice")["status"] == "success"
    assert a.closed()  # the old connection of the same user is replaced
    shared_server.wait_for_log("client=twin .*reason=name in use")


@pytest.mark.parametrize(
    "frame,words",
    [
        (struct.pack(">I", 9) + b"not json!", "JSON object"),
        (struct.pack(">I", 6) + b'{"t":1', "JSON object"),
        (struct.pack(">I", 8) + b'{"t":"x"}'[:8], "JSON object"),
        (struct.pack(">I", 11) + b'{"t":"abc"}', "no command"),
        (struct.pack(">I", 17 * 1024 * 1024), "exceeds MaxMessageSize"),
    ],
)
def test_bad_frames_close_only_that_connection(shared_server, frame, words):
    good = Raw(shared_server.port)
    good.logon("bystander-" + str(abs(hash(words)) % 10000))
    good.subscribe("orders", sub_id="bys")
    bad = Raw(shared_server.port)
    bad.logon("bad-framer-" + str(abs(hash(words)) % 10000))
    bad.send_raw(frame)
    ack = bad.ack("processed")
    assert ack["status"] == "failure" and ack["reason"] == "bad frame" and words in ack["detail"]
    assert bad.closed()
    shared_server.wait_for_log("reason=bad frame")
    p = Raw(shared_server.port)
    p.logon("after-bad-" + str(abs(hash(words)) % 10000))
    pub(p, "orders", '{"still":"alive"}')
    assert json.loads(good.messages(1)[0][1]) == {"still": "alive"}


def test_unknown_command(shared_server):
    c = Raw(shared_server.port)
    c.logon("unk")
    c.send({"c": "explode", "cid": "9", "a": "processed"})
    ack = c.ack("processed", "9")
    assert ack["reason"] == "unknown command"
    assert c.closed()
    shared_server.wait_for_log("client=unk .*reason=unknown command")


@pytest.mark.parametrize(
    "header,reason",
    [
        ({"t": "orders", "f": "/a = "}, "bad filter"),
        ({"t": "orders", "f": "(/a = 1"}, "bad filter"),
        (
            {
                "t": "md\\.(",
            },
            "bad regex topic",
        ),
        ({"t": "orders", "o": "nonsense"}, "invalid options"),
        ({"t": "orders", "o": "rate=2X"}, "invalid options"),  # rate without a bookmark
        ({"t": "orders", "bm": "12|x|"}, "invalid bookmark"),
        ({"t": "orders", "bm": "not a bookmark"}, "invalid bookmark"),
        ({"t": "unlogged", "bm": "0"}, "invalid topic"),
        ({"t": "orders", "bm": "1|1|", "o": "bookmark_not_found=fail"}, "invalid bookmark"),
        ({"t": ""}, "invalid topic"),
    ],
)
def test_subscribe_failures(shared_server, header, reason):
    c = Raw(shared_server.port)
    c.logon("subfail")
    c.send({"c": "subscribe", "cid": "s", "a": "processed", **header})
    ack = c.ack("processed", "s")
    assert ack["status"] == "failure" and ack["reason"] == reason, ack
    assert ack["detail"]
    # the connection stays usable
    assert c.subscribe("orders")["status"] == "success"


def test_bad_filter_names_position(shared_server):
    c = Raw(shared_server.port)
    c.logon("badpos")
    c.send(
        {
            "c": "subscribe",
            "cid": "s",
            "a": "processed",
            "t": "orders",
            "f": "/a = 1 AND AND /b = 2",
        }
    )
    ack = c.ack("processed", "s")
    assert "position" in ack["detail"]


def test_subscription_already_exists_and_replace(shared_server):
    c = Raw(shared_server.port)
    c.logon("replacer")
    c.subscribe("orders", sub_id="r", f="/k = 1")
    c.send({"c": "subscribe", "cid": "d", "a": "processed", "t": "orders", "sub_id": "r"})
    assert c.ack("processed", "d")["reason"] == "subscription already exists"
    c.send(
        {
            "c": "subscribe",
            "cid": "e",
            "a": "processed",
            "t": "orders",
            "sub_id": "r",
            "f": "/k = 2",
            "o": "replace",
        }
    )
    assert c.ack("processed", "e")["status"] == "success"
    p = Raw(shared_server.port)
    p.logon("replace-pub")
    pub(p, "orders", '{"k":1}')
    pub(p, "orders", '{"k":2}')
    assert [json.loads(b) for _, b in c.messages(1)] == [{"k": 2}]


def test_sow_delete_on_plain_topic(shared_server):
    c = Raw(shared_server.port)
    c.logon("sowdel")
    c.send({"c": "sow_delete", "cid": "q", "a": "processed", "t": "orders", "bm": "1|1|"})
    assert c.ack("processed", "q")["reason"] == "not a queue"


def test_publish_to_pattern_is_invalid_topic(shared_server):
    c = Raw(shared_server.port)
    c.logon("patpub")
    c.send({"c": "publish", "cid": "q", "a": "processed", "t": "orders.*"}, "{}")
    assert c.ack("processed", "q")["reason"] == "invalid topic"


def test_heartbeats_both_ways(shared_server):
    c = Raw(shared_server.port)
    c.logon("hb")
    c.send({"c": "heartbeat", "o": "start,0.5"})  # half a second: the close comes after two
    t0 = time.monotonic()
    h, _ = c.recv_until(lambda h, b: h["c"] == "heartbeat", timeout=5)[-1]
    assert time.monotonic() - t0 < 3
    # stay silent: the server closes us after two intervals
    assert c.closed(timeout=6)
    shared_server.wait_for_log("client=hb .*reason=heartbeat")


def test_heartbeat_beats_keep_connection(shared_server):
    c = Raw(shared_server.port)
    c.logon("hb-alive")
    c.send({"c": "heartbeat", "o": "start,1"})
    for _ in range(6):
        time.sleep(0.5)
        c.send({"c": "heartbeat", "o": "beat"})
    c.send({"c": "flush", "cid": "f", "a": "completed"})
    assert c.ack("completed", "f")["status"] == "success"


def test_slow_client_is_disconnected(tmp_path):
    """Past <ClientMaxBufferSize> on a topic that is not recorded (a subscriber to a recorded
    one reads the journal instead: tests/e2e/test_lagging.py)."""
    from tests.support.proc import ServerProcess

    srv = ServerProcess(
        tmp_path / "slow",
        extra="<ClientMaxBufferSize>256KB</ClientMaxBufferSize>",
        transport_extra="<MaxMessageSize>64KB</MaxMessageSize>",
        topics=("recorded",),
    ).start()
    try:
        import socket

        slow = Raw(srv.port)
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.logon("slowpoke")
        slow.subscribe("orders")
        p = Raw(srv.port)
        p.logon("fast-pub")
        body = "x" * 8000
        for i in range(1, 2001):
            pub(p, "orders", json.dumps({"b": body}), s=i)
        p.send({"c": "flush", "cid": "f", "a": "persisted"})
        p.ack("persisted", "f", timeout=30)
        srv.wait_for_log("client=slowpoke .*reason=slow client", timeout=20)
        # the publisher is unaffected
        p.send({"c": "flush", "cid": "g", "a": "completed"})
        assert p.ack("completed", "g")["status"] == "success"
    finally:
        srv.kill()


def test_admin_stats_json_and_prometheus(shared_server):
    p = Raw(shared_server.port)
    p.logon("stats-pub")
    pub(p, "orders", "{}", s=1, a="persisted")
    p.ack("persisted")
    base = f"http://127.0.0.1:{shared_server.admin_port}"
    stats = json.loads(urllib.request.urlopen(base + "/stats", timeout=5).read())
    assert stats["connections"] >= 1 and stats["published"] >= 1
    j = stats["journal"]
    assert j["segments"] >= 1 and j["bytes"] > 0 and j["last_commit_latency_s"] >= 0
    for key in ("subscriptions", "topics", "publish_rate", "delivery_rate"):
        assert key in stats
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    assert "# TYPE tickertape_connections gauge" in text
    assert "tickertape_journal_bytes " in text and "tickertape_published_total " in text
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(base + "/nope", timeout=5)


def test_ack_conflation_interval(shared_server):
    p = Raw(shared_server.port)
    p.logon("conflating-pub", o="ack_conflation=300ms")
    t0 = time.monotonic()
    for i in range(1, 6):
        pub(p, "orders", "{}", s=i, a="persisted")
        time.sleep(0.02)
    # the first ack after a quiet interval goes at once; the rest of its interval is one ack
    assert p.ack("persisted")["s"] == 1
    ack = p.ack("persisted")
    assert ack["s"] == 5 and time.monotonic() - t0 >= 0.25  # one ack for the whole interval
    p.send({"c": "flush", "cid": "f", "a": "completed"})
    frames = p.recv_until(lambda h, b: h.get("cid") == "f")
    assert [h for h, _ in frames if h.get("a") == "persisted"] == []


def test_bad_logon_options(shared_server):
    c = Raw(shared_server.port)
    c.send(
        {
            "c": "logon",
            "cid": "1",
            "client_name": "badopts",
            "o": "ack_conflation=soon",
            "a": "processed",
        }
    )
    assert c.ack("processed", "1")["reason"] == "invalid options"
    assert c.closed()


def test_a_queue_option_on_a_topic_that_is_not_a_queue(shared_server):
    """Issue 23: a queue-only option on a name that is not a queue says so (`not a queue`),
    not `invalid options`."""
    c = Raw(shared_server.port)
    c.logon("not-a-queue")
    c.send({"c": "subscribe", "cid": "q", "a": "processed", "t": "no-such-q", "o": "max_backlog=5"})
    ack = c.ack("processed", "q")
    assert (ack["status"], ack["reason"]) == ("failure", "not a queue")
