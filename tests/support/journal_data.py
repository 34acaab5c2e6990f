"""Journals with known contents for the archive / compaction tests, and a runner of a request's
tasks without Spark (the same task functions batch.py hands to Spark)."""

from __future__ import annotations

import json
import os
import threading

from journal.journal import Journal
from journal.maintenance import plan_groups
from journal.manifest import result_path, staging_dir, write_json_atomic
from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record

TS0 = 1_700_000_000_000_000  # 2023-11-14, microseconds


def submit(j: Journal, records, meta: dict | None = None) -> int:
    """records: list of dicts (kind, pub, seq, ts, topic, body, exp, hdr). Waits; returns position."""
    data = bytearray()
    entries = []
    for r in records:
        if r.get("kind", KIND_MESSAGE) == KIND_MESSAGE:
            entries.append((r["pub"], r["seq"], r["ts"], len(data)))
        data += encode_record(
            r.get("kind", KIND_MESSAGE),
            r["pub"],
            r["seq"],
            r["ts"],
            r["topic"].encode(),
            r["body"],
            r.get("exp"),
            r.get("hdr", b""),
        )
    done = threading.Event()
    out = {}

    def cb(pos, err):
        out["pos"], out["err"] = pos, err
        done.set()

    j.submit(bytes(data), entries, cb, meta)
    assert done.wait(30)
    if out["err"]:
        raise out["err"]
    return out["pos"]


def mixed_records(
    n: int,
    start_seq: int = 1,
    ts0: int = TS0,
    pubs=(11, 12, 13),
    topics=("orders/us", "orders/eu", "md.x"),
    ts_step: int = 1000,
) -> list[dict]:
    """Messages across publishers and topics, JSON bodies, some with expiration / header fragments."""
    out = []
    for k in range(n):
        s = start_seq + k
        pub = pubs[k % len(pubs)]
        out.append(
            {
                "pub": pub,
                "seq": s,
                "ts": ts0 + s * ts_step,
                "topic": topics[k % len(topics)],
                "body": json.dumps(
                    {"order": s, "sym": "ACME", "px": 100 + (s % 50) / 4, "qty": 10 * (s % 7)}
                ).encode(),
                "exp": 30 if s % 17 == 0 else None,
                "hdr": b',"x":"corr-%d"' % s if s % 23 == 0 else b"",
            }
        )
    return out


def queue_event(name: str, ops, ts: int = 0) -> dict:
    """A queue event record (server/queues.py): ops = [(op, value, position)]."""
    import struct

    body = b"".join(struct.pack("<BBHQ", op, 0, v, p) for op, v, p in ops)
    return {"kind": KIND_QUEUE_EVENT, "pub": 0, "seq": 0, "ts": ts, "topic": name, "body": body}


def build(d: str, batches: int, per_batch: int, segment_size: int = 64 * 1024, **kw) -> Journal:
    j = Journal(d, segment_size=segment_size)
    seq = 1
    for _ in range(batches):
        submit(j, mixed_records(per_batch, start_seq=seq, **kw))
        seq += per_batch
    return j


def all_raw(j: Journal) -> list[tuple]:
    """(position, kind, pub, seq, ts, topic, body, extra) of every record, through read_raw."""
    out = []
    pos = j.start_position
    while True:
        recs, nxt = j.read_raw(pos, 64 * 1024)
        if not recs:
            nxt2 = j.next_position(nxt)
            if nxt2 == pos or pos >= j.end_position:
                return out
            pos = nxt2
            continue
        out.extend((r[0], r[1], r[2], r[3], r[4], bytes(r[5]), bytes(r[6]), r[7]) for r in recs)
        pos = j.next_position(nxt)


def run_without_spark(req: dict, parallelism: int = 2) -> dict:
    """Run a request's tasks in this process (jobs.*_group) and write the result file as the
    Spark driver does for compaction. Archive requests need batch.py (Spark) to publish."""
    from journal.spark import jobs

    assert req["kind"] == "compact"
    segs = req["segments"]
    stage = staging_dir(req["journal"], req["id"])
    os.makedirs(stage, exist_ok=True)
    metas = []
    for g in plan_groups(segs, int(req["group_bytes"]), parallelism):
        metas.append(
            jobs.compact_group(
                {
                    "kind": "compact",
                    "segments": [segs[i] for i in g],
                    "staging": stage,
                    "tag": req["id"],
                    "policy": req.get("policy") or {},
                }
            )
        )
    res = {"id": req["id"], "status": "ok", "kind": "compact", "outputs": metas}
    write_json_atomic(result_path(req["journal"], req["id"]), res)
    return res
