"""The active segment's zeroed runway (journal/writer.py): commits overwrite pre-zeroed space,
sealed segments and cleanly closed ones hold exactly their records, and recovery takes a tail of
zeros after the last good record as the clean end, through the Journal's API across restarts."""

from __future__ import annotations

import errno
import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from journal import writer as writer_mod
from journal.fileio import FaultyIO
from journal.journal import Journal
from journal.record import KIND_MESSAGE, SEGMENT_HEADER_SIZE, encode_record
from tests.support import journal_ops
from tests.support.journal_ops import seqs, writer_idle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BODY = b"x" * 100
record = functools.partial(journal_ops.record, body=BODY)
put = functools.partial(journal_ops.put, body=BODY)


def file_size(j: Journal) -> int:
    return os.path.getsize(j.segments[-1].path)


def records_end(j: Journal) -> int:
    return SEGMENT_HEADER_SIZE + j.segments[-1].size


def abandon(j: Journal) -> None:
    """What a crash leaves: the writer stops, nothing is trimmed, closed or synced further."""
    j.writer.stop()
    for fd in (j.writer._fd, *j.reader._read_fds.values()):
        os.close(fd)
    j.index.close()
    os.close(j._lock_fd)


def test_commits_go_into_a_synced_runway_and_close_cuts_it(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d)
    writer_idle(j)
    assert file_size(j) == SEGMENT_HEADER_SIZE + writer_mod.RUNWAY_BYTES
    for s in range(1, 21):
        assert put(j, s) is None
    writer_idle(j)
    assert file_size(j) > records_end(j), "the records were appended, not written in the runway"
    with open(j.segments[-1].path, "rb") as f:
        f.seek(records_end(j))
        assert f.read() == bytes(file_size(j) - records_end(j))
    end = records_end(j)
    j.close()
    assert os.path.getsize(os.path.join(d, "00000000000000000000.seg")) == end
    j2 = Journal(d)
    assert seqs(j2) == list(range(1, 21))
    assert j2.recovery["dropped_bytes"] == 0 and j2.integrity.truncated_bytes == 0
    j2.close()


def test_sealed_segments_hold_exactly_their_records(tmp_path):
    seg_size = 16 * 1024
    j = Journal(str(tmp_path / "j"), segment_size=seg_size)
    for s in range(1, 600):
        assert put(j, s) is None
    assert len(j.segments) > 2
    for seg in j.sealed_segments():
        assert os.path.getsize(seg.path) == SEGMENT_HEADER_SIZE + seg.size
    writer_idle(j)
    # the active segment's runway stops at segment_size
    assert records_end(j) < file_size(j) <= SEGMENT_HEADER_SIZE + seg_size
    j.close()
    j2 = Journal(str(tmp_path / "j"), segment_size=seg_size)
    assert seqs(j2) == list(range(1, 600))
    j2.close()


def test_a_crash_in_the_middle_of_the_runway_loses_nothing(tmp_path, caplog):
    d = str(tmp_path / "j")
    j = Journal(d)
    for s in range(1, 31):
        assert put(j, s) is None
    writer_idle(j)
    end = records_end(j)
    path = j.segments[-1].path
    abandon(j)
    assert os.path.getsize(path) > end  # zeros follow the records on disk
    caplog.set_level("INFO", logger="tickertape.journal")
    j2 = Journal(d)
    assert seqs(j2) == list(range(1, 31))
    assert j2.recovery["dropped_bytes"] == 0 and j2.integrity.truncated_bytes == 0
    assert j2.integrity.damaged_regions == 0
    assert "zeroed runway" in caplog.text and "truncating the tail" not in caplog.text
    assert records_end(j2) == end
    # it goes on where it stopped, and a clean restart finds everything
    assert put(j2, 31) is None
    j2.close()
    j3 = Journal(d)
    assert seqs(j3) == list(range(1, 32))
    j3.close()


def test_kill_9_in_the_middle_of_the_runway(tmp_path):
    d = str(tmp_path / "j")
    code = textwrap.dedent(
        f"""
        import os, signal, sys, threading, time
        sys.path.insert(0, {ROOT!r})
        from journal.journal import Journal
        from journal.record import KIND_MESSAGE, encode_record
        j = Journal({d!r})
        for s in range(1, 51):
            done = threading.Event()
            data = encode_record(KIND_MESSAGE, 1, s, 1_700_000_000_000_000 + s, b"t", b"x" * 100)
            j.submit(data, [(1, s, 0, 0)], lambda pos, err: done.set())
            assert done.wait(30)
        while j.writer._busy or j.writer._runway_wanted():
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert r.returncode == -signal.SIGKILL
    j = Journal(d)
    assert seqs(j) == list(range(1, 51))
    assert j.recovery["dropped_bytes"] == 0
    assert put(j, 51) is None
    j.close()


def test_a_torn_write_inside_the_runway_is_a_torn_tail(tmp_path, caplog):
    d = str(tmp_path / "j")
    j = Journal(d)
    for s in range(1, 11):
        assert put(j, s) is None
    writer_idle(j)
    end = records_end(j)
    path = j.segments[-1].path
    abandon(j)
    torn = encode_record(KIND_MESSAGE, 1, 11, 5, b"t", b"torn away by the crash")[:-5]
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, torn, end)  # zeros still follow it
    os.close(fd)
    j2 = Journal(d)
    assert seqs(j2) == list(range(1, 11))
    assert "truncating the tail" in caplog.text
    assert j2.recovery["dropped_bytes"] == len(torn.rstrip(b"\0"))
    assert records_end(j2) == end
    assert put(j2, 11) is None
    j2.close()
    j3 = Journal(d)
    assert seqs(j3) == list(range(1, 12))
    j3.close()


def test_garbage_after_zeros_keeps_todays_handling(tmp_path, caplog):
    """Zeros, then bytes that are no record, at the end of the newest segment: nothing good
    follows the last record, so it is a torn tail, truncated and counted as before."""
    d = str(tmp_path / "j")
    j = Journal(d)
    for s in range(1, 6):
        assert put(j, s) is None
    writer_idle(j)
    end = records_end(j)
    path = j.segments[-1].path
    abandon(j)
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, b"junk", end + 1000)
    os.close(fd)
    j2 = Journal(d)
    assert seqs(j2) == list(range(1, 6))
    assert "truncating the tail" in caplog.text
    assert j2.recovery["dropped_bytes"] == 1004
    assert records_end(j2) == end
    j2.close()
    assert os.path.getsize(path) == end


def test_a_full_disk_while_extending_the_runway_fails_no_commit(tmp_path, caplog):
    io = FaultyIO(ops=["extend"], errnos=[errno.ENOSPC], count=0)  # every extension fails
    d = str(tmp_path / "j")
    j = Journal(d, io=io)
    for s in range(1, 21):
        assert put(j, s) is None
    assert io.failures >= 1 and j.available and j.stats.failures == 0
    assert file_size(j) == records_end(j)  # commits appended
    assert "could not extend the zeroed runway" in caplog.text
    j.close()
    j2 = Journal(d)
    assert seqs(j2) == list(range(1, 21))
    j2.close()


def test_the_runway_comes_back_after_a_failed_write(tmp_path, monkeypatch):
    """A failed commit cuts the partial write and the runway with it; once the probe has made
    the journal available the runway is zeroed again."""
    monkeypatch.setattr(writer_mod, "PROBE_INTERVAL", 0.05)
    io = FaultyIO(ops=["write"], errnos=[errno.EIO], count=1)
    io.armed = False
    d = str(tmp_path / "j")
    j = Journal(d, io=io)
    assert put(j, 1) is None
    io.armed = True
    assert put(j, 2) is not None
    io.armed = False
    j.fence()
    deadline = time.monotonic() + 10
    while not j.available:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert put(j, 2) is None
    writer_idle(j)
    assert file_size(j) > records_end(j)
    j.close()
    j2 = Journal(d)
    assert seqs(j2) == [1, 2]
    j2.close()


def test_extend_is_a_fault_op_only_when_named():
    assert "extend" not in FaultyIO().ops
    assert "extend" in FaultyIO.from_spec("ops=write+extend").ops


@pytest.mark.parametrize("durability", ["write"])
def test_no_runway_without_fsync(tmp_path, durability):
    j = Journal(str(tmp_path / "j"), durability=durability)
    assert put(j, 1) is None
    writer_idle(j)
    assert file_size(j) == records_end(j)
    j.close()
