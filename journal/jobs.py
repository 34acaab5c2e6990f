"""The work of one task of the archive / compaction job, without Spark.

batch.py (the only module that imports pyspark) hands each Spark task one *group* of consecutive
sealed segments and calls archive_group or compact_group; the same functions run without Spark
in tests and benchmarks. Each reads its segments through the journal's own readers
(record.record_offsets / record_columns for plain segments, compacted.CompactedReader for
compacted ones), checks that every file is still the one the request described (size and
modification time, so a file still being written or replaced fails the task), writes its outputs
under the request's staging directory with names derived only from the positions they cover,
reads them back, and returns one metadata dict for the driver to verify.

Archive layout (hive partitions, readable by `spark.read.parquet(root)` and
`pyarrow.dataset.dataset(root, partitioning="hive")`):

    <archive root>/topic=<topic, Spark-escaped>/date=<YYYY-MM-DD, UTC>/<from:020d>-<to:020d>.parquet

one file per (group, topic, day), rows in position order; see ARCHIVE_COLUMNS for the columns.
Queue events (kind 2: acks, leases of a queue, topic = the queue's name) are archived too, in
the partition of the queue's name and of the day of the message record before them.

Compaction keeps a record if any of these holds (policy, see maintenance.make_request):
- nothing is dropped for age (`cutoff_us` 0), or the record is at or after the first message of
  the group with a receive time >= cutoff_us (inside the retention window);
- a queue may still need it: a message on a topic a queue reads, at or after that queue's floor
  (its recovery checkpoint: every message of the queue below it is done); a queue event of a
  queue, at or after that queue's floor;
- it is the newest message of its publisher (`keep_positions`, from the index's highest sequence
  per publisher), so dedup state survives even an index rebuild.
"""

from __future__ import annotations

import logging
import os
import re
import zlib

from .compacted import CompactedReader, CompactedWriter, compacted_name
from .manifest import file_sha256
from .record import (
    KIND_MESSAGE,
    KIND_QUEUE_EVENT,
    SEGMENT_HEADER_SIZE,
    CorruptRecord,
    decode_segment_header,
    good_runs,
    record_columns,
    record_offsets,
)

log = logging.getLogger("tickertape.journal")

DAY_US = 86_400_000_000
PARQUET_LEVEL = 3

# name, Arrow type (as text, for the docs), Spark SQL type
ARCHIVE_COLUMNS = (
    ("position", "int64", "BIGINT", "journal position of the record (orders records; lineage)"),
    ("bookmark", "string", "STRING", "'publisher_id|seq|', as a subscription's bookmark takes it"),
    (
        "publisher_id",
        "uint64",
        "DECIMAL(20,0)",
        "publisher id (unsigned 64-bit; Spark reads it as DECIMAL(20,0))",
    ),
    ("seq", "uint64", "DECIMAL(20,0)", "the publisher's sequence number"),
    ("ts", "timestamp[us, UTC]", "TIMESTAMP", "receive time (UTC)"),
    (
        "kind",
        "int8",
        "TINYINT",
        "1 = message, 2 = queue event (body = event entries, see server/queues.py)",
    ),
    ("expiration", "int64", "BIGINT", "the publish's expiration in seconds, NULL if none"),
    (
        "header",
        "binary",
        "BINARY",
        "header fragment appended to deliveries (e.g. correlation id), NULL if none",
    ),
    ("body", "binary", "BINARY", "the message as published (CAST(body AS STRING) for JSON)"),
    ("record_crc", "int64", "BIGINT", "the record's crc32 in the journal (verification)"),
    ("segment", "int64", "BIGINT", "base position of the journal segment it came from"),
)
PARTITION_COLUMNS = (("topic", "STRING"), ("date", "STRING"))
SPARK_SCHEMA = (
    ", ".join(f"{n} {t}" for n, _, t, _ in ARCHIVE_COLUMNS)
    + ", "
    + ", ".join(f"{n} {t}" for n, t in PARTITION_COLUMNS)
)


class SegmentChanged(RuntimeError):
    """A segment is not the file the request described (still written, replaced or damaged)."""

    retriable = False

    def __init__(self, path: str, reason: str):
        super().__init__(f"segment {path} {reason}; nothing was published. Make a new request")
        self.path = path
        self.reason = reason


# -- reading ---------------------------------------------------------------------------------


def _stat_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def read_segment(entry: dict, damaged: list | None = None):
    """Yield (buf, positions, columns) chunks of every good record of one segment, checksums
    verified. A damaged region of a plain segment is skipped (never archived or compacted as
    data) and appended to `damaged` as (file offset, bytes), and logged.

    entry: a request's segment entry (path, base, end, kind, file_bytes, mtime_ns).
    """
    import numpy as np

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
        with open(path, "rb") as f:
            data = f.read()
        if len(data) != size:
            raise SegmentChanged(path, "changed while it was read")
        file_crc = zlib.crc32(data)
        try:
            base = decode_segment_header(data)
        except CorruptRecord as exc:
            raise SegmentChanged(path, f"has a bad header ({exc.reason})") from None
        if base != entry["base"]:
            raise SegmentChanged(path, f"starts at {base}, not {entry['base']}")
        buf = memoryview(data)[SEGMENT_HEADER_SIZE:]
        if base + len(buf) != entry["end"]:
            raise SegmentChanged(
                path, f"holds {len(buf)} bytes of records, not {entry['end'] - base}"
            )
        found: list = []
        for a, b in good_runs(buf, found):
            run = buf[a:b]
            offs, stop = record_offsets(run, verify=False)
            cols = record_columns(run, offs, stop)
            yield run, base + a + cols["offset"], cols, file_crc
        for off, nbytes in found:
            log.warning(
                "journal job: %s is damaged at offset %d: %d bytes skipped (not archived or "
                "compacted as data)",
                path,
                SEGMENT_HEADER_SIZE + off,
                nbytes,
            )
            if damaged is not None:
                damaged.append((SEGMENT_HEADER_SIZE + off, nbytes))
    else:
        reader = CompactedReader(path)
        try:
            if (reader.base, reader.end) != (entry["base"], entry["end"]):
                raise SegmentChanged(
                    path,
                    f"covers [{reader.base}, {reader.end}), not [{entry['base']}, {entry['end']})",
                )
            with open(path, "rb") as f:
                file_crc = zlib.crc32(f.read())
            for buf, runs in reader.iter_blocks():
                try:
                    offs, stop = record_offsets(buf, verify=True)
                except CorruptRecord as exc:
                    raise SegmentChanged(
                        path, f"has a damaged record in a block: {exc.reason}"
                    ) from None
                if stop != len(buf):
                    raise SegmentChanged(path, "has a block that ends inside a record")
                cols = record_columns(buf, offs, stop)
                rpos = np.array([r[0] for r in runs], dtype=np.int64)
                rboff = np.array([r[1] for r in runs], dtype=np.int64)
                k = np.searchsorted(rboff, cols["offset"], side="right") - 1
                positions = rpos[k] + (cols["offset"] - rboff[k])
                yield buf, positions, cols, file_crc
        finally:
            reader.close()
    if _stat_key(path) != (size, mtime):
        raise SegmentChanged(path, "changed while it was read")


def _slices(buf, starts, ends) -> list:
    b = bytes(buf) if isinstance(buf, memoryview) else buf
    return [b[s:e] for s, e in zip(starts.tolist(), ends.tolist())]


def binary_column(buf, starts, ends, valid=None):
    """A pyarrow binary array of buf[starts[i]:ends[i]] (None where valid is False).

    Built as an Arrow binary *view* array over buf (16-byte views computed with numpy: no
    Python object per value), then cast to plain binary in C++. Falls back to Python slices
    for buffers past 2 GiB (view offsets are 32-bit).
    """
    import numpy as np
    import pyarrow as pa

    n = len(starts)
    if len(buf) >= 1 << 31 or n == 0:
        vals = _slices(buf, starts, ends)
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


# -- archive ---------------------------------------------------------------------------------

_SPARK_ESCAPE = set("\"#%'*/:=?\\\x7f{[]^")


def escape_partition(value: str) -> str:
    """A partition value as Spark writes it in a directory name (ExternalCatalogUtils.escapePathName)."""
    out = []
    for ch in value:
        if ch in _SPARK_ESCAPE or ord(ch) < 0x20:
            out.append(f"%{ord(ch):02X}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_partition(text: str) -> str:
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("position", pa.int64()),
            ("bookmark", pa.string()),
            ("publisher_id", pa.uint64()),
            ("seq", pa.uint64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("kind", pa.int8()),
            ("expiration", pa.int64()),
            ("header", pa.binary()),
            ("body", pa.binary()),
            ("record_crc", pa.int64()),
            ("segment", pa.int64()),
        ]
    )


def _day_text(day: int) -> str:
    import datetime as dt

    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat()


def archive_file_name(first: int, end: int) -> str:
    return f"{first:020d}-{end:020d}.parquet"


def archive_group(group: dict) -> dict:
    """Archive one group of segments to Parquet under group["staging"] (hive layout).

    group: {"segments": [entries], "staging": dir, "level": zstd level}. Returns metadata:
    per output file (relative path, rows, crc sum, bytes, sha256) and per segment (records, crc
    sum, first/last position, whole-file crc32), counted from the source, and each file's rows
    and crc sum as read back from what was written.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    segs = group["segments"]
    first_pos, end_pos = segs[0]["base"], segs[-1]["end"]
    fname = archive_file_name(first_pos, end_pos)
    staging = group["staging"]
    level = group.get("level", PARQUET_LEVEL)
    schema = _arrow_schema()
    writers: dict = {}
    expect: dict = {}  # rel path -> [rows, crc sum]
    seg_stats = []
    last_msg_day = None
    day_names: dict = {}
    topic_names: dict = {}
    records = 0
    raw_bytes = 0
    try:
        for entry in segs:
            st = {
                "path": entry["path"],
                "base": entry["base"],
                "end": entry["end"],
                "records": 0,
                "crc_sum": 0,
                "first": None,
                "last": None,
                "file_crc32": None,
                "file_bytes": entry["file_bytes"],
            }
            damaged: list = st.setdefault("damaged", [])
            for buf, positions, cols, file_crc in read_segment(entry, damaged):
                st["file_crc32"] = file_crc
                n = len(positions)
                if n == 0:
                    continue
                kind = cols["kind"]
                ts = cols["ts"]
                day = ts // DAY_US
                msg = kind == KIND_MESSAGE
                # queue events take the day of the message before them (their own ts is 0)
                idx = np.where(msg, np.arange(n), -1)
                idx = np.maximum.accumulate(idx)
                if last_msg_day is None:
                    last_msg_day = int(day[msg][0]) if msg.any() else 0
                eday = np.where(idx >= 0, day[np.maximum(idx, 0)], last_msg_day)
                day = np.where(msg, day, eday)
                if msg.any():
                    last_msg_day = int(day[np.nonzero(msg)[0][-1]])
                tarr = binary_column(
                    buf, cols["topic_start"], cols["topic_end"]
                ).dictionary_encode()
                tcodes = tarr.indices.to_numpy(zero_copy_only=False).astype(np.int64)
                tdict = [v.decode("utf-8", "replace") for v in tarr.dictionary.to_pylist()]
                bodies = binary_column(buf, cols["topic_end"], cols["body_end"])
                has_hdr = cols["header_end"] > cols["header_start"]
                if has_hdr.any():
                    headers = binary_column(buf, cols["header_start"], cols["header_end"], has_hdr)
                else:
                    headers = pa.nulls(n, pa.binary())
                has_exp = (cols["flags"] & 1) != 0
                pub = pa.array(cols["publisher_id"], pa.uint64())
                seq = pa.array(cols["seq"], pa.uint64())
                bookmark = pc.binary_join_element_wise(
                    pc.cast(pub, pa.string()), pc.cast(seq, pa.string()), "", "|"
                )
                crc = cols["crc"].astype(np.int64)
                table = pa.table(
                    [
                        pa.array(positions, pa.int64()),
                        bookmark,
                        pub,
                        seq,
                        pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                        pa.array(kind.astype(np.int8), pa.int8()),
                        pa.array(cols["expiration"].astype(np.int64), pa.int64(), mask=~has_exp),
                        headers,
                        bodies,
                        pa.array(crc, pa.int64()),
                        pa.array(np.full(n, entry["base"], dtype=np.int64), pa.int64()),
                    ],
                    schema=schema,
                )
                dmin = int(day.min())
                span = int(day.max()) - dmin + 1
                key = tcodes * span + (day - dmin)
                order = np.argsort(key, kind="stable")
                skey = key[order]
                cuts = np.flatnonzero(np.diff(skey)) + 1
                starts = np.concatenate(([0], cuts))
                stops = np.concatenate((cuts, [n]))
                for a, z in zip(starts.tolist(), stops.tolist()):
                    k = int(skey[a])
                    topic = tdict[k // span]
                    d = k % span + dmin
                    dn = day_names.get(d) or day_names.setdefault(d, _day_text(d))
                    tn = topic_names.get(topic) or topic_names.setdefault(
                        topic, escape_partition(topic)
                    )
                    rel = f"topic={tn}/date={dn}/{fname}"
                    part = table.take(pa.array(order[a:z]))
                    w = writers.get(rel)
                    if w is None:
                        path = os.path.join(staging, rel)
                        os.makedirs(os.path.dirname(path), exist_ok=True)
                        w = writers[rel] = pq.ParquetWriter(
                            path,
                            schema,
                            compression="zstd",
                            compression_level=level,
                            use_dictionary=["kind", "segment"],
                            write_statistics=[
                                "position",
                                "publisher_id",
                                "seq",
                                "ts",
                                "kind",
                                "segment",
                            ],
                        )
                        expect[rel] = [0, 0]
                    w.write_table(part)
                    e = expect[rel]
                    e[0] += z - a
                    e[1] += int(crc[order[a:z]].sum())
                st["records"] += n
                st["crc_sum"] += int(crc.sum())
                p0, p1 = int(positions[0]), int(positions[-1])
                st["first"] = p0 if st["first"] is None else st["first"]
                st["last"] = p1
                raw_bytes += int(cols["size"].sum())
            records += st["records"]
            seg_stats.append(st)
    finally:
        for w in writers.values():
            w.close()
    # read every file back (an independent reader of what was written): per source segment,
    # rows, crc32 sum and first / last position; the driver compares them with the segments
    files = []
    readback: dict = {}
    for rel, (rows, crc_sum) in sorted(expect.items()):
        path = os.path.join(staging, rel)
        back = pq.read_table(path, columns=["segment", "position", "record_crc"])
        got_rows, got_crc = back.num_rows, int(pc.sum(back["record_crc"]).as_py() or 0)
        if (got_rows, got_crc) != (rows, crc_sum):
            raise RuntimeError(
                f"archive file {path} reads back {got_rows} rows / crc sum {got_crc}, "
                f"wrote {rows} / {crc_sum}"
            )
        agg = back.group_by("segment").aggregate(
            [
                ("record_crc", "count"),
                ("record_crc", "sum"),
                ("position", "min"),
                ("position", "max"),
            ]
        )
        for seg, cnt, csum, lo, hi in zip(
            *(
                agg[c].to_pylist()
                for c in (
                    "segment",
                    "record_crc_count",
                    "record_crc_sum",
                    "position_min",
                    "position_max",
                )
            )
        ):
            r = readback.setdefault(seg, [0, 0, lo, hi])
            r[0] += cnt
            r[1] += csum
            r[2] = min(r[2], lo)
            r[3] = max(r[3], hi)
        files.append(
            {
                "path": rel,
                "rows": rows,
                "crc_sum": crc_sum,
                "bytes": os.path.getsize(path),
                "sha256": file_sha256(path),
            }
        )
    return {
        "kind": "archive",
        "first": first_pos,
        "end": end_pos,
        "records": records,
        "raw_bytes": raw_bytes,
        "bytes_in": sum(s["file_bytes"] for s in segs),
        "bytes_out": sum(f["bytes"] for f in files),
        "files": files,
        "segments": seg_stats,
        "readback": {str(k): v for k, v in readback.items()},
    }


# -- compaction ------------------------------------------------------------------------------


def _queue_matchers(policy: dict):
    out = []
    for q in policy.get("queues", ()):
        rx = re.compile(q["topic"]) if q.get("pattern") else None
        out.append((q["name"], q["topic"], rx, int(q["floor"])))
    return out


def keep_mask(
    positions, cols, topics: list[str], topic_codes, policy: dict, cutoff_position: int | None
):
    """Which records of one chunk compaction keeps (a numpy bool array), per the module's rules."""
    import numpy as np

    n = len(positions)
    cutoff = int(policy.get("cutoff_us") or 0)
    if cutoff <= 0:
        return np.ones(n, dtype=bool)
    kind = cols["kind"]
    msg = kind == KIND_MESSAGE
    keep = msg & (cols["ts"] >= cutoff)
    if cutoff_position is not None:
        keep |= positions >= cutoff_position
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


def compact_group(group: dict) -> dict:
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
    try:
        for entry in segs:
            st = {
                "path": entry["path"],
                "base": entry["base"],
                "end": entry["end"],
                "records": 0,
                "crc_sum": 0,
                "file_crc32": None,
                "file_bytes": entry["file_bytes"],
                "kept": 0,
            }
            damaged: list = st.setdefault("damaged", [])
            for buf, positions, cols, file_crc in read_segment(entry, damaged):
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
                    tarr = binary_column(
                        buf, cols["topic_start"], cols["topic_end"]
                    ).dictionary_encode()
                    tcodes = tarr.indices.to_numpy(zero_copy_only=False).astype(np.int64)
                    tdict = [v.decode("utf-8", "replace") for v in tarr.dictionary.to_pylist()]
                    keep = keep_mask(positions, cols, tdict, tcodes, policy, cutoff_position)
                    if len(must_keep):
                        keep |= np.isin(positions, must_keep)
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
    return _verify_compacted(
        final, name, info, seg_stats, records_in, raw_in, crc_out, segs, w.raw_crcs
    )


def _write_kept(w: CompactedWriter, buf, positions, cols, keep) -> int:
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
    final, name, info, seg_stats, records_in, raw_in, crc_out, segs, raw_crcs
) -> dict:
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


# -- the Spark task ------------------------------------------------------------------------------


def spark_task(batches):
    """The mapInArrow function (batch.py): rows (gid, group spec as JSON) in, (gid, metadata as
    JSON) out. Lives here, not in batch.py, so executors import it without the driver's module."""
    import json

    import pyarrow as pa

    schema = pa.schema([("gid", pa.int32()), ("meta", pa.string())])
    for batch in batches:
        for gid, spec in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            g = json.loads(spec)
            meta = archive_group(g) if g["kind"] == "archive" else compact_group(g)
            yield pa.RecordBatch.from_arrays(
                [pa.array([gid], pa.int32()), pa.array([json.dumps(meta)], pa.string())],
                schema=schema,
            )
