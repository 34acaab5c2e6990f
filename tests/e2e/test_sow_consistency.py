"""State of the World consistency against a real server: sow_and_subscribe under full publish
load (no gap, no duplicate at the join), the store equal to a fold of the journal after kill -9
at random points (a property test), and a damaged or deleted store rebuilt and reported."""

import json
import os
import random
import shutil
import struct
import threading
import time

import pytest

from journal.journal import Journal
from journal.record import KIND_MESSAGE, KIND_SOW_DELETE
from protocol.framing import frame_bytes
from server.sow.keys import KeyMaker, key_from_fragment
from server.sow.records import decode_delete
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

SOW = """<SOW><Topic><Name>ticks</Name><Key>/k</Key></Topic></SOW>"""
KEYS = 100


def frames_for(topic: str, start: int, n: int, compact: bool = False) -> bytes:
    """Publishes start..start+n-1 over KEYS keys; compact: headers without white space, the
    form the publish fast path keys in its scan (server/publish_scan.py), else the ordinary
    path's."""
    sep = (",", ":") if compact else None
    out = []
    for seq in range(start, start + n):
        body = json.dumps({"k": seq % KEYS, "n": seq}, separators=sep).encode()
        h = json.dumps({"c": "publish", "t": topic, "s": seq}, separators=sep).encode()
        out.append(struct.pack(">I", len(h) + len(body)) + h + body)
    return b"".join(out)


def publisher(port: int, total: int, name: str = "loader", chunk: int = 500) -> threading.Thread:
    """Publishes 1..total to `ticks` as fast as the server takes them; the first chunk is
    persisted before this returns, so the stream is flowing."""
    c = Raw(port, timeout=60)
    c.logon(name)
    c.send_raw(frames_for("ticks", 1, chunk))
    c.send({"c": "flush", "cid": "first", "a": "persisted"})
    c.ack("persisted", "first")

    def run():
        for start in range(1 + chunk, total + 1, chunk):
            c.send_raw(frames_for("ticks", start, min(chunk, total + 1 - start)))
        cid = c.next_cid()
        c.send({"c": "flush", "cid": cid, "a": "persisted"})
        c.ack("persisted", cid, timeout=60)
        c.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_sow_and_subscribe_has_no_gap_and_no_duplicate_under_load(tmp_path):
    total = 30_000
    s = ServerProcess(tmp_path, extra=SOW).start()
    try:
        sub = Raw(s.port, timeout=30)
        sub.logon("watcher")
        t = publisher(s.port, total)
        time.sleep(0.05)  # the publisher is in full flow
        sub.send(
            {"c": "sow_and_subscribe", "t": "ticks", "cid": "q", "sub_id": "w", "a": "completed"}
        )
        sow: dict[int, int] = {}
        point = None
        live: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            f = sub.recv()
            assert f is not None
            h, body = f
            if h["c"] == "sow":
                assert point is None, "a sow record after the completed ack"
                b = json.loads(body)
                assert b["k"] not in sow, "two records for one key"
                sow[b["k"]] = b["n"]
            elif h["c"] == "ack" and h["a"] == "completed":
                point = int(h["bm"].split("|")[1])
            elif h["c"] == "p":
                assert point is not None, "a live message before the answer ended"
                assert h["sub_id"] == "w"
                live.append(int(h["bm"].split("|")[1]))
                if live[-1] == total:
                    break
        t.join(60)
        assert point is not None and 0 < point < total, point  # taken while publishing
        # the answer is exactly the state at the point: per key, its last message up to it
        expected = {}
        for n in range(1, point + 1):
            expected[n % KEYS] = n
        assert sow == expected
        # live: the first message after the point, then every one, once, in order
        assert live == list(range(point + 1, total + 1))
    finally:
        s.stop()


def fold(journal_dir: str, topic: str) -> dict[str, int]:
    """The SOW state by reading the whole journal: key -> the record's publisher seq."""
    state: dict[str, int] = {}
    j = Journal(journal_dir)
    try:
        for r in j.records():
            if r.topic.decode() != topic:
                continue
            if r.kind == KIND_MESSAGE:
                k = key_from_fragment(r.extra[1] if r.extra else b"")
                assert k is not None
                state[k] = r.seq
            elif r.kind == KIND_SOW_DELETE:
                form, payload = decode_delete(r.body)
                assert form == b"K"
                for k in payload.split(","):
                    state.pop(k, None)
    finally:
        j.close()
    return state


def answer(port: int, topic: str) -> dict[str, int]:
    c = Raw(port, timeout=30)
    c.logon(f"reader-{time.monotonic_ns()}")
    c.send({"c": "sow", "t": topic, "cid": "a", "a": "completed"})
    got = {}
    for h, _b in c.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == "a"):
        if h["c"] == "sow":
            got[h["k"]] = int(h["bm"].split("|")[1])
    c.close()
    return got


@pytest.mark.slow
@pytest.mark.parametrize("compact", [False, True], ids=["ordinary", "fast-path"])
def test_kill_9_at_random_points_leaves_the_store_equal_to_a_fold_of_the_journal(tmp_path, compact):
    """Property: whatever point a kill -9 lands on (mid-publish, mid-delete, mid-commit, with
    store writes deferred), the restarted server's answer equals a fold of the journal it
    recovered."""
    rng = random.Random(25)
    s = ServerProcess(tmp_path, extra=SOW).start()
    seq = 1
    try:
        for _round in range(5):
            c = Raw(s.port, timeout=30)
            c.logon("crasher")
            n = rng.randrange(500, 4000)
            first = rng.randrange(1, n)
            c.send_raw(frames_for("ticks", seq, first, compact))  # whole frames
            for _ in range(rng.randrange(0, 4)):
                keys = ",".join(h for h in answer(s.port, "ticks") if rng.random() < 0.05)
                if keys:
                    c.send({"c": "sow_delete", "t": "ticks", "sow_keys": keys})
            rest = frames_for("ticks", seq + first, n - first, compact)
            c.send_raw(rest[: rng.randrange(len(rest) // 2, len(rest))])  # ends mid-frame
            seq += n
            time.sleep(rng.random() * 0.05)
            s.kill()
            expected = fold(os.path.join(str(tmp_path), "journal"), "ticks")  # as it recovers
            s.start()
            assert answer(s.port, "ticks") == expected
            # the next round resumes after what the journal holds
            c = Raw(s.port, timeout=30)
            seq = c.logon("crasher")["s"] + 1
            c.close()
    finally:
        s.stop()


def test_fast_path_publishes_then_a_delta_publish_in_one_read(tmp_path):
    """Publishes keyed in the publish scan, a delta_publish among them (the ordinary path),
    more after it, all in one write: the delta merges into the latest publish of its key
    while that one is not committed yet, and a query right after the flush answers every key
    with its latest message (the store's deferred writes are flushed for it)."""
    s = ServerProcess(tmp_path, extra=SOW).start()
    try:
        c = Raw(s.port, timeout=30)
        c.logon("fast")
        delta = frame_bytes(b'{"c":"delta_publish","t":"ticks","s":2001}', b'{"k":5,"extra":"d"}')
        c.send_raw(frames_for("ticks", 1, 2000, True) + delta + frames_for("ticks", 2002, 2, True))
        c.send({"c": "flush", "cid": "f", "a": "persisted"})
        c.ack("persisted", "f")
        c.send({"c": "sow", "t": "ticks", "cid": "q", "a": "completed"})
        got = {}
        for h, b in c.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == "q"):
            if h["c"] == "sow":
                doc = json.loads(b)
                assert h["k"] == KeyMaker(("/k",)).key(b, None)
                got[doc["k"]] = doc
        want = {
            k: {"k": k, "n": max(n for n in range(1, 2004) if n % KEYS == k)} for k in range(KEYS)
        }
        want[5] = {"k": 5, "n": 1905, "extra": "d"}
        want[1] = {"k": 1, "n": 1901}  # 2001 was the delta, on key 5
        assert got == want
        c.close()
    finally:
        s.stop()


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_a_damaged_or_deleted_store_is_rebuilt_and_reported(tmp_path, damage):
    s = ServerProcess(tmp_path, extra=SOW).start()
    try:
        c = Raw(s.port)
        c.logon("p")
        c.send_raw(frames_for("ticks", 1, 1000))
        cid = c.next_cid()
        c.send({"c": "flush", "cid": cid, "a": "persisted"})
        c.ack("persisted", cid)
        before = answer(s.port, "ticks")
        assert len(before) == KEYS
        s.stop()
        store = os.path.join(str(tmp_path), "journal", "sow")
        if damage == "delete":
            shutil.rmtree(store)
        else:
            with open(os.path.join(store, "data.mdb"), "r+b") as f:
                f.write(b"\xff" * 8192)  # both meta pages
        s.start()
        s.wait_for_log("SOW store rebuilt from the journal's start")
        assert answer(s.port, "ticks") == before
    finally:
        s.stop()
