"""Answering a maintenance request on the journal's owner (the protocol in journal/maintenance.py):
apply a Spark job's result to the manifest, or reject it and leave the journal untouched; the
results waiting for an answer; requests that never got a result.

`apply_result` checks that every segment the result replaces is still in the layout, unchanged
(path, range, size, mtime), and that every output is there with the checksum the job recorded;
then it commits the new manifest (archive state by position range, compacted segments in place
of the ones they replace) and writes the answer `_maint/applied/<id>.json`. Answering twice
gives the same answer. `apply_if_free` does it when no server holds the journal
(`python -m journal.spark.batch` after a spark-submit run).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

from .compacted import CompactedReader
from .maintenance import STALE_REQUEST_S, Json, MaintenanceError, ids_in, now_us
from .manifest import (
    applied_path,
    file_sha256,
    fsync_dir,
    load_manifest,
    maint_dir,
    read_json,
    request_path,
    result_path,
    staging_dir,
    write_json_atomic,
)
from .segments import Segment

if TYPE_CHECKING:
    from .journal import Journal

log = logging.getLogger("tickertape.journal.maintenance")

__all__ = ["apply_if_free", "apply_result", "clean_stale", "pending_results"]


# -- applying results --------------------------------------------------------------------------


def _same_file(seg: Segment, entry: Json) -> bool:
    try:
        st = os.stat(seg.path)
    except FileNotFoundError:
        return False
    return (
        os.path.abspath(seg.path) == entry["path"]
        and seg.base == entry["base"]
        and seg.end == entry["end"]
        and st.st_size == entry["file_bytes"]
        and st.st_mtime_ns == entry["mtime_ns"]
    )


def _answer(journal_dir: str, req_id: str, status: str, reason: str = "", **extra: Any) -> Json:
    ans = {"id": req_id, "status": status, "reason": reason, "at_us": now_us(), **extra}
    write_json_atomic(applied_path(journal_dir, req_id), ans)
    if status == "applied":
        log.info("maintenance %s: applied %s", req_id, reason)
    else:
        log.warning("maintenance %s: %s: %s", req_id, status, reason)
    return ans


def apply_result(journal: Journal, req_id: str) -> Json:
    """Apply (or reject) the result of request req_id. Idempotent: an answered request is not
    applied twice. Runs on the journal's owner; the layout change itself runs on the writer thread."""
    d = journal.directory
    with contextlib.suppress(FileNotFoundError):
        return read_json(applied_path(d, req_id))
    try:
        req = read_json(request_path(d, req_id))
        res = read_json(result_path(d, req_id))
    except FileNotFoundError as exc:
        raise MaintenanceError(f"request {req_id}: {exc.filename} is missing") from None
    if req_id in journal.manifest.applied:
        return _answer(d, req_id, "noop", "already in the manifest")
    if res.get("status") != "ok":
        ans = _answer(d, req_id, "rejected", f"the job failed: {res.get('error', 'no detail')}")
        _clean_staging(d, req_id)
        return ans
    try:
        if req["kind"] == "archive":
            ans = _apply_archive(journal, req, res)
        else:
            ans = _apply_compaction(journal, req, res)
    except MaintenanceError as exc:
        ans = _answer(d, req_id, "rejected", str(exc))
    _clean_staging(d, req_id)
    return ans


def apply_if_free(journal_dir: str, req_id: str) -> Json | None:
    """Apply a result if no process holds the journal (opened exclusively for this, then
    closed); None if one does: the journal's owner (the server) applies results itself."""
    from .journal import Journal, JournalLocked

    try:
        j = Journal(journal_dir, exclusive=True)
    except JournalLocked:
        return None
    try:
        return apply_result(j, req_id)
    finally:
        j.close()


def _clean_staging(journal_dir: str, req_id: str) -> None:
    shutil.rmtree(staging_dir(journal_dir, req_id), ignore_errors=True)


def _check_sources(
    journal: Journal,
    entries: list[Json],
    why: str = "changed or left the journal since the request; run again",
) -> dict[int, Segment]:
    """The sealed segments by base, once each of `entries` is found there unchanged."""
    by_base = {s.base: s for s in journal.sealed_segments()}
    for e in entries:
        seg = by_base.get(e["base"])
        if seg is None or not _same_file(seg, e):
            raise MaintenanceError(f"segment {e['path']} {why}")
    return by_base


def _apply_archive(journal: Journal, req: Json, res: Json) -> Json:
    cat_path = res["catalog"]
    try:
        cat = read_json(cat_path)
    except FileNotFoundError:
        raise MaintenanceError(f"archive catalog {cat_path} is missing") from None
    if cat.get("id") != req["id"]:
        raise MaintenanceError(f"archive catalog {cat_path} belongs to {cat.get('id')}")
    _check_sources(journal, req["segments"])
    seen = {(s["base"], s["end"]) for s in cat["segments"]}
    for e in req["segments"]:
        if (e["base"], e["end"]) not in seen:
            raise MaintenanceError(f"archive catalog {cat_path} does not cover segment {e['path']}")
    man = journal.manifest.copy()
    for s in cat["segments"]:
        for lo, hi in s.get("ranges") or [(s["base"], s["end"])]:
            man.add_archived(lo, hi, req["id"])
    man.applied.append(req["id"])
    journal.run_in_writer(lambda: journal.commit_layout(man, journal.sealed_segments())).result()
    return _answer(
        journal.directory,
        req["id"],
        "applied",
        f"{len(cat['segments'])} segments archived ({cat['records']} records)",
        generation=journal.manifest.generation,
    )


def _apply_compaction(journal: Journal, req: Json, res: Json) -> Json:
    d = journal.directory
    _check_sources(journal, req["segments"])
    _check_archived(journal, req)
    outputs = res["outputs"]
    readers = []
    try:
        for out in outputs:
            staged = out["staged"]
            if not os.path.exists(staged):
                raise MaintenanceError(f"compacted output {staged} is missing")
            if file_sha256(staged) != out["sha256"]:
                raise MaintenanceError(
                    f"compacted output {staged} does not match its recorded sha256"
                )
            r = CompactedReader(staged)
            r.close()
            if (r.base, r.end, r.records) != (out["base"], out["end"], out["records_out"]):
                raise MaintenanceError(
                    f"compacted output {staged} holds [{r.base}, {r.end}) x {r.records}, "
                    f"not what the job reported"
                )
        # move the outputs into the journal directory (not yet part of the journal: a crash here
        # leaves files the manifest does not name, removed at the next open)
        for out in outputs:
            os.replace(out["staged"], os.path.join(d, out["file"]))
        fsync_dir(d)
        for out in outputs:
            readers.append(CompactedReader(os.path.join(d, out["file"])))
    except BaseException:
        for r in readers:
            r.close()
        raise

    def commit() -> list[Segment]:
        by_base = _check_sources(journal, req["segments"], "changed while the result was applied")
        sealed = list(by_base.values())  # the writer thread's: the layout holds still meanwhile
        replaced = {id(by_base[e["base"]]) for e in req["segments"]}
        new_segs = [Segment(r.base, r.path, r.end - r.base, r) for r in readers]
        layout = [s for s in sealed if id(s) not in replaced] + new_segs
        layout.sort(key=lambda s: s.base)
        man = journal.manifest.copy()
        gone_files = {os.path.basename(s.path) for s in sealed if id(s) in replaced}
        man.compacted = [e for e in man.compacted if e["file"] not in gone_files]
        for out in outputs:
            man.compacted.append(
                {
                    "file": out["file"],
                    "base": out["base"],
                    "end": out["end"],
                    "records": out["records_out"],
                    "raw_bytes": out["raw_out"],
                    "file_bytes": out["bytes_out"],
                    "request": req["id"],
                }
            )
        man.applied.append(req["id"])
        return journal.commit_layout(man, layout)

    try:
        gone = journal.run_in_writer(commit).result()
    except BaseException:
        for r in readers:
            r.close()
        named = _compacted_on_disk(d)
        for out in outputs:  # not committed: these files are not part of the journal
            if named is None or out["file"] in named:
                continue  # committed after all (below): the next open reads them
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(d, out["file"]))
        raise
    journal.collect_garbage()
    rin = sum(o["records_in"] for o in outputs)
    rout = sum(o["records_out"] for o in outputs)
    bin_ = sum(o["bytes_in"] for o in outputs)
    bout = sum(o["bytes_out"] for o in outputs)
    held = _held(outputs)
    return _answer(
        d,
        req["id"],
        "applied",
        f"{len(gone)} segments -> {len(outputs)} compacted; {rin} -> {rout} records; {bin_} -> {bout} bytes"
        + (f"; {held['reason']}" if held else ""),
        generation=journal.manifest.generation,
        **({"held": held} if held else {}),
    )


def _compacted_on_disk(journal_dir: str) -> set[str] | None:
    """The compacted files the MANIFEST on disk names (None: it cannot be read). A commit that
    raised may have happened all the same: the MANIFEST's rename is the commit point and its
    directory's fsync comes after it. Its outputs then stay, or the next open would drop the
    segments they replace and find them missing."""
    try:
        return {e["file"] for e in load_manifest(journal_dir).compacted}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _check_archived(journal: Journal, req: Json) -> None:
    """A compaction that drops only what the archive holds relied on the manifest's archived
    ranges at request time; they must still be recorded (removal forgets ranges only with the
    segments, which the source check catches first)."""
    for lo, hi in (req.get("policy") or {}).get("archived") or ():
        if journal.manifest.archive_gaps(lo, hi):
            raise MaintenanceError(
                f"positions [{lo}, {hi}) are no longer recorded as archived, but the request "
                "relied on it to drop records there; run the compaction again"
            )


def _held(outputs: list[Json]) -> Json | None:
    """What the job kept only because the archive does not hold it (compact_job.py), or None."""
    held = [o for o in outputs if o.get("held_unarchived")]
    if not held:
        return None
    n = sum(o["held_unarchived"] for o in held)
    first = min(o["held_first"] for o in held)
    last = max(o["held_last"] for o in held)
    return {
        "records": n,
        "first": first,
        "last": last,
        "reason": f"kept {n} records past the retention that the archive does not hold "
        f"(positions {first} to {last}): archive them (archive-journal, `tickertape archive`), "
        "then they can be dropped",
    }


def pending_results(journal_dir: str) -> list[str]:
    answered = set(ids_in(maint_dir(journal_dir, "applied")))
    return [i for i in ids_in(maint_dir(journal_dir, "results")) if i not in answered]


def clean_stale(journal_dir: str, max_age_s: float = STALE_REQUEST_S) -> None:
    """Forget requests whose job never reported (killed): staging is removed, the request answered."""
    now = time.time()
    answered = set(ids_in(maint_dir(journal_dir, "applied")))
    results = set(ids_in(maint_dir(journal_dir, "results")))
    for rid in ids_in(maint_dir(journal_dir, "requests")):
        if rid in answered or rid in results:
            continue
        try:
            age = now - os.path.getmtime(request_path(journal_dir, rid))
        except FileNotFoundError:
            continue
        if age > max_age_s:
            _clean_staging(journal_dir, rid)
            _answer(journal_dir, rid, "rejected", f"no result after {age:.0f}s: the job was lost")
