"""The pure-Python framing (no C accelerator, or TICKERTAPE_PURE_PYTHON=1) serves the same
replay and queue deliveries as the accelerated server, byte for byte apart from lease times."""

import json

from server import publish_scan, splice
from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

QUEUE = """<SOW><Queue><Name>pq</Name><UnderlyingTopic>pt</UnderlyingTopic>
<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue></SOW>"""


def _session(tmp_path, env):
    srv = ServerProcess(tmp_path, extra=QUEUE, env=env).start()
    try:
        bodies = [json.dumps({"i": i, "pad": "x" * (i % 7)}) for i in range(1, 41)]
        publish_many(srv.port, "pt", bodies, name="same-publisher")
        r = Raw(srv.port)
        r.logon("replayer")
        r.send(
            {"c": "subscribe", "t": "pt", "bm": "0", "sub_id": "r", "cid": "s", "a": "completed"}
        )
        replay = [
            (h, b) for h, b in r.recv_until(lambda h, b: h.get("a") == "completed") if h["c"] == "p"
        ]
        q = Raw(srv.port)
        q.logon("worker")
        q.send(
            {
                "c": "subscribe",
                "t": "pq",
                "sub_id": "w",
                "cid": "q",
                "o": "max_backlog=10",
                "a": "processed",
            }
        )
        assert q.ack("processed", "q")["status"] == "success"
        work = []
        while len(work) < 40:
            batch = q.messages(10)
            work += batch
            q.send(
                {
                    "c": "sow_delete",
                    "t": "pq",
                    "bm": ",".join(h["bm"] for h, _ in batch),
                    "cid": "k",
                    "a": "processed",
                }
            )
            assert q.ack("processed", "k")["records_deleted"] == 10
        log = srv.output()
    finally:
        srv.stop()
    for h, _ in work:
        assert h.pop("lp")  # the lease end differs between runs; everything else must not
    return replay, work, log


def test_pure_python_serves_the_same_frames(tmp_path):
    replay_py, work_py, log_py = _session(tmp_path / "py", {"TICKERTAPE_PURE_PYTHON": "1"})
    assert "framed by pure Python" in log_py
    assert [json.loads(b)["i"] for _, b in replay_py] == list(range(1, 41))
    assert [json.loads(b)["i"] for _, b in work_py] == list(range(1, 41))
    if not splice.ACCELERATED:
        return
    replay_c, work_c, log_c = _session(tmp_path / "c", {})
    assert "framed by the C accelerator" in log_c
    assert replay_c == replay_py
    assert work_c == work_py


def _publish_frames() -> bytes:
    """Compact publish frames, as clients send them (the publish fast path), with some the fast
    path leaves to the ordinary one: a correlation id, a duplicate, a pattern topic."""
    out = []
    for i in range(1, 301):
        h: dict = {"c": "publish", "t": "pt", "s": i}
        if i % 50 == 0:
            h["x"] = f"corr-{i}"
        if i % 7 == 0:
            h["a"] = "persisted"
        out.append(h)
        if i == 120:
            out.append({"c": "publish", "t": "pt", "s": 100})  # a duplicate
            out.append({"c": "publish", "t": "p.*", "s": 121, "cid": "bad", "a": "persisted"})
    frames = []
    for h in out:
        hb = json.dumps(h, separators=(",", ":")).encode()
        body = json.dumps({"i": h["s"]}).encode()
        frames.append(len(hb + body).to_bytes(4, "big") + hb + body)
    return b"".join(frames)


def _fast_publish_session(tmp_path, env):
    srv = ServerProcess(tmp_path, env=env).start()
    try:
        p = Raw(srv.port)
        p.logon("fast-publisher")
        p.send_raw(_publish_frames())
        p.send({"c": "flush", "cid": "f", "a": "completed"})
        acks = [h for h, _ in p.recv_until(lambda h, b: h.get("cid") == "f")]
        r = Raw(srv.port)
        r.logon("replayer")
        r.send(
            {"c": "subscribe", "t": "pt", "bm": "0", "sub_id": "r", "cid": "s", "a": "completed"}
        )
        replay = [
            (h, b) for h, b in r.recv_until(lambda h, b: h.get("a") == "completed") if h["c"] == "p"
        ]
    finally:
        srv.stop()
    return acks, replay


def test_publishes_store_the_same_with_and_without_the_publish_accelerator(tmp_path):
    acks_py, replay_py = _fast_publish_session(tmp_path / "py", {"TICKERTAPE_PURE_PYTHON": "1"})
    assert [json.loads(b)["i"] for _, b in replay_py] == list(range(1, 301))
    assert [h["x"] for h, _ in replay_py if "x" in h] == [f"corr-{i}" for i in range(50, 301, 50)]
    assert any(h.get("reason") == "invalid topic" for h in acks_py)
    if not publish_scan.ACCELERATED:
        return
    acks_c, replay_c = _fast_publish_session(tmp_path / "c", {})
    assert replay_c == replay_py
    assert [h for h in acks_c if h.get("status") != "success"] == [
        h for h in acks_py if h.get("status") != "success"
    ]
