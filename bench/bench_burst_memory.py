"""What a fast publisher's burst costs the server in memory (issue 23, finding 11).

    ./run bench bench_burst_memory [--count 20000] [--size 4096] [--window 20000] [--reps 3]
                                   [--limit 4MB ...] [--record]

Tickertape only. Per repetition and per `<ClientPublishMemoryLimit>` given (default: the
built-in default and 64MB, about what the server held before the bound), a fresh server with
a journal and no subscriber; one connection publishes `count` messages of `size` bytes with
`persisted` acks, keeping at most `window` unacknowledged (the default: all of them, sent as
fast as the socket takes them). A warm-up burst of 200 goes first.

Figures (medians):
  RssAnon before / after MiB   the server's private memory (/proc/PID/status) before the burst
                               and right after its last ack (not given back: glibc keeps it)
  grown MiB                    after - before
  MB/s                         payload rate of the burst
With --record the table replaces the bench_burst_memory section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import benchlib

CONFIG = """<TickertapeConfig>
  <Name>bench-burst</Name>
  <Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
    <MessageType>json</MessageType><Protocol>amps</Protocol></Transport></Transports>
  <Logging><Target><Protocol>stdout</Protocol><Level>warning</Level></Target></Logging>
  <TransactionLog><JournalDirectory>{dir}/journal</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  {limit}
</TickertapeConfig>
"""


def rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc (Linux only)")


class Conn:
    """The few frames this benchmark needs, over a blocking socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def header(self) -> bytes:
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    frame, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
                    return frame
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk


def frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">I", len(header) + len(body)) + header + body


def burst(port: int, name: str, topic: str, count: int, size: int, window: int) -> None:
    c = Conn(port)
    c.send(frame(b'{"c":"logon","client_name":"%s","a":"processed"}' % name.encode()))
    c.header()
    body = b'{"p":"' + b"x" * max(0, size - 8) + b'"}'
    frames = [
        frame(b'{"c":"publish","t":"%s","s":%d,"a":"persisted"}' % (topic.encode(), s), body)
        for s in range(1, count + 1)
    ]
    sent = acked = 0
    while acked < count:
        upto = min(count, acked + window)
        if upto > sent:
            c.send(b"".join(frames[sent:upto]))
            sent = upto
        head = c.header()
        m = re.search(rb'"a":"persisted","status":"(\w+)","s":(\d+)', head)
        if m:
            if m.group(1) != b"success":
                raise RuntimeError(f"publish failed: {head!r}")
            acked = max(acked, int(m.group(2)))
    c.sock.close()


def one(limit: str | None, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as d:
        xml = CONFIG.format(
            dir=d,
            limit=f"<ClientPublishMemoryLimit>{limit}</ClientPublishMemoryLimit>" if limit else "",
        )
        path = os.path.join(d, "tt.xml")
        with open(path, "w") as f:
            f.write(xml)
        proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", "--config", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert proc.stdout is not None
            port = None
            for line in proc.stdout:
                m = re.search(r"listening on [\d.]+:(\d+)", line)
                if m:
                    port = int(m.group(1))
                    break
            if port is None:
                raise RuntimeError("server did not start")
            burst(port, "warm", "warm", 200, args.size, 200)
            time.sleep(0.5)
            before = rss_anon(proc.pid)
            start = time.perf_counter()
            burst(port, "fast", "burst", args.count, args.size, args.window)
            took = time.perf_counter() - start
            after = rss_anon(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {
        "before": before / 2**20,
        "after": after / 2**20,
        "grown": (after - before) / 2**20,
        "mbps": args.count * args.size / took / 1e6,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--window", type=int, default=None, help="default: --count (no window)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--limit", action="append", help="<ClientPublishMemoryLimit> values")
    p.add_argument("--record", action="store_true", help="write the table into RESULTS.md")
    args = p.parse_args()
    args.window = args.window or args.count
    limits: list[str | None] = list(args.limit or [None, "64MB"])
    rows = []
    for limit in limits:
        runs = [one(limit, args) for _ in range(args.reps)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append((limit or "4MB (default)", med, [r["grown"] for r in runs]))
    lines = [
        "## Memory a publish burst costs (bench_burst_memory)",
        "",
        f"One connection publishes {args.count:,} x {args.size} B (`persisted`, window "
        f"{args.window:,}), no subscriber; the server's RssAnon before and right after. Medians "
        f"of {args.reps}; {benchlib.machine().get('cpu', '')}.",
        "",
        "| `<ClientPublishMemoryLimit>` | RssAnon before MiB | after MiB | grown MiB (each run) | MB/s |",
        "|---|---|---|---|---|",
    ]
    for name, med, grown in rows:
        each = ", ".join(f"{g:.1f}" for g in grown)
        lines.append(
            f"| {name} | {med['before']:.1f} | {med['after']:.1f} | {med['grown']:.1f} ({each}) "
            f"| {med['mbps']:.0f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.record:
        benchlib.update_results("bench_burst_memory", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
