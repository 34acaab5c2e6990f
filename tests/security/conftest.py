"""Fixtures shared by the security tests: one set of test certificates for the session."""

import pytest

from tests.security.certs import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    """A CA, an untrusted CA, and a server certificate for localhost / 127.0.0.1; more
    certificates are issued on demand with `pki.issue` / `pki.client_cert`."""
    return make_pki(tmp_path_factory.mktemp("pki"))
