"""tests/support/raw.py's waits: a short timeout is the wait, whatever the socket's own is."""

import json
import socket
import struct
import time

import pytest

from tests.support.raw import Raw


@pytest.fixture
def peer():
    """A loopback listener; yields (its port, a function returning the accepted socket)."""
    with socket.create_server(("127.0.0.1", 0)) as ls:
        ls.settimeout(5)
        yield ls.getsockname()[1], ls.accept


def _frame(header: dict) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack(">I", len(h)) + h


def test_recv_until_waits_its_timeout_not_the_sockets(peer):
    port, accept = peer
    c = Raw(port, timeout=10.0)
    conn, _ = accept()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no matching frame in 0.3s"):
            c.recv_until(lambda h, _: h.get("c") == "ack", timeout=0.3)
        assert time.monotonic() - started < 3.0  # not the socket's 10 s
        assert c.sock.gettimeout() == 10.0  # the socket's own timeout is back
        # a frame that comes within the timeout is still taken, others before it kept
        conn.sendall(_frame({"c": "p", "i": 1}) + _frame({"c": "ack", "a": "persisted"}))
        got = c.recv_until(lambda h, _: h.get("c") == "ack", timeout=5)
        assert [h["c"] for h, _ in got] == ["p", "ack"]
    finally:
        conn.close()
        c.close()


def test_recv_until_still_stops_at_the_sockets_own_timeout(peer):
    port, accept = peer
    c = Raw(port, timeout=0.2)
    conn, _ = accept()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            c.recv_until(lambda h, _: True, timeout=30)
        assert time.monotonic() - started < 3.0
    finally:
        conn.close()
        c.close()
