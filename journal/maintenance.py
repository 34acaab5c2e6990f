"""Journal maintenance on the journal's owner: what to archive / compact / remove, and applying
a job's result. No Spark here (batch.py runs the jobs); this module runs in the server (in a
worker thread) or in `tickertape archive|compact` when no server has the journal open.

The protocol (file formats in manifest.py):

    order    (CLI, optional)  _maint/orders/<id>.json       {"kind", "older_than_s", "retention_s", ...}
    request  (journal owner)  _maint/requests/<id>.json     make_request(): the segments, policy
    job      (Spark)          _maint/staging/<id>/ ...      batch.py; archive files go to the archive
    result   (Spark driver)   _maint/results/<id>.json      the job's commit point (archive: after
                                                            its catalog file is committed)
    apply    (journal owner)  MANIFEST, _maint/applied/<id>.json   maintenance_apply.apply_result()

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

The rule that keeps archive -> compact -> remove from losing a record whatever the ages: when
the journal is archived (archive_guard), compaction drops only records whose position the
archive holds (policy "archived", archive_held: the manifest's archived ranges, checked against
the archive's catalogs), never by time alone. Ages (archive, compress and remove <Age>,
--older-than) are all measured by newest_time_us: the newest message below a segment's end,
never what follows the segment.

Replication retention: the source's sender writes each destination's acked position to the
index metadata, key `repl_acked_key(dest)` = b"repl-acked:" + destination name (UTF-8), a u64
LE journal position below which the destination holds everything (absent: it holds nothing
yet, so nothing is removed).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .manifest import (
    maint_dir,
    new_request_id,
    read_json,
    request_path,
    write_json_atomic,
)
from .queue_events import checkpoint_key, decode_checkpoint

if TYPE_CHECKING:
    from .journal import Journal
    from .segments import Segment

log = logging.getLogger("tickertape.journal.maintenance")

DEFAULT_GROUP_BYTES = 512 * 1024 * 1024
STALE_REQUEST_S = 24 * 3600.0

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


def newest_time_us(journal: Journal, seg: Segment) -> int:
    """The time a maintenance age is measured from for `seg`: the receive time of the newest
    message below its end (in it, or before it for a segment of queue events only, which carry
    no time of their own), from the index's time entries; the file's mtime (its last write) when
    the index knows no message there. Only the segment and what precedes it count, never what
    follows it: times never decrease along the journal, so this grows with the position."""
    newest = journal.index.newest_time_below(seg.end)
    if newest is not None:
        return newest
    return os.stat(seg.path).st_mtime_ns // 1000


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
    acked = (journal.index.get_meta(repl_acked_key(dest)) for dest in destinations)
    return min((_U64.unpack(r[:8])[0] if r and len(r) >= 8 else 0 for r in acked), default=None)


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
    archive_scheduled: bool = False,
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
    archive_scheduled: an archive-journal step is configured. With it, with an archive root, or
             once anything was archived, compaction drops only records the archive holds
             (policy "archived", archive_guard).
    Ages are measured from newest_time_us. Segments are taken oldest first and the walk stops at
    the first one too young (the ages only grow along the journal).
    """
    if kind not in ("archive", "compact"):
        raise ValueError(f"unknown job kind {kind!r}")
    now = now if now is not None else now_us()
    man = journal.manifest
    chosen = []
    for seg in journal.sealed_segments():
        if seg.size <= 0:
            continue
        # what the segment would give (cheap) before its age (an index lookup)
        gaps = man.archive_gaps(seg.base, seg.end) if kind == "archive" else []
        if kind == "archive" and not gaps:
            continue  # positions archived before are never archived again
        if kind == "compact" and seg.reader is not None and not recompact:
            continue
        if older_than_s and newest_time_us(journal, seg) > now - int(older_than_s * 1_000_000):
            break  # ages only shrink along the journal: later segments are younger still
        entry = segment_entry(seg)
        if kind == "archive" and gaps != [(seg.base, seg.end)]:
            # archived in part (by an earlier run, perhaps before this segment was compacted):
            # the task takes only the gaps
            entry["ranges"] = [list(g) for g in gaps]
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
            "archived": (
                archive_held(journal, archive_root)
                if archive_guard(journal, archive_root, archive_scheduled)
                else None
            ),
            "level": level,
            "block_size": 1 << 20,
        }
    return req


def archive_guard(journal: Journal, archive_root: str | None, archive_scheduled: bool) -> bool:
    """Whether this journal is archived, so that compaction may drop only what the archive
    holds: an archive-journal step is configured, an archive directory is given
    (<JournalArchiveDirectory>, --archive-dir), or the manifest records archived positions."""
    return bool(archive_scheduled or archive_root or journal.manifest.archived)


def archive_held(journal: Journal, archive_root: str | None) -> list[list[int]]:
    """The [from, to) position ranges the archive holds: those the manifest records as archived
    (each verified when its archive was applied) whose catalog is still in the archive (when its
    root is known), adjacent ranges merged. Compaction drops nothing outside them."""
    held: list[list[int]] = []
    cache: dict[str, Json | None] = {}
    for b, e, cat in sorted(journal.manifest.archived, key=lambda r: r[0]):
        if archive_root and _catalog(archive_root, cat, cache) is None:
            continue
        if held and held[-1][1] >= b:
            held[-1][1] = max(held[-1][1], e)
        else:
            held.append([b, e])
    return held


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
    lowest: Json = min(floors, key=lambda q: q["floor"], default={"name": "", "floor": None})
    qfloor: int | None = lowest["floor"]
    dfloor = destination_floor(journal, destinations)
    removed = []
    why = ""
    catalogs: dict[str, Json | None] = {}
    young = False  # stopped at a segment too young: waiting, not held
    for seg in journal.sealed_segments():
        if older_than_s and newest_time_us(journal, seg) > now - int(older_than_s * 1_000_000):
            why = f"{seg.path} is younger than {older_than_s:g}s"
            young = True
            break
        cats = man.archive_catalogs(seg.base, seg.end)
        if cats is None or not archive_root:
            why = f"{seg.path} is not archived"
            break
        if qfloor is not None and seg.end > qfloor:
            why = (
                f"{seg.path} holds messages a queue has not finished (queue {lowest['name']}, "
                f"checkpoint {qfloor})"
            )
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
    # held: a segment old enough for removal stays for a reason the operator may need to act on
    held = bool(why) and not young
    if not removed:
        return {"removed": 0, "reason": why, "held": held}
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
        "held": held,
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


def ids_in(folder: str) -> list[str]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))


def take_orders(
    journal: Journal,
    *,
    archive_root: str | None,
    queues: Queues,
    destinations: Iterable[str] = (),
    archive_scheduled: bool = False,
) -> list[Json]:
    """Turn each order (written by the CLI while the server runs) into a request. Returns the
    answers: {"id", "request": path or None, "reason"} also written next to the order. The
    archive guard (make_request) holds if the server's configuration or the CLI's asks for it."""
    d = journal.directory
    out = []
    for oid in ids_in(maint_dir(d, "orders")):
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
                archive_scheduled=archive_scheduled or bool(order.get("archive_scheduled")),
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
