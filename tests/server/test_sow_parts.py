"""The SOW manager's parts on their own (issue 24: objects handed their collaborators, not
mixins): `HeldWrites` over a real store with the fold's steps as plain callables, and `Deltas`
with spec, key maker and the committed-body read as plain callables."""

import threading
import time
from types import SimpleNamespace

import pytest

from config.model import SowTopicSpec
from server.sow.deltas import Deltas
from server.sow.held import HeldWrites
from server.sow.keys import KeyMaker, expires_at, k_fragment, with_expiration
from server.sow.store import SowStore
from tests.server.test_sow_checkpoints import make_checkpoint


def _refuse(*args):
    raise AssertionError(f"the fold's own step was called for a held put: {args}")


@pytest.fixture
def store(tmp_path):
    s = SowStore(str(tmp_path / "sow"))
    yield s
    s.close()


def test_held_writes_hold_puts_until_flush_and_count_them(store):
    counts: dict[str, int] = {}
    recount: set[str] = set()
    held = HeldWrites(
        store,
        counts,
        recount,
        lambda t: t == "px",
        lambda t: t == "px",
        _refuse,
        _refuse,
        None,
        None,
    )
    k1 = k_fragment("WzFd")
    puts = [
        ("px", 7, 1, 1000, b'{"a":1}', 0, k1, None),
        ("px", 7, 2, 1001, b'{"a":2}', 50, k_fragment("WzJd"), None),
        ("px", 7, 3, 1002, b'{"a":3}', 100, k1, None),
    ]
    assert held.defer(puts, {"px"}, 5000, 5150)
    # held, not written: the committed body is the held one, the store has nothing yet
    assert held.body("px", "WzFd") == b'{"a":3}'
    assert store.position is None and counts == {}
    held.flush()  # handed to the writer thread
    held.sync()  # written
    assert store.position == 5150 and counts == {"px": 2} and not recount
    reader = store.reader(0)
    try:
        assert reader.get("px", "WzFd")[5] == b'{"a":3}'  # the latest of the key won
    finally:
        reader.close()
    assert held.body("px", "WzFd") == b'{"a":3}'  # now from the store
    assert held.body("px", "nope") is None
    # a topic that may not be held (watched, or with <Expiration>) is applied by the manager
    assert not held.defer([("ttl", 7, 4, 1003, b"{}", 0, k1, None)], {"ttl"}, 6000, 6050)
    held.flush()  # nothing held: writes nothing
    held.sync()
    assert store.position == 5150
    held.close()


def _held(store, counts=None):
    return HeldWrites(
        store,
        {} if counts is None else counts,
        set(),
        lambda t: True,
        lambda t: True,
        _refuse,
        _refuse,
        None,
        None,
    )


def test_held_writes_flush_at_the_key_bound_and_the_byte_estimate(store, monkeypatch):
    """The held rows go to the writer once DEFER_RECORDS keys are held, or once the keys held
    times the mean journal bytes of the puts since the last flush reach DEFER_BYTES (a bound on
    memory whatever the message size); repeated keys add puts, not keys."""
    import server.sow.held as held_mod

    monkeypatch.setattr(held_mod, "DEFER_RECORDS", 4)
    monkeypatch.setattr(held_mod, "DEFER_BYTES", 10_000)
    held = _held(store)
    row = lambda k, seq: ("px", 7, seq, 1000, b"{}", 0, k_fragment(k), None)
    # three keys, each put twice, 100 journal bytes a put: 300 bytes held, under both bounds
    for seq in range(6):
        assert held.defer([row(f"k{seq % 3}", seq)], {"px"}, 100 * seq, 100 * (seq + 1))
    assert held.held_end == 600 and not held.writing and store.position is None
    assert held.defer([row("k3", 6)], {"px"}, 600, 700)  # the fourth key: flushed
    assert held.held_end is None
    held.sync()
    assert store.position == 700
    # big messages: 2 keys of 6,000 journal bytes each reach the byte estimate first
    assert held.defer([row("b0", 7)], {"px"}, 700, 6700)
    assert held.held_end == 6700
    assert held.defer([row("b1", 8)], {"px"}, 6700, 12700)
    assert held.held_end is None
    held.sync()
    assert store.position == 12700
    held.close()


def test_held_writes_are_written_once_a_tick_passes_without_a_commit(store):
    """A burst that ends leaves its last rows held; the first tick with no commit since the
    one before writes them (a query after the burst then finds the store written), while a
    tick in a stream of commits leaves them held until DEFER_SECONDS."""
    held = _held(store)
    k1 = k_fragment("WzFd")
    assert held.defer([("px", 7, 1, 1000, b'{"a":1}', 0, k1, None)], {"px"}, 0, 50)
    held.tick()  # a commit came since the last tick: held
    assert held.held_end == 50
    assert held.defer([("px", 7, 2, 1001, b'{"a":2}', 0, k1, None)], {"px"}, 50, 100)
    held.tick()  # again a commit since: held
    assert held.held_end == 100
    held.tick()  # nothing since the last tick: written
    assert held.held_end is None
    held.sync()
    assert store.position == 100
    held.tick()  # nothing held: nothing to do
    assert store.position == 100
    held.close()


def test_held_writes_are_written_off_the_calling_thread_and_readable_until_then(store):
    """A flush hands the rows to the writer thread and returns at once, even while the store's
    write lock is taken (here by another thread, as a slow disk would hold a write); until
    they are written the rows stay readable (`body`, the merge of a delta_publish), and
    `sync` waits for them."""
    counts: dict[str, int] = {}
    held = HeldWrites(
        store, counts, set(), lambda t: True, lambda t: True, _refuse, _refuse, None, None
    )
    k1 = k_fragment("WzFd")
    assert held.defer([("px", 7, 1, 1000, b'{"a":1}', 0, k1, None)], {"px"}, 5000, 5050)
    taken, release = threading.Event(), threading.Event()

    def hold_the_write_lock():
        with store.write():
            taken.set()
            release.wait(10)

    blocker = threading.Thread(target=hold_the_write_lock, daemon=True)
    blocker.start()
    assert taken.wait(10)
    try:
        t0 = time.monotonic()
        held.flush()
        assert time.monotonic() - t0 < 1.0  # not waiting for the write lock
        assert held.body("px", "WzFd") == b'{"a":1}'  # being written: still readable
        assert store.position is None
        # more puts held meanwhile are newer than the rows being written
        assert held.defer([("px", 7, 2, 1001, b'{"a":2}', 0, k1, None)], {"px"}, 5050, 5100)
        assert held.body("px", "WzFd") == b'{"a":2}'
    finally:
        release.set()
    blocker.join(10)
    held.sync()
    assert store.position == 5100 and counts == {"px": 1} and not held.writing
    assert held.body("px", "WzFd") == b'{"a":2}'
    held.close()


def test_deltas_merge_into_the_newest_accepted_body():
    spec = SowTopicSpec(name="px", keys=("/sym",))
    maker = KeyMaker(spec.keys)
    committed = {("px", maker.key(b'{"sym":"A"}', None)): b'{"sym":"A","px":1,"q":{"b":1}}'}
    deltas = Deltas(
        lambda t: spec if t == "px" else None, lambda s: maker, lambda t, k: committed.get((t, k))
    )
    assert deltas.merge_delta(None, "px", b'{"sym":"A","q":{"c":2}}', None) == (
        b'{"sym":"A","px":1,"q":{"b":1,"c":2}}'
    )
    assert deltas.merge_delta(None, "px", b'{"sym":"B","px":5}', None) == b'{"sym":"B","px":5}'
    # a publish accepted and not yet committed is newer than the committed record
    k = k_fragment(maker.key(b'{"sym":"A"}', None))
    open_batch = SimpleNamespace(msgs=[("px", 7, 9, 1000, b'{"sym":"A","px":9}', 0, k, None)])
    commits = SimpleNamespace(batch=open_batch, inflight=[])
    assert deltas.merge_delta(commits, "px", b'{"sym":"A","q":1}', None) == (
        b'{"sym":"A","px":9,"q":1}'
    )
    with pytest.raises(ValueError):
        deltas.merge_delta(None, "px", b"[1]", None)


def test_deltas_keep_replaced_bodies_while_a_feed_is_open_until_the_commit_is_delivered():
    deltas = Deltas(lambda t: None, lambda s: KeyMaker(()), lambda t, k: None)
    feed = deltas.delta_feed(SimpleNamespace(opts=SimpleNamespace(no_empties=False)))
    assert deltas.feeds == 1
    deltas.note_replaced(300, b'{"old":1}')
    batch = SimpleNamespace(after=[])
    deltas.after_commit(batch)
    assert feed._previous(300) == b'{"old":1}'
    (forget,) = batch.after
    forget(0)
    assert feed._previous(300) is None
    deltas.after_commit(batch)  # nothing replaced since: nothing to forget
    assert len(batch.after) == 1
    feed.close()
    assert deltas.feeds == 0


def test_expires_at_is_the_sooner_of_the_topic_and_the_record():
    hdr = with_expiration(k_fragment("K"), 30)
    assert expires_at(None, 1_000_000, b"") is None
    assert expires_at(10.0, 1_000_000, b"") == 11_000_000
    assert expires_at(None, 1_000_000, hdr) == 31_000_000
    assert expires_at(60.0, 1_000_000, hdr) == 31_000_000


def test_a_failed_write_freezes_the_position_before_the_lost_updates(tmp_path):
    """A write of held updates that fails (here: LMDB's map is full) marks the store failed,
    and no later write moves its position past the lost updates: the next start folds the
    journal again from before them, instead of serving a store without them for ever."""
    small = SowStore(str(tmp_path / "sow"), map_size=256 * 1024)
    held = HeldWrites(
        small, {}, set(), lambda t: True, lambda t: True, _refuse, _refuse, None, None
    )
    k1, k2 = k_fragment("WzFd"), k_fragment("WzJd")
    assert held.defer([("px", 7, 1, 1000, b'{"a":1}', 0, k1, None)], {"px"}, 0, 100)
    held.sync()
    assert small.position == 100 and small.failed is None
    big = b'{"pad":"' + b"x" * 400_000 + b'"}'  # past the map: the write fails
    assert held.defer([("px", 7, 2, 1001, big, 0, k2, None)], {"px"}, 100, 500_100)
    held.flush()
    held.sync()
    assert small.failed is not None and "failed" in small.failed
    assert small.position == 100
    # a later update that fits is written, but the position stays before the lost one
    assert held.defer([("px", 7, 3, 1002, b'{"a":3}', 0, k1, None)], {"px"}, 500_100, 500_200)
    held.sync()
    assert small.position == 100
    held.close()
    small.close()


def test_checkpoints_are_kept_across_the_window_and_the_journal(tmp_path, monkeypatch):
    """Every checkpoint a point in the window can start from stays (a historical query folds
    at most one interval, however far back): keeping only the newest 16 made a point older
    than them fold the journal from its start. Those before the journal's start (segments
    removed) go; the newest always stays."""
    from server.sow import checkpoints as history

    monkeypatch.setattr(history, "CHECKPOINT_EVERY", 1)
    store = SowStore(str(tmp_path / "sow"))
    start = [0]
    cps = history.Checkpoints(
        str(tmp_path / "cps"), lambda: store.env, None, None, lambda: start[0]
    )

    def make(pos: int) -> None:
        make_checkpoint(store, cps, pos)

    try:
        made = [100 * (i + 1) for i in range(24)]
        for pos in made:
            make(pos)
        assert cps.positions() == made
        start[0] = 1050  # the journal's segments before it were removed
        make(2500)
        assert cps.positions() == [p for p in made if p >= 1050] + [2500]
    finally:
        store.close()
