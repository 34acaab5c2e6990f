"""Opening a journal directory: the layout per the manifest, segment headers, and recovery.

The newest segment is scanned from the index's checkpoint with checksums verified; a torn or
damaged tail is truncated (logged: file, offset, bytes dropped) and every record past the
checkpoint is indexed again.

The newest segment may end in zeros: the writer's runway (writer.py), pre-zeroed space its
commits overwrite. Zeros alone after the last good record are the clean end and are cut off
(logged at info, nothing counted as lost); a damaged record followed by zeros is a torn write,
truncated and counted exactly as one at the end of the file (the bytes counted as dropped end at
its last non-zero byte); anything else is handled as it always was.

`Recovery(directory, segment_size, index, integrity).open()` does all of it and returns the
layout (state.py) and a reader over it (reading.py), which the Journal (journal.py) goes on
using; `report` says what the open did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from .compacted import CompactedReader, CorruptCompacted, is_compacted_name
from .errors import CorruptSegment
from .index import JournalIndex
from .integrity import Integrity
from .manifest import Manifest, fsync_dir, load_manifest
from .reading import JournalReader
from .record import (
    KIND_MESSAGE,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    CorruptRecord,
    RawRecord,
    decode_segment_header,
    encode_segment_header,
    scan_records,
    verified_prefix,
)
from .segments import READ_BLOCK, Segment, _base_of, segment_name
from .state import Layout
from .walk import good_runs

PROBE_NAME = "probe.tmp"  # writer.py's probe file

log = logging.getLogger("tickertape.journal")


class Recovery:
    layout: Layout  # set by open()
    reader: JournalReader

    def __init__(
        self, directory: str, segment_size: int, index: JournalIndex, integrity: Integrity
    ):
        self.directory = directory
        self.segment_size = segment_size
        self.index = index
        self.integrity = integrity  # damage found and bytes truncated are counted here
        self.manifest = Manifest()
        self.report: dict[str, Any] = {}  # what the open did: segments, records, bytes, time

    def open(self) -> tuple[Layout, JournalReader]:
        """Check and repair the directory, index what the index misses, and return the layout
        and a reader over it. CorruptSegment for what cannot be served."""
        started = time.monotonic()
        names = self._listing()
        segs: list[Segment] = []
        for i, name in enumerate(names):
            if isinstance(name, Segment):  # a compacted segment named by the manifest
                if segs and name.base != segs[-1].end:
                    raise CorruptSegment(
                        name.path,
                        0,
                        f"starts at position {name.base} but the previous segment ends at {segs[-1].end} (a segment is missing)",
                    )
                segs.append(name)
                continue
            path = os.path.join(self.directory, name)
            with open(path, "rb") as f:
                head = f.read(SEGMENT_HEADER_SIZE)
            size = os.path.getsize(path) - SEGMENT_HEADER_SIZE
            last = i == len(names) - 1
            try:
                base = decode_segment_header(head)
            except CorruptRecord as exc:
                if last and size <= 0:
                    # crash between creating the file and writing its header: start it again
                    log.warning(
                        "journal: %s has no complete header (%s); rewriting it", path, exc.reason
                    )
                    base = segs[-1].end if segs else 0
                    self._write_new_segment_file(path, base)
                    size = 0
                else:
                    raise CorruptSegment(path, exc.offset, exc.reason) from None
            if segs and base != segs[-1].end:
                self._segment_gap(segs[-1], path, base)
            segs.append(Segment(base, path, size))
        if not segs or segs[-1].reader is not None:
            base = segs[-1].end if segs else self.manifest.start
            path = os.path.join(self.directory, segment_name(base))
            self._write_new_segment_file(path, base)
            segs.append(Segment(base, path, 0))
        self.layout = Layout(self.directory, self.segment_size, segs, self.manifest)
        self.reader = JournalReader(self.layout, self.index, self.integrity)

        if self.index.rebuilt:
            log.warning(
                "journal: the index was unreadable (%s); rebuilding it from the segments",
                self.index.rebuilt,
            )
            self.integrity.index_rebuilds += 1
        upto = self.index.indexed_upto()
        first, end = segs[0].base, segs[-1].end
        suspect = self._index_problem(upto, first, end)
        if suspect:
            log.warning("journal: %s; rebuilding the index from the segments", suspect)
            self.integrity.index_rebuilds += 1
            self.index.reset()
            upto = first
        upto = max(upto, first)
        indexed, dropped = self._scan_and_index(upto)
        self.layout.end = segs[-1].end  # a torn tail may have been cut
        self._seed_removed_publishers()
        self.report = {
            "segments": len(segs),
            "reindexed_records": indexed,
            "dropped_bytes": dropped,
            "seconds": round(time.monotonic() - started, 3),
        }
        log.info(
            "journal: opened %s: %d segments, positions [%d, %d), %d records re-indexed in %.3fs",
            self.directory,
            len(segs),
            segs[0].base,
            self.layout.segments[-1].end,
            indexed,
            self.report["seconds"],
        )
        return self.layout, self.reader

    def _listing(self) -> list:
        """Plain segment names and compacted Segments, in position order, per the manifest.

        Files the manifest has superseded (a crash after its commit) or never committed (a
        crash before it) are deleted here, and logged.
        """
        man = self.manifest = load_manifest(self.directory)
        named = {e["file"]: e for e in man.compacted}
        items: list[tuple[str, object]] = []
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(".seg"):
                base = _base_of(name)
                if base is not None and (
                    base < man.start or man.covered_by_compacted(base) is not None
                ):
                    self._discard(name, "superseded by the manifest")
                    continue
                items.append((name, name))
            elif name.endswith(".seg.new") or name == PROBE_NAME:
                self._discard(name, "left by a segment roll or a probe that did not finish")
            elif is_compacted_name(name) and name not in named:
                self._discard(name, "an uncommitted compaction output (not in the manifest)")
        for fname, e in named.items():
            path = os.path.join(self.directory, fname)
            try:
                reader = CompactedReader(path)
            except FileNotFoundError:
                raise CorruptSegment(
                    path, 0, "the manifest names this compacted segment but it is missing"
                ) from None
            except CorruptCompacted as exc:
                raise CorruptSegment(path, exc.offset, exc.reason) from None
            if (reader.base, reader.end) != (e["base"], e["end"]):
                reader.close()
                raise CorruptSegment(
                    path,
                    0,
                    f"covers [{reader.base}, {reader.end}) but the manifest says [{e['base']}, {e['end']})",
                )
            items.append(
                (
                    f"{reader.base:020d}",
                    Segment(reader.base, path, reader.end - reader.base, reader),
                )
            )
        items.sort(key=lambda kv: kv[0])
        return [v for _, v in items]

    def _seed_removed_publishers(self) -> None:
        """Dedup state of publishers whose newest message was removed lives in the manifest; an
        index rebuilt from the remaining segments gets it back from there."""
        if not self.manifest.publishers:
            return
        have = self.index.publishers()
        missing = [
            (int(p), seq, 0, pos)
            for p, (seq, pos) in self.manifest.publishers.items()
            if have.get(int(p), (-1, 0))[0] < seq
        ]
        if missing:
            self.index.add(missing, self.index.indexed_upto())

    def _discard(self, name: str, why: str) -> None:
        path = os.path.join(self.directory, name)
        log.warning("journal: removing %s: %s", path, why)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def _index_compacted(self, seg: Segment, pos: int) -> int:
        reader = seg.reader
        assert reader is not None  # a compacted segment
        indexed = 0
        while True:
            try:
                recs, nxt = reader.read(pos, 4 * READ_BLOCK)
            except CorruptCompacted as exc:
                raise CorruptSegment(seg.path, exc.offset, exc.reason) from None
            if not recs:
                self.index.add((), seg.end)
                return indexed
            self.index.add(
                (
                    (r.publisher_id, r.seq, r.timestamp_us, r.position)
                    for r in recs
                    if r.kind == KIND_MESSAGE
                ),
                nxt,
            )
            indexed += len(recs)
            pos = nxt

    def _segment_gap(self, prev: Segment, path: str, base: int) -> None:
        """Segment `path` does not start where the one before it ends: report what is missing
        and serve the rest (an overlap cannot be read in any order and is refused)."""
        if base < prev.end:
            raise CorruptSegment(
                path,
                0,
                f"starts at position {base}, inside the previous segment "
                f"{prev.path} (which ends at {prev.end})",
            )
        missing = base - prev.end
        reason = (
            f"{prev.path} ends at position {prev.end} but the next segment starts at {base}: "
            f"{missing} bytes are missing (the file was truncated, or a segment was removed)"
        )
        self.integrity.damaged(prev.path, SEGMENT_HEADER_SIZE + prev.size, missing, reason)

    def _index_problem(self, upto: int, first: int, end: int) -> str | None:
        """Why the index cannot be trusted against these segments, or None: its checkpoint
        must be a record boundary inside the journal, and each publisher's newest entry must
        name the record it points at."""
        if upto > end or (upto < first and upto != 0 and self.index.count() > 0):
            return f"index checkpoint {upto} is outside the journal [{first}, {end}]"
        if first < upto < end and not self._good_record_at(upto):
            segs, i = self.layout.find(upto)
            if (
                segs[i].reader is None
                and self.reader.resync(segs[i], upto, segs[i].end) < segs[i].end
            ):
                return f"index checkpoint {upto} is not at the start of a record (good records follow it)"
        for pub, (seq, pos) in list(self.index.publishers().items())[:1000]:
            if first <= pos < min(upto, end):
                recs, _ = self.reader.read_raw(pos, RECORD_HEADER_SIZE + 64 * 1024)
                r = RawRecord._make(recs[0]) if recs else None
                if r is not None and r.position == pos and (r.publisher_id, r.seq) != (pub, seq):
                    return f"the index says publisher {pub} seq {seq} is at {pos}, but the record there is not"
        return None

    def _good_record_at(self, position: int) -> bool:
        segs, i = self.layout.find(position)
        seg = segs[i]
        if position == seg.end or seg.reader is not None:
            return True
        buf = self.reader.pread(seg, position, RECORD_HEADER_SIZE + 64 * 1024)
        return verified_prefix(buf)[0] > 0

    def _scan_and_index(self, start: int) -> tuple[int, int]:
        """Verify and index every record from `start` to the end: (records indexed, bytes of a
        torn tail dropped). Damage is reported and skipped."""
        indexed = 0
        i = self.layout.find(start)[1]
        while i < len(self.layout.segments):
            seg = self.layout.segments[i]
            if seg.reader is not None:
                indexed += self._index_compacted(seg, max(start, seg.base))
            else:
                n, dropped = self._index_plain(i, max(start, seg.base))
                indexed += n
                if dropped:
                    return indexed, dropped
            i += 1
        return indexed, 0

    def _index_plain(self, seg_i: int, start: int) -> tuple[int, int]:
        """Index the plain segment's records from start; a partial or damaged tail of the newest
        segment with no good record after it (a torn write) is truncated."""
        seg = self.layout.segments[seg_i]
        last = seg_i == len(self.layout.segments) - 1
        torn: list[tuple[int, str]] = []

        def report(offset: int, size: int, reason: str) -> None:
            at = seg.base + offset - SEGMENT_HEADER_SIZE
            if last and at + size >= seg.end:
                torn.append((at, reason))  # nothing good after it: cut off below
            else:
                self.integrity.damaged(seg.path, offset, size, reason)

        indexed = 0
        for pos, buf in good_runs(self.reader.source(seg), start, seg.end, report, 4 * READ_BLOCK):
            recs, stop = scan_records(buf, pos)
            self.index.add(
                ((p, s, t, at) for at, k, p, s, t, _, _, _ in recs if k == KIND_MESSAGE),
                pos + stop,
            )
            indexed += len(recs)
        return indexed, (self._truncate_tail(seg_i, *torn[0]) if torn else 0)

    def _truncate_tail(self, seg_i: int, position: int, reason: str) -> int:
        seg = self.layout.segments[seg_i]  # the newest: _index_plain reports a torn tail only there
        if seg.end - position <= 0:
            return 0
        offset = SEGMENT_HEADER_SIZE + position - seg.base
        dropped = self._nonzero_end(seg) - position
        if dropped <= 0:
            # only zeros after the last good record: the writer's runway (writer.py), the
            # clean end of a segment the server did not close
            log.info(
                "journal: %s ends in %d bytes of zeroed runway after offset %d; cutting them",
                seg.path,
                seg.end - position,
                offset,
            )
            self._cut(seg, offset, position)
            return 0
        log.warning(
            "journal: truncating the tail of %s at offset %d (%s): %d bytes with no good record "
            "after them dropped (a write torn by a crash, never acknowledged as persisted)",
            seg.path,
            offset,
            reason,
            dropped,
        )
        self.integrity.truncated_bytes += dropped
        self._cut(seg, offset, position)
        return dropped

    def _cut(self, seg: Segment, offset: int, position: int) -> None:
        with open(seg.path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
        seg.size = position - seg.base

    def _nonzero_end(self, seg: Segment) -> int:
        """The position just after the last non-zero byte of a plain segment (its base if none):
        what a torn write left ends there, and zeros after it are runway."""
        fd = self.reader.fd_of(seg)
        end = SEGMENT_HEADER_SIZE + seg.size
        while end > SEGMENT_HEADER_SIZE:
            n = min(READ_BLOCK, end - SEGMENT_HEADER_SIZE)
            chunk = os.pread(fd, n, end - n).rstrip(b"\0")
            if chunk:
                return seg.base + end - n + len(chunk) - SEGMENT_HEADER_SIZE
            end -= n
        return seg.base

    def _write_new_segment_file(self, path: str, base: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, encode_segment_header(base))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.directory)
