"""`sow` on a queue (docs/sow.md "Queries on a queue") against a real server: the answer lists
the messages available to consumers (not leased, not acknowledged), in arrival order, with
filter, sow_keys, order_by, top_n and skip_n, group_begin / group_end and the stats counts; a
lease that ends makes its message available again."""

import json
import time

from tests.e2e.test_queues import ack, consumer
from tests.e2e.test_sow import query
from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

QUEUE = """<SOW><Queue><Name>jobs-q</Name><UnderlyingTopic>jobs</UnderlyingTopic>
  <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue></SOW>"""


def ns(recs):
    return [b["n"] for _, b in recs]


def test_sow_on_a_queue_lists_its_available_messages(tmp_path):
    s = ServerProcess(tmp_path, extra=QUEUE).start()
    try:
        publish_many(s.port, "jobs", [json.dumps({"n": i}) for i in range(6)], name="j-pub")
        cons = consumer(s.port, "jobs-q", "j-cons", backlog=2)
        leased = cons.messages(2)
        assert [json.loads(b)["n"] for _, b in leased] == [0, 1]
        c = Raw(s.port)
        c.logon("j-query")
        recs, completed, stats, frames = query(c, "jobs-q")
        assert ns(recs) == [2, 3, 4, 5]  # the leased two are not available
        assert frames[0][0]["c"] == "group_begin"
        assert [h["c"] for h, _ in frames].index("group_end") == 5
        assert completed["status"] == "success" and completed["bm"]
        assert (stats["records_returned"], stats["topic_matches"]) == (4, 4)
        assert all(h["t"] == "jobs-q" and h["bm"] for h, _ in recs)
        recs, _, stats, _ = query(c, "jobs-q", f="/n > 2", order_by="/n DESC", top_n=2)
        assert ns(recs) == [5, 4] and stats["topic_matches"] == 3
        recs, _, stats, _ = query(c, "jobs-q", o="skip_n=1", top_n=2)
        assert ns(recs) == [3, 4]
        bm3 = next(h["bm"] for h, b in query(c, "jobs-q")[0] if b["n"] == 3)
        recs, *_ = query(c, "jobs-q", sow_keys=bm3)
        assert ns(recs) == [3]
        # acked: gone; a lease that ends (the consumer leaves): available again, first
        assert ack(cons, "jobs-q", [leased[0][0]["bm"]])["records_deleted"] == 1
        cons.close()
        avail = []
        for _ in range(50):
            avail = ns(query(c, "jobs-q")[0])
            if 1 in avail:
                break
            time.sleep(0.1)
        assert sorted(avail) == [1, 2, 3, 4, 5]
        recs, _, stats, frames = query(c, "jobs-q", f="/n > 100")
        assert recs == [] and stats["topic_matches"] == 0
        assert [h["c"] for h, _ in frames][:2] == ["group_begin", "group_end"]
        c.send({"c": "sow", "t": "jobs-q", "bm": "0", "cid": "h", "a": "completed"})
        assert c.ack("completed", "h")["reason"] == "invalid bookmark"
    finally:
        s.stop()
