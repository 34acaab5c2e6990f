import pytest

from tests.support.disk import memory_dir  # noqa: F401 (a fixture: input data built in memory)
from tests.support.proc import kill_leftovers

# The suite runs on three xdist workers with `--dist worksteal` (./run): each worker is first
# handed one contiguous share of the collection (a third each), and a worker whose share runs
# out takes half of what another has not started, from its end. A slow test
# therefore runs on the worker whose share holds it, and runs there before the short tests of
# that share only if it comes first in it. So the slow tests are dealt out between the shares,
# heaviest first onto the lighter share (by the seconds below), and each share begins with its
# own slow tests: every worker starts on minutes-long tests at once, the short ones follow, and
# the stealing evens out the end. (Under plain `--dist load` the first few hundred tests all
# went to one worker: every slow test of the suite ran on it, one after the other.)
#
# Seconds a test, measured with --durations on the two shared cores (2026-11-27, load 5-8);
# the first prefix that matches a slow or spark test's node id gives its weight.
SLOW_SECONDS = {
    "tests/spark/test_cluster.py": 120.0,
    "tests/e2e/test_fault_campaign.py": 19.0,  # each of the five slices of five rounds
    "tests/e2e/test_fault_seams.py": 70.0,  # each of the five slices of ten rounds
    "tests/e2e/test_replication_random.py": 52.0,
    "tests/e2e/test_lagging.py": 33.0,
    "tests/e2e/test_replication_failover.py::test_kill9_mid_stream": 27.0,
    "tests/journal/test_batch_spark.py": 20.0,  # seven tests, 6-73 s
}
DEFAULT_SLOW_SECONDS = 5.0
# modules whose tests stay in one share: they share a session-scoped resource that a second
# worker would start again (test_batch_spark.py's local Spark session, a JVM of its own)
KEEP_TOGETHER = ("tests/journal/test_batch_spark.py",)
# kept for tests/test_suite_order.py: every module named here must exist
LONGEST_FIRST = tuple(p.split("::")[0] for p in SLOW_SECONDS)


def weight(nodeid: str) -> float:
    for prefix, seconds in SLOW_SECONDS.items():
        if nodeid.startswith(prefix):
            return seconds
    return DEFAULT_SLOW_SECONDS


def worksteal_shares(n: int, workers: int) -> list[int]:
    """How many of `n` tests each worker is handed first: xdist's worksteal scheduler gives an
    idle worker len(pending) // (idle workers left) in turn (xdist/scheduler/worksteal.py)."""
    sizes, left = [], n
    for k in range(workers):
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    return sizes


def layout(ids: list[str], slow: list[bool], workers: int) -> list[int]:
    """The order (indexes into `ids`) to run the tests in: see the comment at the top. A pure
    function of the node ids, which slow ones are, and the number of workers; the short tests
    keep their collection order (a module's tests stay together, its fixtures start once)."""
    units: dict[str, list[int]] = {}
    for i, nodeid in enumerate(ids):
        if slow[i]:
            path = nodeid.split("::")[0]
            units.setdefault(path if path in KEEP_TOGETHER else nodeid, []).append(i)
    fast = [i for i in range(len(ids)) if not slow[i]]
    heavy = sorted(units.values(), key=lambda u: -sum(weight(ids[i]) for i in u))  # stable
    load = [0.0] * max(workers, 1)
    share: list[list[int]] = [[] for _ in load]
    for unit in heavy:
        k = load.index(min(load))
        share[k] += unit
        load[k] += sum(weight(ids[i]) for i in unit)
    sizes = worksteal_shares(len(ids), len(load))
    if any(len(s) > size for s, size in zip(share, sizes, strict=True)):
        # too few tests to give each share its slow ones (a small selection): slow ones first
        return [i for s in share for i in s] + fast
    order: list[int] = []
    for s, size in zip(share, sizes, strict=True):
        take = size - len(s)
        order += s + fast[:take]
        fast = fast[take:]
    return order + fast


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # on an xdist worker: the number of workers (every worker collects and orders alike)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    slow = [bool(it.get_closest_marker("slow") or it.get_closest_marker("spark")) for it in items]
    order = layout([it.nodeid for it in items], slow, workers)
    items[:] = [items[i] for i in order]


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_servers():
    """A test that fails between start() and stop() must not leave its server running after the
    session (module fixtures share servers across tests, so this runs once, at the end)."""
    yield
    kill_leftovers()
