"""Out-of-focus notices reach a client's subscription (client/client_sow.py) from a real
server: a `sow_and_subscribe` with the `oof` option gets the answer, then a change, then an
`oof` Message (`header.c == "oof"`, its `k` and `reason`) when a record it was sent is deleted,
in order, through the Client and the HAClient alike."""

import asyncio
import os

import pytest

from client import Client, HAClient
from tests.support.proc import TICKERTAPE, ServerProcess

pytestmark = pytest.mark.skipif(
    not os.path.exists(TICKERTAPE), reason="the tickertape console script is not installed"
)

SOW = "<SOW><Topic><Name>desk</Name><Key>/id</Key></Topic></SOW>"


async def test_oof_notices_reach_the_subscription(tmp_path):
    srv = ServerProcess(tmp_path, extra=SOW).start()
    addr = f"127.0.0.1:{srv.port}"
    try:
        async with Client("oof-pub", server=addr) as pub:
            await pub.publish("desk", {"id": 1, "px": 1})
            await pub.publish("desk", {"id": 2, "px": 2})
            await pub.publish_flush()
            async with Client("oof-sub", server=addr) as c:
                sub = await c.sow_and_subscribe("desk", options="oof", filter="/px < 10")
                ha = HAClient("oof-ha", servers=[addr])
                await ha.connect_and_logon()
                hs = await ha.sow_and_subscribe("desk", options="oof", filter="/px < 10")
                for s in (sub, hs):
                    answer = [await s.next(timeout=10) for _ in range(2)]
                    assert [m.header.c for m in answer] == ["sow", "sow"]  # type: ignore[union-attr]
                await sub.completed.wait()
                await asyncio.sleep(0.3)  # both join the live stream (a replay gets no notice)
                k1 = next(m.header.k for m in answer if m.json()["id"] == 1)  # type: ignore[union-attr]
                await pub.publish("desk", {"id": 2, "px": 3})
                await pub.publish("desk", {"id": 2, "px": 30})  # out of the filter: oof match
                await pub.publish_flush()
                assert await pub.sow_delete("desk", keys=[k1]) == 1
                for s in (sub, hs):
                    got = [await s.next(timeout=10) for _ in range(3)]
                    seen = [(m.header.c, m.header.reason, m.json()) for m in got]  # type: ignore[union-attr]
                    assert seen == [
                        ("p", None, {"id": 2, "px": 3}),
                        ("oof", "match", {"id": 2, "px": 30}),
                        ("oof", "deleted", {"id": 1, "px": 1}),
                    ]
                await ha.close()
    finally:
        srv.stop()
