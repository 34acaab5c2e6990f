"""The journal writer under I/O errors (journal/writer.py, journal/fileio.py).

A FaultyIO fails one chosen operation (open, write, fsync, rename, close, truncate) with ENOSPC,
EIO or EBADF, at an ordinary commit or at a segment roll. After each: no acknowledged record is
lost, nothing unacknowledged is visible, the writer's descriptor is the active segment's, no
half-made segment is counted, the journal recovers by itself once writes succeed, and a reopen
finds exactly the acknowledged records. A power-loss model of the system calls
(tests/support/power_loss.py) checks that every record is synced before its callback runs, and
that a power cut keeps every acknowledged record.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
import time

import pytest

from journal import fileio
from journal import writer as writer_mod
from journal.fileio import FaultSpecError, FaultyIO, FileIO, io_from_env
from journal.journal import Journal, JournalUnavailable
from journal.record import SEGMENT_HEADER_SIZE
from tests.support import journal_ops
from tests.support.journal_ops import seqs, writer_idle
from tests.support.power_loss import PowerLoss

SEG = 4096
BODY = b"x" * 300
record = functools.partial(journal_ops.record, body=BODY)
put = functools.partial(journal_ops.put, body=BODY)


@pytest.fixture(autouse=True)
def quick_probe(monkeypatch):
    """Probe a quarter of the product's second: each failure case waits out one probe before
    the journal is available again (most of this file's time at 1 s), and a quarter second
    still leaves the checks right after a failure (`not j.available`) far ahead of it."""
    monkeypatch.setattr(writer_mod, "PROBE_INTERVAL", 0.25)


def wait_available(j: Journal, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not j.available:
        assert time.monotonic() < deadline, "the journal did not recover by itself"
        time.sleep(0.02)


def writer_fd_is_active_segment(j: Journal) -> bool:
    st = os.fstat(j.writer._fd)
    seg = os.stat(j.segments[-1].path)
    return (st.st_dev, st.st_ino) == (seg.st_dev, seg.st_ino)


def records_before_roll() -> int:
    """How many records fit in the first segment (the next one rolls)."""
    n = 0
    size = 0
    while True:
        size += len(record(n + 1)[0])
        if size > SEG:
            return n
        n += 1


OPS_AT_COMMIT = ["write", "fsync"]
OPS_AT_ROLL = ["fsync", "open", "write", "rename", "close"]
ERRNOS = [errno.ENOSPC, errno.EIO, errno.EBADF]


def run_case(tmp_path, op: str, code: int, at_roll: bool):
    io = FaultyIO(ops=[op], errnos=[code], count=1)
    io.armed = False
    d = str(tmp_path / "j")
    j = Journal(d, segment_size=SEG, io=io)
    acked = []
    n_first = records_before_roll() if at_roll else 3
    for s in range(1, n_first + 1):
        assert put(j, s) is None
        acked.append(s)
    io.armed = True
    failed_seq = n_first + 1
    err = put(j, failed_seq)
    io.armed = False
    if op == "close" and at_roll:
        # closing the sealed segment fails after the switch: the data was synced, nothing is lost
        assert err is None and io.failures == 1
        acked.append(failed_seq)
    else:
        assert isinstance(err, JournalUnavailable), f"{op} {errno.errorcode[code]}: {err!r}"
        assert io.failures == 1
        assert not j.available
        # until the submitter fences, a batch queued behind the failure fails too (no gap)
        assert isinstance(put(j, failed_seq), JournalUnavailable)
        j.fence()
    assert writer_fd_is_active_segment(j)
    assert not [n for n in os.listdir(d) if n.endswith(".new") or n == "probe.tmp"]
    wait_available(j)
    for s in range(acked[-1] + 1, acked[-1] + 4):
        assert put(j, s) is None
        acked.append(s)
    assert seqs(j) == acked
    if at_roll:
        assert len(j.segments) >= 2
    j.close()
    j2 = Journal(d, segment_size=SEG)
    assert seqs(j2) == acked
    j2.close()


@pytest.mark.parametrize("code", ERRNOS, ids=lambda c: errno.errorcode[c])
@pytest.mark.parametrize("op", OPS_AT_COMMIT)
def test_failure_at_a_commit(tmp_path, op, code):
    run_case(tmp_path, op, code, at_roll=False)


@pytest.mark.parametrize("code", ERRNOS, ids=lambda c: errno.errorcode[c])
@pytest.mark.parametrize("op", OPS_AT_ROLL)
def test_failure_at_a_segment_roll(tmp_path, op, code):
    run_case(tmp_path, op, code, at_roll=True)


def test_a_failed_partial_write_is_cut_before_the_next(tmp_path):
    """A write that fails after writing part of the batch, and a truncate that fails too: the
    probe cuts the partial bytes before anything else is appended."""

    class Partial(FileIO):
        def __init__(self):
            self.mode = None

        def pwrite_dsync(self, fd, data, offset):
            if self.mode == "partial":
                self.mode = "no-truncate"
                super().pwrite(fd, bytes(data[:17]), offset)
                raise OSError(errno.ENOSPC, "disk full")
            return super().pwrite_dsync(fd, data, offset)

        def ftruncate(self, fd, size):
            if self.mode == "no-truncate":
                self.mode = None
                raise OSError(errno.EIO, "truncate failed")
            super().ftruncate(fd, size)

    io = Partial()
    d = str(tmp_path / "j")
    j = Journal(d, io=io)
    assert put(j, 1) is None
    io.mode = "partial"
    assert isinstance(put(j, 2), JournalUnavailable)
    j.fence()
    wait_available(j)
    assert put(j, 2) is None
    assert seqs(j) == [1, 2]
    j.close()
    j2 = Journal(d)
    assert seqs(j2) == [1, 2]
    j2.close()


def test_close_returns_on_a_broken_device(tmp_path):
    io = FaultyIO(ops=["fsync", "write", "close", "open"], errnos=[errno.EIO], count=0)
    io.armed = False
    d = str(tmp_path / "j")
    j = Journal(d, io=io)
    assert put(j, 1) is None
    io.armed = True
    assert isinstance(put(j, 2), JournalUnavailable)
    t = threading.Thread(target=j.close)
    t.start()
    t.join(10)
    assert not t.is_alive(), "close() hung on a broken device"
    j2 = Journal(d)
    assert seqs(j2) == [1]
    j2.close()


def test_stale_roll_and_probe_files_are_removed_at_open(tmp_path):
    d = str(tmp_path / "j")
    j = Journal(d)
    assert put(j, 1) is None
    j.close()
    for name in ("00000000000000009999.seg.new", "probe.tmp"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"junk")
    j = Journal(d)
    assert seqs(j) == [1]
    assert sorted(n for n in os.listdir(d) if n.endswith((".new", ".tmp"))) == []
    j.close()


# -- power loss: only what was synced survives -------------------------------------------------------


def journal_file(name: str) -> bool:
    """The files the writer makes durable itself (the LMDB index syncs its own, and is derived)."""
    return name.endswith((".seg", ".seg.new")) or name == "probe.tmp"


@pytest.fixture
def power(monkeypatch, tmp_path):
    """(journal, PowerLoss): a journal whose writer's system calls feed the power-loss model
    (tests/support/power_loss.py) from just after its open (which synced what it made)."""
    j = Journal(str(tmp_path / "j"), segment_size=SEG)
    writer_idle(j)
    model = PowerLoss(j.directory, journal_file)
    monkeypatch.setattr(fileio, "os", model)
    yield j, model
    if not j._closed:
        j.close()


def test_every_record_is_synced_before_its_callback(power):
    """Each record's bytes, and its segment's directory entry, are durable when its callback
    runs. Fails if the fdatasync before the callbacks is removed or moved after them, if the
    commit's pwritev loses RWF_DSYNC (the runway's zeros stay the durable content), or if a
    segment roll skips the directory fsync."""
    j, model = power
    problems = []
    done = threading.Semaphore(0)

    def cb(pos, err):
        seg = j.segments[-1]
        data = record(1)[0]
        start = SEGMENT_HEADER_SIZE + (pos - seg.base)
        if err is None:
            with open(seg.path, "rb") as f:
                f.seek(start)
                written = f.read(len(data))
            if model.durable(seg.path)[start : start + len(data)] != written:
                problems.append((pos, "record not durable"))
            if os.path.basename(seg.path) not in model.entries:
                problems.append((pos, "segment not durable in its directory"))
        done.release()

    for s in range(1, 40):  # crosses several segment rolls
        data, entries = record(s)
        j.submit(data, entries, cb)
    for _ in range(39):
        assert done.acquire(timeout=30)
    assert len(j.segments) > 2
    j.close()
    assert problems == [], f"acknowledged before synced: {problems[:3]}"


def test_power_loss_keeps_every_acknowledged_record(power):
    """A power cut after the acks: the directory as the model leaves it (only what was synced,
    the runway's zeros where a commit's write was not), reopened, holds every acknowledged
    record."""
    j, model = power
    acked = [s for s in range(1, 30) if put(j, s) is None]
    assert len(j.segments) > 2  # the cut also tests the rolls' directory syncs
    # the power goes: the writer thread stops, every file keeps only what was synced
    j.writer.stop()
    os.close(j.writer._fd)
    os.close(j._lock_fd)
    j.index.close()
    j._closed = True
    model.crash()
    j2 = Journal(j.directory, segment_size=SEG)
    assert seqs(j2) == acked, f"{model.unsynced_writes} writes were never synced"
    j2.close()


def test_the_power_loss_model_keeps_only_synced_bytes(tmp_path, monkeypatch):
    """The model itself: a plain pwrite over synced zeros leaves the zeros; RWF_DSYNC and
    fdatasync make bytes durable; a file renamed or created without a directory fsync is, after
    the cut, under its old name or gone."""
    d = tmp_path / "m"
    d.mkdir()
    model = PowerLoss(str(d), lambda n: True)
    fd = model.open(str(d / "a"), os.O_RDWR | os.O_CREAT)
    model.pwrite(fd, bytes(8), 0)
    model.fdatasync(fd)
    dfd = model.open(str(d), os.O_RDONLY)
    model.fsync(dfd)
    model.pwrite(fd, b"lost", 0)
    model.pwritev(fd, [b"kept"], 4, os.RWF_DSYNC)
    assert model.durable(str(d / "a")) == bytes(4) + b"kept"
    model.rename(str(d / "a"), str(d / "b"))
    fd2 = model.open(str(d / "c"), os.O_RDWR | os.O_CREAT)
    model.pwritev(fd2, [b"new"], 0, os.RWF_DSYNC)
    os.close(fd)
    os.close(fd2)
    model.crash()
    assert sorted(os.listdir(d)) == ["a"]
    assert (d / "a").read_bytes() == bytes(4) + b"kept"
    model.fsync(dfd)  # now the entries as they are count
    os.close(dfd)
    assert set(model.entries) == {"a"}


# -- the TICKERTAPE_FAULTS spec --------------------------------------------------------------------


def test_fault_spec_parses():
    io = io_from_env(
        {"TICKERTAPE_FAULTS": "seed=7;p=0.5;ops=write+fsync;errno=ENOSPC+EIO;after=3;count=2"}
    )
    assert isinstance(io, FaultyIO)
    assert io.ops == {"write", "fsync"} and io.errnos == (errno.ENOSPC, errno.EIO)
    assert (io.p, io.after, io.count) == (0.5, 3, 2)
    assert io_from_env({}) is None


@pytest.mark.parametrize(
    "spec,why",
    [
        ("p=2", "probability"),
        ("ops=write+chmod", "unknown operation 'chmod'"),
        ("errno=ENOTANERRNO", "unknown errno"),
        ("after=-1", "0 or more"),
        ("colour=red", "unknown key"),
        ("seed", "not key=value"),
        ("p=x", "not a number"),
        ("delay=-1", "seconds"),
    ],
)
def test_fault_spec_errors_say_what_is_wrong(spec, why):
    with pytest.raises(FaultSpecError, match=why):
        FaultyIO.from_spec(spec)


def test_faulty_io_fails_after_and_at_most_count(tmp_path):
    io = FaultyIO(ops=["write"], errnos=[errno.EIO], after=2, count=2)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    results = []
    for i in range(6):
        try:
            io.pwrite(fd, b"a", i)
            results.append("ok")
        except OSError as exc:
            results.append(errno.errorcode[exc.errno])
    os.close(fd)
    assert results == ["ok", "ok", "EIO", "EIO", "ok", "ok"]


def test_faulty_io_with_a_delay_holds_the_operation_then_makes_it(tmp_path):
    """`delay`: the chosen operation waits, then is made (no error): a commit held on purpose."""
    io = FaultyIO.from_spec("ops=write;delay=0.2;after=1;count=1")
    assert io.delay == 0.2
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    took = []
    for i in range(3):
        t0 = time.monotonic()
        assert io.pwrite(fd, b"a", i) == 1
        took.append(time.monotonic() - t0)
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"aaa"
    assert took[1] >= 0.2 and took[0] < 0.1 and took[2] < 0.1 and io.failures == 1


def test_an_inline_commit_that_fails_makes_the_journal_unavailable(tmp_path):
    """commit_inline (a lone small batch, on the caller's thread) under a full disk: the batch
    fails before commit_inline returns, the journal is unavailable (nothing more is committed
    inline or on the writer until a probe succeeds and the submitter fences), and a reopen finds
    exactly the acknowledged records."""
    io = FaultyIO(ops=["write"], errnos=[errno.ENOSPC], count=1)
    io.armed = False
    d = str(tmp_path / "j")
    j = Journal(d, segment_size=SEG, io=io)
    writer_idle(j)
    got: list = []
    data, entries = record(1)
    assert j.commit_inline(data, entries, lambda pos, err: got.append(err))
    assert got == [None]
    io.armed = True
    data, entries = record(2)
    assert j.commit_inline(data, entries, lambda pos, err: got.append(err))
    io.armed = False
    assert isinstance(got[-1], JournalUnavailable) and io.failures == 1
    assert not j.available
    assert not j.commit_inline(*record(2), lambda pos, err: got.append(err))  # to the writer
    assert isinstance(put(j, 2), JournalUnavailable)  # behind the failure, before the fence
    j.fence()
    wait_available(j)
    assert put(j, 2) is None
    assert seqs(j) == [1, 2]
    j.close()
    j2 = Journal(d, segment_size=SEG)
    assert seqs(j2) == [1, 2]
    j2.close()


def test_an_inline_commit_never_rolls_a_segment(tmp_path):
    """A batch that does not fit in the open segment is left to the writer thread."""
    j = Journal(str(tmp_path / "j"), segment_size=SEG)
    writer_idle(j)
    n = records_before_roll()
    for s in range(1, n + 1):
        assert j.commit_inline(*record(s), lambda pos, err: None)
    assert len(j.segments) == 1
    assert not j.commit_inline(*record(n + 1), lambda pos, err: None)
    assert len(j.segments) == 1
    assert put(j, n + 1) is None and len(j.segments) == 2
    j.close()
