"""What a task of the archive / compaction job reads: one segment file, checked, as columns.

`read_segment` takes a request's segment entry, checks that the file is still the one the
request described (size and modification time, so a file still being written or replaced fails
the task), and yields its good records in chunks of numpy columns (record.record_columns). The
records are walked with the journal's own walk (walk.good_runs: every record's checks, damage
skipped and reported) over the file read into memory; a compacted segment is read block by
block through compacted.CompactedReader and must have no damage at all.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compacted import CompactedReader
from ..record import (
    SEGMENT_HEADER_SIZE,
    BytesLike,
    CorruptRecord,
    decode_segment_header,
    record_columns,
    record_offsets,
)
from ..walk import BufferRecords, good_runs

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

log = logging.getLogger("tickertape.journal")

Columns = dict[str, "np.ndarray"]
Chunk = tuple[memoryview | bytes, "np.ndarray", Columns, int]
"""(records' bytes, their positions, their columns (offsets into the bytes), whole-file crc32)."""


class SegmentChanged(RuntimeError):
    """A segment is not the file the request described (still written, replaced or damaged)."""

    retriable = False

    def __init__(self, path: str, reason: str):
        super().__init__(f"segment {path} {reason}; nothing was published. Make a new request")
        self.path = path
        self.reason = reason


def _stat_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def read_segment(
    entry: dict[str, Any], damaged: list[tuple[int, int]] | None = None
) -> Iterator[Chunk]:
    """Yield chunks of every good record of one segment, checksums verified: (bytes, positions,
    columns, whole-file crc32). A damaged region of a plain segment is skipped (never archived
    or compacted as data), logged, and appended to `damaged` as (file offset, bytes).

    entry: a request's segment entry (path, base, end, kind, file_bytes, mtime_ns).
    Raises SegmentChanged if the file is not the one the request described, or changes while
    it is read.
    """
    path = entry["path"]
    try:
        size, mtime = _stat_key(path)
    except FileNotFoundError:
        raise SegmentChanged(path, "no longer exists") from None
    if size != entry["file_bytes"] or mtime != entry["mtime_ns"]:
        raise SegmentChanged(
            path, f"changed since the request (size {size}, was {entry['file_bytes']})"
        )
    if entry["kind"] == "plain":
        yield from _plain_chunks(entry, size, damaged)
    else:
        yield from _compacted_chunks(entry)
    if _stat_key(path) != (size, mtime):
        raise SegmentChanged(path, "changed while it was read")


def _plain_chunks(
    entry: dict[str, Any], size: int, damaged: list[tuple[int, int]] | None
) -> Iterator[Chunk]:
    path = entry["path"]
    data = Path(path).read_bytes()
    if len(data) != size:
        raise SegmentChanged(path, "changed while it was read")
    file_crc = zlib.crc32(data)
    try:
        base = decode_segment_header(data)
    except CorruptRecord as exc:
        raise SegmentChanged(path, f"has a bad header ({exc.reason})") from None
    if base != entry["base"]:
        raise SegmentChanged(path, f"starts at {base}, not {entry['base']}")
    records = memoryview(data)[SEGMENT_HEADER_SIZE:]
    if base + len(records) != entry["end"]:
        raise SegmentChanged(
            path, f"holds {len(records)} bytes of records, not {entry['end'] - base}"
        )

    def report(offset: int, nbytes: int, reason: str) -> None:
        log.warning(
            "journal job: %s is damaged at offset %d (%s): %d bytes skipped (not archived or "
            "compacted as data)",
            path,
            offset,
            reason,
            nbytes,
        )
        if damaged is not None:
            damaged.append((offset, nbytes))

    for pos, run in good_runs(BufferRecords(records, base), base, entry["end"], report):
        offs, stop = record_offsets(run)  # checked by the walk
        cols = record_columns(run, offs, stop)
        yield run, pos + cols["offset"], cols, file_crc


def _compacted_chunks(entry: dict[str, Any]) -> Iterator[Chunk]:
    """A compacted segment's blocks; any damaged record fails the task (a block's bytes were
    checked as a whole against their crc32, so damage here is not a disk's doing)."""
    import numpy as np

    path = entry["path"]
    reader = CompactedReader(path)
    try:
        if (reader.base, reader.end) != (entry["base"], entry["end"]):
            raise SegmentChanged(
                path,
                f"covers [{reader.base}, {reader.end}), not [{entry['base']}, {entry['end']})",
            )
        file_crc = zlib.crc32(Path(path).read_bytes())

        def fail(offset: int, nbytes: int, reason: str) -> None:
            raise SegmentChanged(path, f"has a damaged record in a block: {reason}")

        for block, runs in reader.iter_blocks():
            rpos = np.array([r[0] for r in runs], dtype=np.int64)
            rboff = np.array([r[1] for r in runs], dtype=np.int64)
            for at, buf in good_runs(BufferRecords(block, 0), 0, len(block), fail):
                offs, stop = record_offsets(buf)  # checked by the walk
                cols = record_columns(buf, offs, stop)
                boff = at + cols["offset"]  # offsets in the block, where the runs are
                k = np.searchsorted(rboff, boff, side="right") - 1
                positions = rpos[k] + (boff - rboff[k])
                yield buf, positions, cols, file_crc
    finally:
        reader.close()


def segment_stats(entry: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A task's metadata of one source segment, before its records are counted in: `more`
    adds the job's own fields; `damaged` is the list read_segment fills."""
    return {
        "path": entry["path"],
        "base": entry["base"],
        "end": entry["end"],
        "records": 0,
        "crc_sum": 0,
        "file_crc32": None,
        "file_bytes": entry["file_bytes"],
        **more,
        "damaged": [],
    }


def topic_codes(buf: BytesLike, cols: Columns) -> tuple[list[str], np.ndarray]:
    """The chunk's distinct topics, and per record the index of its topic among them."""
    import numpy as np

    tarr = binary_column(buf, cols["topic_start"], cols["topic_end"]).dictionary_encode()
    codes = tarr.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return [v.decode("utf-8", "replace") for v in tarr.dictionary.to_pylist()], codes


def binary_column(
    buf: BytesLike, starts: np.ndarray, ends: np.ndarray, valid: np.ndarray | None = None
) -> pa.Array:
    """A pyarrow binary array of buf[starts[i]:ends[i]] (None where valid is False).

    Built as an Arrow binary *view* array over buf (16-byte views computed with numpy: no
    Python object per value), then cast to plain binary in C++. Falls back to Python slices
    for buffers past 2 GiB (view offsets are 32-bit).
    """
    import numpy as np
    import pyarrow as pa

    n = len(starts)
    if len(buf) >= 1 << 31 or n == 0:
        whole = buf if isinstance(buf, bytes) else bytes(buf)
        vals: list[bytes | None] = [whole[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
        if valid is not None:
            vals = [v if ok else None for v, ok in zip(vals, valid.tolist())]
        return pa.array(vals, pa.binary())
    b = np.frombuffer(buf, dtype=np.uint8)
    lens = (ends - starts).astype(np.int32)
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = lens.view(np.uint8).reshape(n, 4)
    idx = starts[:, None] + np.arange(12, dtype=np.int64)
    np.minimum(idx, len(b) - 1, out=idx)
    inline = b[idx]
    inline[np.arange(12)[None, :] >= lens[:, None]] = 0
    short = lens <= 12
    views[short, 4:16] = inline[short]
    lng = ~short
    views[lng, 4:8] = inline[lng, 0:4]
    views[lng, 12:16] = starts[lng].astype(np.int32).view(np.uint8).reshape(-1, 4)
    validity = None if valid is None else pa.array(valid, pa.bool_()).buffers()[1]
    arr = pa.Array.from_buffers(
        pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(buf)]
    )
    return arr.cast(pa.binary())
