import pytest

from tests.support.proc import kill_leftovers

# The suite runs on two xdist workers that take tests in collection order, so a four-minute
# campaign collected last runs alone at the end while the other worker idles. The slow tests go
# first, and first of all the slow tests of the modules whose tests take minutes (measured with
# --durations): xdist deals the first tests out one by one, in turn, so the long ones alternate
# between the workers and run beside the thousands of short tests instead of after them.
LONGEST_FIRST = (
    "tests/e2e/test_fault_seams.py",
    "tests/spark/test_cluster.py",
    "tests/e2e/test_fault_campaign.py",
    "tests/journal/test_batch_spark.py",
    "tests/e2e/test_replication_random.py",
)


def _rank(item: pytest.Item) -> int:
    if not (item.get_closest_marker("slow") or item.get_closest_marker("spark")):
        return len(LONGEST_FIRST) + 1
    for i, path in enumerate(LONGEST_FIRST):
        if item.nodeid.startswith(path):
            return i
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a module's tests keep their order


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_servers():
    """A test that fails between start() and stop() must not leave its server running after the
    session (module fixtures share servers across tests, so this runs once, at the end)."""
    yield
    kill_leftovers()
