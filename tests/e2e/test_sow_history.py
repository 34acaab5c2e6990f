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
