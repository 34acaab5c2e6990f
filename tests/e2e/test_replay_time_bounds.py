"""Time bookmarks at their exact boundaries (docs/protocol.md §5), against a real server: a time
equal to a message's own receive time. `[` and a time start at the first message at or after
it, `(` and a plain time bookmark just after it; `]` includes a message received at the end
time, `)` stops before it. Each message here has a receive time of its own (one commit each)."""

import json
import time

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

N = 6


@pytest.fixture(scope="module")
def stamped(tmp_path_factory):
    """A server holding messages 1..N on `tb`, and each message's receive time (`ts`)."""
    srv = ServerProcess(tmp_path_factory.mktemp("timebounds"), topics=("tb",))
    srv.start()
    pub = Raw(srv.port)
    pub.logon("tb-pub")
    for i in range(1, N + 1):
        publish_many(srv.port, "tb", [json.dumps({"i": i})], start_seq=i, conn=pub)
        time.sleep(0.003)  # the next commit gets a later microsecond
    pub.close()
    c, ids, stamps = replay(srv, "0", "stamps")
    c.close()
    assert ids == list(range(1, N + 1))
    assert len(set(stamps)) == N, f"two messages share a receive time: {stamps}"
    srv.ts = dict(zip(ids, stamps, strict=True))
    yield srv
    srv.stop()


def replay(srv, bm: str, name: str) -> tuple[Raw, list[int], list[str]]:
    """Subscribe to `tb` with `bm` (and the `timestamp` option) until `completed`: the
    connection, the delivered ids and their `ts`."""
    c = Raw(srv.port)
    c.logon(name)
    c.send(
        {"c": "subscribe", "t": "tb", "bm": bm, "cid": "s", "a": "processed,completed",
         "o": "timestamp"}
    )  # fmt: skip
    frames = c.recv_until(
        lambda h, b: h.get("a") == "completed" or h.get("status") == "failure", timeout=20
    )
    assert not [h for h, _ in frames if h.get("status") == "failure"], frames
    delivered = [(json.loads(b)["i"], h["ts"]) for h, b in frames if h["c"] == "p"]
    return c, [i for i, _ in delivered], [ts for _, ts in delivered]


@pytest.mark.parametrize(
    "left,right,expect",
    [("[", "]", [2, 3, 4, 5]), ("[", ")", [2, 3, 4]), ("(", "]", [3, 4, 5]), ("(", ")", [3, 4])],
)
def test_a_time_range_at_its_messages_own_times(stamped, left, right, expect):
    """Fails if a time end is always inclusive (`)` would deliver 5), or if the inclusive and
    exclusive time starts are swapped."""
    bm = f"{left}{stamped.ts[2]}:{stamped.ts[5]}{right}"
    c, ids, _ = replay(stamped, bm, f"tr{left}{right}")
    c.close()
    assert ids == expect, f"{bm} delivered {ids}"


def test_a_time_bookmark_starts_after_a_message_at_that_time(stamped):
    """A plain time bookmark starts at the first message received *after* the time: a message
    received at exactly that microsecond was already there and is not replayed."""
    c, ids, _ = replay(stamped, stamped.ts[3], "tplain")
    c.close()
    assert ids == [4, 5, 6]


@pytest.mark.parametrize("left", ["[", "("])
def test_a_range_that_ends_now_completes_at_the_live_end(stamped, left):
    """`0|1|` as a range's end is the live end when the range began: the range completes there,
    without waiting for a message stored after it (there was none here: it never completed)."""
    c, ids, _ = replay(stamped, f"{left}{stamped.ts[4]}:0|1|)", f"tnow{left}")
    c.close()
    assert ids == ([4, 5, 6] if left == "[" else [5, 6])
