"""QueueState's named operations (server/queue_state.py): the state of a queue is changed by
replication (server/queue_repl.py) only through them, and each keeps the invariants of a lease
(in `leased` and `by_bm`, counted in its holder's `outstanding`) and of a waiting message."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from journal.queue_events import QueueOp
from server import queue, queue_repl
from server.queue import Queue
from server.queue_state import QueueState
from server.queue_types import Lease, new_lease

QUEUES = """<SOW>
  <Queue><Name>work-q</Name><UnderlyingTopic>work</UnderlyingTopic>
         <MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
</SOW>"""


def _queue_with_leases(make_core, n_pub: int, backlog: int):
    core = make_core(QUEUES)
    pub = core.client("pub")
    for n in range(1, n_pub + 1):
        pub.send("publish", json.dumps({"n": n}), t="work", s=n)
    c = core.client("c")
    c.send("subscribe", t="work-q", sub_id="w", o=f"max_backlog={backlog}")
    return core, core.queues.get("work-q").state


def _consistent(q: QueueState) -> None:
    assert {lease.bm: p for p, lease in q.leased.items()} == q.by_bm
    for qs in q.subs:
        assert qs.outstanding == sum(1 for lease in q.leased.values() if lease.holder is qs)


def test_new_lease_builds_the_named_type():
    lease = new_lease(("holder", 7, "1|2|", None))
    assert type(lease) is Lease and lease == Lease("holder", 7, "1|2|", None)  # type: ignore[arg-type]
    assert (lease.holder, lease.gen, lease.bm, lease.counts) == ("holder", 7, "1|2|", None)
    assert lease.delivery_counts() == [1, 0]
    assert Lease("h", 1, "b", [3, 1]).delivery_counts() == [3, 1]  # type: ignore[arg-type]


async def test_apply_done_ends_a_lease_or_a_wait_and_keeps_the_invariants(make_core):
    core, q = _queue_with_leases(make_core, 4, 2)
    await core.settle()
    leased = sorted(q.leased)
    assert len(leased) == 2 and q.depth == 2
    waiting = [p for p in q.waiting_or_leased() if p not in q.leased]
    assert q.apply_done(leased[0]) and q.apply_done(waiting[-1])
    _consistent(q)
    assert leased[0] not in q.leased and not q.is_waiting(waiting[-1])
    assert not q.apply_done(leased[0])  # neither leased nor waiting any more: nothing to do
    assert sorted(q.waiting_or_leased()) == sorted([leased[1], *waiting[:-1]])


async def test_release_drops_the_lease_and_keeps_its_counts(make_core):
    core, q = _queue_with_leases(make_core, 3, 1)
    await core.settle()
    (pos,) = q.leased
    q.release(pos)
    _consistent(q)
    assert pos not in q.leased and q.counts[pos] == [1, 0] and not q.is_waiting(pos)
    other = next(p for p in q.waiting_or_leased() if p not in q.leased)
    q.release(other)  # a waiting one stops waiting
    assert not q.is_waiting(other) and other not in q.leased


async def test_apply_count_keeps_the_highest_for_held_or_delivered_messages(make_core):
    core, q = _queue_with_leases(make_core, 1, 1)
    await core.settle()
    q.apply_count(QueueOp.LEASED, 3, 999, held=False)
    assert 999 not in q.counts  # owned here, never delivered: nothing to keep
    q.apply_count(QueueOp.LEASED, 3, 999, held=True)
    q.apply_count(QueueOp.LEASED, 2, 999, held=True)
    q.apply_count(QueueOp.CANCELLED, 1, 999, held=False)
    assert q.counts[999] == [3, 1]


def test_replication_changes_the_queue_only_through_its_named_operations():
    """server/queue_repl.py reaches the queue (`q`, `self.q`) only by public names of the
    state's operations: no private attribute and no structure of the state."""
    allowed = {
        "add_events",
        "apply_count",
        "apply_done",
        "forget_counts",
        "host",
        "name",
        "pump",
        "release",
        "return_first",
        "waiting_or_leased",
    }
    tree = ast.parse(Path(queue_repl.__file__).read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id == "q") or (
                isinstance(base, ast.Attribute) and base.attr == "q"
            ):
                used.add(node.attr)
    assert used and used <= allowed, sorted(used - allowed)
    for name in allowed - {"host", "name", "pump"}:
        assert callable(getattr(QueueState, name)), name
    assert callable(Queue.pump)  # delivery is the Queue's; the state is handed it as a callable


_MUTATORS = {"append", "add", "clear", "discard", "extend", "insert", "pop", "popitem", "remove",
             "setdefault", "update", "heappush", "heappop", "heapify"}  # fmt: skip


def _state_writes(source: str) -> list[str]:
    """Writes to the state's structures in `source`: `st.x = ...`, `st.x[k] += ...`, `del
    st.x[k]`, `st.x.append(...)`, `heapq.heappush(st.x, ...)` (`st` or `self.state`)."""

    def of_state(node: ast.AST) -> bool:
        if isinstance(node, ast.Subscript):
            node = node.value
        if not isinstance(node, ast.Attribute):
            return False
        v = node.value
        return (isinstance(v, ast.Name) and v.id == "st") or (
            isinstance(v, ast.Attribute) and v.attr == "state"
        )

    wrong = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = getattr(node, "targets", None) or [node.target]  # type: ignore[attr-defined]
            wrong += [ast.unparse(t) for t in targets if of_state(t)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MUTATORS and (
                of_state(node.func.value) or any(of_state(a) for a in node.args[:1])
            ):
                wrong.append(ast.unparse(node))
    return wrong


def test_delivery_changes_the_state_only_through_its_named_operations():
    """server/queue.py (the Queue) reads its state's structures but writes none: each change
    is one of QueueState's operations, which keep the invariants."""
    assert _state_writes(Path(queue.__file__).read_text()) == []
    sample = "st.parked.append(p)\nst.barrier_wait = True\nheapq.heappush(self.state.returned, 1)"
    assert len(_state_writes(sample)) == 3  # the check sees each kind of write
