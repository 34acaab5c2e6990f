"""Journal maintenance on the journal's owner: what to archive / compact / remove, and applying
a job's result. No Spark here (batch.py runs the jobs); this module runs in the server (in a
worker thread) or in `tickertape archive|compact` when no server has the journal open.

The protocol (file formats in manifest.py):

    order    (CLI, optional)  _maint/orders/<id>.json       {"kind", "older_than_s", "retention_s", ...}
    request  (journal owner)  _maint/requests/<id>.json     make_request(): the segments, policy
    job      (Spark)          _maint/staging/<id>/ ...      batch.py; archive files go to the archive
    result   (Spark driver)   _maint/results/<id>.json      the job's commit point (archive: after
                                                            its catalog file is committed)
    apply    (journal owner)  MANIFEST, _maint/applied/<id>.json   apply_result()

The owner (the server, or the CLI holding the journal's exclusive lock) is the only writer of
the manifest and the index. A job only proposes: apply_result checks that every segment the
result replaces is still in the layout, unchanged (path, range, size, mtime), and that every
output is there with the checksum the job recorded; otherwise the result is rejected (the job
can be run again on a new request) and the journal is untouched.

Segment states, as seen from here: sealed -> (archived: a verified archive covers its positions,
recorded in the manifest by position range) -> compacted (replaced by a compacted segment with
the same positions; still archived, since the archive state is by position) -> removed (below
the manifest's start). These can come in any order: archive, compact, remove (the README's
schedule), or compact, archive, remove. Only a prefix of the journal is ever removed, and only
when every position of it is archived (a file its catalog describes still has the crc32 the
catalog recorded), no queue needs it (every queue's checkpoint is past it), no replication
destination needs it (`destination_floor`: every configured destination has acked past it) and
no replay is reading it. Compaction keeps every record at or after the destinations' floor
(policy "replication_floor", compact_job.py), so a destination that comes back is sent exactly
what it misses.

Replication retention: the source's sender writes each destination's acked position to the
index metadata, key `repl_acked_key(dest)` = b"repl-acked:" + destination name (UTF-8), a u64
LE journal position below which the destination holds everything (absent: it holds nothing
yet, so nothing is removed).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import time
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .compacted import CompactedReader
from .manifest import (
    applied_path,
    file_sha256,
    maint_dir,
    new_request_id,
    read_json,
    request_path,
    result_path,
    staging_dir,
    write_json_atomic,
)
from .queue_events import checkpoint_key, decode_checkpoint
from .record import KIND_MESSAGE

if TYPE_CHECKING:
    from .journal import Journal
    from .segments import Segment

log = logging.getLogger("tickertape.journal.maintenance")

DEFAULT_GROUP_BYTES = 512 * 1024 * 1024
STALE_REQUEST_S = 24 * 3600.0
NEWEST_TIME_SPAN = 512 * 1024

Json = dict[str, Any]  # a request, result, answer or catalog, as its JSON file holds it
Queues = Iterable[tuple[str, str, bool]]  # (name, underlying topic, is a pattern) per queue
REPL_ACKED_PREFIX = b"repl-acked:"
_U64 = struct.Struct("<Q")


class MaintenanceError(RuntimeError):
    pass


def now_us() -> int:
    return int(time.time() * 1_000_000)


# -- choosing segments -------------------------------------------------------------------------


def segment_entry(seg: Segment) -> Json:
    st = os.stat(seg.path)
    return {
        "path": os.path.abspath(seg.path),
        "base": seg.base,
        "end": seg.end,
        "kind": seg.kind,
        "file_bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def newest_time_us(journal: Journal, seg: Segment) -> int | None:
    """An upper bound of the receive times in `seg`: the first message time at or after its end
    (times never decrease along the journal); None if nothing follows it yet, or no message in
    the NEWEST_TIME_SPAN bytes after it (only queue events: taken as not old enough)."""
    for r in journal.records(seg.end, max_bytes=64 * 1024):
        if r.kind == KIND_MESSAGE:
            return r.timestamp_us
        if r.position - seg.end >= NEWEST_TIME_SPAN:
            break
    return None


def queue_floors(journal: Journal, queues: Queues) -> list[Json]:
    """[{name, topic, pattern, floor}]: floor is the queue's persisted recovery checkpoint (every
    message of the queue below it is done); 0 (keep everything) where none was written yet."""
    out = []
    for name, topic, pattern in queues:
        floor = decode_checkpoint(journal.index.get_meta(checkpoint_key(name)))
        out.append({"name": name, "topic": topic, "pattern": bool(pattern), "floor": floor})
    return out


def repl_acked_key(dest: str) -> bytes:
    """The index metadata key of a replication destination's acked position."""
    return REPL_ACKED_PREFIX + dest.encode()


def destination_floor(journal: Journal, destinations: Iterable[str]) -> int | None:
    """The lowest position some configured destination has not acked (0 for one that never
    acked), or None with no destination: nothing at or after it may be removed or dropped."""
    floor = None
    for dest in destinations:
        raw = journal.index.get_meta(repl_acked_key(dest))
        pos = _U64.unpack(raw[:8])[0] if raw and len(raw) >= 8 else 0
        floor = pos if floor is None else min(floor, pos)
    return floor


def make_request(
    journal: Journal,
    kind: str,
    *,
    older_than_s: float | None = None,
    retention_s: float | None = None,
    archive_root: str | None = None,
    queues: Queues = (),
    destinations: Iterable[str] = (),
    now: int | None = None,
    recompact: bool = False,
    level: int = 3,
    group_bytes: int | None = None,
    req_id: str | None = None,
) -> Json | None:
    """A request for the sealed segments the job should process, or None if there are none.

    archive: sealed segments older than older_than_s with positions not archived yet; a segment
             archived in part (compacted over ranges archived before) gets "ranges", the
             [from, to) parts to archive, and the task takes only those.
    compact: sealed plain segments older than older_than_s (compacted ones too with recompact);
             with retention_s, records older than now - retention_s may be dropped (policy).
    queues: (name, underlying topic, is_pattern) of every configured queue.
    destinations: names of the configured replication destinations (their acked positions
             bound what compaction may drop: policy "replication_floor").
    """
    if kind not in ("archive", "compact"):
        raise ValueError(f"unknown job kind {kind!r}")
    now = now if now is not None else now_us()
    man = journal.manifest
    chosen = []
    for seg in journal.sealed_segments():
        if seg.size <= 0:
            continue
        if older_than_s:
            newest = newest_time_us(journal, seg)
            if newest is None or newest > now - int(older_than_s * 1_000_000):
                break  # times only grow: later segments are younger still
        entry = segment_entry(seg)
        if kind == "archive":
            # positions archived before (by an earlier run, perhaps before this segment was
            # compacted) are never archived again: the task takes only the gaps
            gaps = man.archive_gaps(seg.base, seg.end)
            if not gaps:
                continue
            if gaps != [(seg.base, seg.end)]:
                entry["ranges"] = [list(g) for g in gaps]
        elif seg.reader is not None and not recompact:
            continue
        chosen.append(entry)
    if not chosen:
        return None
    req = {
        "version": 1,
        "id": req_id or new_request_id(kind),
        "kind": kind,
        "created_us": now,
        "journal": os.path.abspath(journal.directory),
        "generation": man.generation,
        "group_bytes": group_bytes
        or (DEFAULT_GROUP_BYTES if kind == "archive" else 2 * DEFAULT_GROUP_BYTES),
        "segments": chosen,
    }
    if kind == "archive":
        if not archive_root:
            raise MaintenanceError(
                "archive needs <JournalArchiveDirectory> in <TransactionLog> (or --archive-dir)"
            )
        req["archive_root"] = os.path.abspath(archive_root)
    else:
        lo, hi = chosen[0]["base"], chosen[-1]["end"]
        keep = sorted(pos for _, (_seq, pos) in journal.publishers().items() if lo <= pos < hi)
        req["policy"] = {
            "cutoff_us": now - int(retention_s * 1_000_000) if retention_s else 0,
            "retention_s": retention_s,
            "queues": queue_floors(journal, queues),
            "replication_floor": destination_floor(journal, destinations),
            "keep_positions": keep,
            "level": level,
            "block_size": 1 << 20,
        }
    return req


def write_request(journal_dir: str, req: Json) -> str:
    path = request_path(journal_dir, req["id"])
    write_json_atomic(path, req)
    return path


def plan_groups(segments: list[Json], group_bytes: int, parallelism: int = 1) -> list[list[int]]:
    """Consecutive, adjacent segments in groups of about group_bytes, and at least `parallelism`
    groups when there are that many segments (so every core has work)."""
    n = len(segments)
    if n == 0:
        return []
    total = sum(s["file_bytes"] for s in segments)
    target = min(group_bytes, max(1, -(-total // max(1, min(parallelism, n)))))
    groups: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i, s in enumerate(segments):
        adjacent = not cur or segments[cur[-1]]["end"] == s["base"]
        if cur and (size >= target or size + s["file_bytes"] > group_bytes or not adjacent):
            groups.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += s["file_bytes"]
    if cur:
        groups.append(cur)
    return groups


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
    try:
        return read_json(applied_path(d, req_id))
    except FileNotFoundError:
        pass
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


def _check_sources(journal: Journal, entries: list[Json]) -> dict[int, Segment]:
    by_base = {s.base: s for s in journal.sealed_segments()}
    for e in entries:
        seg = by_base.get(e["base"])
        if seg is None or not _same_file(seg, e):
            raise MaintenanceError(
                f"segment {e['path']} changed or left the journal since the request; run again"
            )
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
    from .segments import Segment

    d = journal.directory
    _check_sources(journal, req["segments"])
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
        from .manifest import fsync_dir

        fsync_dir(d)
        for out in outputs:
            readers.append(CompactedReader(os.path.join(d, out["file"])))
    except BaseException:
        for r in readers:
            r.close()
        raise

    def commit() -> list[Segment]:
        sealed = journal.sealed_segments()
        by_base = {s.base: s for s in sealed}
        replaced = set()
        for e in req["segments"]:
            seg = by_base.get(e["base"])
            if seg is None or not _same_file(seg, e):
                raise MaintenanceError(f"segment {e['path']} changed while the result was applied")
            replaced.add(id(seg))
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
        for out in outputs:  # not committed: these files are not part of the journal
            try:
                os.unlink(os.path.join(d, out["file"]))
            except FileNotFoundError:
                pass
        raise
    journal.collect_garbage()
    rin = sum(o["records_in"] for o in outputs)
    rout = sum(o["records_out"] for o in outputs)
    bin_ = sum(o["bytes_in"] for o in outputs)
    bout = sum(o["bytes_out"] for o in outputs)
    return _answer(
        d,
        req["id"],
        "applied",
        f"{len(gone)} segments -> {len(outputs)} compacted; {rin} -> {rout} records; {bin_} -> {bout} bytes",
        generation=journal.manifest.generation,
    )


# -- removal (no Spark: deletes only what a verified archive holds) ------------------------------


def _file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return crc


def remove_journal(
    journal: Journal,
    *,
    older_than_s: float | None,
    archive_root: str | None,
    queues: Queues = (),
    replay_floor: int | None = None,
    now: int | None = None,
    destinations: Iterable[str] = (),
) -> Json:
    """Remove the oldest sealed segments that are old enough, archived, past every queue's
    checkpoint, every replay's position and every replication destination's acked position.

    Archived means: every position of the segment lies in a range the manifest records as
    archived, and each catalog of those ranges is still in the archive. A segment a catalog
    describes as a file (a plain segment by its range, a compacted one by its name) must also
    still have the crc32 the catalog recorded; a compacted segment made after its positions were
    archived is covered by the ranges alone (it holds a subset of the records archived there).
    """
    now = now if now is not None else now_us()
    man = journal.manifest
    floors = queue_floors(journal, queues)
    qfloor = min((q["floor"] for q in floors), default=None)
    dfloor = destination_floor(journal, destinations)
    removed = []
    why = ""
    catalogs: dict[str, Json | None] = {}
    for seg in journal.sealed_segments():
        if older_than_s:
            newest = newest_time_us(journal, seg)
            if newest is None or newest > now - int(older_than_s * 1_000_000):
                why = f"{seg.path} is younger than {older_than_s:g}s"
                break
        cats = man.archive_catalogs(seg.base, seg.end)
        if cats is None or not archive_root:
            why = f"{seg.path} is not archived"
            break
        if qfloor is not None and seg.end > qfloor:
            why = f"{seg.path} holds messages a queue has not finished (checkpoint {qfloor})"
            break
        if dfloor is not None and seg.end > dfloor:
            why = f"{seg.path} holds records a replication destination has not acked ({dfloor})"
            break
        if replay_floor is not None and seg.end > replay_floor:
            why = f"a replay is reading {seg.path}"
            break
        missing = [c for c in cats if _catalog(archive_root, c, catalogs) is None]
        if missing:
            why = f"archive catalog {missing[0]} is missing"
            break
        mismatch = _archived_file_mismatch(seg, cats, archive_root, catalogs)
        if mismatch is not None:
            why = f"{seg.path} does not match its archive (catalog {mismatch}); archive it again"
            break
        removed.append(seg)
    if not removed:
        return {"removed": 0, "reason": why}
    cut = removed[-1].end

    def commit() -> list[Segment]:
        sealed = journal.sealed_segments()
        if [s.path for s in sealed[: len(removed)]] != [s.path for s in removed]:
            raise MaintenanceError("the journal's layout changed during removal; run again")
        m = journal.manifest.copy()
        for pub, (seq, pos) in journal.publishers().items():
            if pos < cut:
                m.publishers[str(pub)] = [seq, pos]
        m.start = cut
        m.forget_archived_below(cut)
        # removed compacted files leave the manifest too (it names only files of the journal)
        m.compacted = [e for e in m.compacted if e["end"] > cut]
        return journal.commit_layout(m, sealed[len(removed) :])

    gone = journal.run_in_writer(commit).result()
    journal.collect_garbage()
    return {
        "removed": len(gone),
        "start": cut,
        "bytes": sum(s.file_bytes for s in removed),
        "reason": why,
    }


def _catalog(root: str, cat_id: str, cache: dict[str, Json | None]) -> Json | None:
    if cat_id not in cache:
        try:
            cache[cat_id] = read_json(os.path.join(root, "_catalog", cat_id + ".json"))
        except FileNotFoundError:
            cache[cat_id] = None
    return cache[cat_id]


def _archived_file_mismatch(
    seg: Segment, cats: list[str], root: str, cache: dict[str, Json | None]
) -> str | None:
    """The catalog (of those covering the segment) that describes this very file with another
    crc32, or None. A plain segment is the same file wherever its range is the same; a compacted
    one is known by its name (it carries the request that wrote it)."""
    name = os.path.basename(seg.path)
    for cat_id in cats:
        cat = _catalog(root, cat_id, cache)
        for entry in (cat or {}).get("segments", ()):
            if seg.kind == "plain":
                same = (entry["base"], entry["end"]) == (seg.base, seg.end) and not str(
                    entry.get("path", "")
                ).endswith(".cseg")
            else:
                same = os.path.basename(str(entry.get("path", ""))) == name
            if same and entry.get("file_crc32") is not None:
                if entry["file_crc32"] != _file_crc32(seg.path):
                    return cat_id
                return None
    return None


# -- the owner's loop over orders and results -----------------------------------------------------


def _ids(folder: str) -> list[str]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))


def pending_results(journal_dir: str) -> list[str]:
    answered = set(_ids(maint_dir(journal_dir, "applied")))
    return [i for i in _ids(maint_dir(journal_dir, "results")) if i not in answered]


def take_orders(
    journal: Journal,
    *,
    archive_root: str | None,
    queues: Queues,
    destinations: Iterable[str] = (),
) -> list[Json]:
    """Turn each order (written by the CLI while the server runs) into a request. Returns the
    answers: {"id", "request": path or None, "reason"} also written next to the order."""
    d = journal.directory
    out = []
    for oid in _ids(maint_dir(d, "orders")):
        opath = maint_dir(d, "orders", oid + ".json")
        try:
            order = read_json(opath)
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        ans: Json = {"id": oid, "request": None, "reason": ""}
        try:
            req = make_request(
                journal,
                order["kind"],
                older_than_s=order.get("older_than_s"),
                retention_s=order.get("retention_s"),
                archive_root=order.get("archive_root") or archive_root,
                queues=queues,
                destinations=destinations,
                recompact=bool(order.get("recompact")),
                req_id=oid,
            )
            if req is None:
                ans["reason"] = "nothing to do: no sealed segment qualifies"
            elif order.get("dry_run"):
                ans["preview"] = req
            else:
                ans["request"] = write_request(d, req)
        except (MaintenanceError, ValueError, KeyError) as exc:
            ans["reason"] = str(exc)
        write_json_atomic(maint_dir(d, "orders", oid + ".answer"), ans)
        os.unlink(opath)
        out.append(ans)
    return out


def clean_stale(journal_dir: str, max_age_s: float = STALE_REQUEST_S) -> None:
    """Forget requests whose job never reported (killed): staging is removed, the request answered."""
    now = time.time()
    answered = set(_ids(maint_dir(journal_dir, "applied")))
    results = set(_ids(maint_dir(journal_dir, "results")))
    for rid in _ids(maint_dir(journal_dir, "requests")):
        if rid in answered or rid in results:
            continue
        try:
            age = now - os.path.getmtime(request_path(journal_dir, rid))
        except FileNotFoundError:
            continue
        if age > max_age_s:
            _clean_staging(journal_dir, rid)
            _answer(journal_dir, rid, "rejected", f"no result after {age:.0f}s: the job was lost")
