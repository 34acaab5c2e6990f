"""The HAClient and the HA command-line client against real server processes: `kill -9` and
restart of the server under a publisher (file publish store) and an out-of-order subscriber
(logged bookmark store); the pub / sub commands killed with SIGKILL and run again; failover
between two instances, by a killed primary and by a silent (stopped) one; the queue command.
No part of our own stack is mocked."""

import asyncio
import os
import random
import signal
import socket
import sys
import time

import pytest

from client import (
    MOST_RECENT,
    Client,
    FilePublishStore,
    FixedDelayStrategy,
    HAClient,
    LoggedBookmarkStore,
    MemoryBookmarkStore,
)
from tests.support.proc import TICKERTAPE, ServerProcess, make_config
from tests.support.raw import publish_many

pytestmark = pytest.mark.skipif(
    not os.path.exists(TICKERTAPE), reason="the tickertape console script is not installed"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fixed_port_server(directory, extra: str = "") -> ServerProcess:
    """A server whose transport keeps its port across restarts (so clients can come back)."""
    port = free_port()
    xml = make_config(str(directory), admin=False, extra=extra).replace(
        "<InetAddr>127.0.0.1:0</InetAddr>", f"<InetAddr>127.0.0.1:{port}</InetAddr>", 1
    )
    return ServerProcess(directory, config_xml=xml)


def addr(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.port}"


async def journal_ids(server: ServerProcess, topic: str) -> list[int]:
    """Every `i` the server's journal holds for `topic` (a replay from EPOCH)."""
    async with Client(f"reader-{os.urandom(3).hex()}", server=addr(server)) as c:
        sub = await c.subscribe(topic, bookmark="0")
        out = []
        while True:
            try:
                msg = await sub.next(timeout=1.0)
            except TimeoutError:
                return out
            out.append(msg.json()["i"])


class WindowConsumer:
    """The seed's moving-window subscriber: holds up to `window` messages and discards a
    random half of them, out of order, whenever the window is full."""

    def __init__(self, hs, window: int = 24, seed: int = 1):
        self.hs = hs
        self.window = window
        self.rnd = random.Random(seed)
        self.held = []
        self.processed: list[int] = []
        self.delivered_at: list[float] = []

    def _process(self, msgs) -> None:
        for m in msgs:
            self.processed.append(m.json()["i"])
            self.hs.discard(m)

    async def run(self, until) -> None:
        while not until(self):
            try:
                m = await self.hs.next(timeout=0.2)
            except TimeoutError:
                self._process(self.held)  # quiet: close every open window
                self.held = []
                continue
            self.delivered_at.append(time.monotonic())
            self.held.append(m)
            if len(self.held) >= self.window:
                self.rnd.shuffle(self.held)
                half = self.window // 2
                self._process(self.held[:half])
                del self.held[:half]


@pytest.mark.slow
async def test_server_kill9_under_file_publisher_and_out_of_order_subscriber(tmp_path):
    srv = fixed_port_server(tmp_path / "srv").start()
    pstore = FilePublishStore(tmp_path / "pub.store")
    bstore = LoggedBookmarkStore(tmp_path / "sub.bm")
    pub = HAClient("ha-pub", servers=[addr(srv)], publish_store=pstore)
    sub = HAClient("ha-sub", servers=[addr(srv)], bookmark_store=bstore)
    n = 6000
    latencies: list[float] = []
    try:
        await pub.connect_and_logon()
        await sub.connect_and_logon()
        hs = await sub.subscribe("trades", bookmark=MOST_RECENT, sub_id="window")
        consumer = WindowConsumer(hs)

        # the publisher waits at 30 % and 70 % of the stream until the kill before it has
        # happened: a restart that is slow under load (it publishes on into its store while
        # the server is down) must not let it finish before the second kill
        shares = (0.25, 0.65)
        killed = {int((s + 0.05) * n): asyncio.Event() for s in shares}

        async def produce():
            for i in range(n):
                if i in killed:
                    await killed[i].wait()
                await pub.publish("trades", {"i": i})
                if i % 50 == 49:
                    await asyncio.sleep(0.015)  # about 3,000 messages a second
            await pub.publish_flush(timeout=30)

        async def kill_and_restart():
            for share, gate in zip(shares, killed.values(), strict=True):
                while pub.last_seq < share * n or not (pub.connected and sub.connected):
                    await asyncio.sleep(0.005)
                srv.kill()  # kill -9 in the middle of the stream, both clients connected
                gate.set()
                await asyncio.sleep(0.3)
                await asyncio.to_thread(srv.start)
                listening = time.monotonic()
                seen = len(consumer.delivered_at)
                await _wait_for(lambda n=seen: len(consumer.delivered_at) > n, 10, "a delivery")
                latencies.append(consumer.delivered_at[seen] - listening)

        consume = asyncio.ensure_future(consumer.run(lambda c: len(c.processed) >= n))
        await asyncio.gather(produce(), kill_and_restart())
        await asyncio.wait_for(consume, 30)
    finally:
        await pub.close()
        await sub.close()
        srv.stop()
    assert pub.reconnects == 2 and sub.reconnects == 2
    assert len(consumer.processed) == len(set(consumer.processed)), "processed twice"
    assert set(consumer.processed) == set(range(n))
    assert pub.unpersisted_count() == 0
    # the default delay strategy: a message is delivered within 1 s of the server listening
    assert len(latencies) == 2 and max(latencies) < 1.0, latencies
    pstore.close()
    bstore.close()


async def _lines(stream, out: list, done: asyncio.Event | None = None) -> None:
    while line := await stream.readline():
        out.append(line)
    if done is not None:
        done.set()


async def _spawn(*args, stdin=None):
    return await asyncio.create_subprocess_exec(
        TICKERTAPE, *args, stdin=stdin, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.cli_process
async def test_cli_pub_and_sub_killed_with_sigkill_resume_exactly(tmp_path):
    srv = fixed_port_server(tmp_path / "srv").start()
    a = addr(srv)
    pstore, bstore = str(tmp_path / "pub.store"), str(tmp_path / "sub.bm")
    sub_args = ("sub", "cli-t", "--server", a, "--bookmark", "recent", "--bookmark-store", bstore,
                "--sub-id", "cli-sub")  # fmt: skip
    pub_args = ("pub", "cli-t", "--server", a, "--publish-store", pstore, "--client-name",
                "cli-pub")  # fmt: skip

    def lines(lo, hi):
        return b"".join(b'{"i":%d}\n' % i for i in range(lo, hi))

    try:
        sub1 = await _spawn(*sub_args)
        printed1: list[bytes] = []
        reader1 = asyncio.ensure_future(_lines(sub1.stdout, printed1))
        pub1 = await _spawn(*pub_args, stdin=asyncio.subprocess.PIPE)
        err1: list[bytes] = []
        errs = asyncio.ensure_future(_lines(pub1.stderr, err1))
        pub1.stdin.write(lines(0, 1000))
        await pub1.stdin.drain()
        await _wait_for(lambda: len(printed1) >= 300, 20, "the subscriber to print 300 lines")
        sub1.kill()  # SIGKILL in the middle of the stream
        await sub1.wait()
        await reader1
        srv.kill()  # and the server: what pub holds now is not persisted anywhere
        pub1.stdin.write(lines(1000, 2000))
        pub1.stdin.close()  # end of input: pub stores it all and waits for persisted acks
        await _wait_for(lambda: any(b"end of input" in e for e in err1), 20, "pub to store all")
        pub1.kill()
        await pub1.wait()
        await errs
        await asyncio.to_thread(srv.start)

        pub2 = await _spawn(*pub_args, stdin=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(pub2.communicate(lines(2000, 3000)), 30)
        err = err.decode()
        assert pub2.returncode == 0, err
        assert "republished" in err and "had not persisted" in err
        assert "published 1000 message(s) to cli-t, persisted through seq 3000" in err
        sub2 = await _spawn(*sub_args, "--timeout", "1.5")
        out2, err = await asyncio.wait_for(sub2.communicate(), 30)
        assert sub2.returncode == 0, err.decode()
    finally:
        srv.stop()
    got1 = [int(x[5:-2]) for x in printed1]
    got2 = [int(x[5:-2]) for x in out2.splitlines(keepends=True)]
    assert set(got1) | set(got2) == set(range(3000)), "lost messages"
    assert len(got1) == len(set(got1)) and len(got2) == len(set(got2))
    # the only message both runs may print is the one the kill hit between printing it and
    # recording the discard
    assert set(got1) & set(got2) <= {got1[-1]}, set(got1) & set(got2)


@pytest.mark.slow
async def test_failover_to_a_secondary_when_the_primary_is_killed(tmp_path):
    primary = ServerProcess(tmp_path / "a", admin=False).start()
    secondary = ServerProcess(tmp_path / "b", admin=False).start()
    servers = [addr(primary), addr(secondary)]
    pub = HAClient("fo-pub", servers=servers, publish_store=FilePublishStore(tmp_path / "p"))
    sub = HAClient("fo-sub", servers=servers, bookmark_store=MemoryBookmarkStore())
    n = 3000
    try:
        await pub.connect_and_logon()
        await sub.connect_and_logon()
        hs = await sub.subscribe("fo", bookmark=MOST_RECENT, sub_id="fo")
        consumer = WindowConsumer(hs, seed=2)

        async def produce():
            for i in range(n):
                await pub.publish("fo", {"i": i})
                if i % 50 == 49:
                    await asyncio.sleep(0.015)
            await pub.publish_flush(timeout=30)

        async def kill_primary():
            await _wait_for(lambda: pub.last_seq >= n // 3, 20, "a third published")
            primary.kill()

        consume = asyncio.ensure_future(consumer.run(lambda c: len(c.processed) >= n))
        await asyncio.gather(produce(), kill_primary())
        await asyncio.wait_for(consume, 30)
    finally:
        await pub.close()
        await sub.close()
    assert pub.current_uri == servers[1] and sub.current_uri == servers[1]
    on_b = await journal_ids(secondary, "fo")
    secondary.stop()
    primary.start()  # its own journal, to see what it had persisted before it died
    on_a = await journal_ids(primary, "fo")
    primary.stop()
    assert set(on_a) | set(on_b) == set(range(n)), "the publisher lost messages"
    assert on_b and min(on_b) > 0  # the secondary started empty and got the rest
    assert len(consumer.processed) == len(set(consumer.processed)), "processed twice"
    assert set(consumer.processed) == set(range(n))


async def test_heartbeat_detects_a_stopped_primary_and_fails_over(tmp_path):
    primary = ServerProcess(tmp_path / "a", admin=False).start()
    secondary = ServerProcess(tmp_path / "b", admin=False).start()
    sub = HAClient("hb-sub", servers=[addr(primary), addr(secondary)], heartbeat=0.2,
                   heartbeat_timeout=0.6, logon_timeout=1.0,
                   delay_strategy=FixedDelayStrategy(0.05))  # fmt: skip
    try:
        await sub.connect_and_logon()
        hs = await sub.subscribe("hb")
        os.kill(primary.proc.pid, signal.SIGSTOP)  # no RST, no FIN: only heartbeats tell
        started = time.monotonic()
        await _wait_for(lambda: sub.current_uri == addr(secondary) and sub.connected, 10,
                        "failover to the secondary")  # fmt: skip
        assert time.monotonic() - started < 5
        publish_many(secondary.port, "hb", ['{"x":1}'])
        assert (await hs.next(timeout=5)).json() == {"x": 1}
    finally:
        await sub.close()
        os.kill(primary.proc.pid, signal.SIGCONT)
        primary.stop()
        secondary.stop()


QUEUE = """<SOW><Queue><Name>jobs-q</Name><UnderlyingTopic>jobs</UnderlyingTopic>
<MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue></SOW>"""


@pytest.mark.cli_process
async def test_queue_cli_prints_and_acknowledges(tmp_path):
    srv = ServerProcess(tmp_path / "q", admin=False, extra=QUEUE).start()
    try:
        publish_many(srv.port, "jobs", [f'{{"job":{i}}}' for i in range(50)]).close()
        a = addr(srv)
        runs = []
        for args in (("--count", "30", "--backlog", "5"), ("--count", "20"),
                     ("--timeout", "0.5")):  # fmt: skip
            proc = await _spawn("queue", "jobs-q", "--server", a, *args)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err.decode()
            runs.append([int(line[7:-1]) for line in out.splitlines()])
    finally:
        srv.stop()
    assert [len(r) for r in runs] == [30, 20, 0]  # acked messages are never delivered again
    assert sorted(runs[0] + runs[1]) == list(range(50))


@pytest.mark.cli_process
async def test_cli_sub_resumes_where_the_last_run_stopped_and_fails_over(tmp_path):
    srv = ServerProcess(tmp_path / "s", admin=False).start()
    dead = free_port()  # listed first: nothing listens there
    store = str(tmp_path / "sub.ring")
    try:
        publish_many(srv.port, "res", [f'{{"i":{i}}}' for i in range(25)]).close()
        got = []
        for kind in ("ring", "ring", "logged"):
            proc = await _spawn(
                "sub", "res", "--server", f"127.0.0.1:{dead}", "--server", addr(srv),
                "--bookmark", "recent", "--bookmark-store", store + kind[0],
                "--bookmark-store-kind", kind, "--sub-id", "r", "--count", "10",
                "--timeout", "2",
            )  # fmt: skip
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            got.append([int(line[5:-1]) for line in out.splitlines()])
    finally:
        srv.stop()
    assert got[0] == list(range(10)) and got[1] == list(range(10, 20))
    assert got[2] == list(range(10))  # another store file: starts from EPOCH


@pytest.mark.cli_process
async def test_cli_store_in_use_is_a_usage_error(tmp_path):
    store = FilePublishStore(tmp_path / "p")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "client.cli", "pub", "t", "--publish-store",
            str(tmp_path / "p"), "--client-name", "x", stdin=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(b""), 20)
    finally:
        store.close()
    assert proc.returncode == 2
    assert "in use by another client" in err.decode() and err.decode().count("\n") == 1
