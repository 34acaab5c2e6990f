"""SyncGate on its own: held batches released in order, downgrade by timer (a fake clock) and by
the admin, upgrade once caught up, the durable end and its bookmark, lag."""

from __future__ import annotations

import logging

import pytest

from server.replication.sync import UPGRADE_WITHIN, SyncGate, UnknownDestination


class Clock:
    """A fake monotonic clock with the loop's call_later."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.timers: list[list] = []  # [due, fn, cancelled]

    def call_later(self, delay: float, fn):
        timer = [self.now + delay, fn, False]
        self.timers.append(timer)

        class Handle:
            def cancel(self_inner) -> None:
                timer[2] = True

        return Handle()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now and not t[2]]
        self.timers = [t for t in self.timers if t not in due]
        for t in due:
            t[1]()

    @property
    def pending(self) -> int:
        return sum(1 for t in self.timers if not t[2])


class Batch:
    def __init__(self, name: str, entries=((1, 1),)) -> None:
        self.name = name
        self.entries = [(pub, seq, 0, 0) for pub, seq in entries]


class Local:
    end = 0


def make(dests, clock: Clock | None = None):
    clock = clock or Clock()
    local = Local()
    gate = SyncGate(dests, lambda: local.end, clock.call_later, lambda: clock.now, lambda: 5.0)
    released: list[str] = []
    woken: list[int] = []
    gate.release = lambda b: released.append(b.name)
    gate.wake = lambda: woken.append(1)
    gate.start()
    return gate, local, clock, released, woken


def commit(gate, local, name: str, end: int, entries=((1, 1),)) -> bool:
    local.end = end
    return gate.committed(Batch(name, entries), end)


def test_without_a_sync_destination_nothing_is_held():
    gate, local, clock, released, _ = make([("b", False, None)])
    assert not commit(gate, local, "x", 100)
    assert gate.held == 0 and released == []
    assert gate.durable_end == 100  # the local durable end
    assert clock.pending == 0  # an async destination has no downgrade timer


def test_held_until_acked_and_released_in_order():
    gate, local, _, released, woken = make([("b", True, None)])
    gate.link_up("b")
    assert commit(gate, local, "one", 100)
    assert commit(gate, local, "two", 200)
    assert commit(gate, local, "three", 300)
    assert gate.held == 3 and gate.durable_end == 0
    gate.acked("b", 150)  # covers only the first
    assert released == ["one"] and gate.durable_end == 150 and woken
    gate.acked("b", 300)
    assert released == ["one", "two", "three"] and gate.held == 0
    assert gate.durable_end == 300
    # acked ahead: the next batch passes at once, unless something is held before it
    gate.acked("b", 400)
    assert not commit(gate, local, "four", 400)


def test_a_batch_behind_a_held_one_waits_even_when_acked():
    gate, local, _, released, _ = make([("b", True, None), ("c", True, None)])
    gate.acked("b", 1000)
    assert commit(gate, local, "one", 100)  # c has not acked
    assert commit(gate, local, "dup-ack", 100, entries=())  # a batch of acks only: same end
    gate.acked("c", 100)
    assert released == ["one", "dup-ack"]


def test_every_active_sync_destination_must_ack():
    gate, local, _, released, _ = make([("b", True, None), ("c", True, None), ("d", False, None)])
    commit(gate, local, "one", 100)
    gate.acked("b", 100)
    gate.acked("d", 100)
    assert released == []
    gate.acked("c", 100)
    assert released == ["one"]


def test_downgrade_after_the_timer_releases_and_upgrade_when_caught_up(caplog):
    caplog.set_level(logging.INFO, "tickertape.replication")
    gate, local, clock, released, _ = make([("b", True, 5.0)])
    gate.link_up("b")
    gate.acked("b", 0)
    assert commit(gate, local, "one", 100)
    gate.link_down("b")
    clock.advance(4.9)
    assert released == [] and gate.dests["b"].mode == "sync"
    clock.advance(0.2)
    assert released == ["one"] and gate.dests["b"].mode == "downgraded"
    assert gate.dests["b"].downgrades == 1
    assert "downgraded to async" in caplog.text and "WARNING" in caplog.text
    assert not commit(gate, local, "two", 200)  # async now: nothing held
    # back, but far behind: still downgraded
    local.end = 10 * UPGRADE_WITHIN
    gate.link_up("b")
    gate.acked("b", 200)
    assert gate.dests["b"].mode == "downgraded"
    assert gate.snapshot()["b"]["catching_up"] is True
    gate.acked("b", local.end - 10)  # within one batch of the end: upgraded
    assert gate.dests["b"].mode == "sync" and gate.dests["b"].upgrades == 1
    assert "upgraded to sync again" in caplog.text
    assert commit(gate, local, "three", local.end + 50)  # holds again
    gate.acked("b", local.end)
    assert released == ["one", "three"]


def test_the_timer_counts_silence_not_time_since_the_last_connect():
    gate, local, clock, released, _ = make([("b", True, 2.0)])
    assert clock.pending == 1  # never connected yet: silent since the start
    gate.link_up("b")
    gate.acked("b", 0)
    clock.advance(10)
    assert gate.dests["b"].mode == "sync"  # up, nothing to acknowledge: not silent
    commit(gate, local, "one", 100)
    clock.advance(1.5)
    gate.acked("b", 100)  # acks within the time: stays sync
    assert released == ["one"] and gate.dests["b"].mode == "sync"
    commit(gate, local, "two", 200)
    # a destination whose commits fail: its link comes up and goes down every 100 ms, and it
    # answers each logon with the same resume point; the reconnects do not restart the count
    for _ in range(19):
        gate.link_down("b")
        clock.advance(0.05)
        gate.link_up("b")
        gate.acked("b", 100)
        clock.advance(0.05)
    assert gate.dests["b"].mode == "sync" and released == ["one"]
    gate.link_down("b")
    clock.advance(0.2)
    assert gate.dests["b"].mode == "downgraded" and released == ["one", "two"]


def test_a_connected_destination_that_does_not_acknowledge_is_downgraded(caplog):
    caplog.set_level(logging.WARNING, "tickertape.replication")
    gate, local, clock, released, _ = make([("b", True, 2.0)])
    gate.link_up("b")
    gate.acked("b", 0)
    clock.advance(5)
    commit(gate, local, "one", 100)  # the oldest batch it lacks is from now
    clock.advance(1.9)
    assert gate.dests["b"].mode == "sync"
    clock.advance(0.2)
    assert gate.dests["b"].mode == "downgraded" and released == ["one"]
    assert "connected, not acknowledging" in caplog.text


def test_never_downgraded_without_downgrade_after():
    gate, local, clock, released, _ = make([("b", True, None)])
    commit(gate, local, "one", 100)
    clock.advance(1e6)
    assert released == [] and clock.pending == 0


def test_admin_downgrade_and_upgrade():
    gate, local, clock, released, _ = make([("b", True, None), ("a", False, None)])
    gate.link_up("b")
    commit(gate, local, "one", 100)
    assert gate.downgrade("b") is True
    assert released == ["one"] and gate.dests["b"].mode == "downgraded"
    assert gate.downgrade("b") is False  # already
    assert gate.downgrade("a") is False  # async
    # connected when the admin downgraded it: its acks do not upgrade it back ...
    gate.acked("b", 100)
    assert gate.dests["b"].mode == "downgraded"
    # ... a reconnect does (once caught up)
    gate.link_down("b")
    gate.link_up("b")
    gate.acked("b", 100)
    assert gate.dests["b"].mode == "sync"
    gate.downgrade("b")
    assert gate.upgrade("b") is True and gate.dests["b"].mode == "sync"
    assert gate.upgrade("b") is False
    with pytest.raises(UnknownDestination, match="no replication destination named 'zz'"):
        gate.downgrade("zz")


def test_admin_upgrade_of_a_down_destination_rearms_its_timer():
    gate, local, clock, released, _ = make([("b", True, 3.0)])
    clock.advance(3)
    assert gate.dests["b"].mode == "downgraded"
    gate.upgrade("b")
    assert gate.dests["b"].mode == "sync" and clock.pending == 1
    commit(gate, local, "one", 100)
    clock.advance(3)
    assert gate.dests["b"].mode == "downgraded" and released == ["one"]


def test_durable_end_and_bookmark():
    gate, local, _, _, _ = make([("b", True, None)])
    gate.link_up("b")
    commit(gate, local, "one", 100, entries=((7, 1), (7, 2)))
    commit(gate, local, "two", 200, entries=((8, 1),))
    assert gate.durable_end == 0 and gate.durable_bm() is None
    gate.acked("b", 100)
    assert gate.durable_end == 100 and gate.durable_bm() == (7, 2)
    gate.acked("b", 199)  # inside the second batch: not all of it
    assert gate.durable_bm() == (7, 2)
    gate.acked("b", 200)
    assert gate.durable_bm() == (8, 1)
    gate.acked("b", 50)  # a destination that lost data acks less: the end never goes back
    assert gate.durable_end == 200


def test_durable_end_without_active_sync_is_the_local_end():
    gate, local, _, _, _ = make([("b", True, None)])
    commit(gate, local, "one", 100, entries=((7, 1),))
    gate.downgrade("b")
    assert gate.durable_end == 100 and gate.durable_bm() == (7, 1)


def test_lag_and_sent_counters():
    gate, local, clock, _, _ = make([("b", False, None)])
    gate.link_up("b")
    commit(gate, local, "one", 100, entries=((1, 1), (1, 2)))
    clock.advance(2)
    commit(gate, local, "two", 250, entries=((1, 3),))
    clock.advance(1)
    gate.sent("b", 250, messages=3, size=240)
    gate.sent("b", 300)
    snap = gate.snapshot()["b"]
    assert snap["lag_bytes"] == 250 and snap["lag_messages"] == 3 and snap["lag_seconds"] == 3.0
    assert snap["sent_bytes"] == 290 and snap["sent_messages"] == 3
    gate.acked("b", 100)
    snap = gate.snapshot()["b"]
    assert snap["lag_bytes"] == 150 and snap["lag_messages"] == 1 and snap["lag_seconds"] == 1.0
    assert snap["last_ack_time"] == 5.0 and snap["mode"] == "async" and snap["connected"]
    gate.acked("b", 250)
    snap = gate.snapshot()["b"]
    assert (snap["lag_bytes"], snap["lag_messages"], snap["lag_seconds"]) == (0, 0, 0.0)


def test_marks_are_bounded_and_never_name_a_bookmark_past_the_durable_end(monkeypatch):
    monkeypatch.setattr("server.replication.sync.MAX_MARKS", 3)
    gate, local, _, _, _ = make([("b", True, None)])
    for n in range(1, 7):
        commit(gate, local, f"b{n}", n * 100, entries=((1, n),))
    assert len(gate._ends) == 3
    gate.downgrade("b")  # durable end: the local end
    assert gate.durable_bm() == (1, 6)
    gate, local, _, _, _ = make([("b", True, None)])
    gate.link_up("b")
    for n in range(1, 7):
        commit(gate, local, f"b{n}", n * 100, entries=((1, n),))
    gate.acked("b", 200)  # marks of 100..300 were forgotten: bookmark 2 is not known any more
    assert gate.durable_end == 200 and gate.durable_bm() is None
    assert gate.snapshot()["b"]["lag_messages"] >= 3


def test_a_downgraded_destination_that_reconnects_without_progress_stays_downgraded():
    """A destination whose commits fail reconnects every 100 ms and answers each logon with the
    same resume point, near the end: that is no ack, so it stays downgraded (flapping back to
    sync would hold every publisher for another <DowngradeAfter>)."""
    gate, local, clock, released, _ = make([("b", True, 2.0)])
    gate.link_up("b")
    gate.acked("b", 1000)
    commit(gate, local, "one", 2000)
    clock.advance(2.1)
    assert gate.dests["b"].mode == "downgraded" and released == ["one"]
    for _ in range(30):
        gate.link_down("b")
        gate.link_up("b")
        gate.acked("b", 1000)  # within UPGRADE_WITHIN of the end, but not moving
        clock.advance(0.1)
    assert gate.dests["b"].mode == "downgraded" and gate.dests["b"].upgrades == 0
    assert not commit(gate, local, "two", 3000)  # publishers are not held again
    gate.acked("b", 2500)  # it moves: caught up, upgraded
    assert gate.dests["b"].mode == "sync" and gate.dests["b"].upgrades == 1
