"""Publish stores through their API: the memory and file stores pass the same contract tests;
the file store also across reopen, under kill-like reopen without close, with a damaged tail,
a corrupted record, a damaged header, and with its space reused once acked."""

import os
import random
from pathlib import Path

import pytest

from client import (
    CorruptStore,
    FilePublishStore,
    MemoryPublishStore,
    StoreClosed,
    StoredPublish,
    StoreFull,
    StoreLocked,
)
from client.pubstore_file import DATA, REC_MAGIC


@pytest.fixture(params=["memory", "file"])
def make_store(request, tmp_path):
    def make(**kw):
        if request.param == "memory":
            return MemoryPublishStore(**kw)
        return FilePublishStore(tmp_path / "pub.store", **kw)

    return make


def test_numbering_discard_and_resync(make_store):
    s = make_store()
    assert (s.last_seq, s.acked_seq, s.unpersisted_count()) == (0, 0, 0)
    assert [s.store("t", b"%d" % i) for i in range(5)] == [1, 2, 3, 4, 5]
    assert s.store("u", b"x", expiration=2.5, correlation_id="c-1") == 6
    assert s.get(6) == StoredPublish(6, "u", b"x", 2.5, "c-1")
    assert s.discard_up_to(2) == 2 and s.acked_seq == 2
    assert s.discard_up_to(1) == 0 and s.acked_seq == 2  # never goes back
    assert [e.seq for e in s.entries_after(0)] == [3, 4, 5, 6]
    assert [e.seq for e in s.entries_after(4)] == [5, 6]
    assert s.first_after(6) is None and s.get(2) is None
    # logon ack: the server has through 4; republish 5 and 6
    assert s.resync(4) == 2 and [e.body for e in s.entries_after(0)] == [b"4", b"x"]
    # a server that knows more than the store handed out: numbering continues after it
    assert s.resync(40) == 0 and s.store("t", b"n") == 41
    s.close()
    with pytest.raises(StoreClosed):
        s.store("t", b"late")


def test_bounds(make_store):
    s = make_store(max_messages=3)
    for _ in range(3):
        s.store("t", b"x")
    assert not s.fits(100)
    with pytest.raises(StoreFull):
        s.store("t", b"x")
    s.discard_up_to(1)
    assert s.fits(100) and s.store("t", b"x") == 4
    s.close()


def test_matches_a_model_under_random_use(make_store):
    s = make_store()
    model: dict[int, bytes] = {}
    rnd = random.Random(7)
    for i in range(5000):
        body = os.urandom(rnd.randint(0, 400))
        seq = s.store(f"topic/{i % 3}", body, correlation_id="x" if i % 5 == 0 else None)
        model[seq] = body
        if rnd.random() < 0.03:
            upto = rnd.randint(s.acked_seq, s.last_seq)
            s.discard_up_to(upto)
            model = {k: v for k, v in model.items() if k > upto}
    assert {e.seq: e.body for e in s.entries_after(0)} == model
    assert s.unpersisted_count() == len(model)
    s.close()


# ---------------------------------------------------------------------------------- file only


def reopen(path, **kw):
    return FilePublishStore(path, **kw)


def drop(store) -> None:
    """What `kill -9` does to an open file store: unmap and close, no flush, no fsync (the
    kernel keeps every write that reached the mapping)."""
    store._mm.close()
    os.close(store._fd)
    store._closed = True


def test_file_store_survives_reopen_and_kill(tmp_path):
    path = tmp_path / "p.store"
    s = FilePublishStore(path)
    for i in range(100):
        s.store("t", b'{"i":%d}' % i)
    s.discard_up_to(60)
    s.close()
    s = reopen(path)
    assert s.recovery.clean and s.recovery.records == 40
    assert (s.acked_seq, s.last_seq) == (60, 100)
    assert [e.seq for e in s.entries_after(0)] == list(range(61, 101))
    assert s.store("t", b"{}") == 101
    drop(s)  # no close(): the process "dies" with the file open
    s = reopen(path)
    assert s.recovery.clean and s.last_seq == 101 and s.unpersisted_count() == 41
    s.close()


def test_one_client_per_file(tmp_path):
    s = FilePublishStore(tmp_path / "p.store")
    with pytest.raises(StoreLocked, match="in use"):
        FilePublishStore(tmp_path / "p.store")
    s.close()
    FilePublishStore(tmp_path / "p.store").close()


def test_space_is_reused_once_acked(tmp_path):
    s = FilePublishStore(tmp_path / "p.store", initial_bytes=64 * 1024)
    body = b"x" * 200
    for i in range(50_000):  # 12 MB through the store, acked in batches of 100
        s.store("t", body)
        if i % 100 == 99:
            s.discard_up_to(s.last_seq)
    assert s.file_bytes == 64 * 1024
    assert os.path.getsize(tmp_path / "p.store") == 64 * 1024
    # unacked data makes it grow, and a wrapped full ring is unwrapped, not lost
    for _ in range(2000):
        s.store("t", body)
    assert s.file_bytes > 64 * 1024
    seqs = [e.seq for e in s.entries_after(0)]
    assert seqs == list(range(50_001, 52_001))
    s.close()
    s = reopen(tmp_path / "p.store")
    assert [e.seq for e in s.entries_after(0)] == seqs and s.recovery.clean
    s.close()


def test_wrapped_ring_unwraps_and_recovers(tmp_path):
    path = tmp_path / "p.store"
    s = FilePublishStore(path, initial_bytes=4096)
    rnd = random.Random(3)
    kept: dict[int, bytes] = {}
    for _ in range(3000):
        body = os.urandom(rnd.randint(1, 300))
        kept[s.store("t", body)] = body
        if rnd.random() < 0.02:  # rare acks: the ring wraps and fills again and again
            upto = rnd.randint(s.acked_seq, s.last_seq)
            s.discard_up_to(upto)
            kept = {k: v for k, v in kept.items() if k > upto}
    assert {e.seq: e.body for e in s.entries_after(0)} == kept
    drop(s)
    s = reopen(path, initial_bytes=4096)
    assert {e.seq: e.body for e in s.entries_after(0)} == kept and s.recovery.clean
    s.close()


def test_records_never_overlap_while_the_ring_wraps_grows_and_unwraps(tmp_path):
    # the content check above can pass with a wrong unwrap (a record written over an older
    # one that a later ack frees); the layout itself must hold after every store
    s = FilePublishStore(tmp_path / "p.store", initial_bytes=4096, max_bytes=1 << 17)
    rnd = random.Random(5)
    for _ in range(3000):
        s.store("t", os.urandom(rnd.randint(1, 600)))
        spans = sorted((off, off + size) for _, off, size in s._live)
        assert spans[0][0] >= DATA and spans[-1][1] <= s.file_bytes
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))
        if rnd.random() < 0.03:
            s.discard_up_to(rnd.randint(s.acked_seq, s.last_seq))
    s.close()


def record_offsets(path) -> list[int]:
    data = Path(path).read_bytes()
    out, off = [], DATA
    while (off := data.find(REC_MAGIC, off)) >= 0:
        if off % 8 == 0:
            out.append(off)
        off += 1
    return out


def test_truncated_tail_loads_what_is_valid(tmp_path):
    path = tmp_path / "p.store"
    s = FilePublishStore(path)
    for i in range(10):
        s.store("t", b'{"n":%d}' % i)
    s.close()
    last = record_offsets(path)[-1]
    os.truncate(path, last + 45)  # past the header of seq 10 (40 bytes), into its payload
    s = reopen(path)
    r = s.recovery
    assert not r.clean and r.records == 9 and r.dropped_records == 1
    assert "seq 10 cut off" in str(r) and r.dropped_bytes == 45
    assert [e.seq for e in s.entries_after(0)] == list(range(1, 10))
    assert s.store("t", b"{}") == 10  # numbering goes on from what is there
    s.close()
    assert reopen(path).recovery.clean  # the damage was cut off at the open


def test_corrupted_record_is_dropped_and_reported(tmp_path):
    path = tmp_path / "p.store"
    s = FilePublishStore(path)
    for i in range(10):
        s.store("t", b'{"n":%d}' % i)
    s.discard_up_to(2)
    s.close()
    offsets = record_offsets(path)
    with open(path, "r+b") as f:  # flip one body byte of seq 5
        f.seek(offsets[4] + 45)
        b = f.read(1)
        f.seek(offsets[4] + 45)
        f.write(bytes([b[0] ^ 0xFF]))
    s = reopen(path)
    r = s.recovery
    assert r.dropped_records == 1 and r.missing == [5]
    assert "seq 5: payload checksum mismatch" in str(r) and "lost sequence number(s) 5" in str(r)
    assert [e.seq for e in s.entries_after(0)] == [3, 4, 6, 7, 8, 9, 10]
    assert s.first_after(4).seq == 6 and s.get(6).body == b'{"n":5}'
    s.close()


def test_damaged_header_and_ack_slots(tmp_path):
    path = tmp_path / "p.store"
    s = FilePublishStore(path)
    for _i in range(4):
        s.store("t", b"{}")
    s.discard_up_to(2)
    s.close()
    data = bytearray(Path(path).read_bytes())
    broken = bytearray(data)
    broken[16:64] = bytes(48)  # both ack slots
    Path(path).write_bytes(broken)
    s = reopen(path)  # every valid record is kept: the server drops what it has
    assert [e.seq for e in s.entries_after(0)] == [1, 2, 3, 4]
    assert "both ack slots damaged" in str(s.recovery)
    s.close()
    data[0:4] = b"XXXX"
    Path(path).write_bytes(data)
    with pytest.raises(CorruptStore, match="magic"):
        reopen(path)
    Path(path).write_bytes(b"short but not empty")
    with pytest.raises(CorruptStore, match="shorter than the header"):
        reopen(path)
