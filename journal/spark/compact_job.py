"""Compaction, one task's work: a group of segments rewritten as one compacted segment.

Compaction keeps a record if any of these holds (policy, see maintenance.make_request):
- nothing is dropped for age (`cutoff_us` 0), or the record is at or after the first message of
  the group with a receive time >= cutoff_us (inside the retention window);
- a queue may still need it: a message on a topic a queue reads, at or after that queue's floor
  (its recovery checkpoint: every message of the queue below it is done); a queue event of a
  queue, at or after that queue's floor;
- a replication destination may still need it: at or after `replication_floor` (the lowest
  position a configured destination has not acked, maintenance.destination_floor);
- it is the newest message of its publisher (`keep_positions`, from the index's highest sequence
  per publisher), so dedup state survives even an index rebuild;
- it is a SOW delete record (kind 3, server/sow/records.py): a message kept for one of the rules
  above may be one a delete removed, and a SOW store rebuilt from the compacted journal must
  not bring it back (deletes are small and few beside the messages);
- the journal is archived (policy `archived` is a list, not null) and the archive does not hold
  it: its position is in none of the `archived` [from, to) ranges (maintenance.archive_held, from
  the manifest). Compaction drops only what the archive holds; the records kept for this alone
  are counted (`held_unarchived`, `held_first`, `held_last` in the output's metadata) so the
  step can say why they stay.

The segments are read with job_input.read_segment; the output (compacted.py's format) is read
back, every block checked, before its metadata goes to the driver (batch.py).
"""

from __future__ import annotations

import os
import re
import zlib
from typing import TYPE_CHECKING, Any

from ..compacted import CompactedReader, CompactedWriter, compacted_name
from ..manifest import file_sha256
from ..record import KIND_MESSAGE, KIND_QUEUE_EVENT, KIND_SOW_DELETE, BytesLike
from .job_input import Columns, read_segment, segment_stats, topic_codes

if TYPE_CHECKING:
    import numpy as np

QueueMatcher = tuple[str, str, re.Pattern[str] | None, int]
"""(queue name, underlying topic, its compiled pattern if it is one, floor position)."""


def _queue_matchers(policy: dict[str, Any]) -> list[QueueMatcher]:
    out: list[QueueMatcher] = []
    for q in policy.get("queues", ()):
        rx = re.compile(q["topic"]) if q.get("pattern") else None
        out.append((q["name"], q["topic"], rx, int(q["floor"])))
    return out


def keep_mask(
    positions: np.ndarray,
    cols: Columns,
    topics: list[str],
    topic_codes: np.ndarray,
    policy: dict[str, Any],
    cutoff_position: int | None,
) -> np.ndarray:
    """Which records of one chunk compaction keeps (a numpy bool array), per the module's rules."""
    import numpy as np

    n = len(positions)
    cutoff = int(policy.get("cutoff_us") or 0)
    if cutoff <= 0:
        return np.ones(n, dtype=bool)
    kind = cols["kind"]
    msg = kind == KIND_MESSAGE
    keep = msg & (cols["ts"] >= cutoff)
    keep |= kind == KIND_SOW_DELETE
    if cutoff_position is not None:
        keep |= positions >= cutoff_position
    repl_floor = policy.get("replication_floor")
    if repl_floor is not None:
        keep |= positions >= int(repl_floor)
    queues = _queue_matchers(policy)
    if queues:
        big = np.iinfo(np.int64).max
        topic_floor = np.full(len(topics), big, dtype=np.int64)  # messages a queue may need
        event_floor = np.full(len(topics), big, dtype=np.int64)  # events of a queue
        for i, t in enumerate(topics):
            for name, topic, rx, floor in queues:
                if (rx.fullmatch(t) is not None) if rx is not None else t == topic:
                    topic_floor[i] = min(topic_floor[i], floor)
                if t == name:
                    event_floor[i] = min(event_floor[i], floor)
        keep |= msg & (positions >= topic_floor[topic_codes])
        keep |= (kind == KIND_QUEUE_EVENT) & (positions >= event_floor[topic_codes])
    return keep


def compact_group(group: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one group of segments into one compacted segment under group["staging"].

    group: {"segments": [entries], "staging": dir, "tag": request id, "policy": {...}}.
    The output keeps every record the policy keeps, at its original position, and is read back
    (every block decompressed, every record's crc checked) before its metadata is returned.
    """
    import numpy as np

    segs = group["segments"]
    policy = group.get("policy") or {}
    base, end = segs[0]["base"], segs[-1]["end"]
    staging = group["staging"]
    os.makedirs(staging, exist_ok=True)
    name = compacted_name(base, group["tag"])
    final = os.path.join(staging, name)
    tmp = final + ".tmp"
    cutoff = int(policy.get("cutoff_us") or 0)
    must_keep = np.asarray(sorted(policy.get("keep_positions") or ()), dtype=np.int64)
    w = CompactedWriter(
        tmp,
        base,
        end,
        sources=len(segs),
        cutoff_us=cutoff,
        level=int(policy.get("level", 3)),
        block_size=int(policy.get("block_size", 1 << 20)),
    )
    seg_stats = []
    records_in = raw_in = crc_out = 0
    cutoff_position = None
    archived = policy.get("archived")
    held_n = 0
    held_span = [end, base]  # the first and last position held for the archive alone
    try:
        for entry in segs:
            st = segment_stats(entry, kept=0)
            for buf, positions, cols, file_crc in read_segment(entry, st["damaged"]):
                st["file_crc32"] = file_crc
                n = len(positions)
                if n == 0:
                    continue
                crc = cols["crc"].astype(np.int64)
                st["records"] += n
                st["crc_sum"] += int(crc.sum())
                records_in += n
                raw_in += int(cols["size"].sum())
                keep = None
                if cutoff > 0:
                    if cutoff_position is None:
                        inside = np.flatnonzero(
                            (cols["kind"] == KIND_MESSAGE) & (cols["ts"] >= cutoff)
                        )
                        if len(inside):
                            cutoff_position = int(positions[inside[0]])
                    tdict, tcodes = topic_codes(buf, cols)
                    keep = keep_mask(positions, cols, tdict, tcodes, policy, cutoff_position)
                    if len(must_keep):
                        keep |= np.isin(positions, must_keep)
                    if archived is not None:
                        held = ~keep & ~_inside(positions, archived)
                        if held.any():
                            keep |= held
                            where = positions[held]
                            held_n += len(where)
                            held_span[0] = min(held_span[0], int(where[0]))
                            held_span[1] = max(held_span[1], int(where[-1]))
                    if keep.all():
                        keep = None
                crc_out += _write_kept(w, buf, positions, cols, keep)
                st["kept"] += n if keep is None else int(keep.sum())
            seg_stats.append(st)
        info = w.finish()
    except BaseException:
        w.abort()
        raise
    os.replace(tmp, final)
    meta = _verify_compacted(
        final, name, info, seg_stats, records_in, raw_in, crc_out, segs, w.raw_crcs
    )
    if held_n:
        meta.update(held_unarchived=held_n, held_first=held_span[0], held_last=held_span[1])
    return meta


def _inside(positions: np.ndarray, ranges: list[list[int]]) -> np.ndarray:
    """Which positions lie in one of the [from, to) ranges (sorted, apart)."""
    import numpy as np

    if not ranges:
        return np.zeros(len(positions), dtype=bool)
    starts = np.asarray([r[0] for r in ranges], dtype=np.int64)
    ends = np.asarray([r[1] for r in ranges], dtype=np.int64)
    i = np.searchsorted(starts, positions, side="right") - 1
    return (i >= 0) & (positions < ends[np.maximum(i, 0)])


def _write_kept(
    w: CompactedWriter,
    buf: BytesLike,
    positions: np.ndarray,
    cols: Columns,
    keep: np.ndarray | None,
) -> int:
    """Add the kept records of one chunk (all when keep is None) as runs; return their crc sum."""
    import numpy as np

    offs = cols["offset"]
    sizes = cols["size"]
    crc = cols["crc"].astype(np.int64)
    mv = memoryview(buf)
    if keep is None:
        # nothing dropped: runs are the stretches of contiguous positions (a compacted source
        # segment has gaps already)
        idx = None
        pos = positions
        siz = sizes
        total_crc = int(crc.sum())
    else:
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            return 0
        pos = positions[idx]
        siz = sizes[idx]
        total_crc = int(crc[idx].sum())
    brk = np.flatnonzero(pos[1:] != pos[:-1] + siz[:-1]) + 1
    starts = np.concatenate(([0], brk)).tolist()
    stops = np.concatenate((brk, [len(pos)])).tolist()
    for a, z in zip(starts, stops):
        ia = a if idx is None else int(idx[a])
        iz = z - 1 if idx is None else int(idx[z - 1])
        o0 = int(offs[ia])
        o1 = int(offs[iz] + sizes[iz])
        w.add_run(int(pos[a]), mv[o0:o1], siz[a:z].tolist())
    return total_crc


def _verify_compacted(
    final: str,
    name: str,
    info: dict[str, Any],
    seg_stats: list[dict[str, Any]],
    records_in: int,
    raw_in: int,
    crc_out: int,
    segs: list[dict[str, Any]],
    raw_crcs: list[int],
) -> dict[str, Any]:
    """Read the output back: every block decompressed, and equal (crc32) to the bytes written,
    which were read from the segments with every record's crc checked; record counts too."""
    reader = CompactedReader(final)
    try:
        if reader.blocks != len(raw_crcs) or sum(reader.block_records) != info["records"]:
            raise RuntimeError(
                f"compacted segment {final} has {reader.blocks} blocks / "
                f"{sum(reader.block_records)} records; wrote {len(raw_crcs)} / {info['records']}"
            )
        for i, want in enumerate(raw_crcs):
            buf, _ = reader.block(i)
            if zlib.crc32(buf) != want:
                raise RuntimeError(
                    f"compacted segment {final}: block {i} does not read back as written"
                )
    finally:
        reader.close()
    return {
        "kind": "compact",
        "file": name,
        "staged": final,
        "base": info["base"],
        "end": info["end"],
        "records_in": records_in,
        "records_out": info["records"],
        "raw_in": raw_in,
        "raw_out": info["raw_bytes"],
        "bytes_in": sum(s["file_bytes"] for s in segs),
        "bytes_out": info["file_bytes"],
        "crc_sum_out": crc_out,
        "sha256": file_sha256(final),
        "segments": seg_stats,
    }
