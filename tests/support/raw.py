"""A blocking raw-protocol client for tests: frames as dicts, nothing of the client library.

End-to-end tests speak the wire protocol directly so they test the server against
docs/protocol.md, not against our own client's interpretation of it.
"""

from __future__ import annotations

import json
import socket
import struct
import time


class Raw:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.cid = 0
        self.pending: list = []  # frames put back by pushback(), returned first by recv()

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, header: dict, body: bytes | str = b"") -> None:
        if isinstance(body, str):
            body = body.encode()
        h = json.dumps(header, separators=(",", ":")).encode()
        self.sock.sendall(struct.pack(">I", len(h) + len(body)) + h + body)

    def _fill(self, n: int) -> bool:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return False
            self.buf += chunk
        return True

    def pushback(self, frames) -> None:
        self.pending[:0] = list(frames)

    def recv(self) -> tuple[dict, bytes] | None:
        """Next frame as (header, body); None when the server closed the connection."""
        if self.pending:
            return self.pending.pop(0)
        if not self._fill(4):
            return None
        (n,) = struct.unpack(">I", self.buf[:4])
        if not self._fill(4 + n):
            return None
        frame = self.buf[4 : 4 + n]
        self.buf = self.buf[4 + n :]
        dec = json.JSONDecoder()
        header, end = dec.raw_decode(frame.decode("utf-8", "surrogateescape"))
        hdr_len = len(
            frame.decode("utf-8", "surrogateescape")[:end].encode("utf-8", "surrogateescape")
        )
        return header, frame[hdr_len:]

    def recv_until(self, pred, timeout: float = 10.0) -> list[tuple[dict, bytes]]:
        """Frames up to and including the first matching pred(header, body); TimeoutError when
        none came within `timeout` (a wait for one frame is also bounded by the socket's own
        timeout: a "nothing comes" check with a short timeout does not wait out the socket's)."""
        got = []
        deadline = time.monotonic() + timeout
        own = self.sock.gettimeout()
        try:
            while (left := deadline - time.monotonic()) > 0:
                wait = left if own is None else min(left, own)
                self.sock.settimeout(wait)
                try:
                    f = self.recv()
                except TimeoutError:
                    if wait < left:
                        raise  # the socket's own timeout: one frame took longer than it allows
                    break
                if f is None:
                    raise ConnectionError(f"closed before the expected frame; got {got}")
                got.append(f)
                if pred(*f):
                    return got
        finally:
            self.sock.settimeout(own)
        raise TimeoutError(f"no matching frame in {timeout}s; got {got}")

    def ack(self, kind: str | None = None, cid=None, timeout: float = 10.0) -> dict:
        """The next matching ack; deliveries that arrive before it are kept for messages()."""
        frames = self.recv_until(
            lambda h, b: (
                h.get("c") == "ack"
                and (kind is None or h.get("a") == kind)
                and (cid is None or h.get("cid") == cid)
            ),
            timeout,
        )
        self.pushback(f for f in frames[:-1] if f[0].get("c") == "p")
        return frames[-1][0]

    def closed(self, timeout: float = 5.0) -> bool:
        """True if the server closes this connection within timeout (frames before are dropped)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True

    def logon(self, name: str, **extra) -> dict:
        self.cid += 1
        self.send(
            {"c": "logon", "cid": str(self.cid), "client_name": name, "a": "processed", **extra}
        )
        return self.ack("processed", str(self.cid))

    def next_cid(self) -> str:
        self.cid += 1
        return str(self.cid)

    def subscribe(self, topic: str, ack="processed", **extra) -> dict:
        cid = self.next_cid()
        self.send({"c": "subscribe", "t": topic, "cid": cid, "a": ack, **extra})
        return self.ack("processed", cid)

    def messages(self, n: int, timeout: float = 10.0) -> list[tuple[dict, bytes]]:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"got {len(out)} of {n} messages")
            f = self.recv()
            if f is None:
                raise ConnectionError(f"closed after {len(out)} of {n} messages")
            if f[0].get("c") == "p":
                out.append(f)
        return out


def publish_many(
    port: int,
    topic: str,
    bodies,
    name: str = "bulk-pub",
    start_seq: int = 1,
    conn: Raw | None = None,
) -> Raw:
    """Publish every body (pipelined), then wait until all are persisted. Returns the connection."""
    c = conn or Raw(port)
    if conn is None:
        c.logon(name)
    frames = []
    seq = start_seq
    for body in bodies:
        if isinstance(body, str):
            body = body.encode()
        h = json.dumps({"c": "publish", "t": topic, "s": seq}).encode()
        frames.append(struct.pack(">I", len(h) + len(body)) + h + body)
        seq += 1
        if len(frames) >= 1000:
            c.send_raw(b"".join(frames))
            frames = []
    if frames:
        c.send_raw(b"".join(frames))
    cid = c.next_cid()
    c.send({"c": "flush", "cid": cid, "a": "persisted"})
    c.ack("persisted", cid, timeout=60)
    return c


def bookmark_of(header: dict) -> str:
    return header["bm"]
