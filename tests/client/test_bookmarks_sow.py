"""The SOW recovery point adapter (client/bookmarks_sow.py) against a real server: a subscriber
process keeps its recovery point in a SOW topic, discards some messages (one out of order) and
is killed with SIGKILL; a new client with another store on the same topic, as on another
machine with no file, resumes exactly: every message not discarded once, none discarded."""

import asyncio
import json
import os
import subprocess
import sys

import pytest

from client import MOST_RECENT, Client, HAClient, SowBookmarkStore
from tests.support.proc import TICKERTAPE, ServerProcess
from tests.support.raw import publish_many

pytestmark = pytest.mark.skipif(
    not os.path.exists(TICKERTAPE), reason="the tickertape console script is not installed"
)

SOW = """<SOW><Topic><Name>/ADMIN/bookmark_store</Name><Key>/clientName</Key><Key>/subId</Key>
  </Topic></SOW>"""

# the first subscriber: discards 1..5 and 7 (not 6, not 8..10), writes its point, waits
FIRST = """
import asyncio, json, sys
from client import MOST_RECENT, Client, HAClient, SowBookmarkStore

async def main(addr):
    async with Client("bm-writer-1", server=addr) as writer:
        store = await SowBookmarkStore.open(writer, "desk-sub")
        ha = HAClient("desk-sub", servers=[addr], bookmark_store=store)
        await ha.connect_and_logon()
        sub = await ha.subscribe("ticks", bookmark=MOST_RECENT, sub_id="s1")
        got = [await sub.next(timeout=10) for _ in range(10)]
        for m in got:
            if json.loads(m.body)["i"] in (1, 2, 3, 4, 5, 7):
                sub.discard(m)
        await store.flush()
        print("ready", flush=True)
        await asyncio.sleep(60)

asyncio.run(main(sys.argv[1]))
"""


async def _resume(addr: str) -> tuple[list[int], dict]:
    async with Client("bm-writer-2", server=addr) as writer:
        store = await SowBookmarkStore.open(writer, "desk-sub")
        ha = HAClient("desk-sub", servers=[addr], bookmark_store=store)
        await ha.connect_and_logon()
        try:
            sub = await ha.subscribe("ticks", bookmark=MOST_RECENT, sub_id="s1")
            got = []
            while True:
                try:
                    m = await sub.next(timeout=1.5)
                except TimeoutError:
                    break
                assert m is not None
                got.append(json.loads(m.body)["i"])
                sub.discard(m)
            await store.flush()
            record = store.record("s1")
        finally:
            await ha.close()
    return got, record or {}


def test_a_restarted_client_resumes_from_the_sow_recovery_point(tmp_path):
    s = ServerProcess(tmp_path, extra=SOW).start()
    proc = None
    try:
        publish_many(s.port, "ticks", [json.dumps({"i": i}) for i in range(1, 11)], name="tk")
        addr = f"127.0.0.1:{s.port}"
        proc = subprocess.Popen(
            [sys.executable, "-c", FIRST, addr], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.kill()  # SIGKILL: nothing more is written
        proc.wait(10)
        publish_many(s.port, "ticks", [json.dumps({"i": 11})], name="tk2")
        got, record = asyncio.run(_resume(addr))
        assert got == [6, 8, 9, 10, 11]  # not 1..5 nor 7 (discarded), each other once
        assert record["clientName"] == "desk-sub" and record["discarded"] == []
        # the point written after the resume: a third client gets nothing more
        assert asyncio.run(_resume(addr))[0] == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        s.stop()
