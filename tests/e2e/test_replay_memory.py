"""A 1M-message replay to a subscriber that reads slowly: the server's memory stays bounded and
live traffic to other subscribers keeps its pace (docs/protocol.md §5: replay is paced by the socket)."""

import json
import socket
import threading
import time

import pytest

from journal.journal import Journal
from journal.record import KIND_MESSAGE, encode_record
from server.ids import publisher_id
from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

RSS_BOUND_MB = 50


def build_journal(directory: str, n: int) -> None:
    j = Journal(directory)
    pub = publisher_id("generator")
    body = json.dumps(
        {"sym": "ACME", "px": 101.25, "qty": 300, "side": "buy", "pad": "x" * 40}
    ).encode()
    ts = int(time.time() * 1e6) - n
    done = threading.Semaphore(0)
    batches = 0
    for start in range(1, n + 1, 20_000):
        data = bytearray()
        entries = []
        for s in range(start, min(n + 1, start + 20_000)):
            entries.append((pub, s, ts + s, len(data)))
            data += encode_record(KIND_MESSAGE, pub, s, ts + s, b"history", body)
        j.submit(bytes(data), entries, lambda p, e: done.release())
        batches += 1
    for _ in range(batches):
        done.acquire()
    j.close()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
def test_slow_reader_replay_of_1m_messages_is_bounded(tmp_path):
    build_journal(str(tmp_path / "srv" / "journal"), 1_000_000)
    srv = ServerProcess(tmp_path / "srv").start()
    try:
        time.sleep(0.5)
        base = rss_mb(srv.proc.pid)
        slow = socket.create_connection(("127.0.0.1", srv.port))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw = Raw.__new__(Raw)
        raw.sock, raw.buf, raw.cid, raw.pending = slow, b"", 0, []
        raw.sock.settimeout(10)
        raw.logon("slow-reader")
        raw.send({"c": "subscribe", "t": "history", "bm": "0", "cid": "s", "a": "processed"})
        # live traffic meanwhile: its pace must not suffer
        fast = Raw(srv.port)
        fast.logon("live-sub")
        fast.subscribe("live")
        peak = base
        received = 0
        t0 = time.monotonic()
        p = Raw(srv.port)
        p.logon("live-pub")
        live_times = []
        for k in range(10):
            t = time.monotonic()
            publish_many(
                srv.port,
                "live",
                [json.dumps({"k": k, "i": i}) for i in range(500)],
                conn=p,
                start_seq=1 + 500 * k,
            )
            fast.messages(500)
            live_times.append(time.monotonic() - t)
            # the slow reader takes a little, then sleeps
            data = slow.recv(256 * 1024)
            received += len(data)
            time.sleep(0.2)
            peak = max(peak, rss_mb(srv.proc.pid))
        assert received > 0
        growth = peak - base
        assert growth < RSS_BOUND_MB, f"server RSS grew by {growth:.1f} MB during a slow replay"
        # 500 persisted publishes delivered live, each round well under a second on a 2-core box
        assert sorted(live_times)[len(live_times) // 2] < 1.0, live_times
        assert time.monotonic() - t0 < 60
    finally:
        srv.kill()
