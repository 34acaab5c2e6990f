"""The queue's delivery and plain ack at a backlog of many (bench_queue's backlog 100): a run's
leases are made in one C call (`put_leases`, held to its Python reference), and a plain ack ends
its leases in one QueueState loop, so neither costs a Python call per message."""

from __future__ import annotations

import array
import json
import sys
from pathlib import Path

import pytest

from journal.queue_events import QueueOp
from server import queue_types
from server.queue_types import Lease, QueueSub, put_leases_py

QUEUES = """<SOW>
  <Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue>
</SOW>"""

_C = queue_types._c


def _deliveries(frames):
    return [f for f in frames if f["c"] == "p"]


def _consumer_with(make_core, n: int, sub: str = "a"):
    """A consumer holding the leases of n messages (backlog n: one run), nothing else waiting."""
    core = make_core(QUEUES, sub=sub)
    pub = core.client("pub")
    for i in range(1, n + 1):
        pub.send("publish", json.dumps({"n": i}), t="work", s=i)
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o=f"max_backlog={n}")
    return core, c


@pytest.mark.parametrize("impl", ["py", "c"])
def test_put_leases_makes_named_leases_and_their_bookmarks(impl):
    if impl == "c" and _C is None:
        pytest.skip("server._splice is not built here (or TICKERTAPE_PURE_PYTHON is set)")
    fn = put_leases_py if impl == "py" else _C.put_leases
    holder = QueueSub.__new__(QueueSub)
    leased: dict = {7: Lease(holder, 1, "0|7|", [2, 1])}
    by_bm = {"0|7|": 7}
    positions = array.array("Q", [100, 2**40 + 5, 300])
    bms = ["1|1|", "1|2|", "1|3|"]
    fn(leased, by_bm, positions, bms, Lease, holder, 9)
    assert by_bm == {"0|7|": 7, "1|1|": 100, "1|2|": 2**40 + 5, "1|3|": 300}
    assert leased[7] == (holder, 1, "0|7|", [2, 1])  # the others are left alone
    for p, bm in zip(positions, bms, strict=True):
        lease = leased[p]
        assert type(lease) is Lease and lease == (holder, 9, bm, None)
        assert (lease.holder, lease.gen, lease.bm, lease.counts) == (holder, 9, bm, None)
        assert lease.delivery_counts() == [1, 0]
    with pytest.raises(ValueError, match="2 bookmarks"):
        fn({}, {}, positions, bms[:2], Lease, holder, 9)


def test_the_queue_uses_the_c_put_leases_where_it_is_built():
    assert queue_types.put_leases is (_C.put_leases if _C is not None else put_leases_py)


async def test_ack_leased_ends_each_lease_once_in_one_event(make_core):
    core, c = _consumer_with(make_core, 5)
    await core.settle()
    st = core.queues.get("work-q").state
    bms = [f["bm"] for f in _deliveries(c.take())]
    assert len(bms) == 5 and st.subs[0].outstanding == 5
    st.take_events()
    positions = [st.by_bm[b] for b in bms]
    # twice the same bookmark, and one leased to no one: each passed over
    acked = st.ack_leased([bms[0], bms[2], bms[0], "9|9|"])
    assert list(acked) == [positions[0], positions[2]]
    assert st.subs[0].outstanding == 3 and st.stats["acked"] == 2
    assert {lease.bm: p for p, lease in st.leased.items()} == st.by_bm
    assert sorted(st.by_bm) == sorted([bms[1], bms[3], bms[4]])
    body = st.take_events()
    assert body is not None and body[0] == QueueOp.ACKED_RUN  # one run entry for both
    assert len(st.ack_leased(["9|9|"])) == 0 and st.take_events() is None  # nothing: no event


def _queue_calls(c, bms: list[str]) -> int:
    """Python calls into the queue's modules while the session applies one ack of `bms`."""
    calls = 0
    here = str(Path(queue_types.__file__).parent)

    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(here + "/queue"):
            calls += 1

    sys.setprofile(count)
    try:
        c.send("sow_delete", t="work-q", bm=",".join(bms))
    finally:
        sys.setprofile(None)
    return calls


async def test_a_plain_ack_costs_no_queue_call_per_message(make_core):
    counts = []
    for n in (4, 64):
        core, c = _consumer_with(make_core, n, sub=f"n{n}")
        await core.settle()
        bms = [f["bm"] for f in _deliveries(c.take())]
        assert len(bms) == n
        counts.append(_queue_calls(c, bms))
        st = core.queues.get("work-q").state
        assert not st.leased and st.stats["acked"] == n
    assert counts[0] == counts[1], counts  # 64 messages cost what 4 do (was one end_lease each)
