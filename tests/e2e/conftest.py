import pytest

from tests.support.disk import small_disk  # noqa: F401 (a fixture for the disk-full tests)
from tests.support.proc import ServerProcess


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def shared_server(request, tmp_path_factory):
    """One server per event loop kind, for tests that do not care about each other's data."""
    s = ServerProcess(
        tmp_path_factory.mktemp("shared"),
        topics=("orders", "md\\..*", "work", "t\\..*"),
        args=("--loop", request.param),
    )
    s.start()
    yield s
    s.stop()


@pytest.fixture
def server(tmp_path):
    s = ServerProcess(tmp_path / "srv")
    s.start()
    yield s
    s.kill()
