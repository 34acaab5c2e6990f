"""Bookmark replay (docs/protocol.md §5, §6) against a real server: start points, ranges, the join to
live, rate, pause/resume, replace, conflation, periodic persisted acks, restarts and segments."""

import json
import threading
import time

import pytest

from protocol.bookmarks import format_timestamp
from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many


def bodies(n, start=1, **extra):
    return [json.dumps({"i": i, **extra}) for i in range(start, start + n)]


def sub_until_completed(port, topic, bm, name="r", **extra):
    c = Raw(port)
    c.logon(name)
    c.send(
        {"c": "subscribe", "t": topic, "bm": bm, "cid": "s", "a": "processed,completed", **extra}
    )
    frames = c.recv_until(
        lambda h, b: h.get("a") == "completed" or h.get("status") == "failure", timeout=30
    )
    failures = [h for h, _ in frames if h.get("status") == "failure"]
    return (
        c,
        [json.loads(b)["i"] for h, b in frames if h["c"] == "p"],
        [h for h, _ in frames if h["c"] == "p"],
        failures,
    )


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A server holding orders 1..100 (with known bookmarks and times) and md.* topics."""
    srv = ServerProcess(
        tmp_path_factory.mktemp("replay"),
        topics=("orders", "md\\..*", "ranged", "work"),
        extra="<SOW><Queue><Name>orders-q</Name><UnderlyingTopic>orders</UnderlyingTopic></Queue></SOW>",
    )
    srv.start()
    before = int(time.time() * 1e6)
    publish_many(srv.port, "orders", bodies(50), name="loader")
    time.sleep(0.05)
    middle = int(time.time() * 1e6)
    time.sleep(0.05)
    p = publish_many(srv.port, "orders", bodies(50, 51), name="loader2")
    publish_many(srv.port, "md.eq", bodies(5, 1000), name="md-loader")
    publish_many(srv.port, "mdXeq", bodies(5, 2000), name="md-loader2")
    _, ids, headers, _ = sub_until_completed(srv.port, "orders", "0")
    assert ids == list(range(1, 101))
    srv.bms = [h["bm"] for h in headers]
    srv.times = (before, middle)
    p.close()
    yield srv
    srv.stop()


def test_epoch_replays_everything_then_live(loaded):
    c, ids, _, _ = sub_until_completed(loaded.port, "orders", "0", name="epoch-live")
    assert ids == list(range(1, 101))
    publish_many(loaded.port, "ranged", bodies(1, 5000), name="unrelated")
    p = publish_many(loaded.port, "orders", [], name="late-pub")
    p.send({"c": "publish", "t": "orders", "s": 1}, json.dumps({"i": 999}))
    ((h, b),) = c.messages(1)
    assert json.loads(b)["i"] == 999


def test_now_replays_nothing(loaded):
    c, ids, _, _ = sub_until_completed(loaded.port, "orders", "0|1|", name="now")
    assert ids == []


def test_bookmark_starts_after_it(loaded):
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", loaded.bms[89], name="after")
    assert ids[:10] == list(range(91, 101))


def test_list_starts_after_the_oldest(loaded):
    bm = ",".join([loaded.bms[95], loaded.bms[79], loaded.bms[90]])
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", bm, name="list")
    assert ids[:20] == list(range(81, 101))


def test_timestamps(loaded):
    before, middle = loaded.times
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", format_timestamp(middle), name="ts")
    assert ids[:50] == list(range(51, 101))
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", "19990101T000000", name="ts-old")
    assert ids[:100] == list(range(1, 101))  # before the journal = EPOCH


def test_future_timestamp_waits_for_it(loaded):
    start = int(time.time() * 1e6) + 1_500_000
    c = Raw(loaded.port)
    c.logon("future")
    c.send(
        {
            "c": "subscribe",
            "t": "md.eq",
            "bm": format_timestamp(start),
            "cid": "s",
            "a": "processed",
        }
    )
    c.ack("processed", "s")
    publish_many(
        loaded.port, "md.eq", bodies(3, 3000), name="before-start"
    )  # before the start time
    time.sleep(max(0, (start / 1e6) - time.time()) + 0.3)
    publish_many(loaded.port, "md.eq", bodies(3, 4000), name="after-start")
    assert [json.loads(b)["i"] for _, b in c.messages(3)] == [4000, 4001, 4002]


@pytest.mark.parametrize("mode,expect", [(None, []), ("now", []), ("epoch", list(range(1, 101)))])
def test_unknown_bookmark(loaded, mode, expect):
    extra = {"o": f"bookmark_not_found={mode}"} if mode else {}
    _, ids, _, fails = sub_until_completed(
        loaded.port, "orders", "12345|678|", name=f"unk-{mode}", **extra
    )
    assert not fails and ids[: len(expect)] == expect and (expect or ids == [])


def test_unknown_bookmark_fail(loaded):
    _, ids, _, fails = sub_until_completed(
        loaded.port, "orders", "12345|678|", name="unk-fail", o="bookmark_not_found=fail"
    )
    assert (
        fails[0]["reason"] == "invalid bookmark"
        and "not in the transaction log" in fails[0]["detail"]
    )


def test_regex_topic_replays_only_matching_logged_topics(loaded):
    _, ids, headers, _ = sub_until_completed(loaded.port, "md\\..*", "0", name="rx")
    assert ids[:5] == list(range(1000, 1005)) and all(h["t"] == "md.eq" for h in headers)


def test_queue_name_replays_underlying_topic(loaded):
    _, ids, headers, _ = sub_until_completed(loaded.port, "orders-q", "0", name="qreplay")
    assert ids[:100] == list(range(1, 101)) and headers[0]["t"] == "orders"


def test_filter_applies_during_replay(loaded):
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", "0", name="filt", f="/i % 10 = 0")
    assert ids[:10] == list(range(10, 101, 10))


def test_timestamp_option(loaded):
    _, _, headers, _ = sub_until_completed(
        loaded.port, "orders", loaded.bms[97], name="tsopt", o="timestamp"
    )
    assert headers[0]["ts"].endswith("Z") and len(headers[0]["ts"]) == 23


@pytest.mark.parametrize(
    "left,right,expect",
    [
        ("[", "]", list(range(10, 21))),
        ("(", "]", list(range(11, 21))),
        ("[", ")", list(range(10, 20))),
        ("(", ")", list(range(11, 20))),
    ],
)
def test_range_brackets(loaded, left, right, expect):
    bm = f"{left}{loaded.bms[9]}:{loaded.bms[19]}{right}"
    c, ids, _, _ = sub_until_completed(loaded.port, "orders", bm, name=f"range{left}{right}")
    assert ids == expect
    # the subscription is gone after completed: new publishes do not arrive
    publish_many(loaded.port, "orders", [], name="range-after-" + left + right)
    c.send({"c": "flush", "cid": "f", "a": "completed"})
    assert [h for h, _ in c.recv_until(lambda h, b: h.get("cid") == "f") if h["c"] == "p"] == []


def test_range_with_lists_and_timestamps(loaded):
    before, middle = loaded.times
    bm = f"[{loaded.bms[30]},{loaded.bms[20]}:{format_timestamp(middle)})"
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", bm, name="rangelist")
    assert ids == list(range(21, 51))
    bm = f"({format_timestamp(before)}:{loaded.bms[4]},{loaded.bms[2]}]"
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", bm, name="rangelist2")
    assert ids == list(range(1, 6))


def test_range_end_in_the_future(loaded):
    end = int(time.time() * 1e6) + 1_200_000
    c = Raw(loaded.port)
    c.logon("future-end")
    c.send(
        {
            "c": "subscribe",
            "t": "ranged",
            "bm": f"[{loaded.bms[99]}:{format_timestamp(end)}]",
            "cid": "s",
            "a": "processed,completed",
        }
    )
    c.ack("processed", "s")
    p = publish_many(loaded.port, "ranged", bodies(3, 100), name="ranged-pub")
    frames = c.recv_until(lambda h, b: h.get("a") == "completed", timeout=10)
    got = [json.loads(b)["i"] for h, b in frames if h["c"] == "p"]
    assert got[-3:] == [100, 101, 102]
    assert time.time() * 1e6 >= end
    publish_many(loaded.port, "ranged", bodies(1, 200), conn=p, start_seq=4)
    c.send({"c": "flush", "cid": "f", "a": "completed"})
    assert [h for h, _ in c.recv_until(lambda h, b: h.get("cid") == "f") if h["c"] == "p"] == []


def test_join_to_live_under_concurrent_publishing(tmp_path):
    srv = ServerProcess(tmp_path / "join").start()
    try:
        total = 6000
        p = Raw(srv.port)
        p.logon("joiner-pub")
        publish_many(srv.port, "orders", bodies(2000), conn=p)
        done = threading.Event()

        def keep_publishing():
            publish_many(srv.port, "orders", bodies(total - 2000, 2001), conn=p, start_seq=2001)
            done.set()

        t = threading.Thread(target=keep_publishing)
        t.start()
        c = Raw(srv.port)
        c.logon("joiner")
        c.send({"c": "subscribe", "t": "orders", "bm": "0", "cid": "s", "a": "processed,completed"})
        got = [json.loads(b)["i"] for h, b in c.messages(total, timeout=60)]
        t.join()
        assert got == list(range(1, total + 1))
    finally:
        srv.stop()


def test_rate_limits_messages_per_second(loaded):
    t0 = time.monotonic()
    _, ids, _, _ = sub_until_completed(loaded.port, "orders", "0", name="rate", o="rate=200")
    elapsed = time.monotonic() - t0
    assert ids[:100] == list(range(1, 101))
    assert 0.3 < elapsed < 2.5, elapsed


def test_rate_multiple_of_original_pace(tmp_path):
    srv = ServerProcess(tmp_path / "pace").start()
    try:
        p = Raw(srv.port)
        p.logon("pacer")
        for i in range(1, 5):
            publish_many(srv.port, "orders", bodies(1, i), conn=p, start_seq=i)
            time.sleep(0.3)
        t0 = time.monotonic()
        _, ids, _, _ = sub_until_completed(srv.port, "orders", "0", name="2x", o="rate=2X")
        elapsed = time.monotonic() - t0
        assert ids == [1, 2, 3, 4]
        assert 0.35 < elapsed < 1.2, elapsed  # 0.9 s of original gaps at 2X ~ 0.45 s
        t0 = time.monotonic()
        _, ids, _, _ = sub_until_completed(
            srv.port, "orders", "0", name="gap", o="rate=.5X,rate_max_gap=100ms"
        )
        assert time.monotonic() - t0 < 0.8  # gaps of 0.6 s at .5X are cut to 0.1 s
    finally:
        srv.stop()


def test_pause_and_resume_in_step(loaded):
    c = Raw(loaded.port)
    c.logon("pauser")
    c.send(
        {
            "c": "subscribe",
            "t": "orders",
            "bm": "0",
            "sub_id": "a",
            "o": "pause",
            "cid": "1",
            "a": "processed",
        }
    )
    c.ack("processed", "1")
    c.send(
        {
            "c": "subscribe",
            "t": "orders",
            "bm": "0",
            "sub_id": "b",
            "o": "pause",
            "f": "/i > 50",
            "cid": "2",
            "a": "processed",
        }
    )
    c.ack("processed", "2")
    c.send({"c": "flush", "cid": "f", "a": "completed"})
    time.sleep(0.3)
    assert [h for h, _ in c.recv_until(lambda h, b: h.get("cid") == "f") if h["c"] == "p"] == []
    c.send({"c": "subscribe", "sub_id": "a,b", "o": "resume", "cid": "3", "a": "processed"})
    frames = c.messages(150)
    order = [(h["sub_id"], json.loads(b)["i"]) for h, b in frames]
    assert [i for s, i in order if s == "a"] == list(range(1, 101))
    assert [i for s, i in order if s == "b"] == list(range(51, 101))
    # one pass: b's messages are interleaved with a's, right after a's copy of each
    for k, (s, i) in enumerate(order):
        if s == "b":
            assert order[k - 1] == ("a", i)


def test_pause_a_live_bookmark_subscription(loaded):
    c = Raw(loaded.port)
    c.logon("pause-live")
    c.send(
        {"c": "subscribe", "t": "work", "bm": "0|1|", "sub_id": "w", "cid": "1", "a": "processed"}
    )
    c.ack("processed", "1")
    c.send({"c": "subscribe", "sub_id": "w", "o": "pause", "cid": "2", "a": "processed"})
    c.ack("processed", "2")
    publish_many(loaded.port, "work", bodies(5, 10), name="work-pub")
    c.send({"c": "flush", "cid": "f", "a": "completed"})
    assert [h for h, _ in c.recv_until(lambda h, b: h.get("cid") == "f") if h["c"] == "p"] == []
    c.send({"c": "subscribe", "sub_id": "w", "o": "resume", "cid": "3", "a": "processed"})
    assert [json.loads(b)["i"] for _, b in c.messages(5)] == [10, 11, 12, 13, 14]


def test_replace_keeps_the_place(loaded):
    c = Raw(loaded.port)
    c.logon("replace-bm")
    c.send(
        {
            "c": "subscribe",
            "t": "orders",
            "bm": "0",
            "sub_id": "r",
            "o": "rate=100",
            "cid": "1",
            "a": "processed",
        }
    )
    first = c.messages(10)
    assert [json.loads(b)["i"] for _, b in first] == list(range(1, 11))
    c.send(
        {
            "c": "subscribe",
            "t": "orders",
            "bm": "0",
            "sub_id": "r",
            "o": "replace",
            "f": "/i % 2 = 0",
            "cid": "2",
            "a": "processed",
        }
    )
    frames = c.recv_until(lambda h, b: h["c"] == "p" and json.loads(b)["i"] == 100, timeout=20)
    got = [json.loads(b)["i"] for h, b in frames if h["c"] == "p"]
    # no message is repeated, none before the place is replayed again, and after the replace only evens
    assert got == sorted(set(got)) and got[0] > 10
    evens_from = next(k for k, i in enumerate(got) if all(x % 2 == 0 for x in got[k:]))
    assert got[-1] == 100 and len(got) - evens_from >= 10


def test_conflation_on_the_replayed_timeline(tmp_path):
    srv = ServerProcess(tmp_path / "conf").start()
    try:
        p = Raw(srv.port)
        p.logon("conf-pub")
        seq = 1
        for burst in range(3):
            msgs = [
                json.dumps({"i": seq + k, "sym": "AB"[k % 2], "px": burst * 10 + k})
                for k in range(6)
            ]
            publish_many(srv.port, "orders", msgs, conn=p, start_seq=seq)
            seq += 6
            time.sleep(0.35)
        c, ids, headers, _ = sub_until_completed(
            srv.port, "orders", "0", name="conf", o="conflation=200ms,conflation_key=[/sym]"
        )
        # per burst and symbol: the latest message, carrying the first conflated message's bookmark
        assert ids == [5, 6, 11, 12, 17, 18]
        assert [int(h["bm"].split("|")[1]) for h in headers] == [1, 2, 7, 8, 13, 14]
        c.close()
    finally:
        srv.stop()


def test_periodic_persisted_acks_advance_on_filtered_topics(loaded):
    c = Raw(loaded.port)
    c.logon("pacer-acks")
    c.send(
        {
            "c": "subscribe",
            "t": "orders",
            "bm": "0",
            "f": "/i > 100000",
            "cid": "1",
            "a": "processed,persisted",
        }
    )
    ack = c.recv_until(lambda h, b: h.get("a") == "persisted", timeout=5)[-1][0]
    assert ack["sub_id"] and ack["bm"].count("|") == 2


def test_replay_across_segments_and_restart(tmp_path):
    srv = ServerProcess(tmp_path / "segs", journal_size="64KB").start()
    try:
        p = Raw(srv.port)
        p.logon("seg-pub")
        for k in range(10):  # separate commits, so segments roll between them
            publish_many(
                srv.port,
                "orders",
                bodies(300, 1 + 300 * k, pad="x" * 60),
                conn=p,
                start_seq=1 + 300 * k,
            )
        srv.restart()
        stats = json.loads(
            __import__("urllib.request")
            .request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats")
            .read()
        )
        assert stats["journal"]["segments"] > 3
        _, ids, headers, _ = sub_until_completed(srv.port, "orders", "0", name="seg-replay")
        assert ids == list(range(1, 3001))
        _, ids, _, _ = sub_until_completed(srv.port, "orders", headers[1499]["bm"], name="seg-mid")
        assert ids == list(range(1501, 3001))
    finally:
        srv.stop()


def test_live_option_delivers_before_the_commit(tmp_path):
    """With `live`, a message reaches the subscriber before it is durable: shown with a journal
    whose writes fail (file-size limit), where only the `live` subscriber sees the message."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    srv = ServerProcess(tmp_path / "live", preexec_fn=limit).start()
    try:
        publish_many(srv.port, "orders", bodies(3), name="live-pre")
        early = Raw(srv.port)
        early.logon("early")
        early.send(
            {
                "c": "subscribe",
                "t": "orders",
                "bm": "0",
                "o": "live",
                "cid": "s",
                "a": "processed,completed",
            }
        )
        frames = early.recv_until(lambda h, b: h.get("a") == "completed")
        assert [json.loads(b)["i"] for h, b in frames if h["c"] == "p"] == [1, 2, 3]
        normal = Raw(srv.port)
        normal.logon("normal")
        normal.subscribe("orders")
        p = Raw(srv.port)
        p.logon("live-pub")
        p.send(
            {"c": "publish", "t": "orders", "s": 1, "a": "persisted"},
            json.dumps({"i": 4, "pad": "z" * 200_000}),
        )
        assert p.ack("persisted")["reason"] == "journal unavailable"
        ((h, b),) = early.messages(1)
        assert json.loads(b)["i"] == 4 and h["bm"].endswith("|1|")
        normal.send({"c": "flush", "cid": "f", "a": "completed"})
        assert [
            h for h, _ in normal.recv_until(lambda h, b: h.get("cid") == "f") if h["c"] == "p"
        ] == []
    finally:
        srv.kill()


def test_correlation_id_survives_replay(loaded):
    p = Raw(loaded.port)
    p.logon("corr-pub")
    p.send({"c": "publish", "t": "ranged", "s": 1, "x": "corr-42", "a": "persisted"}, '{"i":7}')
    p.ack("persisted")
    _, ids, headers, _ = sub_until_completed(loaded.port, "ranged", "0", name="corr-replay")
    assert [h.get("x") for h in headers if h.get("x")] == ["corr-42"]
