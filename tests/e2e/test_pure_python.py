"""The pure-Python framing (no C accelerator, or TICKERTAPE_PURE_PYTHON=1) serves the same
replay and queue deliveries as the accelerated server, byte for byte apart from lease times."""

import json

from server import splice
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
