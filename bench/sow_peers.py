"""The peers' last-value reads for bench_sow.py: a JetStream KV bucket delivered last per subject
(`jetstream_kv`) and Redis hashes read with pipelined HGETALL (`redis_hashes`), each holding the
same latest records the SOW query answers with (`latest_bodies` in bench_sow.py)."""

from __future__ import annotations

import json
import socket
import time

import peers
from loadwire import resp_command


def jetstream_kv(args, bodies: list[tuple[int, int, bytes]]) -> dict:
    """A 100k-key KV bucket loaded with the same bodies, then every key's last value delivered
    to an ephemeral push consumer (deliver_policy last_per_subject, as a KV watch of all keys
    starts): seconds from the consumer's creation to the last value, server CPU over it."""
    peer = peers.make_peer("jetstream")
    try:
        peer.start(timeout=args.timeout)
        peer.create_kv("bench")
        c = peers.NatsConn(peer.host, peer.port, args.timeout)
        c.s.sendall(b"SUB _INBOX.ack 9\r\n")
        for i in range(0, len(bodies), 1000):
            chunk = bodies[i : i + 1000]
            c.s.sendall(
                b"".join(
                    b"PUB $KV.bench.k%d _INBOX.ack %d\r\n%s\r\n" % (k, len(b), b)
                    for k, _s, b in chunk
                )
            )
            for _ in chunk:
                _sid, ack = c.msg()
                if b'"error"' in ack:
                    raise RuntimeError(f"kv put failed: {ack[:200]!r}")
        c.s.sendall(b"SUB _INBOX.kv 1\r\nSUB _INBOX.create 2\r\n")
        cfg = json.dumps(
            {
                "stream_name": "KV_bench",
                "config": {
                    "deliver_subject": "_INBOX.kv",
                    "deliver_policy": "last_per_subject",
                    "ack_policy": "none",
                    "replay_policy": "instant",
                    "filter_subject": "$KV.bench.>",
                    "mem_storage": True,
                    "num_replicas": 1,
                },
            }
        ).encode()
        cpu0 = peer.cpu_seconds()
        t0 = time.perf_counter()
        c.s.sendall(
            b"PUB $JS.API.CONSUMER.CREATE.KV_bench _INBOX.create %d\r\n%s\r\n" % (len(cfg), cfg)
        )
        got = 0
        while got < len(bodies):
            sid, payload = c.msg()
            if sid == 1:
                got += 1
            elif b'"error"' in payload:
                raise RuntimeError(f"consumer create failed: {payload[:300]!r}")
        secs = time.perf_counter() - t0
        cpu = peer.cpu_seconds() - cpu0
        c.close()
        return {"records": got, "s": secs, "cpu": cpu}
    finally:
        peer.cleanup()


def _resp_end(buf: bytearray, pos: int) -> int:
    """The end of the RESP reply at pos in buf, or -1 when it is not all there."""
    i = buf.find(b"\r\n", pos)
    if i < 0:
        return -1
    t = buf[pos]
    if t == 0x24:  # $ bulk string
        n = int(buf[pos + 1 : i])
        end = i + 2 + max(n, 0) + (2 if n >= 0 else 0)
        return end if end <= len(buf) else -1
    if t == 0x2A:  # * array
        n = int(buf[pos + 1 : i])
        p = i + 2
        for _ in range(max(n, 0)):
            p = _resp_end(buf, p)
            if p < 0:
                return -1
        return p
    if t == 0x2D:  # - error
        raise RuntimeError(f"redis: {bytes(buf[pos:i]).decode(errors='replace')}")
    return i + 2  # + simple string, : integer


def _redis_replies(s: socket.socket, buf: bytearray, n: int) -> bytearray:
    """Read n whole replies; returns what is left after them."""
    pos = 0
    while n:
        end = _resp_end(buf, pos) if pos < len(buf) else -1
        if end < 0:
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError("redis-server closed the connection")
            buf += data
            continue
        pos = end
        n -= 1
    return buf[pos:]


def redis_hashes(args, bodies: list[tuple[int, int, bytes]]) -> dict:
    """The same records as Redis hashes (h:<key> -> seq, key, pad), then all of them read with
    HGETALL, pipelined 1,000 at a time on one connection: seconds, server CPU."""
    peer = peers.make_peer("redis-everysec")
    try:
        peer.start(timeout=args.timeout)
        with socket.create_connection((peer.host, peer.port), timeout=args.timeout) as s:
            buf = bytearray()
            for i in range(0, len(bodies), 1000):
                chunk = bodies[i : i + 1000]
                s.sendall(
                    b"".join(
                        resp_command(
                            b"HSET",
                            b"h:%d" % k,
                            b"seq",
                            b"%d" % sq,
                            b"key",
                            b"%d" % k,
                            b"pad",
                            b[b.index(b'"pad":"') + 7 : -2],
                        )
                        for k, sq, b in chunk
                    )
                )
                buf = _redis_replies(s, buf, len(chunk))
            cpu0 = peer.cpu_seconds()
            t0 = time.perf_counter()
            got = 0
            for i in range(0, len(bodies), 1000):
                chunk = bodies[i : i + 1000]
                s.sendall(b"".join(resp_command(b"HGETALL", b"h:%d" % k) for k, _s, _b in chunk))
                buf = _redis_replies(s, buf, len(chunk))
                got += len(chunk)
            secs = time.perf_counter() - t0
            cpu = peer.cpu_seconds() - cpu0
        return {"records": got, "s": secs, "cpu": cpu}
    finally:
        peer.cleanup()
