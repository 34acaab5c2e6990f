"""Small synchronous operations on a Journal for the storage tests: one record at a time,
through the writer thread, and waits on the writer's state."""

from __future__ import annotations

import threading
import time

from journal.journal import Journal
from journal.record import KIND_MESSAGE, encode_record


def record(seq: int, body: bytes) -> tuple[bytes, list]:
    """Publisher 1's message `seq` on topic "t", and its index entry."""
    data = encode_record(KIND_MESSAGE, 1, seq, 1_700_000_000_000_000 + seq, b"t", body)
    return data, [(1, seq, 0, 0)]


def put(j: Journal, seq: int, body: bytes) -> BaseException | None:
    """Submit one record and wait: None once durable, else the error."""
    data, entries = record(seq, body)
    done = threading.Event()
    out: dict = {}

    def cb(pos, err):
        out["err"] = err
        done.set()

    j.submit(data, entries, cb)
    assert done.wait(30), "the writer never answered"
    return out["err"]


def seqs(j: Journal) -> list[int]:
    return [r.seq for r in j.scan()]


def writer_idle(j: Journal, timeout: float = 10.0) -> None:
    """Wait until the writer thread has nothing to do (it zeroes the runway after an open)."""
    deadline = time.monotonic() + timeout
    while j.writer._busy or j.writer._runway_wanted():
        assert time.monotonic() < deadline, "the writer thread stayed busy"
        time.sleep(0.005)
    time.sleep(0.01)
