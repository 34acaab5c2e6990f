"""Corruption at rest against a real server (docs/integrity.md): damaged records are never
served, are reported with file and offset in /stats and the log, and everything after them is
served, in later segments too; a bad index checkpoint or an unreadable index file costs a
rebuild, never an acknowledged record. Each test fails on the code before the checks."""

import json
import os
import shutil
import urllib.request

import pytest

from journal.index import JournalIndex
from journal.journal import Journal
from journal.record import SEGMENT_HEADER_SIZE
from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

N = 300
QUEUE = """<SOW><Queue><Name>iq</Name><UnderlyingTopic>orders</UnderlyingTopic>
  <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog></Queue></SOW>"""


def stats(srv) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats", timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A stopped server's directory whose journal holds N messages over several 64 KB segments,
    and where each record is: {seq: (path relative to the directory, file offset, size)}.
    Written once for the module: each test damages its own copy."""
    root = tmp_path_factory.mktemp("integrity") / "srv"
    srv = ServerProcess(root, journal_size="64KB", extra=QUEUE)
    srv.start()
    publish_many(
        srv.port,
        "orders",
        [json.dumps({"n": i, "pad": "p" * 500}) for i in range(1, N + 1)],
        name="ipub",
    )
    assert srv.stop() == 0
    j = Journal(str(root / "journal"))
    where = {}
    recs = list(j.scan())
    for r, nxt in zip(recs, [*recs[1:], None]):
        segs, i = j.layout.find(r.position)
        seg = segs[i]
        end = nxt.position if nxt is not None and nxt.position < seg.end else seg.end
        where[r.seq] = (
            os.path.relpath(seg.path, root),
            SEGMENT_HEADER_SIZE + r.position - seg.base,
            end - r.position,
        )
    assert len(j.segments) >= 3
    j.close()
    return root, where


@pytest.fixture
def stored(pristine, tmp_path):
    """A stopped server (not started yet) on a copy of the pristine journal, and where each
    record is: {seq: (path, file offset, record size)}."""
    root, where = pristine
    shutil.copytree(root, tmp_path / "srv")
    srv = ServerProcess(tmp_path / "srv", journal_size="64KB", extra=QUEUE)
    here = {
        seq: (str(tmp_path / "srv" / rel), off, size) for seq, (rel, off, size) in where.items()
    }
    return srv, here


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def replay_all(srv, timeout=20):
    r = Raw(srv.port)
    r.logon("replayer")
    r.send({"c": "subscribe", "t": "orders", "bm": "0", "a": "completed", "cid": "all"})
    got = r.recv_until(lambda h, b: h.get("c") == "ack" and h.get("a") == "completed", timeout)
    return [(h, json.loads(b)) for h, b in got if h.get("c") == "p"]


def test_a_flipped_body_byte_is_not_delivered_and_is_reported(stored):
    srv, where = stored
    path, off, size = where[150]
    flip(path, off + size - 10)  # inside the body
    srv.start()
    try:
        got = replay_all(srv)
        assert [b["n"] for _, b in got] == [n for n in range(1, N + 1) if n != 150]
        ig = stats(srv)["journal"]["integrity"]
        assert ig["damaged_regions"] == 1 and ig["last_damage"]["file"] == path
        assert ig["last_damage"]["offset"] == off
        srv.wait_for_log(rf"damaged data in {path} at offset {off}")
    finally:
        srv.kill()


def test_a_flipped_sequence_does_not_give_two_messages_one_bookmark(stored):
    srv, where = stored
    path, off, _ = where[100]
    flip(path, off + 20)  # the low byte of the sequence: 100 would read as another number
    srv.start()
    try:
        got = replay_all(srv)
        bms = [h["bm"] for h, _ in got]
        assert len(bms) == len(set(bms)) == N - 1
        assert 100 not in [b["n"] for _, b in got]
    finally:
        srv.kill()


def test_a_flipped_length_does_not_end_replay(stored):
    srv, where = stored
    path, off, _ = where[20]
    flip(path, off + 2)  # the length's third byte: the record would run far past its end
    srv.start()
    try:
        got = [b["n"] for _, b in replay_all(srv)]
        assert got == [n for n in range(1, N + 1) if n != 20]  # later segments included
    finally:
        srv.kill()


def test_an_index_checkpoint_inside_a_record_truncates_nothing(stored, tmp_path):
    srv, where = stored
    path, off, size = where[N - 10]
    j = Journal(str(tmp_path / "srv" / "journal"))
    segs, i = j.layout.find(j.end_position - 1)
    inside = segs[i].base + off - SEGMENT_HEADER_SIZE + 7  # 7 bytes into record N-10
    j.close()
    idx = JournalIndex(str(tmp_path / "srv" / "journal" / "index"))
    idx.add((), inside)
    idx.sync()
    idx.close()
    srv.start()
    try:
        assert [b["n"] for _, b in replay_all(srv)] == list(range(1, N + 1))
        c = Raw(srv.port)
        assert c.logon("ipub")["s"] == N
        srv.wait_for_log("rebuilding the index")
    finally:
        srv.kill()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_unreadable_index_file_is_rebuilt(stored, tmp_path, damage):
    srv, where = stored
    data = tmp_path / "srv" / "journal" / "index" / "data.mdb"
    if damage == "garbage":
        with open(data, "r+b") as f:
            f.write(os.urandom(8192))
    else:
        os.truncate(data, os.path.getsize(data) // 2)
    srv.start()
    try:
        c = Raw(srv.port)
        assert c.logon("ipub")["s"] == N
        # a bookmark subscription finds its place through the rebuilt index
        r = Raw(srv.port)
        r.logon("from-bm")
        r.subscribe("orders", bm=f"{c_pub_id(srv)}|250|")
        assert [json.loads(b)["n"] for _, b in r.messages(N - 250)] == list(range(251, N + 1))
        assert stats(srv)["journal"]["integrity"]["index_rebuilds"] == 1
        assert any(
            n.startswith("index.unreadable-") for n in os.listdir(tmp_path / "srv" / "journal")
        )
    finally:
        srv.kill()


def c_pub_id(srv) -> int:
    from server.ids import publisher_id

    return publisher_id("ipub")


def test_queue_delivery_skips_damage(stored):
    srv, where = stored
    path, off, size = where[5]
    flip(path, off + size - 3)
    srv.start()
    try:
        c = Raw(srv.port)
        c.logon("iq-cons")
        c.send({"c": "subscribe", "t": "iq", "cid": "q", "a": "processed", "o": "max_backlog=1000"})
        assert c.ack("processed", "q")["status"] == "success"
        got = [json.loads(b)["n"] for _, b in c.messages(N - 1)]
        assert got == [n for n in range(1, N + 1) if n != 5]
    finally:
        srv.kill()


def test_a_truncated_sealed_segment_is_reported_as_truncated(stored):
    srv, where = stored
    path, off, size = where[10]
    first_seg = path
    os.truncate(first_seg, off + 3)  # cut inside record 10: records 10.. of this file are gone
    srv.start()
    try:
        got = [b["n"] for _, b in replay_all(srv)]
        assert got[:9] == list(range(1, 10)) and got[-1] == N
        assert stats(srv)["journal"]["integrity"]["damaged_regions"] >= 1
        srv.wait_for_log(
            rf"damaged data in {first_seg} .*bytes are missing \(the file was truncated"
        )
    finally:
        srv.kill()
