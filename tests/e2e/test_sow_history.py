"""Historical SOW queries (`sow` with `bm`, docs/sow.md) against a real server: the state as of
any bookmark or time equals a fold of what was published up to it, through checkpoints made
every few KB here (TICKERTAPE_SOW_CHECKPOINT_BYTES), deletes included."""

import json
import os
import random
import time

from protocol.bookmarks import format_timestamp
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

SOW = "<SOW><Topic><Name>h</Name><Key>/k</Key></Topic></SOW>"


def answer(c: Raw, **extra) -> tuple[dict[int, int], dict]:
    cid = c.next_cid()
    c.send({"c": "sow", "t": "h", "cid": cid, "a": "completed", **extra})
    got = {}
    frames = c.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == cid)
    for h, b in frames:
        if h["c"] == "sow":
            d = json.loads(b)
            got[d["k"]] = d["n"]
    return got, frames[-1][0]


def test_historical_queries_answer_the_state_at_each_point(tmp_path):
    rng = random.Random(7)
    s = ServerProcess(tmp_path, extra=SOW, env={"TICKERTAPE_SOW_CHECKPOINT_BYTES": "8192"}).start()
    try:
        c = Raw(s.port, timeout=30)
        c.logon("hist")
        state: dict[int, int] = {}
        points = []  # (bookmark, time, expected state)
        for n in range(1, 1201):
            k = rng.randrange(40)
            if rng.random() < 0.05 and state:
                victim = rng.choice(sorted(state))
                # the delete goes by the body's key
                c.send({"c": "sow_delete", "t": "h", "cid": f"d{n}", "a": "stats"},
                       json.dumps({"k": victim}))  # fmt: skip
                c.ack("stats", f"d{n}")
                state.pop(victim)
            cid = c.next_cid()
            c.send({"c": "publish", "t": "h", "cid": cid, "a": "processed", "s": n},
                   json.dumps({"k": k, "n": n, "pad": "x" * 50}))  # fmt: skip
            c.ack("processed", cid)
            state[k] = n
            if n % 150 == 0:
                cid = c.next_cid()
                c.send({"c": "flush", "cid": cid, "a": "completed"})
                c.ack("completed", cid)
                now, bm = answer(c)
                assert now == state
                points.append((bm["bm"], dict(state)))
                time.sleep(0.01)
        ckpts = os.listdir(os.path.join(str(tmp_path), "journal", "sow-checkpoints"))
        assert len([p for p in ckpts if p.isdigit()]) >= 3, ckpts
        for bm, expected in points:
            got, ack = answer(c, bm=bm)
            assert ack["status"] == "success", ack
            assert got == expected
        got, _ = answer(c, bm="0")
        assert got == {}
        got, _ = answer(c, bm=format_timestamp(int(time.time() * 1e6)))
        assert got == state
        _, ack = answer(c, bm="123|456|")
        assert ack["status"] == "failure" and ack["reason"] == "invalid bookmark"
        _, ack = answer(c, bm=f"[0:{points[0][0]}]")
        assert ack["reason"] == "invalid bookmark"
    finally:
        s.stop()


def test_sow_and_subscribe_from_a_point_answers_its_state_then_every_later_change_once(tmp_path):
    rng = random.Random(11)
    s = ServerProcess(tmp_path, extra=SOW, env={"TICKERTAPE_SOW_CHECKPOINT_BYTES": "8192"}).start()
    try:
        c = Raw(s.port, timeout=30)
        c.logon("hist-sub")
        state: dict[int, int] = {}
        published: list[int] = []  # n in journal order (deletes are not delivered)
        points = []  # (bookmark, expected state, how many were published up to it)
        for n in range(1, 601):
            k = rng.randrange(30)
            if rng.random() < 0.05 and state:
                victim = rng.choice(sorted(state))
                c.send({"c": "sow_delete", "t": "h", "cid": f"d{n}", "a": "stats"},
                       json.dumps({"k": victim}))  # fmt: skip
                c.ack("stats", f"d{n}")
                state.pop(victim)
            c.send({"c": "publish", "t": "h", "s": n},
                   json.dumps({"k": k, "n": n}))  # fmt: skip
            state[k] = n
            published.append(n)
            if n % 200 == 100:
                cid = c.next_cid()
                c.send({"c": "flush", "cid": cid, "a": "completed"})
                c.ack("completed", cid)
                now, bm = answer(c)
                assert now == state
                points.append((bm["bm"], dict(state), len(published)))
        cid = c.next_cid()
        c.send({"c": "flush", "cid": cid, "a": "completed"})
        c.ack("completed", cid)
        for i, (bm, expected, upto) in enumerate(points):
            sub = Raw(s.port, timeout=30)
            sub.logon(f"sub{i}")
            sub.send({"c": "sow_and_subscribe", "t": "h", "cid": "q", "sub_id": f"s{i}",
                      "a": "completed", "bm": bm})  # fmt: skip
            frames = sub.recv_until(lambda h, _b: h.get("c") == "ack" and h.get("cid") == "q")
            assert frames[-1][0]["status"] == "success", frames[-1][0]
            got = {json.loads(b)["k"]: json.loads(b)["n"] for h, b in frames if h["c"] == "sow"}
            assert got == expected
            # then the journal from the point, then live: every later message, once, in order
            live = 601 + i
            c.send({"c": "publish", "t": "h", "s": live}, json.dumps({"k": 99, "n": live}))
            published.append(live)
            want = published[upto:]
            msgs = sub.recv_until(
                lambda h, b, last=live: h.get("c") == "p" and json.loads(b)["n"] == last
            )
            ns = [json.loads(b)["n"] for h, b in msgs if h.get("c") == "p"]
            assert ns == want
            sub.close()
        c.send({"c": "sow_and_subscribe", "t": "h", "cid": "bad", "a": "completed",
                "bm": "123|456|"})  # fmt: skip
        assert c.ack("completed", "bad")["reason"] == "invalid bookmark"
    finally:
        s.stop()


def _disk(path: str) -> int:
    return sum(os.stat(os.path.join(path, f)).st_blocks * 512 for f in os.listdir(path))


def test_checkpoints_stay_within_max_checkpoint_size_and_answers_stay_exact(tmp_path):
    """`<SOW><MaxCheckpointSize>`: the checkpoints take at most that on disk (the newest
    copy's own size beside them while it is made), thinned over the journal rather than only
    the newest kept; a point anywhere, its checkpoint gone or not, still gets its state."""
    limit = 96 * 1024
    sow = SOW.replace("<SOW>", f"<SOW><MaxCheckpointSize>{limit}</MaxCheckpointSize>")
    s = ServerProcess(tmp_path, extra=sow, env={"TICKERTAPE_SOW_CHECKPOINT_BYTES": "8192"})
    s.start()
    cdir = os.path.join(str(tmp_path), "journal", "sow-checkpoints")
    try:
        c = Raw(s.port, timeout=30)
        c.logon("hist-cap")
        rng = random.Random(5)
        points = []  # (bookmark, the state then: the current answer, exact per the test above)
        for n in range(1, 2001):
            cid = c.next_cid()
            c.send({"c": "publish", "t": "h", "cid": cid, "a": "processed", "s": n},
                   json.dumps({"k": rng.randrange(40), "n": n, "pad": "x" * 50}))  # fmt: skip
            c.ack("processed", cid)
            if n % 100 == 0:
                cid = c.next_cid()
                c.send({"c": "flush", "cid": cid, "a": "completed"})
                c.ack("completed", cid)
                now, bm = answer(c)
                points.append((bm["bm"], now))
                time.sleep(0.01)
        deadline = time.monotonic() + 20
        while any(not p.isdigit() for p in os.listdir(cdir)):  # a copy being made
            assert time.monotonic() < deadline, os.listdir(cdir)
            time.sleep(0.05)
        kept = sorted(p for p in os.listdir(cdir) if p.isdigit())
        sizes = [_disk(os.path.join(cdir, p)) for p in kept]
        journal_end = int(kept[-1])
        assert sum(sizes) <= limit, (kept, sizes)
        assert 2 <= len(kept) < journal_end // 8192, kept  # thinned: fewer than were made
        assert int(kept[0]) < journal_end // 2, kept  # not only the newest: spread over it
        for bm, expected in points:
            got, ack = answer(c, bm=bm)
            assert ack["status"] == "success", ack
            assert got == expected
    finally:
        s.stop()
