"""The client's State of the World calls (client/client_sow.py) and `tickertape sow` /
`tickertape sub --sow` against the real server."""

import asyncio
import json
import os

import pytest

from client import Client, CommandError
from tests.support.proc import TICKERTAPE, ServerProcess

pytestmark = pytest.mark.skipif(
    not os.path.exists(TICKERTAPE), reason="the tickertape console script is not installed"
)

SOW = "<SOW><Topic><Name>px</Name><Key>/sym</Key></Topic></SOW>"


@pytest.fixture(scope="module")
def sow_server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("client-sow"), extra=SOW, admin=False).start()
    yield s
    s.stop()


@pytest.fixture
def address(sow_server):
    return f"127.0.0.1:{sow_server.port}"


async def test_sow_query_delete_and_refusal(address):
    async with Client(f"c-sow-{os.urandom(3).hex()}", server=address) as c:
        await c.sow_delete("px", filter="1=1")
        for i, sym in enumerate(["A", "B", "C", "A"]):
            await c.publish("px", {"sym": sym, "v": i})
        await c.publish_flush()
        recs = await c.sow("px", order_by="/sym")
        assert [(m.json()["sym"], m.json()["v"]) for m in recs] == [("A", 3), ("B", 1), ("C", 2)]
        assert all(m.header.c == "sow" and m.header.k for m in recs)
        top = await c.sow("px", filter="/v > 1", top_n=1, order_by="/v DESC")
        assert [m.json()["v"] for m in top] == [3]
        assert await c.sow_delete("px", keys=[recs[1].header.k]) == 1
        assert await c.sow_delete("px", data=b'{"sym":"C"}') == 1
        assert [m.json()["sym"] for m in await c.sow("px")] == ["A"]
        with pytest.raises(CommandError) as info:
            await c.sow("not-sow")
        assert info.value.reason == "invalid topic"


async def test_sow_and_subscribe_yields_the_answer_then_live(address):
    p = f"S{os.urandom(3).hex()}"
    async with Client(f"c-sow-{p}", server=address) as c:
        await c.publish("px", {"sym": f"{p}-1", "v": 1})
        await c.publish_flush()
        sub = await c.sow_and_subscribe("px", filter=f"/sym LIKE '^{p}'")
        first = await sub.next(timeout=5)
        assert first.header.c == "sow" and first.json() == {"sym": f"{p}-1", "v": 1}
        await c.publish("px", {"sym": f"{p}-2", "v": 2})
        live = await sub.next(timeout=5)
        assert live.header.c == "p" and live.json() == {"sym": f"{p}-2", "v": 2}


async def test_sow_and_sow_and_subscribe_from_a_bookmark(address):
    p = f"H{os.urandom(3).hex()}"
    async with Client(f"c-sow-{p}", server=address) as c:
        await c.publish("px", {"sym": f"{p}-1", "v": 1})
        await c.publish_flush()
        (rec,) = await c.sow("px", filter=f"/sym = '{p}-1'")
        point = rec.header.bm
        await c.publish("px", {"sym": f"{p}-1", "v": 2})
        await c.publish("px", {"sym": f"{p}-2", "v": 3})
        await c.publish_flush()
        mine = f"/sym LIKE '^{p}'"
        then = await c.sow("px", filter=mine, bookmark=point)
        assert [m.json() for m in then] == [{"sym": f"{p}-1", "v": 1}]
        sub = await c.sow_and_subscribe("px", filter=mine, bookmark=point)
        got = [await sub.next(timeout=5) for _ in range(3)]
        assert [(m.header.c, m.json()["v"]) for m in got] == [("sow", 1), ("p", 2), ("p", 3)]
        await c.publish("px", {"sym": f"{p}-3", "v": 4})
        live = await sub.next(timeout=5)
        assert (live.header.c, live.json()["v"]) == ("p", 4)
        with pytest.raises(CommandError) as info:
            await c.sow_and_subscribe("px", filter=mine, bookmark="123|456|")
        assert info.value.reason == "invalid bookmark"


async def run_cli(*args):
    proc = await asyncio.create_subprocess_exec(
        TICKERTAPE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out, err.decode()


async def test_cli_sow_and_sub_sow(address):
    async with Client(f"c-sow-{os.urandom(3).hex()}", server=address) as c:
        await c.sow_delete("px", filter="1=1")
        for i in range(5):
            await c.publish("px", {"sym": f"Q{i}", "v": 10 + i})
        await c.publish_flush()
    status, out, err = await run_cli(
        "sow", "px", "--server", address, "--filter", "/v >= 10", "--order-by", "/v DESC",
        "--top-n", "2",
    )  # fmt: skip
    assert status == 0, err
    assert [json.loads(line)["v"] for line in out.splitlines()] == [14, 13]
    status, out, err = await run_cli(
        "sub", "px", "--sow", "--server", address, "--filter", "/v >= 13", "--count", "2",
        "--headers",
    )  # fmt: skip
    assert status == 0, err
    assert sorted(json.loads(line)["body"]["v"] for line in out.splitlines()) == [13, 14]
    assert all(json.loads(line)["k"] for line in out.splitlines())
