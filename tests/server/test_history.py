"""The console's ring of samples (server/history.py): bounded, and one wake-up per sample."""

import asyncio

from server.history import HOUR, History


def test_the_ring_keeps_the_last_hour_only():
    h = History()
    for i in range(HOUR + 500):
        h.record({"i": i})
    assert len(h.samples) == HOUR and h.count == HOUR + 500
    assert h.samples[0] == {"i": 500, "n": 501}
    assert h.last() == {"i": HOUR + 499, "n": HOUR + 500}


async def test_every_waiting_page_gets_the_next_sample():
    h = History(size=3)
    assert h.last() is None
    waiters = [asyncio.create_task(h.next()) for _ in range(3)]
    await asyncio.sleep(0)
    h.record({"x": 1})
    assert [await w for w in waiters] == [{"x": 1, "n": 1}] * 3
    late = asyncio.create_task(h.next())
    await asyncio.sleep(0)
    assert not late.done()  # a sample already recorded does not wake a new waiter
    h.record({"x": 2})
    assert (await late)["x"] == 2


async def test_a_waiter_that_gives_up_does_not_spoil_the_next():
    h = History()
    try:
        await asyncio.wait_for(h.next(), 0.01)
    except TimeoutError:
        pass
    nxt = asyncio.create_task(h.next())
    await asyncio.sleep(0)
    h.record({})
    assert (await nxt)["n"] == 1
