"""<IdlePoll>: after input the server polls for a bounded time instead of sleeping, then stops;
0 turns it off. Seen through the idle_poll_rounds counter in /stats."""

import json
import time
import urllib.request

from tests.support.proc import ServerProcess
from tests.support.raw import Raw


def _rounds(srv) -> int:
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats").read())[
        "idle_poll_rounds"
    ]


def _talk(srv) -> None:
    c = Raw(srv.port)
    c.logon("poller")
    for i in range(20):
        c.send({"c": "heartbeat"})
        c.send({"c": "flush", "cid": f"f{i}", "a": "completed"})
        c.ack("completed", f"f{i}")
    c.close()


def test_polls_after_input_then_sleeps(tmp_path):
    with ServerProcess(tmp_path, extra="<IdlePoll>3ms</IdlePoll>") as srv:
        _talk(srv)
        time.sleep(0.05)
        after = _rounds(srv)
        assert after > 0  # it polled after the input
        time.sleep(0.2)
        assert _rounds(srv) == after  # and stopped: no input, no polling


def test_zero_turns_it_off(tmp_path):
    with ServerProcess(tmp_path, extra="<IdlePoll>0</IdlePoll>") as srv:
        _talk(srv)
        assert _rounds(srv) == 0
