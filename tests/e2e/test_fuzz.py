"""Hostile input against a live server: random frames and random headers on many connections.
The server must never crash, and a well-behaved client must keep working throughout."""

import json
import random
import socket
import struct

from tests.support.raw import Raw

COMMANDS = [
    "logon",
    "publish",
    "subscribe",
    "unsubscribe",
    "sow_delete",
    "heartbeat",
    "flush",
    "p",
    "ack",
    "x",
]
KEYS = ["c", "t", "s", "bm", "o", "f", "a", "cid", "sub_id", "e", "x", "client_name", "max_backlog"]
VALUES = [
    "",
    "0",
    "-1",
    "1|1|",
    "[0:",
    "/a = ",
    "((",
    "orders",
    "work",
    ".*(",
    "rate=2X",
    "live,pause",
    "max_backlog=0",
    "99999999999999999999999",
    "start,0",
    "\x00",
    "é",
    1.5,
    -3,
    2**70,
    None,
    True,
]


def random_header(rng: random.Random) -> dict:
    h = {"c": rng.choice(COMMANDS)} if rng.random() < 0.9 else {}
    for _ in range(rng.randint(0, 6)):
        h[rng.choice(KEYS)] = rng.choice(VALUES)
    return h


def test_random_frames_never_crash_the_server(shared_server):
    rng = random.Random(int(__import__("os").environ.get("FUZZ_SEED", "1234")))
    watcher = Raw(shared_server.port)
    watcher.logon("fuzz-watcher")
    watcher.subscribe("orders", sub_id="watch", f="/fuzz = 'ok'")
    for round_ in range(150):
        s = socket.create_connection(("127.0.0.1", shared_server.port), timeout=5)
        try:
            if rng.random() < 0.5:
                logon = json.dumps({"c": "logon", "client_name": f"fuzz-{round_}"}).encode()
                s.sendall(struct.pack(">I", len(logon)) + logon)
            for _ in range(rng.randint(1, 8)):
                kind = rng.random()
                if kind < 0.6:
                    h = json.dumps(random_header(rng)).encode()
                    body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))
                    s.sendall(struct.pack(">I", len(h) + len(body)) + h + body)
                elif kind < 0.8:
                    s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))))
                else:
                    junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 30)))
                    s.sendall(struct.pack(">I", len(junk)) + junk)
        except OSError:
            pass  # the server closed a connection that sent garbage: expected
        finally:
            s.close()
    # the server is alive and still delivers to a well-behaved client
    p = Raw(shared_server.port)
    p.logon("fuzz-after")
    p.send({"c": "publish", "t": "orders", "s": 1, "a": "persisted"}, '{"fuzz":"ok"}')
    assert p.ack("persisted")["status"] == "success"
    ((h, b),) = watcher.messages(1)
    assert json.loads(b) == {"fuzz": "ok"}
    assert "Traceback" not in shared_server.output()
