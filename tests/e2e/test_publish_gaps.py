"""The gap rule as a property (docs/publishing.md), against a real server with injected journal
write failures (TICKERTAPE_FAULTS): pipelining publishers with random windows, random failures;
every `persisted` success covers only stored sequences, each publisher's stored sequences run
1..n without a hole or a repeat, and every publisher gets everything stored in the end by
resending from its first unpersisted sequence."""

from __future__ import annotations

import asyncio
import json
import random
import struct

import pytest

from journal.journal import Journal
from server.ids import publisher_id
from tests.support.proc import FAST_PROBE, ServerProcess

PUBLISHERS = 3
MESSAGES = 250


async def publisher(port: int, name: str, rng: random.Random, log: dict) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    def frame(h: dict, body: bytes = b"") -> bytes:
        hb = json.dumps(h).encode()
        return struct.pack(">I", len(hb) + len(body)) + hb + body

    async def read_frame() -> dict:
        n = struct.unpack(">I", await reader.readexactly(4))[0]
        data = await reader.readexactly(n)
        return json.loads(data[: data.index(b"}") + 1])

    frames: asyncio.Queue[dict] = asyncio.Queue()

    async def read_all() -> None:  # one reader, so a timed-out wait never cuts a frame in two
        while True:
            await frames.put(await read_frame())

    writer.write(frame({"c": "logon", "client_name": name, "a": "processed", "cid": "l"}))
    reading = asyncio.create_task(read_all())
    assert (await asyncio.wait_for(frames.get(), 30))["status"] == "success"
    loop = asyncio.get_running_loop()
    acked = 0
    sent = 0
    window = rng.choice([1, 5, 50, 200])
    successes: list[int] = log.setdefault("successes", [])
    failures = 0
    # after a failure: back off once, then resend from the first sequence not persisted (what
    # the HA publisher does); failures that arrive meanwhile (the rest of the window, refused
    # past the gap or failed while the journal is unavailable) join the same back-off
    resend_at: float | None = None
    while acked < MESSAGES:
        if resend_at is None:
            while sent < MESSAGES and sent - acked < window:
                sent += 1
                writer.write(
                    frame(
                        {"c": "publish", "t": "gaps", "s": sent, "a": "persisted"},
                        b'{"p":"%s","s":%d}' % (name.encode(), sent),
                    )
                )
            await writer.drain()
        wait = 30.0 if resend_at is None else max(0.0, resend_at - loop.time())
        try:
            h = await asyncio.wait_for(frames.get(), wait)
        except TimeoutError:
            if resend_at is None:
                raise
            resend_at = None
            sent = acked
            continue
        if h.get("c") != "ack" or h.get("a") != "persisted":
            continue
        if h["status"] == "success":
            successes.append(h["s"])
            acked = max(acked, h["s"])
        else:
            failures += 1
            if resend_at is None:
                resend_at = loop.time() + rng.uniform(0.02, 0.1)
    reading.cancel()
    log["failures"] = failures
    writer.close()


async def run_publishers(port: int, seed: int) -> dict:
    rng = random.Random(seed)
    logs = {f"gap-pub-{k}": {} for k in range(PUBLISHERS)}
    await asyncio.wait_for(
        asyncio.gather(*(publisher(port, n, random.Random(rng.random()), logs[n]) for n in logs)),
        120,
    )
    return logs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_persisted_ack_covers_only_stored_sequences(tmp_path, seed):
    srv = ServerProcess(
        tmp_path / "srv",
        env={
            "TICKERTAPE_FAULTS": f"seed={seed};p=0.1;ops=write+fsync;errno=ENOSPC+EIO;after=5;count=6",
            **FAST_PROBE,
        },
    )
    srv.start()
    try:
        logs = asyncio.run(run_publishers(srv.port, seed))
        assert srv.stop() == 0
    finally:
        srv.kill()
    j = Journal(str(tmp_path / "srv" / "journal"))
    stored: dict[int, list[int]] = {}
    for r in j.scan():
        if r.kind == 1:
            stored.setdefault(r.publisher_id, []).append(r.seq)
    j.close()
    assert sum(log["failures"] for log in logs.values()) > 0, (
        "no failure was injected: the test proves nothing"
    )
    for name, log in logs.items():
        seqs = stored.get(publisher_id(name), [])
        assert seqs == list(range(1, len(seqs) + 1)), (
            f"{name}: a hole or a repeat in {seqs[:20]}..."
        )
        assert max(log["successes"]) <= len(seqs), f"{name}: persisted ack past what is stored"
        assert len(seqs) == MESSAGES
