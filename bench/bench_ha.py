"""HA client costs: publish throughput through the HAClient (memory and file publish stores)
against the plain Client, subscriber throughput with the logged and ring bookmark stores, and
the time from a server restart (listening again) to the first delivered message.

    ./run bench bench_ha                       # default counts, 3 repetitions, medians
    ./run bench bench_ha --count 50000 --reps 5
    ./run bench bench_ha --quick               # a smoke run

Every repetition starts its own `tickertape serve` (bench/peers.py: a TransactionLog recording
every topic, persisted = fdatasync'd group commit) on a free port in bench/.data/, and stops
it after. The clients run in this process on one event loop (uvloop unless --loop asyncio).
Prints tables only; it does not write bench/RESULTS.md.

Measures:
- publish: N publishes of a `--size`-byte JSON body, from the first publish to the persisted
  ack of the last (publish_flush); msgs/s, and this process's CPU time per message (steadier
  than msgs/s on a shared machine). `plain` is Client.publish with its default window
  (10,000 in flight); the HA rows add the publish store (the same window applies).
- subscribe: N stored messages replayed from EPOCH, each taken from the iterator and
  discarded; msgs/s from the subscribe call to the last message. `plain` is a Client bookmark
  subscription (no store).
- restart: an HA publisher (file store) publishes at `--rate` msgs/s to an HA subscriber
  (logged store, discarding each message); the server is killed with SIGKILL, restarted on the
  same port and journal after 0.3 s; the time from the restarted server listening (its
  `listening on` log line) to the subscriber's next message, and to both clients connected.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time

import benchlib
import loadgen
import peers

sys.path.insert(0, peers.REPO)

from client import (
    EPOCH,
    MOST_RECENT,
    Client,
    FilePublishStore,
    HAClient,
    LoggedBookmarkStore,
    MemoryBookmarkStore,
    MemoryPublishStore,
    RingBookmarkStore,
)


def measure(n: int, start: float, cpu: float) -> tuple[float, float]:
    """(msgs/s, client CPU microseconds per message) since `start` / `cpu`."""
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n * 1e6


def body_of(size: int) -> bytes:
    pad = max(0, size - len(b'{"seq":0000000000,"p":""}'))
    return b'{"seq":0000000000,"p":"' + b"x" * pad + b'"}'


# ---------------------------------------------------------------------------------- publish


async def timed_publish(c, n: int, body: bytes, topic: str = "bench") -> tuple[float, float]:
    """n publishes through c (a Client or an HAClient) and its publish_flush: measure()."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await c.publish(topic, body)
    await c.publish_flush(timeout=300)
    return measure(n, start, cpu)


async def publish_plain(address: str, n: int, body: bytes) -> tuple[float, float]:
    async with Client(f"bench-plain-{os.getpid()}", server=address) as c:
        return await timed_publish(c, n, body)


async def publish_ha(address: str, n: int, body: bytes, store) -> tuple[float, float]:
    ha = HAClient(f"bench-ha-{os.getpid()}-{id(store)}", servers=[address], publish_store=store)
    await ha.connect_and_logon()
    try:
        return await timed_publish(ha, n, body)
    finally:
        await ha.close()


# ---------------------------------------------------------------------------------- subscribe


async def fill(address: str, n: int, body: bytes) -> None:
    async with Client(f"bench-fill-{os.getpid()}", server=address) as c:
        await timed_publish(c, n, body, "replay")


async def subscribe_plain(address: str, n: int) -> float:
    async with Client(f"bench-sub-{os.getpid()}", server=address) as c:
        start, cpu = time.perf_counter(), time.process_time()
        sub = await c.subscribe("replay", bookmark=EPOCH)
        for _ in range(n):
            await sub.next(timeout=60)
        return measure(n, start, cpu)


async def subscribe_ha(address: str, n: int, store) -> float:
    ha = HAClient(f"bench-hasub-{os.getpid()}-{id(store)}", servers=[address],
                  bookmark_store=store)  # fmt: skip
    await ha.connect_and_logon()
    try:
        start, cpu = time.perf_counter(), time.process_time()
        sub = await ha.subscribe("replay", bookmark=EPOCH, sub_id="bench")
        for _ in range(n):
            sub.discard(await sub.next(timeout=60))
        return measure(n, start, cpu)
    finally:
        await ha.close()


# ---------------------------------------------------------------------------------- restart


async def restart_to_first_message(peer, workdir: str, rate: int) -> dict:
    address = f"{peer.host}:{peer.port}"
    pstore = FilePublishStore(os.path.join(workdir, "pub.store"))
    bstore = LoggedBookmarkStore(os.path.join(workdir, "sub.bm"))
    pub = HAClient("bench-restart-pub", servers=[address], publish_store=pstore)
    sub = HAClient("bench-restart-sub", servers=[address], bookmark_store=bstore)
    delivered: list[float] = []
    stop = asyncio.Event()
    try:
        await pub.connect_and_logon()
        await sub.connect_and_logon()
        hs = await sub.subscribe("restart", bookmark=MOST_RECENT, sub_id="restart")

        async def produce():
            i = 0
            while not stop.is_set():
                await pub.publish("restart", b'{"i":%d}' % i)
                i += 1
                await asyncio.sleep(1 / rate)

        async def consume():
            while not stop.is_set():
                try:
                    m = await hs.next(timeout=0.1)
                except TimeoutError:
                    continue
                delivered.append(time.monotonic())
                hs.discard(m)

        tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
        while len(delivered) < rate // 4:  # flowing
            await asyncio.sleep(0.01)
        peer.proc.kill()  # SIGKILL
        peer.proc.wait()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(peer.restart)  # returns at its `listening on` line
        listening = time.monotonic()
        seen = len(delivered)
        connected = None
        deadline = listening + 30
        while len(delivered) <= seen and time.monotonic() < deadline:
            if connected is None and pub.connected and sub.connected:
                connected = time.monotonic()
            await asyncio.sleep(0.001)
        if connected is None:
            connected = time.monotonic()
        stop.set()
        await asyncio.gather(*tasks)
        return {"first": delivered[seen] - listening, "connected": connected - listening}
    finally:
        await pub.close()
        await sub.close()
        pstore.close()
        bstore.close()


# ---------------------------------------------------------------------------------- driver


def run_rep(fn, *args):
    """fn(peer, workdir, *args) on a fresh server; the client stores go in its work dir."""
    peer = peers.make_peer("tickertape").start()
    try:
        return loadgen.run_coro(fn(peer, peer.workdir, *args), uv=LOOP == "uvloop")
    finally:
        peer.cleanup()


LOOP = "uvloop"


def table(title: str, rows: list[tuple[str, list[float]]], fmt: str, base: str | None = None,
          unit: str = "") -> None:  # fmt: skip
    print(f"\n{title}")
    med = {label: statistics.median(vals) for label, vals in rows}
    width = max(len(label) for label, _ in rows)
    for label, vals in rows:
        line = f"  {label:<{width}}  {fmt.format(med[label]):>10}{unit}"
        line += "   (reps: " + ", ".join(fmt.format(v) for v in vals) + ")"
        if base is not None and label != base:
            line += f"   {med[label] / med[base]:.2f}x {base}"
        print(line)


def both(title: str, rep_fn, kinds: list[str], reps: int) -> None:
    """reps runs of rep_fn per kind, each on a fresh server; their rates and client CPU."""
    rows: dict[str, list] = {k: [] for k in kinds}
    for _ in range(reps):
        for k in kinds:  # interleaved: drift in the machine hits every row alike
            rows[k].append(run_rep(rep_fn, k))
    table(f"{title} (msgs/s)", [(k, [r[0] for r in rows[k]]) for k in kinds], "{:,.0f}",
          "plain")  # fmt: skip
    table(f"{title} (client CPU µs/msg)", [(k, [r[1] for r in rows[k]]) for k in kinds],
          "{:.2f}", "plain")  # fmt: skip


def main() -> None:
    global LOOP
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--count", type=int, default=100_000, help="messages per publish / replay run")
    p.add_argument("--size", type=int, default=100, help="JSON body bytes")
    p.add_argument("--reps", type=int, default=3, help="repetitions (medians reported)")
    p.add_argument("--rate", type=int, default=2000, help="restart test publish rate, msgs/s")
    p.add_argument("--restarts", type=int, default=5, help="restart measurements")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--quick", action="store_true", help="small counts, one repetition")
    p.add_argument("--sections", default="publish,subscribe,restart",
                   help="comma list of: publish, subscribe, restart")  # fmt: skip
    args = p.parse_args()
    LOOP = args.loop
    if LOOP == "uvloop" and loadgen.uvloop is None:
        sys.exit("bench_ha: --loop uvloop, but uvloop is not installed (pip install uvloop)")
    # the restart section loses connections on purpose: keep the client's warnings quiet
    logging.getLogger("tickertape.client").addHandler(logging.NullHandler())
    if args.quick:
        args.count, args.reps, args.restarts = 10_000, 1, 2
    benchlib.tickertape_only()
    n, body = args.count, body_of(args.size)
    print(f"bench_ha: {n} messages of {len(body)} bytes, {args.reps} rep(s), loop {LOOP}, "
          f"{os.cpu_count()} CPU(s), Python {sys.version.split()[0]}")  # fmt: skip

    async def pub_rep(peer, workdir, kind):
        address = f"{peer.host}:{peer.port}"
        if kind == "plain":
            return await publish_plain(address, n, body)
        if kind == "memory store":
            return await publish_ha(address, n, body, MemoryPublishStore())
        store = FilePublishStore(os.path.join(workdir, "pub.store"))
        try:
            return await publish_ha(address, n, body, store)
        finally:
            store.close()

    sections = set(args.sections.split(","))
    kinds = ["plain", "memory store", "file store"]
    if "publish" in sections:
        both("publish, persisted", pub_rep, kinds, args.reps)

    async def sub_rep(peer, workdir, kind):
        address = f"{peer.host}:{peer.port}"
        await fill(address, n, body)
        if kind == "plain":
            return await subscribe_plain(address, n)
        store = {
            "memory store": MemoryBookmarkStore,
            "logged store": lambda: LoggedBookmarkStore(os.path.join(workdir, "b.log")),
            "ring store": lambda: RingBookmarkStore(os.path.join(workdir, "b.ring")),
        }[kind]()
        try:
            return await subscribe_ha(address, n, store)
        finally:
            store.close()

    kinds = ["plain", "memory store", "logged store", "ring store"]
    if "subscribe" in sections:
        both("subscribe, replay + discard each", sub_rep, kinds, args.reps)

    async def restart_rep(peer, workdir):
        return await restart_to_first_message(peer, workdir, args.rate)

    if "restart" not in sections:
        return
    results = [run_rep(restart_rep) for _ in range(args.restarts)]
    table("server kill -9 + restart (seconds after it listens again)", [
        ("first message delivered", [r["first"] for r in results]),
        ("both clients connected", [r["connected"] for r in results]),
    ], "{:.3f}", unit=" s")  # fmt: skip
    worst = max(r["first"] for r in results)
    print(f"  worst first delivery: {worst:.3f} s")


if __name__ == "__main__":
    main()
