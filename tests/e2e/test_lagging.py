"""Lagging subscribers against a real server (issue 12): a live subscriber to a recorded topic
that falls behind reads the journal instead of being cut off, and rejoins the live stream with
no gap and no duplicate; a subscriber that stops reading is closed after
<ClientMessageAgeLimit>; nobody else notices."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

PAD = "x" * 900  # about 1 KB a message


def stats(srv) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats", timeout=10) as r:
        return json.loads(r.read())


def metrics(srv) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/metrics", timeout=10) as r:
        return r.read().decode()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def reader(port: int, name: str, topic: str, rcvbuf: int = 64 * 1024) -> Raw:
    c = Raw(port, timeout=60)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    c.logon(name)
    c.subscribe(topic)
    return c


def frame(topic: str, n: int) -> bytes:
    h = json.dumps({"c": "publish", "t": topic}).encode()
    body = json.dumps({"n": n, "pad": PAD}).encode()
    return struct.pack(">I", len(h) + len(body)) + h + body


def read_ns(c: Raw, count: int, timeout: float = 60) -> list[int]:
    return [json.loads(b)["n"] for _, b in c.messages(count, timeout=timeout)]


def test_a_lagging_subscriber_catches_up_from_the_journal(tmp_path):
    srv = ServerProcess(
        tmp_path / "srv", extra="<ClientOfflineThreshold>256KB</ClientOfflineThreshold>"
    ).start()
    try:
        lagger = reader(srv.port, "lagger", "orders", rcvbuf=16 * 1024)
        watcher = reader(srv.port, "watcher", "orders")
        got_watcher: list[int] = []
        n = 20_000  # 20 MB: more than the kernel's socket buffers hold for the lagger
        t = threading.Thread(target=lambda: got_watcher.extend(read_ns(watcher, n)))
        t.start()
        publish_many(
            srv.port, "orders", [json.dumps({"n": i, "pad": PAD}) for i in range(1, n + 1)]
        )
        t.join(60)
        assert got_watcher == list(range(1, n + 1))  # unaffected
        lagging = stats(srv)["lagging"]
        assert lagging["fallbacks"] >= 1  # the lagger read nothing yet
        assert read_ns(lagger, n) == list(range(1, n + 1))  # from memory, then the journal
        publish_many(
            srv.port,
            "orders",
            [json.dumps({"n": i, "pad": PAD}) for i in range(n + 1, n + 11)],
            start_seq=n + 1,
        )
        assert read_ns(lagger, 10) == list(range(n + 1, n + 11))  # live again
        assert stats(srv)["lagging"]["rejoins"] >= 1
        text = metrics(srv)
        assert "tickertape_subscriber_fallbacks_total" in text
        assert "tickertape_subscriber_rejoins_total" in text
        assert "slow client" not in stats(srv)["disconnects"]
    finally:
        srv.kill()


@pytest.mark.slow
def test_a_burst_at_ten_times_the_reading_pace(tmp_path):
    """30 s of publishing at ten times what one subscriber reads: it gets every message in order,
    once, is never disconnected, and the server grows by less than 20 MB; a subscriber that
    stops reading is closed after <ClientMessageAgeLimit>; a fast one is unaffected."""
    rate, seconds = 2000, 30  # messages per second, of about 1 KB: 60 MB in all
    total = rate * seconds
    srv = ServerProcess(
        tmp_path / "srv", extra="<ClientMessageAgeLimit>5s</ClientMessageAgeLimit>"
    ).start()
    try:
        pid = srv.proc.pid
        slow = reader(srv.port, "slow-reader", "burst")
        stopped = reader(srv.port, "stopped-reader", "burst", rcvbuf=4096)
        fast = reader(srv.port, "fast-reader", "burst")
        pub = Raw(srv.port, timeout=60)
        pub.logon("burster")
        time.sleep(0.5)
        baseline = rss_mb(pid)
        peak = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(pid))
                time.sleep(0.2)

        fast_got: list[int] = []
        slow_got: list[int] = []

        def read_fast() -> None:
            fast_got.extend(read_ns(fast, total, timeout=seconds + 60))

        def read_slow() -> None:
            # a tenth of the publish rate while the burst lasts, then as fast as it can
            started = time.monotonic()
            while not done.is_set() and len(slow_got) < total:
                slow_got.extend(read_ns(slow, rate // 100))  # 20 every 0.1 s: 200/s
                due = started + len(slow_got) / (rate / 10)
                time.sleep(max(0.0, due - time.monotonic()))
            slow_got.extend(read_ns(slow, total - len(slow_got), timeout=120))

        threads = [threading.Thread(target=f) for f in (sample, read_fast, read_slow)]
        for t in threads:
            t.start()
        started = time.monotonic()
        n = 0
        while n < total:  # batches of 50 every 25 ms
            batch = b"".join(frame("burst", i) for i in range(n + 1, n + 51))
            pub.send_raw(batch)
            n += 50
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
        pub.send({"c": "flush", "cid": "f", "a": "persisted"})
        pub.ack("persisted", "f", timeout=60)
        burst_s = time.monotonic() - started
        slow_during_burst = len(slow_got)
        done.set()
        for t in threads:
            t.join(180)
        assert burst_s < seconds * 1.5, f"the publisher took {burst_s:.1f}s"
        assert slow_during_burst < total / 3  # it really lagged
        assert fast_got == list(range(1, total + 1))
        assert slow_got == list(range(1, total + 1))  # every message, in order, once
        growth = peak[0] - baseline
        assert growth < 20, f"server RSS grew by {growth:.1f} MB"
        srv.wait_for_log(r"client=stopped-reader .*reason=slow client", timeout=10)
        lines = srv.output().splitlines()
        for name in ("slow-reader", "fast-reader"):
            assert not [ln for ln in lines if f"client={name} " in ln and "disconnect" in ln]
        assert stats(srv)["disconnects"] == {"slow client": 1}
        stopped.close()
        lagging = stats(srv)["lagging"]
        assert lagging["fallbacks"] >= 2 and lagging["rejoins"] >= 1
    finally:
        srv.kill()
