import pytest

from tests.support.proc import kill_leftovers


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_servers():
    """A test that fails between start() and stop() must not leave its server running after the
    session (module fixtures share servers across tests, so this runs once, at the end)."""
    yield
    kill_leftovers()
