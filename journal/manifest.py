"""The journal manifest and the maintenance request / result files. This module owns their format.

The manifest (`<JournalDirectory>/MANIFEST`, JSON) says which files make up the sealed part of
the journal when compaction or removal has changed it. Without one, the journal is every
`<base:020d>.seg` file, as before. It is written only by the process that has the journal open
(the server, or `tickertape journal apply` when no server runs), as `MANIFEST.tmp` + fsync +
rename + fsync of the directory: the rename is the commit point of every change.

```json
{"version": 1,
 "generation": 4,                      // +1 at every change
 "start": 1048576,                     // positions below were removed (remove-journal)
 "compacted": [                        // compacted files (compacted.py) and the range each covers
   {"file": "00000000000000000000.compact-20261121T220000Z-1a2b.cseg", "base": 0,
    "end": 1048576, "records": 900, "raw_bytes": 210000, "file_bytes": 52000,
    "request": "compact-20261121T220000Z-1a2b"}],
 "archived": [[0, 2097152, "archive-20261121T210000Z-77aa"]],   // [base, end, catalog]: position
                                       // ranges whose archive was verified (adjacent ranges of
                                       // one catalog merged); kept through compaction
 "publishers": {"123456789": [42, 1040000]},   // dedup state of removed records:
                                       // publisher id -> [highest seq, its position]
 "applied": ["compact-20261121T220000Z-1a2b", ...]   // recent requests, for idempotent apply
}
```

Archive state is kept by *position range*, not by file: compaction keeps every retained record
at its position and only drops records, so an archive verified for a range holds every record the
journal can still hold there, whichever file (plain or compacted, before or after) holds them now.

At open, a plain segment whose base lies inside a compacted range, or below `start`, is
superseded: it is deleted (a crash after the commit left it behind). A `.cseg` file the manifest
does not name is an uncommitted output (a crash before the commit): it is deleted too.

Maintenance files live under `<JournalDirectory>/_maint/` (names starting with `_` are skipped
by the journal, Spark and pyarrow):

- `requests/<id>.json`: what a job is asked to do (written by the proposer: the server's
  action scheduler or the CLI). Kinds `archive` and `compact`; see maintenance.make_request.
- `staging/<id>/`: a compaction job's outputs before they are applied.
- `results/<id>.json`: the job's result (its commit point): verified outputs and counts.
- `applied/<id>.json`: the journal owner's answer, `{"status": "applied" | "rejected" | "noop",
  "reason": ..., "generation": ...}`; the CLI waits for it when a server applies for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "MANIFEST"
MAINT = "_maint"
VERSION = 1
KEEP_APPLIED = 64


@dataclass
class Manifest:
    generation: int = 0
    start: int = 0
    compacted: list[dict[str, Any]] = field(default_factory=list)  # entries, as drawn above
    archived: list[list[Any]] = field(default_factory=list)  # [base, end, catalog id]
    publishers: dict[str, list[int]] = field(default_factory=dict)  # id -> [seq, position]
    applied: list[str] = field(default_factory=list)  # request ids

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "generation": self.generation,
            "start": self.start,
            "compacted": sorted(self.compacted, key=lambda e: e["base"]),
            "archived": self.archived,
            "publishers": self.publishers,
            "applied": self.applied[-KEEP_APPLIED:],
        }

    def copy(self) -> Manifest:
        return Manifest.from_json(json.loads(json.dumps(self.to_json())))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        if d.get("version") != VERSION:
            raise ValueError(f"unsupported journal manifest version {d.get('version')!r}")
        return cls(
            generation=int(d.get("generation", 0)),
            start=int(d.get("start", 0)),
            compacted=list(d.get("compacted", [])),
            archived=[list(a) for a in d.get("archived", [])],
            publishers=dict(d.get("publishers", {})),
            applied=list(d.get("applied", [])),
        )

    def covered_by_compacted(self, base: int) -> dict[str, Any] | None:
        """The compacted entry whose range holds position `base`, or None."""
        for e in self.compacted:
            if e["base"] <= base < e["end"]:
                return e
        return None

    def archive_gaps(self, base: int, end: int) -> list[tuple[int, int]]:
        """The parts of [base, end) that no archived range covers, in order ([] if archived)."""
        gaps = []
        at = base
        for b, e, _cat in sorted(self.archived, key=lambda r: r[0]):
            if e <= at or b >= end:
                continue
            if b > at:
                gaps.append((at, b))
            at = max(at, e)
            if at >= end:
                break
        if at < end:
            gaps.append((at, end))
        return gaps

    def archive_catalogs(self, base: int, end: int) -> list[str] | None:
        """The catalogs whose ranges cover [base, end), oldest range first; None if a part of it
        is not archived."""
        if self.archive_gaps(base, end):
            return None
        ranges = sorted(self.archived, key=lambda r: r[0])
        return list(dict.fromkeys(cat for b, e, cat in ranges if b < end and base < e))

    def add_archived(self, base: int, end: int, catalog: str) -> None:
        """Record [base, end) as archived by `catalog`. Ranges of one catalog merge when they
        touch; ranges of different catalogs stay apart, so each range names the catalog that
        describes it (remove-journal reads it)."""
        ranges = sorted(self.archived + [[base, end, catalog]], key=lambda r: (r[0], r[1]))
        merged: list[list[Any]] = []
        for r in ranges:
            last = merged[-1] if merged else None
            if last is not None and r[2] == last[2] and r[0] <= last[1]:
                last[1] = max(last[1], r[1])
            else:
                merged.append(list(r))
        self.archived = merged

    def forget_archived_below(self, position: int) -> None:
        """Drop archive state below `position` (removed from the journal: nothing reads it)."""
        self.archived = [[max(b, position), e, cat] for b, e, cat in self.archived if e > position]


def load_manifest(directory: str) -> Manifest:
    path = os.path.join(directory, MANIFEST)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return Manifest()
    return Manifest.from_json(json.loads(raw))


def save_manifest(directory: str, manifest: Manifest) -> None:
    write_json_atomic(os.path.join(directory, MANIFEST), manifest.to_json())


def write_json_atomic(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=False).encode())


def write_atomic(path: str, content: bytes) -> None:
    """temp + fsync + rename + fsync of the directory: readers see the old file or the new one.
    A disk that fills up meanwhile raises OSError (ENOSPC) and leaves the old file and no temp
    file: a write on a nearly full disk may be short (the pages there was room for), and the
    next one is what fails, so every byte is written before the rename."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    data = memoryview(content)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(d)


def fsync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: str) -> Any:
    return json.loads(Path(path).read_bytes())


def new_request_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def maint_dir(journal_dir: str, *parts: str) -> str:
    return os.path.join(journal_dir, MAINT, *parts)


def request_path(journal_dir: str, req_id: str) -> str:
    return maint_dir(journal_dir, "requests", req_id + ".json")


def result_path(journal_dir: str, req_id: str) -> str:
    return maint_dir(journal_dir, "results", req_id + ".json")


def applied_path(journal_dir: str, req_id: str) -> str:
    return maint_dir(journal_dir, "applied", req_id + ".json")


def staging_dir(journal_dir: str, req_id: str) -> str:
    return maint_dir(journal_dir, "staging", req_id)


def file_sha256(path: str) -> str:
    """Hex sha256 of a file's bytes (archive files in the catalog, staged compaction outputs)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
