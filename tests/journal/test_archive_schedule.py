"""The README's schedule, archive -> compact -> remove-journal, on the journal's owner without
Spark (batch.run_in_process runs the tasks Spark would run, then the same verification, commit
and result file): archive state survives compaction, so the disk is reclaimed, replay from the
start has no gap, and no position is ever archived twice."""

import os

import pyarrow.dataset as ds
import pytest

from journal import maintenance as jm
from journal import maintenance_apply as jma
from journal.journal import Journal
from journal.manifest import read_json
from journal.spark.batch import run_in_process
from tests.support.journal_data import build


def run(j, kind, **kw):
    req = jm.make_request(j, kind, **kw)
    if req is None:
        return None, None
    jm.write_request(j.directory, req)
    s = run_in_process(req)
    assert s["status"] == "ok", s
    ans = jma.apply_result(j, req["id"])
    assert ans["status"] == "applied", ans
    return req, s


def files_bytes(d):
    return sum(
        os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith((".seg", ".cseg"))
    )


def archived_positions(root):
    t = ds.dataset(root, format="parquet", partitioning="hive").to_table(columns=["position"])
    return sorted(t["position"].to_pylist())


def test_archive_then_compact_then_remove_frees_the_disk(tmp_path):
    d, root = str(tmp_path / "j"), str(tmp_path / "archive")
    j = build(d, batches=40, per_batch=60)
    sealed_end = j.sealed_segments()[-1].end
    everything = list(j.records())
    disk_before = files_bytes(d)

    # 1. archive every sealed segment
    req, s = run(j, "archive", archive_root=root)
    assert s["records_in"] == sum(1 for r in everything if r.position < sealed_end)
    assert archived_positions(root) == [r.position for r in everything if r.position < sealed_end]

    # 2. compact them, dropping what the retention allows (the records are from 2023)
    _, cs = run(j, "compact", retention_s=3600.0)
    assert cs["records_out"] < cs["records_in"]
    assert all(seg.kind == "compacted" for seg in j.sealed_segments())
    kept = list(j.records())
    assert [r.position for r in kept if r.position >= sealed_end] == [
        r.position for r in everything if r.position >= sealed_end
    ]

    # the compacted positions are still known as archived: nothing to archive, nothing repeated
    assert jm.make_request(j, "archive", archive_root=root) is None
    assert j.manifest.archive_catalogs(j.start_position, sealed_end) == [req["id"]]

    # 3. remove-journal takes every sealed (compacted, archived) segment
    n = len(j.sealed_segments())
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == n, res
    assert res["start"] == sealed_end and j.start_position == sealed_end, res
    j.collect_garbage(grace_s=0)
    assert files_bytes(d) < disk_before
    # replay from the start: every record written from the new start on, none missing
    after = list(j.records())
    assert after == [r for r in everything if r.position >= sealed_end]
    assert after[0].position == j.start_position
    j.close()
    # the same after a restart
    j = Journal(d, segment_size=64 * 1024)
    assert list(j.records()) == after
    j.close()


def test_compacting_over_archived_and_unarchived_positions_archives_only_the_rest(tmp_path):
    d, root = str(tmp_path / "j"), str(tmp_path / "archive")
    j = build(d, batches=60, per_batch=60)
    sealed = j.sealed_segments()
    assert len(sealed) >= 4
    first = jm.make_request(j, "archive", archive_root=root)
    first["segments"] = first["segments"][:2]  # archive only the two oldest segments
    jm.write_request(d, first)
    assert run_in_process(first)["status"] == "ok"
    assert jma.apply_result(j, first["id"])["status"] == "applied"
    half = sealed[1].end
    assert j.manifest.archive_gaps(sealed[0].base, sealed[-1].end) == [(half, sealed[-1].end)]

    # compress everything sealed into one compacted segment: part archived, part not
    run(j, "compact", group_bytes=1 << 30)
    (cseg,) = j.sealed_segments()
    assert (cseg.kind, cseg.base, cseg.end) == ("compacted", sealed[0].base, sealed[-1].end)
    # it cannot go yet (half of it is not archived); the next archive takes only that half
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == 0 and res["reason"].endswith("is not archived")
    req = jm.make_request(j, "archive", archive_root=root)
    assert [e["ranges"] for e in req["segments"]] == [[[half, cseg.end]]]
    jm.write_request(d, req)
    s = run_in_process(req)
    assert s["status"] == "ok" and s["records_in"] == sum(1 for r in j.records(half, cseg.end)), s
    assert jma.apply_result(j, req["id"])["status"] == "applied"
    # every position archived once; the first catalog stands (not superseded, files kept)
    want = [r.position for r in j.records(None, cseg.end)]
    assert archived_positions(root) == want
    cat1 = read_json(os.path.join(root, "_catalog", first["id"] + ".json"))
    assert "superseded_by" not in cat1 and all(
        os.path.exists(os.path.join(root, f["path"])) for f in cat1["files"]
    )
    assert j.manifest.archive_catalogs(cseg.base, cseg.end) == [first["id"], req["id"]]
    assert jm.make_request(j, "archive", archive_root=root) is None
    # and now the compacted segment goes
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == 1 and j.start_position == cseg.end, res
    assert j.manifest.archived == [] or all(e > cseg.end for _b, e, _c in j.manifest.archived)
    j.close()


def test_a_compacted_segment_archived_as_such_must_still_match_its_catalog(tmp_path):
    """compact -> archive -> remove: the catalog describes the compacted file by name; a file
    that changed since is kept."""
    d, root = str(tmp_path / "j"), str(tmp_path / "archive")
    j = build(d, batches=30, per_batch=60)
    run(j, "compact")
    run(j, "archive", archive_root=root)
    victim = j.sealed_segments()[0]
    with open(victim.path, "r+b") as f:  # the block index's last byte: still opens, other crc
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == 0 and "does not match its archive" in res["reason"]
    with open(victim.path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b)
    n = len(j.sealed_segments())
    res = jm.remove_journal(j, older_than_s=None, archive_root=root)
    assert res["removed"] == n >= 1 and j.start_position == res["start"], res
    j.close()


@pytest.mark.parametrize(
    "ranges, segment, gaps",
    [
        ([], (0, 100), [(0, 100)]),
        ([[0, 100, "a"]], (0, 100), []),
        ([[0, 40, "a"], [40, 100, "b"]], (0, 100), []),
        ([[0, 40, "a"], [60, 80, "b"]], (0, 100), [(40, 60), (80, 100)]),
        ([[50, 150, "a"]], (0, 100), [(0, 50)]),
    ],
)
def test_archive_gaps(ranges, segment, gaps):
    from journal.manifest import Manifest

    m = Manifest(archived=[list(r) for r in ranges])
    assert m.archive_gaps(*segment) == gaps
    assert (m.archive_catalogs(*segment) is None) == bool(gaps)


def test_ranges_of_different_catalogs_stay_apart_and_old_ones_are_forgotten():
    from journal.manifest import Manifest

    m = Manifest()
    m.add_archived(0, 10, "a")
    m.add_archived(10, 20, "a")
    m.add_archived(20, 30, "b")
    assert m.archived == [[0, 20, "a"], [20, 30, "b"]]
    assert m.archive_catalogs(5, 25) == ["a", "b"] and m.archived_through(0, 20) == "a"
    m.forget_archived_below(25)
    assert m.archived == [[25, 30, "b"]]


def test_a_dry_run_whose_reader_goes_away_ends_quietly(tmp_path):
    """`tickertape archive --dry-run | head -1`: more lines than a pipe holds, the reader closes
    after one: no BrokenPipeError traceback, status 141 (SIGPIPE's)."""
    import subprocess

    from tests.support.proc import TICKERTAPE, make_config

    data = tmp_path / "data"
    j = build(str(data / "journal"), batches=2000, per_batch=1, segment_size=200)
    assert len(j.sealed_segments()) > 800
    j.close()
    cfg = tmp_path / "tt.xml"
    cfg.write_text(
        make_config(str(data)).replace(
            "</JournalDirectory>",
            f"</JournalDirectory><JournalArchiveDirectory>{data}/a</JournalArchiveDirectory>",
        )
    )
    p = subprocess.Popen(
        [TICKERTAPE, "archive", "--config", str(cfg), "--dry-run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout.readline().startswith(b"archive: would take")
    p.stdout.close()
    assert p.wait(60) == 141
    assert p.stderr.read() == b""
    p.stderr.close()
