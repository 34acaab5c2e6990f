import pytest

from tests.support.proc import ServerProcess


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for tests that do not care about each other's data."""
    s = ServerProcess(tmp_path_factory.mktemp("shared"), topics=("orders", "md\\..*", "work", "t\\..*"))
    s.start()
    yield s
    s.stop()


@pytest.fixture
def server(tmp_path):
    s = ServerProcess(tmp_path / "srv")
    s.start()
    yield s
    s.kill()
