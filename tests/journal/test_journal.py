"""The journal through its API, across restarts: write, close, reopen, check."""

import os
import threading
import time

import pytest

from journal.journal import CorruptSegment, Journal, JournalClosed, JournalUnavailable, segment_name
from journal.record import KIND_MESSAGE, SEGMENT_HEADER_SIZE, encode_record


def write_batch(j: Journal, msgs, pub=7, ts0=1_000_000):
    """msgs: list of (seq, topic, body). Returns the batch's base position (waits for durability)."""
    data = bytearray()
    entries = []
    for seq, topic, body in msgs:
        entries.append((pub, seq, ts0 + seq, len(data)))
        data += encode_record(KIND_MESSAGE, pub, seq, ts0 + seq, topic.encode(), body)
    done = threading.Event()
    result = {}

    def cb(pos, err):
        result["pos"], result["err"] = pos, err
        done.set()

    j.submit(bytes(data), entries, cb)
    assert done.wait(10)
    if result["err"]:
        raise result["err"]
    return result["pos"]


def all_records(j):
    return [(r.seq, r.topic, r.body) for r in j.scan()]


def test_write_close_reopen(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d)
    msgs = [(i, "orders", b'{"n":%d}' % i) for i in range(1, 101)]
    write_batch(j, msgs[:50])
    write_batch(j, msgs[50:])
    assert all_records(j) == msgs
    j.close()
    with pytest.raises(JournalClosed):
        j.submit(b"", [], lambda p, e: None)
    j2 = Journal(d)
    assert all_records(j2) == msgs
    assert j2.publishers()[7][0] == 100
    pos = j2.locate(7, 42)
    recs, _ = j2.read(pos)
    assert recs[0].seq == 42
    assert j2.locate(7, 1000) is None
    j2.close()


def test_segments_roll_and_read_across(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d, segment_size=2000)
    msgs = [(i, "t", b"x" * 100) for i in range(1, 201)]
    for k in range(0, 200, 10):
        write_batch(j, msgs[k : k + 10])
    assert len(j.segments) > 5
    assert all_records(j) == msgs
    j.close()
    j2 = Journal(d, segment_size=2000)
    assert all_records(j2) == msgs
    for seq in (1, 57, 200):
        recs, _ = j2.read(j2.locate(7, seq))
        assert recs[0].seq == seq
    j2.close()


def test_torn_tail_is_truncated_and_logged(tmp_path, caplog):
    d = str(tmp_path / "j")
    j = Journal(d)
    msgs = [(i, "t", b"body-%d" % i) for i in range(1, 11)]
    write_batch(j, msgs)
    j.close()
    seg = os.path.join(d, segment_name(0))
    good = os.path.getsize(seg)
    extra = encode_record(KIND_MESSAGE, 7, 11, 5, b"t", b"torn away")
    with open(seg, "ab") as f:
        f.write(extra[:-3])  # a write cut short by a crash
    j2 = Journal(d)
    assert all_records(j2) == msgs
    assert SEGMENT_HEADER_SIZE + j2.segments[-1].size == good  # the file has its runway again
    assert "truncating the tail" in caplog.text
    assert j2.recovery["dropped_bytes"] == len(extra) - 3
    # the journal keeps working after recovery
    write_batch(j2, [(11, "t", b"after")])
    assert all_records(j2)[-1] == (11, "t", b"after")
    j2.close()


def test_corrupted_record_checksum_truncates(tmp_path, caplog):
    d = str(tmp_path / "j")
    j = Journal(d)
    write_batch(j, [(1, "t", b"one")])
    write_batch(j, [(2, "t", b"two")])
    j.close()
    # wipe the index checkpoint so the whole segment is verified, then flip a byte of record 2
    import shutil

    shutil.rmtree(os.path.join(d, "index"))
    seg = os.path.join(d, segment_name(0))
    with open(seg, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"X")
    j2 = Journal(d)
    assert all_records(j2) == [(1, "t", b"one")]
    assert "bad length, kind or checksum" in caplog.text
    assert j2.locate(7, 1) is not None and j2.locate(7, 2) is None
    j2.close()


def test_index_rebuilt_when_deleted(tmp_path):
    import shutil

    d = str(tmp_path / "j")
    j = Journal(d, segment_size=1000)
    msgs = [(i, "t", b"y" * 50) for i in range(1, 61)]
    write_batch(j, msgs)
    j.close()
    shutil.rmtree(os.path.join(d, "index"))
    j2 = Journal(d, segment_size=1000)
    assert j2.recovery["reindexed_records"] == 60
    assert j2.publishers()[7][0] == 60
    assert j2.read(j2.locate(7, 33))[0][0].seq == 33
    j2.close()


def test_locate_time(tmp_path):
    j = Journal(str(tmp_path / "j"))
    write_batch(j, [(i, "t", b"z") for i in range(1, 1001)], ts0=5_000_000)
    # record i has ts 5_000_000 + i; the first record after ts 5_000_500 is seq 501
    pos = j.locate_time(5_000_500)
    assert j.read(pos)[0][0].seq == 501
    assert j.read(j.locate_time(0))[0][0].seq == 1
    assert j.locate_time(10**15) == j.end_position
    j.close()


def test_write_failure_fails_batch_and_recovers(tmp_path, monkeypatch):
    import journal.journal as jm

    j = Journal(str(tmp_path / "j"))
    write_batch(j, [(1, "t", b"ok")])
    real_pwritev = os.pwritev

    def full_disk(fd, buffers, offset, flags=0):
        real_pwritev(fd, [bytes(buffers[0][:5])], offset)  # a partial write, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jm.os, "pwritev", full_disk)  # the commit's write (fileio.pwrite_dsync)
    with pytest.raises(JournalUnavailable) as info:
        write_batch(j, [(2, "t", b"lost")])
    assert "No space left" in str(info.value) and "nothing in this batch was persisted" in str(
        info.value
    )
    monkeypatch.setattr(jm.os, "pwritev", real_pwritev)
    # until the submitter has rolled back and fenced, later batches fail too (no gap is stored)
    with pytest.raises(JournalUnavailable):
        write_batch(j, [(3, "t", b"queued behind the failure")])
    j.fence()
    assert not j.available
    deadline = time.monotonic() + 10
    while not j.available:  # the writer probes the device every second and resumes by itself
        assert time.monotonic() < deadline, "the journal did not recover after the disk came back"
        time.sleep(0.05)
    write_batch(j, [(3, "t", b"later")])
    assert all_records(j) == [(1, "t", b"ok"), (3, "t", b"later")]
    j.close()
    j2 = Journal(str(tmp_path / "j"))
    assert all_records(j2) == [(1, "t", b"ok"), (3, "t", b"later")]
    j2.close()


def test_missing_middle_segment_is_reported_and_the_rest_served(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d, segment_size=500)
    for i in range(1, 40):
        write_batch(j, [(i, "t", b"q" * 60)])
    j.close()
    gone = j.segments[2]
    os.remove(gone.path)
    j2 = Journal(d, segment_size=500)
    seqs = [r.seq for r in j2.scan()]
    assert len(seqs) < 39 and seqs == sorted(seqs) and seqs[-1] == 39
    damage = j2.integrity.last_damage
    assert damage["file"] == j2.segments[1].path and "bytes are missing" in damage["reason"]
    assert j2.integrity.damaged_bytes == gone.size
    j2.close()


def test_bad_segment_header(tmp_path):
    d = str(tmp_path / "j")
    os.makedirs(d)
    with open(os.path.join(d, segment_name(0)), "wb") as f:
        f.write(b"NOPE" + b"\0" * 40)
    with pytest.raises(CorruptSegment) as info:
        Journal(d)
    assert "not a journal segment" in str(info.value)
    assert SEGMENT_HEADER_SIZE == 16


def test_optional_fields_round_trip(tmp_path):
    from journal.record import decode_records, scan_records

    rec = encode_record(
        KIND_MESSAGE, 9, 3, 77, b"topic", b"{}", expiration=30, header=b',"x":"c-1"'
    )
    plain = encode_record(KIND_MESSAGE, 9, 4, 78, b"topic", b"[]")
    buf = rec + plain
    recs, stop = decode_records(buf, 0, len(buf), 100)
    assert stop == len(buf)
    assert (recs[0].expiration, recs[0].header, recs[0].topic, recs[0].body) == (
        30,
        b',"x":"c-1"',
        "topic",
        b"{}",
    )
    assert (recs[1].expiration, recs[1].header, recs[1].body) == (None, b"", b"[]")
    raw, _ = scan_records(buf, 100)
    assert raw[0][5:] == (b"topic", b"{}", (30, b',"x":"c-1"')) and raw[1][7] is None
    assert raw[1][0] == 100 + len(rec)


def test_sparse_bookmark_index_finds_every_message(tmp_path):
    j = Journal(str(tmp_path / "j"), segment_size=20_000)
    for k in range(10):
        # three publishers interleaved, several commits, several segments
        for pub in (3, 5, 8):
            write_batch(j, [(i, "t", b"b" * 40) for i in range(1 + 30 * k, 31 + 30 * k)], pub=pub)
    assert len(j.segments) > 3
    assert j.index.count() < 900 / 10  # far fewer entries than messages
    for pub in (3, 5, 8):
        for seq in (1, 2, 63, 64, 65, 150, 299, 300):
            pos = j.locate(pub, seq)
            rec = j.read(pos)[0][0]
            assert (rec.publisher_id, rec.seq) == (pub, seq)
        assert j.locate(pub, 301) is None and j.locate(pub, 0) is None
        assert j.read(j.after(j.locate(pub, 10)))[0][0].position > j.locate(pub, 10)
    assert j.locate(4, 1) is None
    j.close()
    j2 = Journal(str(tmp_path / "j"), segment_size=20_000)
    assert j2.read(j2.locate(5, 123))[0][0].seq == 123
    j2.close()


def test_read_block_walks_every_record_across_segments_and_restarts(tmp_path):
    """read_block's bytes hold exactly the records read_raw returns, segment by segment; a
    record larger than the block comes whole; below the start reads from the start."""
    from journal.record import scan_records

    d = str(tmp_path / "j")
    j = Journal(d, segment_size=4000)
    msgs = [(i, "t", b"y" * (900 if i % 10 == 0 else 50)) for i in range(1, 121)]
    for k in range(0, 60, 10):
        write_batch(j, msgs[k : k + 10])
    j.close()
    j = Journal(d, segment_size=4000)
    for k in range(60, 120, 10):
        write_batch(j, msgs[k : k + 10])
    assert len(j.sealed_segments()) > 3
    got = []
    pos = j.start_position
    while pos < j.end_position:
        buf, at = j.read_block(pos, 300)  # smaller than the big records
        assert at == pos
        recs, stop = scan_records(buf, at)
        assert recs, f"no whole record at {pos}"
        got += [(r[3], r[5].decode(), bytes(r[6])) for r in recs]
        pos = j.next_position(at + stop)
    assert got == msgs
    assert j.read_block(j.end_position) == (b"", j.end_position)
    j.close()
