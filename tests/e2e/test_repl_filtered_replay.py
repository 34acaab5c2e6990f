"""A filtered bookmark replay on a replication destination finds the replicated messages.

Replicated records carry an origin block before their topic (journal/record.py). The C filter
scanner (server/_filterscan.c) once skipped only the expiration and the header fragment, read
the topic at the wrong place in such a record, and so a filtered replay on a destination
answered nothing for every message that came over replication. The scanner now walks records
with the one record_next() of journal/_record.h."""

import json

from tests.e2e.test_repl_core import converge, free_ports, instance, publish
from tests.support.raw import Raw


def filtered_replay(port, flt, topic="orders"):
    c = Raw(port)
    c.logon("filtered")
    c.send({"c": "subscribe", "t": topic, "bm": "0", "filter": flt, "cid": "f",
            "a": "processed,completed"})  # fmt: skip
    frames = c.recv_until(lambda h, b: h.get("a") == "completed", timeout=30)
    c.close()
    return [json.loads(b)["i"] for h, b in frames if h["c"] == "p"]


def test_filtered_replay_on_a_destination_finds_the_replicated_messages(tmp_path):
    pa, pb = free_ports(2)
    b = instance(tmp_path, "tt-b", pb, []).start()
    a = instance(tmp_path, "tt-a", pa, [("tt-b", pb)]).start()
    try:
        publish(a.port, "pub", 1, 20)
        assert len(converge(b.port, 20)) == 20
        assert filtered_replay(a.port, "/i > 14") == [15, 16, 17, 18, 19, 20]  # the source
        assert filtered_replay(b.port, "/i > 14") == [15, 16, 17, 18, 19, 20]  # the destination
    finally:
        a.stop()
        b.stop()
