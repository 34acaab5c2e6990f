"""A publish's own `e` on a SOW topic (docs/sow.md "Expiration") against a real server: the
record leaves at its time, `oof` subscribers are told `expired`, the removal is journaled, and a
restart before the time still expires it (the store keeps `e` with the record)."""

import json
import time

from tests.e2e.test_sow import flush, pub, query
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

SOW = "<SOW><Topic><Name>quotes</Name><Key>/k</Key></Topic></SOW>"


def test_a_records_own_e_expires_it(tmp_path):
    s = ServerProcess(tmp_path, extra=SOW).start()
    try:
        sub = Raw(s.port)
        sub.logon("e-sub")
        sub.send({"c": "sow_and_subscribe", "t": "quotes", "cid": "q", "sub_id": "qs",
                  "o": "oof", "a": "completed"})  # fmt: skip
        sub.ack("completed", "q")
        time.sleep(0.2)  # the subscription joins the live stream
        c = Raw(s.port)
        c.logon("e-pub")
        pub(c, "quotes", {"k": 1}, e=1)
        pub(c, "quotes", {"k": 2})  # no e, no <Expiration>: it stays
        pub(c, "quotes", {"k": 3}, e=1)
        pub(c, "quotes", {"k": 3, "v": "kept"})  # an update without e: no longer expires
        flush(c)
        assert len(query(c, "quotes")[0]) == 3
        frames = sub.recv_until(lambda h, b: h.get("c") == "oof", timeout=5)
        oof = [(h["reason"], json.loads(b)) for h, b in frames if h["c"] == "oof"]
        assert oof == [("expired", {"k": 1})]
        recs, *_ = query(c, "quotes", order_by="/k")
        assert [b for _, b in recs] == [{"k": 2}, {"k": 3, "v": "kept"}]
        pub(c, "quotes", {"k": 4}, e=2)
        flush(c)
        c.close()
        sub.close()
        s.restart()  # before k=4's time: the heap is rebuilt from the store
        c = Raw(s.port)
        c.logon("e-pub2")
        assert sorted(b["k"] for _, b in query(c, "quotes")[0]) == [2, 3, 4]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(query(c, "quotes")[0]) != 2:
            time.sleep(0.2)
        assert sorted(b["k"] for _, b in query(c, "quotes")[0]) == [2, 3]
        c.close()
        s.restart()  # the expirations were journaled: nothing comes back
        c = Raw(s.port)
        c.logon("e-pub3")
        assert sorted(b["k"] for _, b in query(c, "quotes")[0]) == [2, 3]
    finally:
        s.stop()
