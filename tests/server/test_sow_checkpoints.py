"""The SOW store's checkpoints (server/sow/checkpoints.py): which are kept under
`<SOW><MaxCheckpointSize>`."""

from __future__ import annotations

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
