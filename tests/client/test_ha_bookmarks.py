"""Bookmark stores through their API: duplicate and out-of-order filtering, MOST_RECENT,
marks, recovery across a (kill-like) reopen, prune(), damaged files; and a simulation of a
subscriber that discards out of order across reconnects and crashes against a model of the
server's replay (docs/protocol.md §5: "after the bookmark", a list starts after its oldest)."""

import os
import random
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from client import (
    EPOCH,
    MOST_RECENT,
    NOW,
    CorruptStore,
    LoggedBookmarkStore,
    MemoryBookmarkStore,
    RingBookmarkStore,
    StoreClosed,
    StoreLocked,
)

M = namedtuple("M", "sub_id bookmark")


def bm(pub: int, seq: int) -> str:
    return f"{pub}|{seq}|"


def msg(pub: int, seq: int, sub: str = "s") -> M:
    return M(sub, bm(pub, seq))


@pytest.fixture(params=["memory", "logged", "ring"])
def kind(request):
    return request.param


def open_store(kind, path, **kw):
    if kind == "memory":
        return MemoryBookmarkStore(**kw)
    if kind == "logged":
        return LoggedBookmarkStore(path, **kw)
    return RingBookmarkStore(path, **kw)


def kill(store) -> None:
    """What `kill -9` leaves of an open store: what reached the kernel, no close()."""
    if isinstance(store, LoggedBookmarkStore):
        os.close(store._fd)
    elif isinstance(store, RingBookmarkStore):
        store._mm.close()
        os.close(store._fd)
    store._closed = True


# ---------------------------------------------------------------------------------- every kind


def test_most_recent_of_unknown_is_epoch_and_explicit_start_is_kept(kind, tmp_path):
    s = open_store(kind, tmp_path / "b")
    assert s.most_recent("nobody") == EPOCH
    assert s.start("s", MOST_RECENT) == EPOCH
    assert s.start("t", NOW) == NOW and s.most_recent("t") == NOW
    s.close()
    with pytest.raises(StoreClosed):
        s.most_recent("s")


def test_duplicates_and_out_of_order_per_publisher_are_dropped(kind, tmp_path):
    s = open_store(kind, tmp_path / "b")
    s.start("s", EPOCH)
    assert [s.log(msg(7, n)) for n in (1000, 1002, 999, 1002, 1003)] == [
        True, True, False, False, True,
    ]  # fmt: skip
    assert s.log(msg(8, 5)) and s.log(msg(8, 6)) and not s.log(msg(8, 5))  # per publisher
    s.close()


def test_in_order_discards_move_the_resume_point(kind, tmp_path):
    s = open_store(kind, tmp_path / "b")
    s.start("s", EPOCH)
    for n in range(1, 6):
        s.log(msg(7, n))
    assert s.most_recent("s") in (EPOCH, bm(7, 1))  # nothing discarded yet
    s.discard(msg(7, 1))
    s.discard(msg(7, 2))
    assert s.most_recent("s") == bm(7, 2)
    s.persisted("s", bm(9, 99))  # a mark behind undiscarded messages waits for them
    for n in (3, 4, 5):
        s.discard(msg(7, n))
    # the exact stores add each publisher's own point (a failover to another instance)
    per_pub = "" if kind == "ring" else "," + bm(7, 5)
    assert s.most_recent("s") == bm(9, 99) + per_pub
    s.persisted("s", bm(9, 120))  # nothing pending: the mark is the resume point at once
    assert s.most_recent("s") == bm(9, 120) + per_pub
    s.close()


# ---------------------------------------------------------------------------------- memory + logged


@pytest.fixture(params=["memory", "logged"])
def exact(request, tmp_path):
    return open_store(request.param, tmp_path / "b")


def test_out_of_order_discards_resolve_to_the_right_list(exact):
    s = exact
    s.start("s", EPOCH)
    # arrival: A1 B1 A2 B2 A3 B3 ; the application discards A1, B1, B2, A3 (A2, B3 held)
    for pub, n in [(1, 1), (2, 1), (1, 2), (2, 2), (1, 3), (2, 3)]:
        assert s.log(msg(pub, n))
    for pub, n in [(1, 1), (2, 1), (2, 2), (1, 3)]:
        s.discard(msg(pub, n))
    # resume after B1 (just before the oldest undiscarded, A2); per publisher, the newest
    # processed before its oldest undiscarded: B2 for B, A1 for A
    assert s.most_recent("s") == ",".join([bm(2, 1), bm(2, 2), bm(1, 1)])
    # replay after B1 brings A2 B2 A3 B3 again: all were delivered in this process
    assert [s.log(msg(p, n)) for p, n in [(1, 2), (2, 2), (1, 3), (2, 3)]] == [False] * 4
    s.discard(msg(1, 2))
    assert s.most_recent("s") == ",".join([bm(1, 3), bm(2, 2)])
    s.discard(msg(2, 3))
    assert s.most_recent("s") == ",".join([bm(2, 3), bm(1, 3)]) and s.window_size("s") == 0


def test_elsewhere_adds_the_start_for_publishers_never_seen(exact):
    """On another instance a publisher this subscription has not seen may lie before the
    resume point: the list then holds the subscription's start too (the server leaves out, per
    publisher listed, what the subscriber has)."""
    s = exact
    s.start("s", EPOCH)
    for n in range(1, 4):
        assert s.log(msg(1, n))
        s.discard(msg(1, n))
    assert s.most_recent("s") == bm(1, 3)  # the same instance: its order is the one seen
    assert s.most_recent("s", elsewhere=True) == ",".join([bm(1, 3), EPOCH])
    s.start("t", NOW)  # a NOW start is no point before anything: nothing to add
    s.log(msg(1, 9, "t"))
    s.discard(msg(1, 9, "t"))
    assert s.most_recent("t", elsewhere=True) == bm(1, 9)
    s.start("u", bm(1, 1))  # a bookmark start is added once
    s.log(msg(2, 5, "u"))
    s.discard(msg(2, 5, "u"))
    assert s.most_recent("u", elsewhere=True) == ",".join([bm(2, 5), bm(1, 1)])


def test_now_start_resolves_to_the_first_message(exact):
    exact.start("s", NOW)
    exact.log(msg(3, 10))
    exact.log(msg(3, 11))
    assert exact.most_recent("s") == bm(3, 10)


def test_explicit_start_forgets_the_old_state(exact):
    exact.start("s", EPOCH)
    exact.log(msg(1, 5))
    exact.discard(msg(1, 5))
    assert exact.start("s", MOST_RECENT) == bm(1, 5)
    assert exact.start("s", EPOCH) == EPOCH and exact.log(msg(1, 5))  # replay again


@pytest.mark.parametrize("kind", ["memory", "logged"])
def test_a_full_publisher_table_forgets_one_the_window_does_not_hold(kind, tmp_path):
    s = open_store(kind, tmp_path / "b", max_publishers=3)
    s.start("s", EPOCH)
    for pub in (1, 2):
        assert s.log(msg(pub, 1))
        s.discard(msg(pub, 1))
    assert s.log(msg(3, 1))
    s.persisted("s", bm(1, 7))  # a mark: publisher 1, least recently seen, is in the window
    assert s.log(msg(4, 1))  # the table is full: publisher 2 goes, not 1
    assert not s.log(msg(1, 1)) and s.log(msg(2, 1))
    s.close()


def test_logged_store_recovers_exactly_after_kill(tmp_path):
    path = tmp_path / "b.log"
    s = LoggedBookmarkStore(path)
    s.start("s", EPOCH)
    for n in range(1, 11):
        s.log(msg(4, n))
    for n in (1, 2, 3, 5, 8):  # 4, 6, 7, 9, 10 still being processed
        s.discard(msg(4, n))
    s.log(msg(4, 11))  # buffered receipt, never discarded: not on disk yet, and not needed
    kill(s)
    s = LoggedBookmarkStore(path)
    assert s.recovery.clean
    assert s.start("s", MOST_RECENT) == bm(4, 3)
    replay = [s.log(msg(4, n)) for n in range(4, 13)]
    # 4, 6, 7, 9, 10 come once more (the process lost them), 5 and 8 do not, 11 and 12 are new
    assert replay == [True, False, True, True, False, True, True, True, True]
    assert [s.log(msg(4, n)) for n in (4, 6)] == [False, False]  # only once
    s.close()


def test_prune_shrinks_the_log_and_keeps_recovery_exact(tmp_path):
    path = tmp_path / "b.log"
    s = LoggedBookmarkStore(path, prune_on_close=False)
    rnd = random.Random(5)
    for sub in ("a", "b"):
        s.start(sub, EPOCH)
    held = []
    for n in range(1, 5001):
        for sub in ("a", "b"):
            s.log(msg(1 + n % 3, n, sub))
            held.append(msg(1 + n % 3, n, sub))
        if len(held) > 40:
            rnd.shuffle(held)
            for m in held[:20]:
                s.discard(m)
            del held[:20]
    s.persisted("a", bm(9, 1))
    s.sync()
    before = os.path.getsize(path)
    shutil.copy(path, tmp_path / "unpruned.log")
    s.prune()
    after = os.path.getsize(path)
    assert after * 20 < before, (before, after)
    kill(s)

    def recovered(p):
        st = LoggedBookmarkStore(p, prune_on_close=False)
        got = {sub: st.most_recent(sub) for sub in ("a", "b")}
        probe = [st.log(msg(1 + n % 3, n, sub)) for sub in ("a", "b") for n in range(4800, 5003)]
        st.close()
        return got, probe

    assert recovered(path) == recovered(tmp_path / "unpruned.log")


def test_logged_store_damaged_tail_is_cut_and_reported(tmp_path):
    path = tmp_path / "b.log"
    s = LoggedBookmarkStore(path, prune_on_close=False)
    s.start("s", EPOCH)
    for n in range(1, 6):
        s.log(msg(1, n))
        s.discard(msg(1, n))
    s.close()
    size = os.path.getsize(path)
    os.truncate(path, size - 5)  # the last DISCARD record cut short
    s = LoggedBookmarkStore(path, prune_on_close=False)
    r = s.recovery
    assert r.dropped_records == 1 and "cut off" in str(r)
    assert s.most_recent("s") == bm(1, 4)
    assert os.path.getsize(path) == size - 29  # cut at the last good record
    s.close()
    data = bytearray(Path(path).read_bytes())
    data[-30] ^= 0xFF  # corrupt the record before the last one
    Path(path).write_bytes(data)
    s = LoggedBookmarkStore(path, prune_on_close=False)
    assert "checksum mismatch" in str(s.recovery) and s.recovery.dropped_records == 1
    assert s.most_recent("s") == bm(1, 3)
    s.close()
    Path(path).write_bytes(b"not a bookmark log at all")
    with pytest.raises(CorruptStore, match="magic"):
        LoggedBookmarkStore(path)


def test_file_stores_are_single_owner(tmp_path):
    for cls in (LoggedBookmarkStore, RingBookmarkStore):
        a = cls(tmp_path / cls.__name__)
        with pytest.raises(StoreLocked):
            cls(tmp_path / cls.__name__)
        a.close()


def test_a_store_refused_at_open_leaves_its_file_unlocked(tmp_path):
    """A file that does not load is closed with its lock (client/storefile.py's `recovered`):
    opening it again is refused for what is in it, not `StoreLocked`, and after the file is
    replaced the store opens."""
    from client import FilePublishStore

    for cls in (LoggedBookmarkStore, RingBookmarkStore, FilePublishStore):
        path = tmp_path / cls.__name__
        path.write_bytes(b"not a store file at all, and long enough for any header" * 2)
        for _ in range(2):
            with pytest.raises(CorruptStore):
                cls(path)
        path.unlink()
        cls(path).close()


# ---------------------------------------------------------------------------------- ring


def test_ring_store_recovers_its_point_after_kill(tmp_path):
    path = tmp_path / "b.ring"
    s = RingBookmarkStore(path)
    s.start("a", EPOCH)
    s.start("b", NOW)
    for n in range(1, 6):
        s.log(msg(1, n, "a"))
        s.discard(msg(1, n, "a"))
    kill(s)
    s = RingBookmarkStore(path)
    assert s.recovery.clean and s.recovery.records == 2
    assert s.most_recent("a") == bm(1, 5) and s.most_recent("b") == NOW
    s.purge("b")
    s.start("c", MOST_RECENT)  # reuses b's slot
    s.close()
    assert os.path.getsize(path) == 64 + 2 * 512


def test_ring_store_torn_half_and_damaged_slot(tmp_path):
    path = tmp_path / "b.ring"
    s = RingBookmarkStore(path)
    s.start("a", EPOCH)
    s.start("b", EPOCH)
    s.log(msg(1, 1, "a"))
    s.discard(msg(1, 1, "a"))  # generation 2, in half A
    s.log(msg(1, 2, "a"))
    s.discard(msg(1, 2, "a"))  # generation 3, in half B
    s.close()
    data = bytearray(Path(path).read_bytes())
    data[64 + 384 + 20] ^= 0xFF  # tear slot a's newest half
    data[64 + 512 + 10] ^= 0xFF  # damage slot b's identity
    Path(path).write_bytes(data)
    s = RingBookmarkStore(path)
    assert s.most_recent("a") == bm(1, 1)  # the previous point survives
    assert s.most_recent("b") == EPOCH and "slot identity" in str(s.recovery)
    s.close()


# ---------------------------------------------------------------------------------- simulation


class Server:
    """The server's replay, as docs/protocol.md §5 states it, over a journal of (pub, seq)."""

    def __init__(self, journal):
        self.journal = journal
        self.pos = {bm(p, n): i for i, (p, n) in enumerate(journal)}

    def start_after(self, text: str) -> int:
        if text == EPOCH:
            return 0
        found = [self.pos[t] + 1 for t in text.split(",") if t in self.pos]
        assert found, f"resume point {text} unknown"
        return min(found)


def interleave(rnd, streams: dict[int, int]) -> list[tuple[int, int]]:
    """One instance's journal: each publisher's messages 1..n in order, publishers mixed at
    random (a replicated set agrees on per-publisher order only)."""
    counters = dict.fromkeys(streams, 0)
    out = []
    while len(out) < sum(streams.values()):
        p = rnd.choice([q for q in streams if counters[q] < streams[q]])
        counters[p] += 1
        out.append((p, counters[p]))
    return out


def simulate(store_factory, *, seed: int, in_order: bool, crashes: bool, marks: bool,
             instances: int = 1):  # fmt: skip
    """A subscriber against `instances` servers holding the same messages in different
    orders; every reconnect or crash moves it to the next one (failover)."""
    rnd = random.Random(seed)
    journal = interleave(rnd, {11: 1000, 22: 1000, 33: 1000})
    servers = [Server(journal)]
    for _ in range(instances - 1):
        servers.append(Server(interleave(rnd, {11: 1000, 22: 1000, 33: 1000})))
    current = 0
    server = servers[0]
    store = store_factory()
    store.start("s", MOST_RECENT)
    processed: list[tuple[int, int]] = []
    window: list[M] = []
    pos = 0
    events = 0
    while pos < len(server.journal):
        p, n = server.journal[pos]
        pos += 1
        m = msg(p, n)
        if store.log(m):
            window.append(m)
        if len(window) >= 16:
            if not in_order:
                rnd.shuffle(window)
            for done in window[:8]:
                processed.append(tuple(int(x) for x in done.bookmark.split("|")[:2]))
                store.discard(done)
            del window[:8]
        if marks and rnd.random() < 0.02:
            store.persisted("s", bm(*server.journal[pos - 1]))
        r = rnd.random()
        if r < (0.015 if crashes else 0.01):  # the next connection is to another instance
            current = (current + 1) % len(servers)
            server = servers[current]
        if r < 0.01:  # reconnect: the window stays with the application
            events += 1
            pos = server.start_after(store.most_recent("s"))
        elif crashes and r < 0.015:  # crash: the window dies with the process
            events += 1
            window = []
            kill(store)
            store = store_factory()
            pos = server.start_after(store.start("s", MOST_RECENT))
    for done in window:
        processed.append(tuple(int(x) for x in done.bookmark.split("|")[:2]))
        store.discard(done)
    store.close()
    assert events > 10
    assert len(processed) == len(set(processed)), "a message was processed twice"
    assert set(processed) == set(journal), "a message was never processed"


@pytest.mark.parametrize("seed", range(4))
def test_simulated_out_of_order_subscriber_memory_reconnects(seed):
    store = MemoryBookmarkStore()
    simulate(lambda: store, seed=seed, in_order=False, crashes=False, marks=True)


@pytest.mark.parametrize("seed", range(4))
def test_simulated_out_of_order_subscriber_logged_reconnects_and_crashes(seed, tmp_path):
    path = tmp_path / "b.log"
    simulate(lambda: LoggedBookmarkStore(path, auto_prune_bytes=20_000),
             seed=seed, in_order=False, crashes=True, marks=True)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_simulated_failover_across_a_replicated_set_memory(seed):
    """Each reconnect lands on another instance whose journal orders publishers differently:
    the per-publisher resume list loses nothing and the store drops every duplicate."""
    store = MemoryBookmarkStore()
    simulate(lambda: store, seed=seed, in_order=False, crashes=False, marks=True, instances=3)


@pytest.mark.parametrize("seed", range(4))
def test_simulated_failover_across_a_replicated_set_logged_with_crashes(seed, tmp_path):
    path = tmp_path / "b.log"
    simulate(lambda: LoggedBookmarkStore(path, auto_prune_bytes=20_000),
             seed=seed, in_order=False, crashes=True, marks=True, instances=2)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_simulated_in_order_subscriber_ring_reconnects_and_crashes(seed, tmp_path):
    path = tmp_path / "b.ring"
    simulate(lambda: RingBookmarkStore(path), seed=seed, in_order=True, crashes=True, marks=True)
