"""The suite's order (tests/conftest.py): the modules named as the longest exist; each worker's
first share of the collection begins with its own slow tests, dealt out by weight; and the
shares are the ones xdist's worksteal scheduler really hands out."""

import itertools
import os
import subprocess
import sys

import pytest

from tests.conftest import KEEP_TOGETHER, LONGEST_FIRST, layout, weight, worksteal_shares

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_named_longest_exists():
    missing = [p for p in LONGEST_FIRST if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"renamed or removed: update SLOW_SECONDS in tests/conftest.py: {missing}"


def test_the_longest_and_the_slow_tests_are_collected_first():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/server/test_sync_gate.py", "tests/e2e/test_replication_random.py",
         "tests/e2e/test_fault_seams.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    ids = [ln for ln in out.stdout.splitlines() if "::" in ln]
    assert ids, out.stdout + out.stderr
    files = [i.split("::")[0] for i in ids]
    first_fast = files.index("tests/server/test_sync_gate.py")
    assert set(files[:first_fast]) == {
        "tests/e2e/test_fault_seams.py",
        "tests/e2e/test_replication_random.py",
    }, files
    assert ids[0].startswith("tests/e2e/test_fault_seams.py::test_seams_rounds_keep")


def _suite(n_fast: int = 400):
    """A made-up collection: short tests of four modules with the slow ones among them, as
    collected (module by module)."""
    ids, slow = [], []
    for m in range(4):
        ids += [f"tests/m{m}.py::test_{k}" for k in range(n_fast // 4)]
        slow += [False] * (n_fast // 4)
    long = (
        [
            f"tests/e2e/test_fault_seams.py::test_seams_rounds_keep_the_promise[{k}]"
            for k in range(5)
        ]
        + ["tests/spark/test_cluster.py::test_a", "tests/e2e/test_fault_campaign.py::test_a"]
        + [f"tests/journal/test_batch_spark.py::test_{k}" for k in range(7)]
        + [f"tests/m1.py::test_slow_{k}" for k in range(6)]
    )
    at = [0] * 5 + [120, 130] + [250] * 7 + [260] * 6  # where each goes, in collection order
    for pos, nodeid in sorted(zip(at, long, strict=True), key=lambda x: -x[0]):
        ids.insert(pos, nodeid)
        slow.insert(pos, True)
    return ids, slow


def _units(run: list[str]) -> list[float]:
    """The weights of the units in a run of slow tests: a KEEP_TOGETHER module's tests are one."""
    out: list[float] = []
    for k, nodeid in enumerate(run):
        path = nodeid.split("::")[0]
        if path in KEEP_TOGETHER and k and run[k - 1].startswith(path):
            out[-1] += weight(nodeid)
        else:
            out.append(weight(nodeid))
    return out


@pytest.mark.parametrize("workers", [2, 3])  # ./run test uses three
def test_each_worker_share_begins_with_its_slow_tests_and_their_weights_are_even(workers):
    ids, slow = _suite()
    order = layout(ids, slow, workers)
    assert sorted(order) == list(range(len(ids)))  # every test once
    sizes = worksteal_shares(len(ids), workers)
    ends = list(itertools.accumulate(sizes))
    shares = [order[end - size : end] for size, end in zip(sizes, ends, strict=True)]
    heavy = []
    for share in shares:
        n_slow = next(k for k, i in enumerate(share) if not slow[i])
        assert not any(slow[i] for i in share[n_slow:]), "a slow test after a short one"
        units = _units([ids[i] for i in share[:n_slow]])
        assert units == sorted(units, reverse=True), "not the heaviest first"
        heavy.append(sum(units))
    total = sum(heavy)
    assert max(heavy) - min(heavy) <= max(weight(ids[i]) for i in order if slow[i]), heavy
    assert total == sum(weight(i) for i, s in zip(ids, slow, strict=True) if s)
    # the Spark session's module stays in one share, in its own order
    spark = [[i for i in s if ids[i].startswith(KEEP_TOGETHER[0])] for s in shares]
    assert sorted(map(len, spark)) == [0] * (workers - 1) + [7] and max(spark, key=len) == sorted(
        max(spark, key=len)
    )
    # the short tests keep the collection's order (a module's tests stay together)
    fast = [i for i in order if not slow[i]]
    assert fast == sorted(fast)


def test_one_worker_or_a_small_selection_runs_the_slow_tests_first():
    ids, slow = _suite()
    order = layout(ids, slow, 1)
    n_slow = sum(slow)
    assert all(slow[i] for i in order[:n_slow])
    units = _units([ids[i] for i in order[:n_slow]])
    assert units == sorted(units, reverse=True) and units[0] == 7 * weight(KEEP_TOGETHER[0])
    few = [ids[0], "tests/e2e/test_fault_campaign.py::test_a", "tests/spark/test_cluster.py::t"]
    assert layout(few, [False, True, True], 2) == [2, 1, 0]


@pytest.mark.parametrize("workers", [2, 3])
def test_the_shares_are_those_xdists_worksteal_scheduler_hands_out(workers):
    """worksteal_shares mirrors xdist's scheduler: run the real one on made-up workers."""
    from xdist.scheduler.worksteal import WorkStealingScheduling

    class Node:
        shutting_down = False

        def __init__(self, name):
            self.gateway = type("Gateway", (), {"id": name})
            self.sent: list[int] = []

        def send_runtest_some(self, indices):
            self.sent += indices

    ids, _ = _suite()
    sched = WorkStealingScheduling.__new__(WorkStealingScheduling)
    sched.numnodes, sched.node2collection, sched.node2pending = workers, {}, {}
    sched.pending, sched.collection, sched.steal_requested_from_node = [], None, None
    sched.log = lambda *a: None
    nodes = [Node(f"gw{k}") for k in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, ids)
    sched.schedule()
    sizes = worksteal_shares(len(ids), workers)
    ends = list(itertools.accumulate(sizes))
    assert [n.sent for n in nodes] == [
        list(range(end - size, end)) for size, end in zip(sizes, ends, strict=True)
    ]
