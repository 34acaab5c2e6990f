"""The SOW store's checkpoints (server/sow/checkpoints.py): which are kept under
`<SOW><MaxCheckpointSize>`."""

from __future__ import annotations

import logging
import time

from server.sow import checkpoints
from server.sow.checkpoints import Checkpoints, over_limit
from server.sow.keys import k_fragment
from server.sow.store import SowStore, encode_value


def make_checkpoint(store: SowStore, cps: Checkpoints, pos: int) -> None:
    """One record in `store` at `pos`, then a checkpoint of it, waited for (its copy runs on a
    thread)."""
    with store.write() as txn:
        store.put(txn, "px", "WzFd", encode_value(pos, 7, pos, 0, k_fragment("WzFd"), b"{}"))
        store.set_position(txn, pos)
    cps.maybe_make(pos, None)
    deadline = time.monotonic() + 10
    while cps._busy:
        assert time.monotonic() < deadline, "the checkpoint copy did not finish"
        time.sleep(0.01)


def test_over_limit_removes_the_one_leaving_the_shortest_stretch():
    # equal sizes, evenly made: on a tie the older goes; never the newest
    kept = [(100 * (i + 1), 10) for i in range(4)]
    assert over_limit(kept, 0, 40) == []
    assert over_limit(kept, 0, 39) == [100]
    # uneven: 300 sits 50 after 250, so removing 250 leaves 200..300 (100), the shortest
    kept = [(100, 10), (200, 10), (250, 10), (300, 10), (1000, 10)]
    assert over_limit(kept, 0, 40) == [250]
    # the journal's start counts as the stretch's start for the oldest
    assert over_limit([(900, 10), (1000, 10), (2000, 10)], 850, 20) == [900]
    # one larger than the limit alone: the newest stays
    assert over_limit([(100, 10), (200, 50)], 0, 20) == [100]


def test_over_limit_thins_evenly_as_checkpoints_come():
    """Made one after another at even spacing under a limit of 8 copies, the kept ones spread
    over the whole journal (the longest stretch stays within a few spacings of the average),
    where dropping the oldest would leave the first part of the journal with none."""
    kept: list[tuple[int, int]] = []
    for i in range(1, 201):
        kept.append((i * 10, 1))
        gone = set(over_limit(kept, 0, 8))
        kept = [kv for kv in kept if kv[0] not in gone]
    assert len(kept) == 8 and kept[-1][0] == 2000
    stretches = [b - a for (a, _), (b, _) in zip([(0, 0)] + kept, kept, strict=False)]
    assert max(stretches) <= 2 * 2000 / 8 + 10, stretches
    assert kept[0][0] <= 2000 / 4


def test_checkpoints_past_the_limit_are_thinned_on_disk(tmp_path, monkeypatch):
    """Checkpoints.keep (after each copy) applies over_limit to what the copies take on disk:
    they stay within the limit (the newest whatever its size), spread over the journal."""
    monkeypatch.setattr(checkpoints, "CHECKPOINT_EVERY", 1)
    store = SowStore(str(tmp_path / "sow"))
    one = [0]

    def make(cps: Checkpoints, pos: int) -> None:
        make_checkpoint(store, cps, pos)

    try:
        probe = Checkpoints(str(tmp_path / "probe"), lambda: store.env, None, None, lambda: 0)
        make(probe, 100)
        one[0] = probe.disk_bytes()  # one copy of this store on disk
        assert one[0] > 0
        limit = 5 * one[0]
        cps = Checkpoints(str(tmp_path / "cps"), lambda: store.env, None, None, lambda: 0, limit)
        for i in range(1, 41):
            make(cps, 100 * i)
            assert cps.disk_bytes() <= limit
        kept = cps.positions()
        assert len(kept) == 5 and kept[-1] == 4000
        assert kept[0] <= 1000, kept  # not only the newest: the early journal keeps one
        small = Checkpoints(
            str(tmp_path / "cps"), lambda: store.env, None, None, lambda: 0, one[0] // 2
        )
        make(small, 4100)
        assert small.positions() == [4100]  # the newest stays, whatever its size
    finally:
        store.close()


def _state(reader) -> dict:
    return {t: [kv for c in reader.chunks(t, 64) for kv in c] for t in ("px", "pz")}


def test_a_torn_or_missing_checkpoint_is_passed_for_the_one_before_it(
    tmp_path, monkeypatch, caplog
):
    """A historical query whose newest checkpoint is torn (its data file cut short, as a
    crash before the copy reached the disk leaves it), emptied, filled with garbage or gone
    answers from the checkpoint before it (or the journal's start), exactly as the fold of the
    whole journal does: never from the damaged copy (a short file read through LMDB's map is
    a SIGBUS), never a wrong answer; the damaged one is removed and said."""
    import os
    import random

    from server.sow import history
    from tests.server.test_sow_fold import _journal

    monkeypatch.setattr(checkpoints, "CHECKPOINT_EVERY", 1)
    j = _journal(tmp_path, random.Random(3))
    store = SowStore(str(tmp_path / "sow"))
    cps = Checkpoints(str(tmp_path / "cps"), lambda: store.env)
    is_sow = lambda t: t in ("px", "pz")
    try:
        starts = [r[0] for recs in j.raw_batches() for r in recs]
        made = [starts[len(starts) * i // 5] for i in (1, 2, 3, 4)]
        for pos in made:  # each checkpoint holds the fold of the journal up to it
            ref = history.fold_state(j, None, j.start_position, pos, is_sow, lambda t: None, int)
            with store.write() as txn:
                for t, pairs in _state(ref).items():
                    for key, value in pairs:
                        store.put(txn, t, key[len(t) + 1 :].decode(), value)
                store.set_position(txn, pos)
            ref.close()
            cps.maybe_make(pos, None)
            deadline = time.monotonic() + 10
            while cps._busy:
                assert time.monotonic() < deadline, "the checkpoint copy did not finish"
                time.sleep(0.01)
        assert cps.positions() == made
        end = j.end_position
        whole = history.fold_state(j, None, j.start_position, end, is_sow, lambda t: None, int)
        want = _state(whole)
        whole.close()

        def answer() -> dict:
            r = cps.reader(j, end, is_sow, lambda t: None)
            try:
                return _state(r)
            finally:
                r.close()

        assert answer() == want

        def garbage(f: str) -> None:
            with open(f, "r+b") as out:
                out.write(b"\xa5" * os.path.getsize(f))

        damage = [
            lambda f: os.truncate(f, os.path.getsize(f) // 2),  # torn
            lambda f: os.truncate(f, 0),  # emptied
            garbage,
            os.remove,  # the data file gone, its directory left
        ]
        for pos, hurt in zip(reversed(made), damage):  # the newest first: each query's own
            hurt(os.path.join(cps._path(pos), "data.mdb"))
            with caplog.at_level(logging.WARNING, logger="tickertape.sow"):
                assert answer() == want, pos
            assert pos not in cps.positions()
            assert f"SOW checkpoint {cps._path(pos)} is damaged" in caplog.text
        assert cps.positions() == []
        assert answer() == want  # from the journal's start
    finally:
        store.close()
        j.close()
