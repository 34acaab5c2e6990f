"""The driver's side of the journal job after its tasks ran, without Spark: verify what the
tasks report, publish an archive (its catalog is the commit point), check a compaction's
outputs. batch.py calls these for Spark runs and for runs in this process (batch.run_in_process).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from ..manifest import read_json, write_json_atomic
from . import jobs

Json = dict[str, Any]


class VerificationFailed(RuntimeError):
    pass


# -- archive: verify, then publish ----------------------------------------------------------------


def existing_catalog(req: Json) -> Json | None:
    path = os.path.join(req["archive_root"], "_catalog", req["id"] + ".json")
    try:
        return {"path": path, "cat": read_json(path)}
    except FileNotFoundError:
        return None


def verify_archive(req: Json, metas: list[Json]) -> dict[int, Json]:
    """Check the tasks' read-back of the staged Parquet files against what they read from the
    segments, per source segment (rows, crc32 sum, first and last position); returns the
    segments' statistics by base. Raises VerificationFailed."""
    expected = {}
    readback: dict = {}
    for m in metas:
        for s in m["segments"]:
            expected[s["base"]] = s
        for seg, r in m["readback"].items():
            readback[int(seg)] = r
    for e in req["segments"]:
        s = expected.get(e["base"])
        if s is None or s["end"] != e["end"]:
            raise VerificationFailed(f"segment {e['path']} was not archived by any task")
    # the files as read back by the tasks, per source segment, against the segments as read
    for base, s in expected.items():
        n, crc, lo, hi = readback.get(base, (0, 0, None, None))
        if (n, crc) != (s["records"], s["crc_sum"]) or (n and (lo, hi) != (s["first"], s["last"])):
            raise VerificationFailed(
                f"segment {s['path']}: the archive reads back {n} records (crc sum {crc}, positions "
                f"[{lo}, {hi}]), the segment holds {s['records']} ({s['crc_sum']}, [{s['first']}, {s['last']}])"
            )
    return expected


def publish_archive(req: Json, metas: list[Json], stage: str, expected: dict[int, Json]) -> Json:
    """Rename the staged files into the archive, then write the catalog: the commit point."""
    files = [f for m in metas for f in m["files"]]
    root = req["archive_root"]
    # publish: rename each file into place (deterministic names: a re-run rewrites the same ones)
    new_rel = set()
    for f in files:
        dst = os.path.join(root, f["path"])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(os.path.join(stage, f["path"]), dst)
        new_rel.add(f["path"])
    ranges = [(lo, hi) for e in req["segments"] for lo, hi in jobs.archive_ranges(e)]
    drop_stale_files(root, ranges, new_rel, req["id"])
    records = sum(s["records"] for s in expected.values())
    cat = {
        "id": req["id"],
        "created_us": int(time.time() * 1e6),
        "root": root,
        "records": records,
        "bytes_in": sum(m["bytes_in"] for m in metas),
        "bytes_out": sum(m["bytes_out"] for m in metas),
        "schema": jobs.SPARK_SCHEMA,
        "segments": sorted(expected.values(), key=lambda s: s["base"]),
        "files": sorted(files, key=lambda f: f["path"]),
    }
    cat_path = os.path.join(root, "_catalog", req["id"] + ".json")
    write_json_atomic(cat_path, cat)  # the commit point
    shutil.rmtree(stage, ignore_errors=True)
    return {
        "result": {"catalog": cat_path},
        "summary": {
            "records_in": records,
            "records_out": records,
            "bytes_in": cat["bytes_in"],
            "bytes_out": cat["bytes_out"],
            "files": len(files),
            "catalog": cat_path,
        },
    }


def drop_stale_files(root: str, ranges: list[tuple[int, int]], keep: set[str], rid: str) -> None:
    """Delete archive files over the same positions that this run did not write (left by an
    interrupted run grouped differently), and take them out of older catalogs."""
    stale = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        for fn in filenames:
            if not fn.endswith(".parquet") or fn.startswith(("_", ".")):
                continue
            try:
                lo, hi = (int(x) for x in fn[: -len(".parquet")].split("-"))
            except ValueError:
                continue
            rel = os.path.relpath(os.path.join(dirpath, fn), root)
            if rel in keep:
                continue
            if any(lo < e and b < hi for b, e in ranges):
                stale.append(rel)
    if not stale:
        return
    for rel in stale:
        os.unlink(os.path.join(root, rel))
    gone = set(stale)
    cdir = os.path.join(root, "_catalog")
    for name in sorted(os.listdir(cdir)) if os.path.isdir(cdir) else ():
        if not name.endswith(".json") or name == rid + ".json":
            continue
        path = os.path.join(cdir, name)
        cat = read_json(path)
        if any(f["path"] in gone for f in cat.get("files", ())):
            cat["files"] = [f for f in cat["files"] if f["path"] not in gone]
            cat["segments"] = [
                s
                for s in cat["segments"]
                if not any(s["base"] < e and b < s["end"] for b, e in ranges)
            ]
            cat["superseded_by"] = rid
            write_json_atomic(path, cat)


# -- compaction ---------------------------------------------------------------------------------


def verify_compaction(req: Json, metas: list[Json]) -> Json:
    seen = {}
    for m in metas:
        for s in m["segments"]:
            seen[s["base"]] = s
        if sum(s["kept"] for s in m["segments"]) != m["records_out"]:
            raise VerificationFailed(
                f"{m['file']}: {m['records_out']} records written, {sum(s['kept'] for s in m['segments'])} kept"
            )
    for e in req["segments"]:
        if e["base"] not in seen:
            raise VerificationFailed(f"segment {e['path']} was not compacted by any task")
    summary = {
        "records_in": sum(m["records_in"] for m in metas),
        "records_out": sum(m["records_out"] for m in metas),
        "bytes_in": sum(m["bytes_in"] for m in metas),
        "bytes_out": sum(m["bytes_out"] for m in metas),
        "files": len(metas),
    }
    return {"result": {"outputs": metas}, "summary": summary}
