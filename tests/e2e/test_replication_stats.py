"""Replication statistics between two server processes (docs/replication.md "Statistics"): what
/stats and /metrics say of a source, of the messages stored and dropped as duplicates, and of
a replicated queue."""

import json

from tests.e2e.test_replication_partition import dest_stats
from tests.support.cluster import Cluster, wait_until
from tests.support.raw import publish_many

QUEUE = """<SOW><Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic></Queue></SOW>"""


def test_sources_totals_and_queue_counters_in_stats_and_metrics(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, topics=("work", "work-q"),
                 extra=QUEUE).start()  # fmt: skip
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        wait_until(lambda: dest_stats(a, "tt-b").get("connected"), 20, "link a -> b")
        publish_many(a.port, "work", [json.dumps({"i": i}) for i in range(50)], name="p").close()

        def source():
            return b.admin_get("/stats")["replication"]["sources"].get("tt-a", {})

        wait_until(lambda: source().get("received_messages") == 50, 20, "50 received")
        repl = b.admin_get("/stats")["replication"]
        src = repl["sources"]["tt-a"]
        assert src["connected"] and src["duplicates"] == 0 and src["received_bytes"] > 0
        wait_until(lambda: source().get("resume_position", 0) > 0, 10, "a resume point")
        assert repl["replicated"] == 50 and repl["replicated_duplicates"] == 0
        assert set(repl["queues"]) >= {"unresolved_dropped", "unnamed_dropped"}
        q = b.admin_get("/stats")["queues"]["work-q"]
        assert q["held_for_others"] == 50  # published at tt-a: tt-a's to lease
        assert {"taken_over", "done_elsewhere", "released"} <= set(q)
        # the sender counts what it sent: the 50 messages, in as many bytes as b received
        sent = dest_stats(a, "tt-b")
        assert sent["sent_messages"] == 50, sent
        assert sent["sent_bytes"] == src["received_bytes"]
        assert 'tickertape_replication_sent_messages_total{destination="tt-b"} 50' in a.admin_get(
            "/metrics"
        )
        metrics = b.admin_get("/metrics")
        for line in (
            'tickertape_replication_source_connected{source="tt-a"} 1',
            'tickertape_replication_source_received_messages_total{source="tt-a"} 50',
            "tickertape_replication_received_messages_stored_total 50",
            "tickertape_replication_received_duplicates_total 0",
            "tickertape_replication_queue_events_unresolved_dropped_total 0",
            'tickertape_queue_held_for_others{queue="work-q"} 50',
            'tickertape_queue_taken_over_total{queue="work-q"} 0',
        ):
            assert line in metrics, line
    finally:
        cl.close()
