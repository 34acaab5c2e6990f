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


def sow_fold(records, topic: str) -> dict[str, bytes]:
    """The SOW state of `topic` (key -> body) a fold of these raw records gives (the rule of
    server/sow: a message puts its record, a delete removes by keys or by filter)."""
    from journal.record import KIND_SOW_DELETE
    from protocol.filters import compile_filter
    from server.matching import body_matches
    from server.sow.keys import key_from_fragment
    from server.sow.records import BY_FILTER, decode_delete

    state: dict[str, bytes] = {}
    for r in records:
        if r[5] != topic.encode():
            continue
        if r[1] == KIND_MESSAGE:
            state[key_from_fragment(r[7][1])] = r[6]
        elif r[1] == KIND_SOW_DELETE:
            form, payload = decode_delete(r[6])
            if form == BY_FILTER:
                f = compile_filter(payload)
                for k in [k for k, b in state.items() if body_matches(f, b)]:
                    del state[k]
            else:
                for k in payload.split(","):
                    state.pop(k, None)
    return state


def sow_journal(d: str) -> tuple[Journal, dict[str, bytes], int]:
    """A journal whose SOW topic `prices` has old records that are each the newest message of
    their publisher (compaction keeps them) and old deletes of two of them (by key, by filter),
    then old messages compaction drops and newer ones in sealed segments. Returns (journal, its
    fold of `prices`, a "now" at which a 1 s retention drops the old messages)."""
    from journal.record import KIND_SOW_DELETE
    from server.sow.keys import KeyMaker, k_fragment
    from server.sow.records import BY_FILTER, BY_KEYS, encode_delete

    keys = KeyMaker(("/sym",))

    def sow(pub: int, ts: int, body: dict) -> dict:
        raw = json.dumps(body).encode()
        hdr = k_fragment(keys.key(raw, None))
        return {"pub": pub, "seq": 1, "ts": ts, "topic": "prices", "body": raw, "hdr": hdr}

    def delete(ts: int, form: bytes, payload: str) -> dict:
        body = encode_delete(form, payload)
        return {
            "kind": KIND_SOW_DELETE,
            "pub": 0,
            "seq": 0,
            "ts": ts,
            "topic": "prices",
            "body": body,
        }

    j = Journal(d, segment_size=4096)
    submit(
        j,
        [
            sow(21, TS0 + 1000, {"sym": "X", "px": 1}),
            sow(23, TS0 + 2000, {"sym": "Y", "px": 50}),
            sow(24, TS0 + 2500, {"sym": "Z", "px": 3}),
        ],
    )
    x = keys.key(b'{"sym":"X"}', None)
    submit(j, [delete(TS0 + 3000, BY_KEYS, x), delete(TS0 + 4000, BY_FILTER, "/px > 10")])
    submit(j, mixed_records(40, start_seq=1, ts0=TS0 + 5000, pubs=(22,)))  # old: dropped
    for seq in range(41, 41 + 12 * 40, 40):  # newer: segments sealed past the cutoff
        submit(j, mixed_records(40, start_seq=seq, ts0=TS0 + 10_000_000, pubs=(22,)))
    want = sow_fold(all_raw(j), "prices")
    assert list(want) == [keys.key(b'{"sym":"Z"}', None)]
    return j, want, TS0 + 11_000_000
