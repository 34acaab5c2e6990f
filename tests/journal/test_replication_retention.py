"""Replication retention through the maintenance API: a segment a configured destination has
not acked (meta `repl-acked:<dest>`, written by the sender) is never removed, and compaction
keeps every record at or after the destinations' floor. Checked across a restart."""

import os
import struct
import zlib

from journal import maintenance as jm
from journal import maintenance_apply as jma
from journal.journal import Journal
from journal.manifest import write_json_atomic
from tests.support.journal_data import (
    TS0,
    all_raw,
    build,
    mixed_records,
    run_without_spark,
    submit,
)


def _fake_archive(j, root, cat_id="archive-test"):
    segs = j.sealed_segments()
    cat = {
        "id": cat_id,
        "segments": [
            {"base": s.base, "end": s.end, "file_crc32": zlib.crc32(open(s.path, "rb").read())}
            for s in segs
        ],
    }
    write_json_atomic(os.path.join(root, "_catalog", cat_id + ".json"), cat)
    man = j.manifest.copy()
    for s in segs:
        man.add_archived(s.base, s.end, cat_id)
    j.run_in_writer(lambda: j.commit_layout(man, j.sealed_segments())).result()
    return segs


def _acked(j, **dests):
    submit(
        j,
        mixed_records(1, start_seq=90_000 + len(all_raw(j)), pubs=(77,)),
        meta={jm.repl_acked_key(k): struct.pack("<Q", v) for k, v in dests.items()},
    )


def test_destination_floor_reads_every_configured_destination(tmp_path):
    j = build(str(tmp_path / "j"), batches=2, per_batch=10)
    assert jm.destination_floor(j, []) is None
    assert jm.destination_floor(j, ["tt-2"]) == 0  # never acked: it needs everything
    _acked(j, **{"tt-2": 500, "tt-3": 300})
    assert jm.destination_floor(j, ["tt-2"]) == 500
    assert jm.destination_floor(j, ["tt-2", "tt-3"]) == 300
    assert jm.destination_floor(j, ["tt-2", "tt-4"]) == 0
    j.close()


def test_remove_keeps_what_a_destination_has_not_acked_across_a_restart(tmp_path):
    d = str(tmp_path / "j")
    root = str(tmp_path / "archive")
    j = build(d, batches=30, per_batch=60, pubs=(11, 12), segment_size=16 * 1024)
    segs = _fake_archive(j, root)
    assert len(segs) >= 4
    _acked(j, **{"tt-2": segs[2].base + 1, "tt-3": segs[-1].end})
    j.close()
    j = Journal(d, segment_size=16 * 1024)
    res = jm.remove_journal(j, older_than_s=None, archive_root=root, destinations=["tt-2"])
    assert res["removed"] == 2 and "a replication destination has not acked" in res["reason"]
    assert j.start_position == segs[2].base
    # a destination with no acked position at all: nothing goes
    res = jm.remove_journal(j, older_than_s=None, archive_root=root, destinations=["tt-9"])
    assert res["removed"] == 0 and "has not acked (0)" in res["reason"]
    _acked(j, **{"tt-2": segs[-1].end})
    res = jm.remove_journal(j, older_than_s=None, archive_root=root, destinations=["tt-2", "tt-3"])
    assert res["start"] == segs[-1].end
    j.close()


def test_compaction_keeps_records_a_destination_has_not_acked(tmp_path):
    d = str(tmp_path / "j")
    j = build(d, batches=30, per_batch=60, pubs=(11, 12))
    before = all_raw(j)
    sealed = j.sealed_segments()
    floor = before[len(before) // 3][0]
    _acked(j, **{"tt-2": floor})
    req = jm.make_request(j, "compact", retention_s=1.0, now=TS0 + 10**12, destinations=["tt-2"])
    assert req is not None and req["policy"]["replication_floor"] == floor
    jm.write_request(d, req)
    run_without_spark(req)
    assert jma.apply_result(j, req["id"])["status"] == "applied"
    j.close()
    j = Journal(d, segment_size=64 * 1024)
    after = {r[0] for r in all_raw(j)}
    kept_floor = [r[0] for r in before if r[0] >= floor]
    assert set(kept_floor) <= after  # everything the destination still needs
    dropped = [r[0] for r in before if r[0] < floor and r[0] < sealed[-1].end and r[0] not in after]
    assert dropped  # and the retention did drop older records
    req = jm.make_request(j, "compact", retention_s=1.0, recompact=True, now=TS0 + 10**12)
    assert req is not None and req["policy"]["replication_floor"] is None  # no destination
    j.close()
