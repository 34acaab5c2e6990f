"""A fast publisher's burst is bounded in the server's memory (finding 11), against a real
server: one connection publishes 80 MB (20,000 x 4 KB, `persisted` acks) as fast as the socket
takes it, with no subscriber. Before, the server's private memory (RssAnon) grew by some
86 MB and kept it; now publish data in flight is bounded per connection
(`<ClientPublishMemoryLimit>`) and in all (`<PublishMemoryLimit>`): reading pauses at the bound.
Every message is still stored."""

from __future__ import annotations

import struct
import time

from tests.support.proc import ServerProcess
from tests.support.raw import Raw

COUNT = 20_000
SIZE = 4096
WINDOW = COUNT  # no window: everything is sent as fast as the socket takes it


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def burst(
    port: int, name: str, topic: str, count: int = COUNT, size: int = SIZE, window: int = WINDOW
) -> int:
    """Publish `count` messages of `size` bytes as fast as the socket takes them, keeping at most
    `window` unacknowledged; returns the highest sequence acknowledged as persisted."""
    c = Raw(port, timeout=60)
    c.logon(name)
    body = b'{"p":"' + b"x" * (size - 8) + b'"}'
    frames = []
    for seq in range(1, count + 1):
        hb = b'{"c":"publish","t":"%s","s":%d,"a":"persisted"}' % (topic.encode(), seq)
        frames.append(struct.pack(">I", len(hb) + len(body)) + hb + body)
    sent = acked = 0
    try:
        while acked < count:
            upto = min(count, acked + window)
            if upto > sent:
                c.send_raw(b"".join(frames[sent:upto]))
                sent = upto
            ack = c.ack("persisted", timeout=60)
            assert ack["status"] == "success", ack
            acked = max(acked, ack["s"])
    finally:
        c.close()
    return acked


def test_a_burst_from_one_connection_is_bounded_in_memory(tmp_path):
    limit = 4 * 1024 * 1024  # <ClientPublishMemoryLimit>'s default
    srv = ServerProcess(tmp_path / "srv", topics=("burst", "warm"))
    srv.start()
    try:
        assert srv.proc is not None
        # warm up: one small burst, so what the first publishes allocate once is not counted
        burst(srv.port, "warm", "warm", count=200)
        time.sleep(0.5)
        before = rss_anon(srv.proc.pid)
        start = time.monotonic()
        assert burst(srv.port, "fast", "burst") == COUNT
        took = time.monotonic() - start
        after = rss_anon(srv.proc.pid)
        grown = after - before
        print(
            f"burst of {COUNT * SIZE / 1e6:.0f} MB in {took:.1f} s: RssAnon "
            f"{before / 1e6:.0f} -> {after / 1e6:.0f} MB (+{grown / 1e6:.1f} MB)"
        )
        # generous: a few copies of the bound (decoded, batched, handed to the writer) and the
        # allocator's slack; before the bound it grew by 60-100 MB
        assert grown < 12 * limit, f"RssAnon grew by {grown / 1e6:.0f} MB"
        # every message is stored: a replay from the start finds all of them
        r = Raw(srv.port, timeout=60)
        r.logon("reader")
        r.send({"c": "subscribe", "t": "burst", "bm": "0", "cid": "r", "a": "completed"})
        got = 0
        while True:
            f = r.recv()
            assert f is not None
            if f[0].get("c") == "p":
                got += 1
            elif f[0].get("c") == "ack" and f[0].get("a") == "completed":
                break
        assert got == COUNT
    finally:
        srv.kill()
