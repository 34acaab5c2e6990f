"""Compacted segments, the manifest, and maintenance on the journal's owner, without Spark:
the compaction tasks run in-process (the same functions Spark runs), results are applied and
the journal is checked through its API and across restarts."""

import errno
import os
import shutil
import struct
import zlib

import pytest

from journal import maintenance as jm
from journal import maintenance_apply as jma
from journal import state
from journal.compacted import CompactedReader, CompactedWriter
from journal.journal import CorruptSegment, Journal, JournalLocked
from journal.manifest import applied_path, read_json, save_manifest, staging_dir, write_json_atomic
from journal.record import KIND_MESSAGE, encode_record
from tests.support.journal_data import (
    TS0,
    all_raw,
    build,
    mixed_records,
    queue_event,
    run_without_spark,
    sow_fold,
    sow_journal,
    submit,
)


def compact(j, **kw):
    req = jm.make_request(j, "compact", **kw)
    assert req is not None
    jm.write_request(j.directory, req)
    run_without_spark(req)
    ans = jma.apply_result(j, req["id"])
    return req, ans


def newest_positions(records):
    newest = {}
    for r in records:
        if r[1] == KIND_MESSAGE:
            newest[r[2]] = r[0]
    return set(newest.values())


def test_compacted_format_reads_records_at_or_after_a_position(tmp_path):
    recs = []
    pos = 5000
    for i in range(300):
        raw = encode_record(KIND_MESSAGE, 1, i, TS0 + i, b"t", b'{"i":%d}' % i)
        recs.append((pos, raw))
        pos += len(raw)
    path = str(tmp_path / "x.cseg")
    w = CompactedWriter(path, 5000, pos, block_size=2048)
    kept = [r for k, r in enumerate(recs) if k % 3]
    for p, raw in kept:
        w.add_run(p, raw, [len(raw)])
    info = w.finish()
    r = CompactedReader(path)
    assert (r.base, r.end, r.records, info["blocks"] > 3) == (5000, pos, len(kept), True)
    got, p = [], 5000
    while True:
        rs, nxt = r.read_raw(p, 700)
        if not rs:
            assert nxt == r.end
            break
        got += rs
        p = nxt
    assert [g[0] for g in got] == [p for p, _ in kept]
    assert r.read_raw(recs[3][0], 10)[0][0][3] == 4  # a dropped position reads as the next record
    assert not r.holds(recs[3][0]) and r.holds(recs[4][0])
    # inside a record (not a boundary, checked by record.checked_size): the next record
    assert r.read_raw(recs[4][0] + 1, 10)[0][0][0] == recs[5][0]
    assert r.record_end(recs[4][0]) == recs[5][0]
    assert r.read(recs[298][0], 100)[0][0].seq == 298
    r.close()
    # damage one block: the reader names the file and the offset
    with open(path, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    r = CompactedReader(path)
    with pytest.raises(ValueError, match="checksum mismatch|zstd"):
        r.read_raw(5000, 100)
    r.close()


def test_compaction_keeps_retention_window_and_newest_per_publisher(tmp_path):
    d = str(tmp_path / "j")
    j = build(d, batches=30, per_batch=60)
    before = all_raw(j)
    sealed_end = j.sealed_segments()[-1].end
    cutoff = TS0 + 1200 * 1000  # records with seq >= 1200 are inside the window
    # make_request derives the cutoff from now - retention: give it the matching "now"
    now = cutoff + 10_000_000
    req, ans = compact(j, retention_s=10.0, now=now)
    assert ans["status"] == "applied", ans
    assert req["policy"]["cutoff_us"] == cutoff
    newest = {pos for pos in req["policy"]["keep_positions"]}
    expected = [r for r in before if r[0] >= sealed_end or r[4] >= cutoff or r[0] in newest]
    after = all_raw(j)
    assert after == expected  # same records, same positions, same order
    assert len(after) < len(before)
    dropped = [r for r in before if r not in expected]
    kept = [r for r in expected if r[0] < sealed_end]
    # locate: a kept message is found at its position, a dropped one is not in the journal
    for r in kept[:50] + kept[-50:]:
        assert j.locate(r[2], r[3]) == r[0]
    for r in dropped[:50] + dropped[-50:]:
        assert j.locate(r[2], r[3]) is None
        assert (
            j.read_raw(r[0])[0][0][0] > r[0]
        )  # reading at a dropped position: the next retained one
    # after(): the record after a kept one is the next retained record
    for a, b in zip(expected[:200], expected[1:201]):
        assert j.after(a[0]) == b[0]
    assert j.read(j.locate_time(cutoff - 1))[0][0].timestamp_us >= cutoff - 1
    stats = j.disk_bytes()
    j.close()
    # across a restart, and with the index rebuilt from the compacted segments
    j = Journal(d, segment_size=64 * 1024)
    assert all_raw(j) == expected and j.disk_bytes() == stats
    pubs = j.publishers()
    j.close()
    shutil.rmtree(os.path.join(d, "index"))
    j = Journal(d, segment_size=64 * 1024)
    assert all_raw(j) == expected
    assert j.publishers() == pubs
    # the journal keeps taking writes after the compacted range
    submit(j, mixed_records(5, start_seq=10_000))
    assert all_raw(j)[-1][3] == 10_004
    j.close()


def test_compress_only_keeps_every_record(tmp_path):
    d = str(tmp_path / "j")
    j = build(d, batches=20, per_batch=80)
    before = all_raw(j)
    sealed = j.sealed_segments()
    bytes_before = sum(s.file_bytes for s in sealed)
    req, ans = compact(j)
    assert ans["status"] == "applied"
    assert all_raw(j) == before
    now_sealed = j.sealed_segments()
    assert len(now_sealed) < len(sealed) and all(s.kind == "compacted" for s in now_sealed)
    assert sum(s.file_bytes for s in now_sealed) < 0.35 * bytes_before
    # a second run has nothing to do (compacted segments are not rewritten without recompact)
    assert jm.make_request(j, "compact") is None
    req2, ans2 = compact(j, recompact=True)
    assert ans2["status"] == "applied" and all_raw(j) == before
    j.close()


def test_queue_needs_and_events_survive(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d, segment_size=64 * 1024)
    work = [dict(r, topic="work") for r in mixed_records(300, start_seq=1, pubs=(21,))]
    submit(j, work[:150])
    other = mixed_records(300, start_seq=1, pubs=(31,), topics=("noise",))
    submit(j, other[:200])
    floor = all_raw(j)[120][0]  # every work message below the 121st is done
    submit(j, [queue_event("work-q", [(2, 0, floor - 1)])])
    submit(j, work[150:] + other[200:], meta={b"queue-checkpoint:work-q": struct.pack("<Q", floor)})
    submit(j, mixed_records(50, start_seq=1000, pubs=(41,), topics=("pad",)))
    submit(
        j, mixed_records(3000, start_seq=2000, pubs=(41,), topics=("pad",))
    )  # seal what came before
    before = all_raw(j)
    sealed_end = j.sealed_segments()[-1].end
    req, ans = compact(j, retention_s=1.0, queues=[("work-q", "work", False)], now=TS0 + 10**12)
    assert ans["status"] == "applied"
    assert req["policy"]["queues"] == [
        {"name": "work-q", "topic": "work", "pattern": False, "floor": floor}
    ]
    after = {r[0] for r in all_raw(j)}
    for r in before:
        if r[0] >= sealed_end:
            assert r[0] in after
        elif r[5] == b"work":
            assert (r[0] in after) == (r[0] >= floor or r[0] in req["policy"]["keep_positions"]), r[
                :4
            ]
        elif r[1] == 2:
            assert (r[0] in after) == (r[0] >= floor)
        elif r[5] == b"noise":
            assert (r[0] in after) == (r[0] in req["policy"]["keep_positions"])
    j.close()


def test_a_crash_at_any_step_leaves_the_journal_readable(tmp_path):
    d = str(tmp_path / "j")
    j = build(d, batches=20, per_batch=60)
    before = all_raw(j)
    sealed = [s.path for s in j.sealed_segments()]
    saved = {p: open(p, "rb").read() for p in sealed}
    req = jm.make_request(j, "compact")
    jm.write_request(d, req)
    res = run_without_spark(req)
    j.close()
    # crash 1: the outputs were moved into the journal directory, the manifest was not written
    for out in res["outputs"]:
        shutil.copy(out["staged"], os.path.join(d, out["file"]))
    j = Journal(d, segment_size=64 * 1024)
    assert all_raw(j) == before and all(s.kind == "plain" for s in j.segments)
    assert not any(n.endswith(".cseg") for n in os.listdir(d))
    # the job can be applied after the restart
    assert jma.apply_result(j, req["id"])["status"] == "applied"
    assert all_raw(j) == before
    j.close()
    # crash 2: the manifest was committed, the replaced files were not deleted yet
    for p, data in saved.items():
        with open(p, "wb") as f:
            f.write(data)
    j = Journal(d, segment_size=64 * 1024)
    assert all_raw(j) == before and j.segments[0].kind == "compacted"
    assert not any(os.path.exists(p) for p in sealed)
    j.close()


def test_a_stale_result_is_rejected_and_changes_nothing(tmp_path):
    d = str(tmp_path / "j")
    j = build(d, batches=15, per_batch=60)
    before = all_raw(j)
    r1 = jm.make_request(j, "compact")
    r2 = jm.make_request(j, "compact", retention_s=1.0, now=TS0 + 10**12)
    for r in (r1, r2):
        jm.write_request(d, r)
        run_without_spark(r)
    assert jma.apply_result(j, r1["id"])["status"] == "applied"
    gen = j.manifest.generation
    ans = jma.apply_result(j, r2["id"])
    assert ans["status"] == "rejected" and "changed or left the journal" in ans["reason"]
    assert j.manifest.generation == gen and all_raw(j) == before
    assert not os.path.exists(staging_dir(d, r2["id"]))
    assert jma.apply_result(j, r2["id"])["status"] == "rejected"  # answered once, the same answer
    assert read_json(applied_path(d, r1["id"]))["status"] == "applied"
    j.close()


def _fake_archive(j, root, cat_id="archive-test"):
    """Record the sealed segments as archived with a catalog holding their crc32 (what batch.py writes)."""
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


def test_remove_only_archived_prefix_not_needed_by_queues_or_replays(tmp_path):
    d = str(tmp_path / "j")
    root = str(tmp_path / "archive")
    j = build(d, batches=30, per_batch=60, pubs=(11, 12))
    submit(j, mixed_records(1, start_seq=5000, pubs=(99,)))  # publisher 99's only message
    for k in range(10):
        submit(j, mixed_records(60, start_seq=6000 + 60 * k, pubs=(11, 12)))
    before = all_raw(j)
    pos99 = next(r[0] for r in before if r[2] == 99)
    assert jm.remove_journal(j, older_than_s=None, archive_root=root)["reason"].endswith(
        "is not archived"
    )
    segs = _fake_archive(j, root)
    cut = segs[-1].end
    # a queue that has not finished its messages there, or a replay reading there, keeps them
    submit(
        j,
        mixed_records(1, start_seq=9000, pubs=(12,)),
        meta={b"queue-checkpoint:q": struct.pack("<Q", segs[1].base)},
    )
    res = jm.remove_journal(
        j, older_than_s=None, archive_root=root, queues=[("q", "orders/us", False)]
    )
    assert res["removed"] == 1 and "a queue has not finished" in res["reason"]
    res = jm.remove_journal(j, older_than_s=None, archive_root=root, replay_floor=segs[2].base + 1)
    assert res["removed"] == 1 and "a replay is reading" in res["reason"]
    # a file that no longer matches its archive stays
    with open(segs[2].path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == 0 and "does not match its archive" in res["reason"]
    with open(segs[2].path, "r+b") as f:
        f.seek(100)
        f.write(b)
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == len(segs) - 2 and res["start"] == cut
    assert j.start_position == cut
    assert all_raw(j)[:-1] == [r for r in before if r[0] >= cut]
    assert j.read_raw(0)[0][0][0] == cut  # a position below the start reads from the start
    assert j.locate(99, 5000) is None
    j.collect_garbage(grace_s=0)
    assert not any(os.path.exists(s.path) for s in segs)
    j.close()
    # dedup state of the removed publisher survives even an index rebuild
    shutil.rmtree(os.path.join(d, "index"))
    j = Journal(d, segment_size=64 * 1024)
    assert j.start_position == cut and j.publishers()[99] == (5000, pos99)
    j.close()


def test_every_open_is_exclusive_and_names_the_holder(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d)
    with pytest.raises(JournalLocked, match=f"locked by process {os.getpid()}"):
        Journal(d, exclusive=True)
    with pytest.raises(JournalLocked, match=f"locked by process {os.getpid()}"):
        Journal(d)
    j.close()
    j = Journal(d, exclusive=True)
    j.close()


def test_manifest_naming_a_missing_file_refuses_to_open(tmp_path):
    d = str(tmp_path / "j")
    j = build(d, batches=20, per_batch=60)
    compact(j)
    name = j.manifest.compacted[0]["file"]
    j.close()
    os.remove(os.path.join(d, name))
    with pytest.raises(
        CorruptSegment, match="manifest names this compacted segment but it is missing"
    ):
        Journal(d)


def test_plan_groups_and_schedules():
    from config.model import ActionTrigger
    from server.maintenance import next_run

    segs = [{"base": i * 10, "end": i * 10 + 10, "file_bytes": 100} for i in range(10)]
    assert jm.plan_groups(segs, 10_000, 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert jm.plan_groups(segs, 250, 1) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    segs[5]["base"] = 999  # not adjacent: never in one group
    assert jm.plan_groups(segs, 10_000, 1) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert next_run(ActionTrigger(kind="schedule", every=3600.0), 1000.0) == 4600.0
    daily = next_run(ActionTrigger(kind="schedule", at=(0, 30), utc=True), 86400 * 3 + 3600)
    assert daily == 86400 * 4 + 1800
    weekly = next_run(
        ActionTrigger(kind="schedule", at=(0, 30), weekday=5, utc=True), 0
    )  # 1970-01-01 was a Thursday
    assert weekly == 86400 * 2 + 1800
    assert next_run(ActionTrigger(kind="startup"), 0) is None


def test_compaction_keeps_sow_deletes_so_the_journal_folds_to_the_same_state(tmp_path):
    j, want, now = sow_journal(str(tmp_path / "j"))
    before = all_raw(j)
    _req, ans = compact(j, retention_s=1.0, now=now)
    assert ans["status"] == "applied", ans
    after = all_raw(j)
    assert len(after) < len(before)
    assert sow_fold(after, "prices") == want
    j.close()


def test_a_manifest_committed_whose_directory_sync_failed_keeps_its_compacted_files(
    tmp_path, monkeypatch
):
    """The MANIFEST's rename is the commit point; its directory's fsync comes after it. When
    that fsync failed (EIO), applying the compaction reported a failure and deleted its outputs,
    which the MANIFEST on disk already named: the next open deleted the plain segments they
    replaced, then found the compacted ones missing. Nothing is lost now: an output the
    MANIFEST on disk names stays (found reading maintenance under disk errors, issue 23)."""
    d = str(tmp_path / "j")
    j = build(d, batches=20, per_batch=60)
    before = all_raw(j)
    req = jm.make_request(j, "compact")
    jm.write_request(d, req)
    run_without_spark(req)

    def renamed_then_sync_failed(directory, manifest):
        save_manifest(directory, manifest)
        raise OSError(errno.EIO, "directory fsync failed (injected)")

    monkeypatch.setattr(state, "save_manifest", renamed_then_sync_failed)
    with pytest.raises(OSError, match="injected"):
        jma.apply_result(j, req["id"])
    monkeypatch.undo()
    assert all_raw(j) == before  # this run still reads the segments it had
    j.close()
    j = Journal(d, segment_size=64 * 1024)
    try:
        assert all_raw(j) == before
        assert j.segments[0].kind == "compacted"
    finally:
        j.close()
