"""SOW across a replication pair (docs/sow.md "Replicas"): deletes by key and by filter,
journaled on one side, reach the other, and expirations happen on both, so the same query on
both sides of a pair gives the same answer, also after a cut link heals."""

import json

import pytest

from tests.support.cluster import Cluster, wait_until
from tests.support.raw import Raw

SOW = """<SOW>
  <Topic><Name>prices</Name><Key>/sym</Key></Topic>
  <Topic><Name>ttl</Name><Key>/k</Key><Expiration>1s</Expiration></Topic>
</SOW>"""


def answer(inst, topic: str) -> list[tuple[str, dict]]:
    """The sow answer of `topic` on `inst`: (k, body) sorted by k."""
    c = Raw(inst.port)
    try:
        c.logon("q")
        cid = c.next_cid()
        c.send({"c": "sow", "t": topic, "cid": cid, "a": "completed"})
        frames = c.recv_until(lambda h, _b: h.get("c") == "ack" and h.get("cid") == cid)
        return sorted((h["k"], json.loads(b)) for h, b in frames if h.get("c") == "sow")
    finally:
        c.close()


def same_answer(cl: Cluster, topic: str, want: list[dict]):
    """The answer when both instances give `want` (bodies, any order), else None."""
    answers = [answer(inst, topic) for inst in cl]
    bodies = [sorted(json.dumps(b, sort_keys=True) for _, b in a) for a in answers]
    expected = sorted(json.dumps(b, sort_keys=True) for b in want)
    return answers[0] if all(b == expected for b in bodies) and answers[0] == answers[1] else None


def publish(c: Raw, topic: str, body: dict) -> None:
    c.send({"c": "publish", "t": topic}, json.dumps(body))


def delete(c: Raw, topic: str, **how) -> int:
    cid = c.next_cid()
    c.send({"c": "sow_delete", "t": topic, "cid": cid, "a": "stats", **how})
    return c.ack("stats", cid)["records_deleted"]


@pytest.fixture
def pair(tmp_path):
    cl = Cluster(tmp_path, ["tt-a", "tt-b"], sync=False, extra=SOW).start()
    yield cl
    cl.close()


def test_deletes_by_key_and_filter_reach_the_peer(pair):
    a, b = pair["tt-a"], pair["tt-b"]
    ca, cb = Raw(a.port), Raw(b.port)
    ca.logon("pub-a")
    cb.logon("pub-b")
    for i in range(10):
        publish(ca, "prices", {"sym": f"A{i}", "px": i})
        publish(cb, "prices", {"sym": f"B{i}", "px": i})
    state = {f"{s}{i}": {"sym": f"{s}{i}", "px": i} for s in "AB" for i in range(10)}
    got = wait_until(lambda: same_answer(pair, "prices", list(state.values())), 30, "published")
    keys = {body["sym"]: k for k, body in got}
    # by keys on A (one of A's, one of B's), by filter on B, by body on A
    assert delete(ca, "prices", sow_keys=f"{keys['A0']},{keys['B1']}") == 2
    assert delete(cb, "prices", f="/px >= 8") == 4
    cid = ca.next_cid()
    ca.send({"c": "sow_delete", "t": "prices", "cid": cid, "a": "stats"}, b'{"sym":"B5"}')
    assert ca.ack("stats", cid)["records_deleted"] == 1
    for s in ("A0", "B1", "A8", "A9", "B8", "B9", "B5"):
        del state[s]
    # both sides hold the deletes first: a publish on A racing B's delete of the same key is a
    # conflict that each instance orders by arrival (two writers of one key; docs/sow.md)
    wait_until(lambda: same_answer(pair, "prices", list(state.values())), 30, "deleted")
    # a publish after the deletes, on the side the filter delete did not run on
    publish(ca, "prices", {"sym": "A9", "px": 99})
    state["A9"] = {"sym": "A9", "px": 99}
    wait_until(lambda: same_answer(pair, "prices", list(state.values())), 30, "republished")


def test_expiration_on_both_sides(pair):
    a = pair["tt-a"]
    ca = Raw(a.port)
    ca.logon("pub-a")
    publish(ca, "ttl", {"k": 1})
    publish(ca, "ttl", {"k": 2})
    wait_until(lambda: same_answer(pair, "ttl", [{"k": 1}, {"k": 2}]), 30, "published")
    wait_until(lambda: same_answer(pair, "ttl", []) is not None, 30, "expired")


def test_deletes_during_a_cut_arrive_after_the_heal(pair):
    a, b = pair["tt-a"], pair["tt-b"]
    ca, cb = Raw(a.port), Raw(b.port)
    ca.logon("pub-a")
    cb.logon("pub-b")
    for i in range(20):
        publish(ca, "prices", {"sym": f"S{i}", "px": i})
    state = {f"S{i}": {"sym": f"S{i}", "px": i} for i in range(20)}
    wait_until(lambda: same_answer(pair, "prices", list(state.values())), 30, "published")
    pair.cut("tt-a", "tt-b", "drop")
    assert delete(ca, "prices", f="/px < 5") == 5
    assert delete(cb, "prices", f="/px >= 15") == 5
    publish(cb, "prices", {"sym": "S20", "px": 20})  # not matched by A's filter delete
    for i in list(range(5)) + list(range(15, 20)):
        del state[f"S{i}"]
    state["S20"] = {"sym": "S20", "px": 20}
    cid = cb.next_cid()
    cb.send({"c": "flush", "cid": cid, "a": "completed"})
    cb.ack("completed", cid)
    assert (len(answer(a, "prices")), len(answer(b, "prices"))) == (15, 16)  # cut: apart
    pair.heal()
    wait_until(lambda: same_answer(pair, "prices", list(state.values())), 40, "healed")
