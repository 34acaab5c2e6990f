"""Sync replication without the C intake (TICKERTAPE_PURE_PYTHON=1: server/replicate_scan.py's
reference) stores and serves on the destination what the accelerated pair does: the same
bookmarks, bodies and header fragments, in the same order, duplicates dropped either way."""

from __future__ import annotations

import json

from tests.support.cluster import Cluster, wait_until
from tests.support.raw import Raw, publish_many


def _destination_replay(tmp_path, monkeypatch, pure: bool):
    if pure:
        monkeypatch.setenv("TICKERTAPE_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("TICKERTAPE_PURE_PYTHON", raising=False)
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], links=[("tt-a", "tt-b")], proxy=False).start()
    try:
        a = cl["tt-a"]
        publish_many(a.port, "orders", [json.dumps({"i": i}) for i in range(1, 301)], "p1")
        # a second publisher with header members and an expiration, and a re-sent duplicate
        c = Raw(a.port)
        c.logon("p2")
        for i in range(1, 21):
            c.send({"c": "publish", "t": "quotes", "s": i, "x": f"corr-{i}", "e": 60}, f"q{i}")
        c.send({"c": "publish", "t": "quotes", "s": 5, "a": "persisted"}, "again")
        c.send({"c": "publish", "t": "quotes", "s": 21, "a": "persisted"}, "last")
        while c.ack("persisted")["s"] < 21:
            pass
        c.close()
        b = cl["tt-b"]
        wait_until(lambda: len(b.replay()) == 321, what="tt-b holds every message")
        frames = []
        r = Raw(b.port)
        r.logon("replayer")
        r.send({"c": "subscribe", "t": ".*", "bm": "0", "cid": "r", "a": "completed"})
        for h, body in r.recv_until(lambda h, _b: h.get("a") == "completed"):
            if h.get("c") == "p":
                frames.append(({k: v for k, v in h.items() if k != "sub_id"}, body))
        r.close()
        return frames
    finally:
        cl.close()


def test_pure_python_intake_serves_what_the_c_intake_serves(tmp_path, monkeypatch):
    fast = _destination_replay(tmp_path / "c", monkeypatch, pure=False)
    pure = _destination_replay(tmp_path / "py", monkeypatch, pure=True)
    assert len(fast) == 321
    assert fast == pure
    assert [b for h, b in fast if h["t"] == "quotes"][4] == b"q5"
