"""The work of one task of the archive / compaction job, without Spark.

batch.py (the only module that imports pyspark) hands each Spark task one *group* of consecutive
sealed segments and calls archive_group or compact_group; the same functions run without Spark
in tests and benchmarks. Each reads its segments with job_input.read_segment
(the journal's own walk over the file, checked against the request), writes its outputs under
the request's staging directory with names derived only from the positions they cover, reads
them back, and returns one metadata dict for the driver to verify. The archive is here; the
compaction is in compact_job.py.

Archive layout (hive partitions, readable by `spark.read.parquet(root)` and
`pyarrow.dataset.dataset(root, partitioning="hive")`):

    <archive root>/topic=<topic, Spark-escaped>/date=<YYYY-MM-DD, UTC>/<from:020d>-<to:020d>.parquet

one file per (group, topic, day), rows in position order; see ARCHIVE_COLUMNS for the columns.
<from>-<to> are the first and last archived positions' bounds of the group (archive_ranges), so
a re-run over the same positions writes the same names, and positions archived before are
never archived again.
Queue events (kind 2: acks, leases of a queue, topic = the queue's name) are archived too, in
the partition of the queue's name and of the day of the message record before them.

"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..manifest import file_sha256
from ..record import FLAG_EXPIRATION, KIND_MESSAGE
from .compact_job import compact_group, keep_mask
from .job_input import SegmentChanged, binary_column, read_segment, segment_stats, topic_codes

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ARCHIVE_COLUMNS",
    "SPARK_SCHEMA",
    "SegmentChanged",
    "archive_group",
    "binary_column",
    "compact_group",
    "keep_mask",
    "read_segment",
    "run_group",
    "spark_task",
]

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
        "1 = message, 2 = queue event (body = event entries, see journal/queue_events.py)",
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


# -- archive ---------------------------------------------------------------------------------

_SPARK_ESCAPE = set("\"#%'*/:=?\\\x7f{[]^")


def escape_partition(value: str) -> str:
    """A partition value as Spark writes it in a directory name (ExternalCatalogUtils.escapePathName)."""
    return "".join(
        f"%{ord(ch):02X}" if ch in _SPARK_ESCAPE or ord(ch) < 0x20 else ch for ch in value
    )


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    # the types as ARCHIVE_COLUMNS writes them; the one that is not a pyarrow alias spelled out
    special = {"timestamp[us, UTC]": pa.timestamp("us", tz="UTC")}
    return pa.schema(
        [(n, special.get(t) or pa.type_for_alias(t)) for n, t, _, _ in ARCHIVE_COLUMNS]
    )


def _day_text(day: int) -> str:
    import datetime as dt

    return (dt.date(1970, 1, 1) + dt.timedelta(days=int(day))).isoformat()


def archive_file_name(first: int, end: int) -> str:
    return f"{first:020d}-{end:020d}.parquet"


def archive_ranges(entry: dict[str, Any]) -> list[list[int]]:
    """The [from, to) position ranges of a request's segment entry to archive: its "ranges" (the
    parts not archived before, maintenance.make_request), or the whole segment."""
    return entry.get("ranges") or [[entry["base"], entry["end"]]]


def archive_group(group: dict[str, Any]) -> dict[str, Any]:
    """Archive one group of segments to Parquet under group["staging"] (hive layout).

    group: {"segments": [entries], "staging": dir, "level": zstd level}. Only the records inside
    each entry's archive_ranges are archived (and counted). Returns metadata:
    per output file (relative path, rows, crc sum, bytes, sha256) and per segment (records, crc
    sum, first/last position, whole-file crc32), counted from the source, and each file's rows
    and crc sum as read back from what was written.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    segs = group["segments"]
    first_pos, end_pos = archive_ranges(segs[0])[0][0], archive_ranges(segs[-1])[-1][1]
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
            st = segment_stats(entry, first=None, last=None)
            ranges = entry.get("ranges")
            if ranges:
                st["ranges"] = ranges
            for buf, positions, cols, file_crc in read_segment(entry, st["damaged"]):
                st["file_crc32"] = file_crc
                if ranges:
                    inside = np.zeros(len(positions), dtype=bool)
                    for lo, hi in ranges:
                        inside |= (positions >= lo) & (positions < hi)
                    if not inside.all():
                        positions = positions[inside]
                        cols = {k: v[inside] for k, v in cols.items()}
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
                tdict, tcodes = topic_codes(buf, cols)
                bodies = binary_column(buf, cols["topic_end"], cols["body_end"])
                has_hdr = cols["header_end"] > cols["header_start"]
                if has_hdr.any():
                    headers = binary_column(buf, cols["header_start"], cols["header_end"], has_hdr)
                else:
                    headers = pa.nulls(n, pa.binary())
                has_exp = (cols["flags"] & FLAG_EXPIRATION) != 0
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
                            write_statistics="position publisher_id seq ts kind segment".split(),
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
        names = "segment record_crc_count record_crc_sum position_min position_max".split()
        for seg, cnt, csum, lo, hi in zip(*(agg[c].to_pylist() for c in names)):
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


# -- the Spark task ------------------------------------------------------------------------------


def run_group(spec: dict[str, Any]) -> dict[str, Any]:
    """One task's work: a group spec (batch._group_specs) in, its metadata out."""
    return archive_group(spec) if spec["kind"] == "archive" else compact_group(spec)


def spark_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function (batch.py, through job_code.spark_task): rows (gid, group spec as
    JSON) in, (gid, metadata as JSON) out. Lives here, not in batch.py, so executors import it
    without the driver's module."""
    import json

    import pyarrow as pa

    schema = pa.schema([("gid", pa.int32()), ("meta", pa.string())])
    for batch in batches:
        for gid, spec in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            g = json.loads(spec)
            meta = run_group(g)
            yield pa.RecordBatch.from_arrays(
                [pa.array([gid], pa.int32()), pa.array([json.dumps(meta)], pa.string())],
                schema=schema,
            )
