"""Tickertape journals with known contents, built with the journal API (no server), cached.

A replay or locate benchmark needs a journal of 1M .. 10M messages; publishing them through the
server would take minutes and would be the load, not the measure. `cached_journal()` builds one
with `journal.journal.Journal.submit` (records from `journal.record.encode_record`, the exact
bytes the server writes) and keeps it under bench/.data/journals/, reused while its parameters,
the record format (record.MAGIC) and the index strides are the same and it opens with the
expected end position. A server started on a copy of it (TickertapePeer extra
`journal_copy_from`) or on it in place (`journal_dir`) sees ordinary stored messages.

Contents: `n` messages on one topic, publishers `bench-gen-0 .. bench-gen-{P-1}` (publisher ids
as the server derives them from a client name, server/ids.py) taking turns, sequence numbers
1, 2, ... per publisher, receive times `ts0 + i * ts_step_us` (i = 0 .. n-1, all in the past),
JSON bodies of exactly `size` bytes:

    {"qty":55,"seq":42,"pad":"xxxx..."}

(valid JSON, unlike loadwire.make_body's zero-padded `seq`, so that content filters can read it).
`seq` is the message's index + 1 over the whole journal; `qty` is 1..100, and exactly half of
each run of 100 messages have qty > 50 (so the filter `/qty > 50` matches 50 %).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time

import peers

from journal import index as jindex
from journal import record as jrecord
from journal.journal import Journal
from server.ids import publisher_id

ROOT = os.path.join(peers.DATA_ROOT, "journals")
BUILDER_VERSION = 2
BATCH = 20_000  # records per submit (one group commit each)
IN_FLIGHT = 4  # batches submitted and not yet written


def qty_of(seq: int) -> int:
    """1..100; a permutation of each run of 100 sequences, so exactly half are > 50."""
    return (seq * 37) % 100 + 1


def make_body(seq: int, size: int = 100) -> bytes:
    head = b'{"qty":%d,"seq":%d,"pad":"' % (qty_of(seq), seq)
    pad = size - len(head) - 2
    if pad < 0:
        raise ValueError(f"body size {size} too small (minimum {len(head) + 2})")
    return head + b"x" * pad + b'"}'


def publisher_names(pubs: int) -> list[str]:
    return [f"bench-gen-{k}" for k in range(pubs)]


def message_at(i: int, meta: dict) -> tuple[int, int, int]:
    """(publisher_id, seq, ts_us) of the i-th message (0-based) of a journal described by meta."""
    p = meta["pubs"]
    return meta["pub_ids"][i % p], i // p + 1, meta["ts0"] + i * meta["ts_step_us"]


def _key(n: int, topic: str, size: int, pubs: int, ts_step_us: int) -> str:
    fmt = (
        f"v{BUILDER_VERSION}|{jrecord.MAGIC!r}|{jindex.BM_STRIDE}|{jindex.BM_SPAN}|"
        f"{jindex.TIME_STRIDE}|{n}|{topic}|{size}|{pubs}|{ts_step_us}"
    )
    return hashlib.sha1(fmt.encode()).hexdigest()[:10]


def build(
    directory: str,
    n: int,
    topic: str = "bench.replay",
    size: int = 100,
    pubs: int = 1,
    ts_step_us: int = 10,
) -> dict:
    """Write a fresh journal of n messages into `directory` (which must not hold one). Returns
    its description (meta): n, topic, size, pubs, pub_ids, ts0, ts_step_us, end_position."""
    os.makedirs(directory, exist_ok=True)
    ts0 = int(time.time() * 1e6) - n * ts_step_us - 60_000_000  # all of it in the past
    pub_ids = [publisher_id(x) for x in publisher_names(pubs)]
    topic_b = topic.encode()
    enc = jrecord.encode_record
    kind = jrecord.KIND_MESSAGE
    # durability "write": no fdatasync per batch; close() fsyncs the segment once at the end
    j = Journal(directory, durability="write")
    slots = threading.Semaphore(IN_FLIGHT)
    errors: list[BaseException] = []

    def done(_pos, err):
        if err is not None:
            errors.append(err)
        slots.release()

    t0 = time.monotonic()
    last_note = t0
    try:
        for start in range(0, n, BATCH):
            parts = []
            entries = []
            off = 0
            for i in range(start, min(n, start + BATCH)):
                pid = pub_ids[i % pubs]
                seq = i // pubs + 1
                ts = ts0 + i * ts_step_us
                r = enc(kind, pid, seq, ts, topic_b, make_body(i + 1, size))
                entries.append((pid, seq, ts, off))
                parts.append(r)
                off += len(r)
            slots.acquire()
            if errors:
                raise errors[0]
            j.submit(b"".join(parts), entries, done)
            now = time.monotonic()
            if now - last_note > 10:
                last_note = now
                print(
                    f"  building journal: {start + BATCH:,}/{n:,} messages ({now - t0:.0f}s)",
                    flush=True,
                )
        for _ in range(IN_FLIGHT):
            slots.acquire()
        if errors:
            raise errors[0]
        end = j.end_position
    finally:
        j.close()
    return {
        "n": n,
        "topic": topic,
        "size": size,
        "pubs": pubs,
        "pub_ids": pub_ids,
        "ts0": ts0,
        "ts_step_us": ts_step_us,
        "end_position": end,
        "build_seconds": round(time.monotonic() - t0, 1),
    }


def _valid(path: str, meta: dict) -> bool:
    try:
        j = Journal(os.path.join(path, "journal"))
    except Exception:
        return False
    try:
        if j.end_position != meta["end_position"]:
            return False
        pid, seq, _ = message_at(meta["n"] - 1, meta)
        return j.locate(pid, seq) is not None
    except Exception:
        return False
    finally:
        j.close()


def cached_journal(
    n: int,
    topic: str = "bench.replay",
    size: int = 100,
    pubs: int = 1,
    ts_step_us: int = 10,
    rebuild: bool = False,
) -> tuple[str, dict]:
    """(journal directory, meta) of a cached journal with these parameters, built if needed.

    Do not run a server on the returned directory unless nothing writes to it (bench_locate
    runs one with no publisher); copy it otherwise (TickertapePeer extra journal_copy_from)."""
    key = _key(n, topic, size, pubs, ts_step_us)
    path = os.path.join(ROOT, f"j{n}-{key}")
    meta_path = os.path.join(path, "meta.json")
    if not rebuild and os.path.exists(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if _valid(path, meta):
            print(f"  journal of {n:,} messages reused from {os.path.relpath(path)}", flush=True)
            return os.path.join(path, "journal"), meta
        print(f"  cached journal {os.path.relpath(path)} does not open as built: rebuilding")
    shutil.rmtree(path, ignore_errors=True)
    print(f"  building a journal of {n:,} messages with the journal API ...", flush=True)
    meta = build(os.path.join(path, "journal"), n, topic, size, pubs, ts_step_us)
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta, f)
    os.replace(meta_path + ".tmp", meta_path)  # the marker: written last
    print(
        f"  built {n:,} messages in {meta['build_seconds']}s "
        f"({meta['end_position'] / 2**20:,.0f} MiB) at {os.path.relpath(path)}",
        flush=True,
    )
    return os.path.join(path, "journal"), meta
