"""What an idle connection and an idle subscription cost in Python objects (tracemalloc, per
object over 1,000), under bounds that a regression would cross: issue 15 asks for under 20 KB
per idle connection and under 2 KB per idle subscription in the server's memory.

The measure is the Python heap only: the event loop's C transport (uvloop) and the kernel's
socket buffers are not in it; bench/bench_scale.py measures the server's RSS as well.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

from protocol.headers import Header
from server.connection import Connection
from tests.server.core_harness import FakeTransport, connection_env

N = 1000
# Measured when written (Python 3.11, asyncio): a logged-on connection 2.2 KB (3.0 KB with an
# asyncio.Event per Outbox), a subscription 370 B (750 B with its own empty ack set, options
# and topic bytes), 1.3 KB with a filter of its own (the compiled closures are most of it).


def _bytes_per(n: int, make: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = make()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del kept
    return (after - before) / n


def _connections(core, n: int) -> list[Connection]:
    env = connection_env(core)
    conns = []
    for i in range(n):
        conn = Connection(env, "json-tcp", 1 << 20)
        conn.out.attach(FakeTransport())
        conn.session.receive([(Header(c="logon", client_name=f"c{i}"), b"")])
        conns.append(conn)
    return conns


async def test_an_idle_connection_costs_under_2_75_kb_of_python_objects(core):
    _connections(core, 10)  # first-use caches (logon path) are not per connection
    per = _bytes_per(N, lambda: _connections(core, N))
    assert per < 2816, f"{per:.0f} B per idle logged-on connection"


def _subscribe(core, n: int, filt: Callable[[int], str | None]) -> object:
    c = core.client("sub")
    for i in range(n):
        f = filt(i)
        c.send("subscribe", t="orders", sub_id=f"s{i}", **({"f": f} if f else {}))
    c.take()
    return c


async def test_an_idle_subscription_costs_under_512_b_without_a_filter(core):
    _subscribe(core, 10, lambda i: None)
    per = _bytes_per(N, lambda: _subscribe(core, N, lambda i: None))
    assert per < 512, f"{per:.0f} B per idle subscription"


async def test_an_idle_subscription_with_its_own_filter_costs_under_2_kb(core):
    """Each with a filter of its own text (`/id = i`): the compiled filter is its cost too."""
    _subscribe(core, 10, lambda i: f"/id = {-i}")
    per = _bytes_per(N, lambda: _subscribe(core, N, lambda i: f"/id = {i}"))
    assert per < 2048, f"{per:.0f} B per idle subscription with a filter"
