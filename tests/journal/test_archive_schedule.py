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
    assert m.archive_catalogs(5, 25) == ["a", "b"] and m.archive_catalogs(0, 20) == ["a"]
    m.forget_archived_below(25)
    assert m.archived == [[25, 30, "b"]]


def test_a_dry_run_whose_reader_goes_away_ends_quietly(tmp_path, memory_dir):
    """`tickertape archive --dry-run | head -1`: more lines than a pipe holds, the reader closes
    after one: no BrokenPipeError traceback, status 141 (SIGPIPE's). The journal of 2,000
    one-record commits is built in memory: what is tested is the command's output."""
    import subprocess

    from tests.support.proc import TICKERTAPE, make_config

    data = memory_dir / "data"
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


def _events_then_young(d):
    """Old messages (2023) over a few segments, then more than 512 KiB of queue events only
    (a consumer draining), then young messages (a second before NOW): (journal, young's
    position)."""
    from tests.support.journal_data import TS0, mixed_records, queue_event, submit

    j = build(d, batches=10, per_batch=60)
    body_ops = [(2, 0, TS0)] * 80  # 80 ACKED entries: about 1 KiB a record
    for _ in range(24):
        submit(j, [queue_event("work-q", body_ops) for _ in range(32)])
    young = submit(j, mixed_records(60, start_seq=5000, ts0=NOW - 1_000_000 - 5000 * 1000))
    for k in range(10):  # seal the young one
        submit(j, mixed_records(100, start_seq=6000 + 100 * k, ts0=NOW - 6000 * 1000))
    return j, young


NOW = 1_800_000_000_000_000  # 2027: the journals built here are from 2023


def test_a_segment_followed_only_by_queue_events_is_archived_by_its_own_age(tmp_path):
    """The age of a segment is its newest message's (or, with queue events only, the newest
    message's before it), never what follows it: segments of old messages and of queue events
    are old, whatever comes after, and the walk stops only at the young messages."""
    d, root = str(tmp_path / "j"), str(tmp_path / "archive")
    j, young = _events_then_young(d)
    sealed = j.sealed_segments()
    old = [s for s in sealed if s.end <= young]
    assert len(old) >= 12 and len(old) < len(sealed)
    for _ in range(2):  # and the same across a reopen (the index's time entries are kept)
        req = jm.make_request(j, "archive", archive_root=root, older_than_s=60.0, now=NOW)
        assert [e["base"] for e in req["segments"]] == [s.base for s in old]
        res = jm.make_request(j, "compact", older_than_s=60.0, now=NOW)
        assert [e["base"] for e in res["segments"]] == [s.base for s in old]  # the same notion
        j.close()
        j = Journal(d, segment_size=64 * 1024)
    # removal measures the same age: it stops at the first segment not archived, not earlier
    res = jm.remove_journal(j, older_than_s=60.0, archive_root=root, now=NOW)
    assert res["removed"] == 0 and res["reason"] == f"{old[0].path} is not archived", res
    assert res["held"] is True
    j.close()


def test_newest_time_below_bounds_the_newest_message_by_a_second(tmp_path):
    j = build(str(tmp_path / "j"), batches=30, per_batch=60, ts_step=37_000)
    recs = [r for r in j.records() if r.kind == 1]
    for probe in [recs[0].position + 1, *(r.position for r in recs[1::97]), j.end_position]:
        newest = max(r.timestamp_us for r in recs if r.position < probe)
        got = j.index.newest_time_below(probe)
        assert newest < got <= newest + 1_000_000, probe
    assert j.index.newest_time_below(recs[0].position) is None
    j.close()


def test_compaction_drops_only_what_the_archive_holds(tmp_path):
    """archive (two oldest segments) -> compact with a retention every record is past: records
    the archive holds may go, the others all stay, and the step says how many it kept and why."""
    d, root = str(tmp_path / "j"), str(tmp_path / "archive")
    j = build(d, batches=40, per_batch=60)
    sealed = j.sealed_segments()
    before = list(j.records())
    first = jm.make_request(j, "archive", archive_root=root)
    first["segments"] = first["segments"][:2]
    jm.write_request(d, first)
    assert run_in_process(first)["status"] == "ok"
    assert jma.apply_result(j, first["id"])["status"] == "applied"
    half = sealed[1].end

    req = jm.make_request(j, "compact", retention_s=3600.0, archive_root=root)
    jm.write_request(d, req)
    assert run_in_process(req)["status"] == "ok"
    ans = jma.apply_result(j, req["id"])
    assert ans["status"] == "applied", ans
    unarchived = [r for r in before if r.position >= half]
    for _ in range(2):  # through the journal's API, and across a reopen
        after = list(j.records())
        assert [r for r in after if r.position >= half] == unarchived
        assert len([r for r in after if r.position < half]) < sum(
            1 for r in before if r.position < half
        )
        j.close()
        j = Journal(d, segment_size=64 * 1024)
    # everything that left the journal is in the archive
    held = set(archived_positions(root)) | {r.position for r in j.records()}
    assert {r.position for r in before} <= held
    # the request named what the archive holds; the answer says what was kept, and why
    assert req["policy"]["archived"] == [[sealed[0].base, half]]
    assert ans["held"]["records"] > 0 and ans["held"]["first"] == half, ans
    assert "the archive does not hold" in ans["reason"]
    j.close()


def test_an_archive_directory_with_nothing_archived_keeps_every_record(tmp_path):
    """With an archive step configured (or an archive directory) but nothing archived yet,
    compaction drops nothing for age; without any archiving it drops by retention alone."""
    d = str(tmp_path / "j")
    j = build(d, batches=20, per_batch=60)
    before = list(j.records())
    req = jm.make_request(j, "compact", retention_s=3600.0, archive_root=str(tmp_path / "a"))
    jm.write_request(d, req)
    assert run_in_process(req)["status"] == "ok"
    ans = jma.apply_result(j, req["id"])
    assert ans["status"] == "applied", ans
    assert list(j.records()) == before
    assert req["policy"]["archived"] == [] and ans["held"]["records"] > 0, ans
    scheduled = jm.make_request(
        j, "compact", retention_s=3600.0, archive_scheduled=True, recompact=True
    )
    assert scheduled["policy"]["archived"] == []
    plain = jm.make_request(j, "compact", retention_s=3600.0, recompact=True)
    assert plain["policy"]["archived"] is None  # nothing archives this journal: retention rules
    j.close()


def test_a_compaction_relying_on_archived_ranges_that_left_the_manifest_is_rejected(tmp_path):
    d, root = str(tmp_path / "j"), str(tmp_path / "archive")
    j = build(d, batches=20, per_batch=60)
    run(j, "archive", archive_root=root)
    req = jm.make_request(j, "compact", retention_s=3600.0, archive_root=root)
    assert req["policy"]["archived"]
    jm.write_request(d, req)
    assert run_in_process(req)["status"] == "ok"
    man = j.manifest.copy()
    man.archived = []  # e.g. a manifest restored from before the archive
    j.run_in_writer(lambda: j.commit_layout(man, j.sealed_segments())).result()
    before = list(j.records())
    ans = jma.apply_result(j, req["id"])
    assert ans["status"] == "rejected" and "no longer recorded as archived" in ans["reason"]
    assert list(j.records()) == before
    j.close()


def test_the_cli_takes_the_segments_the_schedule_takes_and_keeps_what_is_not_archived(
    tmp_path, capsys
):
    """`tickertape archive --older-than` and `compact --retention` (no server: the CLI owns the
    journal) measure ages and guard the archive as the <Actions> steps do: the archive takes
    the segments of old messages and of queue events up to the young messages, and with an
    archive step configured the compaction drops nothing the archive does not hold."""
    import argparse

    from server import maintenance_cli
    from tests.support.proc import make_config

    data = tmp_path / "data"
    j, young = _events_then_young(str(data / "journal"))
    old = [s.base for s in j.sealed_segments() if s.end <= young]
    before = list(j.records())
    j.close()
    cfg = tmp_path / "tt.xml"
    actions = """<Actions><Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>1d</Every></Options></On>
      <Do><Module>amps-action-do-archive-journal</Module><Options><Age>60s</Age></Options></Do>
      <Do><Module>tickertape-action-do-compact-journal</Module><Options><Retention>60s</Retention></Options></Do>
    </Action></Actions>"""
    cfg.write_text(
        make_config(str(data), extra=actions).replace(
            "</JournalDirectory>",
            f"</JournalDirectory><JournalArchiveDirectory>{data}/a</JournalArchiveDirectory>",
        )
    )

    def request(kind, **kw):
        args = dict(
            config=str(cfg),
            older_than=None,
            retention=None,
            recompact=False,
            master=None,
            driver_memory="1g",
            dry_run=False,
            json=False,
            quiet=True,
            wait=5.0,
            archive_dir=None,
            write_request=True,
        )
        args.update(kw)
        assert maintenance_cli.run(argparse.Namespace(**args), kind) == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert out, f"{kind} {kw}: no request (nothing qualifies)"
        return read_json(out[-1])

    # the ages come from the configuration's steps (60s), as the schedule's do
    assert [e["base"] for e in request("archive")["segments"]] == old
    assert [e["base"] for e in request("archive", older_than="60s")["segments"]] == old
    comp = request("compact")
    assert comp["policy"]["retention_s"] == 60.0 and comp["policy"]["archived"] == []
    assert run_in_process(comp)["status"] == "ok"
    j = Journal(str(data / "journal"), segment_size=64 * 1024)
    ans = jma.apply_result(j, comp["id"])
    assert ans["status"] == "applied" and ans["held"]["records"] > 0, ans
    assert list(j.records()) == before
    j.close()
