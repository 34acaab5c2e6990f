"""The fault campaign: rounds of random faults under continuous load, each checked for the promise.

    ./run bench fault_campaign --rounds 50 --seed 1 [--json out.json] [--keep DIR] [--time-limit S]
    ./run bench fault_campaign --seams ...   (the replicated set: bench/fault_seams.py)

Each round starts a server on a fresh journal (a small tmpfs, so the disk can fill), runs two
pipelining publishers, a live subscriber and a queue consumer against it, and injects one fault:

- `kill`: kill -9 of the server while publishing;
- `disk-full`: the journal's filesystem is filled for a while, then freed (the journal recovers
  by itself, publishers resend from their gap);
- `io-errors`: the server runs with TICKERTAPE_FAULTS (write / fsync / open / rename / close
  errors in the journal writer), then is killed;
- `bitflip`: the server is stopped cleanly and one byte of a stored record is flipped at rest.

The server is started again (clean), the publishers reconnect and resend what was not persisted,
and the round is checked: every acknowledged message is in the journal exactly once (but the
record flipped at rest, which must then never be served), no bookmark twice, nothing delivered
(live, replayed or from the queue) that was not published byte for byte (payloads carry their
own hash), no client received bytes that are not a well-formed frame (journal bytes leaking into
a socket), and no queue message is delivered again after its acknowledgement was confirmed.

The rounds, totals and exit code are bench/campaign_runner.py's (shared with --seams): exit
code 0 = no violation, 1 = violations, 2 = setup error, 3 = time limit. Random choices come from
--seed (round r uses seed*100003+r), so `--first-round R --rounds 1` replays one round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from campaign_runner import Mode, add_arguments, mount_tmpfs, run
from peerbase import free_port

from journal.journal import Journal
from journal.record import SEGMENT_HEADER_SIZE
from server.ids import publisher_id
from tests.support.proc import server_env

TICKERTAPE = os.path.join(os.path.dirname(sys.executable), "tickertape")
FAULTS = ("kill", "disk-full", "io-errors", "bitflip")
TOPIC = "fc"
QUEUE = "fcq"


def payload(name: str, seq: int) -> bytes:
    h = hashlib.blake2b(b"%s|%d" % (name.encode(), seq), digest_size=8).hexdigest()
    return json.dumps({"p": name, "s": seq, "h": h, "pad": "x" * (seq % 200)}).encode()


def payload_ok(body: bytes) -> tuple[str, int] | None:
    try:
        d = json.loads(body)
        if payload(d["p"], d["s"]) != body:
            return None
        return d["p"], d["s"]
    except (ValueError, KeyError, TypeError):
        return None


class Violation(Exception):
    pass


# -- a server process --------------------------------------------------------------------------


def config(data: str, port: int) -> str:
    return f"""<TickertapeConfig><Name>fc</Name>
  <Transports><Transport><Name>t</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr>
    <MessageType>json</MessageType><Protocol>amps</Protocol></Transport></Transports>
  <Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
  <Logging><Target><Protocol>stdout</Protocol><Level>warning</Level></Target></Logging>
  <TransactionLog><JournalDirectory>{data}/journal</JournalDirectory><JournalSize>256KB</JournalSize>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  <SOW><Queue><Name>{QUEUE}</Name><UnderlyingTopic>{TOPIC}</UnderlyingTopic>
    <MaxPerSubscriptionBacklog>200</MaxPerSubscriptionBacklog></Queue></SOW>
</TickertapeConfig>"""


class Server:
    def __init__(self, data: str):
        self.data = data
        self.port = free_port()
        self.cfg = os.path.join(data, "tt.xml")
        with open(self.cfg, "w") as f:
            f.write(config(data, self.port))
        self.proc: subprocess.Popen | None = None
        self.log = open(os.path.join(data, "server.log"), "a")

    def start(self, faults: str | None = None) -> None:
        env = server_env()  # bytecode cached outside the tree: a start compiles nothing
        env.pop("TICKERTAPE_FAULTS", None)
        if faults:
            env["TICKERTAPE_FAULTS"] = faults
        self.proc = subprocess.Popen(
            [TICKERTAPE, "serve", "--config", self.cfg],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.data,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited at start ({self.proc.returncode}); see {self.data}/server.log"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not start listening")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise Violation("SIGTERM did not stop the server within 30 s") from None


# -- clients -------------------------------------------------------------------------------------


class Frames:
    """A strict frame reader: anything that is not a well-formed frame is a leak."""

    def __init__(self, reader):
        self.reader = reader

    async def next(self) -> tuple[dict, bytes]:
        n = struct.unpack(">I", await self.reader.readexactly(4))[0]
        if not 2 <= n <= 4 << 20:
            raise Violation(f"leak: a frame length of {n} bytes")
        data = await self.reader.readexactly(n)
        end = data.find(b"}")
        try:
            h = json.loads(data[: end + 1])
            assert isinstance(h, dict) and "c" in h
        except (ValueError, AssertionError):
            raise Violation(f"leak: bytes that are not a frame header: {data[:60]!r}") from None
        return h, data[end + 1 :]


def frame(h: dict, body: bytes = b"") -> bytes:
    hb = json.dumps(h).encode()
    return struct.pack(">I", len(hb) + len(body)) + hb + body


async def connect(port: int, name: str, **logon):
    """Log on (`logon`: user_id and pw, say); returns (frames, writer, stored sequence)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    f = Frames(reader)
    writer.write(frame({"c": "logon", "client_name": name, "a": "processed", "cid": "l", **logon}))
    while True:
        h, _ = await f.next()
        if h.get("c") == "ack" and h.get("cid") == "l":
            if h.get("status") != "success":
                raise ConnectionError(f"logon refused: {h}")
            return f, writer, int(h.get("s") or 0)


class Publisher:
    """A pipelining publisher of `body(name, seq)` to `topic`; `logon` goes into its logons."""

    def __init__(self, name: str, rng: random.Random, topic: str = TOPIC, body=None, logon=None):
        self.name = name
        self.topic = topic
        self.body = body or payload
        self.logon = logon or {}
        self.acked = 0  # highest persisted success
        # (stored, acked) at each logon whose instance had less than this publisher was acked
        # for: it goes on after `acked`, so that instance lacks (stored, acked] unless
        # replication brings them first (docs/replication.md, "Duplicates")
        self.skipped: list[tuple[int, int]] = []
        self.target = 0
        self.window = rng.choice([1, 20, 200])

    async def run(self, port, stop: asyncio.Event, count: int) -> None:
        """Publish up to `count`, resending from the last persisted on failure or reconnect.
        `port`: a port, or a function called for the port of each (re)connection."""
        self.target = max(self.target, count)
        while self.acked < self.target and not stop.is_set():
            try:
                f, w, stored = await connect(port() if callable(port) else port, self.name,
                                             **self.logon)  # fmt: skip
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.1)
                continue
            if stored < self.acked:
                self.skipped.append((stored, self.acked))
            self.acked = max(self.acked, stored)  # stored by the server: the logon says so
            sent = self.acked
            try:
                while self.acked < self.target and not stop.is_set():
                    while sent < self.target and sent - self.acked < self.window:
                        sent += 1
                        w.write(
                            frame(
                                {"c": "publish", "t": self.topic, "s": sent, "a": "persisted"},
                                self.body(self.name, sent),
                            )
                        )
                    await w.drain()
                    h, _ = await asyncio.wait_for(f.next(), 5)
                    if h.get("c") != "ack" or h.get("a") != "persisted":
                        continue
                    if h["status"] == "success":
                        self.acked = max(self.acked, int(h["s"]))
                    else:
                        await asyncio.sleep(0.2)
                        sent = self.acked
            except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.1)
            finally:
                w.close()


class Consumer:
    """Live subscriber (kind "live") or queue consumer (kind "queue"); checks what it gets."""

    def __init__(self, kind: str):
        self.kind = kind
        self.got = 0
        self.acked_bms: set[str] = set()  # queue: acks confirmed
        self.violations: list[str] = []

    async def run(self, port: int, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                f, w, _ = await connect(port, f"fc-{self.kind}")
                t = QUEUE if self.kind == "queue" else TOPIC
                w.write(
                    frame({"c": "subscribe", "t": t, "cid": "s", "a": "processed", "sub_id": "s1"})
                )
                pending: dict[str, str] = {}
                n = 0
                while not stop.is_set():
                    h, body = await asyncio.wait_for(f.next(), 0.5)
                    if h.get("c") == "p":
                        self.got += 1
                        if payload_ok(body) is None:
                            self.violations.append(
                                f"{self.kind}: delivered a message that was not published: {body[:80]!r}"
                            )
                        bm = h.get("bm", "")
                        if self.kind == "queue":
                            if bm in self.acked_bms:
                                self.violations.append(
                                    f"queue: {bm} delivered again after its ack was confirmed"
                                )
                            n += 1
                            pending[f"a{n}"] = bm
                            w.write(
                                frame(
                                    {
                                        "c": "sow_delete",
                                        "t": QUEUE,
                                        "bm": bm,
                                        "cid": f"a{n}",
                                        "a": "processed",
                                    }
                                )
                            )
                    elif h.get("c") == "ack" and h.get("cid", "").startswith("a"):
                        bm = pending.pop(h["cid"], None)
                        if bm and h.get("status") == "success":
                            self.acked_bms.add(bm)
            except Violation as exc:
                self.violations.append(str(exc))
                return
            except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.05)


async def replay_all(port: int) -> list[tuple[dict, bytes]]:
    f, w, _ = await connect(port, "fc-replayer")
    w.write(frame({"c": "subscribe", "t": TOPIC, "bm": "0", "cid": "r", "a": "completed"}))
    out = []
    while True:
        h, body = await asyncio.wait_for(f.next(), 30)
        if h.get("c") == "p":
            out.append((h, body))
        elif h.get("c") == "ack" and h.get("a") == "completed":
            w.close()
            return out


# -- one round -------------------------------------------------------------------------------------


def fill(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):  # full: the next, smaller size
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


def flip_at_rest(jdir: str, rng: random.Random) -> tuple[int, int] | None:
    """Flip one byte inside a random stored message record; return its (publisher, seq)."""
    j = Journal(jdir)
    try:
        recs = [r for r in j.scan() if r.kind == 1]
        if not recs:
            return None
        r = rng.choice(recs)
        segs, i = j.layout.find(r.position)
        seg = segs[i]
        off = SEGMENT_HEADER_SIZE + r.position - seg.base + rng.randrange(8, 36 + len(r.body))
    finally:
        j.close()
    with open(seg.path, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
    return r.publisher_id, r.seq


async def round_async(srv: Server, rng: random.Random, fault: str, data: str) -> dict:
    pubs = [Publisher(f"fc-pub-{k}", random.Random(rng.random())) for k in range(2)]
    live, queue = Consumer("live"), Consumer("queue")
    stop = asyncio.Event()
    count = rng.randrange(300, 1500)
    flipped = None
    faults_env = None
    if fault == "io-errors":
        faults_env = (
            f"seed={rng.randrange(1 << 30)};p={rng.choice([0.02, 0.1, 0.3])};"
            "ops=write+fsync+open+rename+close;errno=ENOSPC+EIO;after=20;count=4"
        )
    srv.start(faults_env)
    tasks = [asyncio.create_task(p.run(srv.port, stop, count)) for p in pubs]
    tasks += [asyncio.create_task(c.run(srv.port, stop)) for c in (live, queue)]
    await asyncio.sleep(rng.uniform(0.1, 0.6))
    if fault in ("kill", "io-errors"):
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        srv.kill()
    elif fault == "disk-full":
        filler = os.path.join(data, "filler")
        await asyncio.to_thread(fill, filler)
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        os.unlink(filler)
    elif fault == "bitflip":
        await asyncio.sleep(0.3)
        await asyncio.to_thread(srv.stop)
        flipped = await asyncio.to_thread(flip_at_rest, os.path.join(data, "journal"), rng)
    if srv.proc.poll() is not None:
        await asyncio.sleep(0.2)
        await asyncio.to_thread(srv.start)
    # everything goes through after the fault
    deadline = time.monotonic() + 60
    while any(p.acked < p.target for p in pubs):
        if time.monotonic() > deadline:
            raise Violation(f"publishers stalled: {[(p.acked, p.target) for p in pubs]}")
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    replayed = await replay_all(srv.port)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.to_thread(srv.stop)
    return {"pubs": pubs, "live": live, "queue": queue, "replayed": replayed, "flipped": flipped}


def check(out: dict, jdir: str) -> tuple[dict, list[str]]:
    violations = list(out["live"].violations) + list(out["queue"].violations)
    flipped = out["flipped"]
    j = Journal(jdir)
    try:
        stored: dict[int, list[int]] = {}
        for r in j.scan():
            if r.kind == 1:
                stored.setdefault(r.publisher_id, []).append(r.seq)
                if payload_ok(r.body) is None:
                    violations.append(f"journal serves a damaged or foreign record at {r.position}")
        damaged = j.integrity.damaged_regions
    finally:
        j.close()
    acked = 0
    lost = dup = 0
    for p in out["pubs"]:
        pid = publisher_id(p.name)
        seqs = stored.get(pid, [])
        seen = set(seqs)
        dup += len(seqs) - len(seen)
        for s in range(1, p.acked + 1):
            if s not in seen and flipped != (pid, s):
                lost += 1
        acked += p.acked
    if lost:
        violations.append(f"{lost} acknowledged message(s) missing from the journal")
    if dup:
        violations.append(f"{dup} message(s) stored twice")
    bms = [h.get("bm") for h, _ in out["replayed"]]
    if len(bms) != len(set(bms)):
        violations.append("replay gave one bookmark twice")
    leaked = sum(1 for v in violations if v.startswith("leak"))
    served_damaged = 0
    for _h, body in out["replayed"]:
        got = payload_ok(body)
        if got is None:
            served_damaged += 1
            violations.append(f"replay served a record that was not published: {body[:60]!r}")
        elif flipped is not None and (publisher_id(got[0]), got[1]) == flipped:
            served_damaged += 1
            violations.append("replay served the record damaged at rest")
    return {
        "acked": acked,
        "lost": lost,
        "duplicated": dup,
        "leaked": leaked,
        "damaged_served": served_damaged,
        "damaged_found": damaged,
        "delivered": out["live"].got + out["queue"].got + len(out["replayed"]),
    }, violations


def play(r: int, rng: random.Random, fault: str, data: str) -> tuple[dict, list[str]]:
    """One single-node round in `data` (campaign_runner.Mode.play)."""
    if fault == "disk-full":
        mount_tmpfs(data, "48m")
    srv = Server(data)
    try:
        out = asyncio.run(round_async(srv, rng, fault, data))
        return check(out, os.path.join(data, "journal"))
    except Violation as exc:
        return {}, [str(exc)]
    except Exception as exc:  # a round that could not run is a failure, with its reason
        return {}, [f"round failed: {type(exc).__name__}: {exc}"]
    finally:
        srv.kill()
        srv.log.close()


SINGLE_NODE = Mode(
    name="single-node",
    faults=FAULTS,
    stat_keys=(
        "acked",
        "delivered",
        "lost",
        "duplicated",
        "leaked",
        "damaged_served",
        "damaged_found",
    ),
    pick=lambda rng, faults: rng.choice(faults),
    play=play,
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(ap)
    ap.add_argument(
        "--seams", action="store_true",
        help="the campaign at the seams: a replicated set (bench/fault_seams.py)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if not os.path.exists(TICKERTAPE):
        print(f"fault_campaign: {TICKERTAPE} is missing: run ./run install first", file=sys.stderr)
        return 2
    if args.seams:
        from fault_seams import SEAMS

        return run(args, SEAMS)
    return run(args, SINGLE_NODE)


if __name__ == "__main__":
    sys.exit(main())
