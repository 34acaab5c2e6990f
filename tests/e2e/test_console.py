"""The web console on the admin endpoint (docs/console.md), against a real server process:
its static files, and its `/events` stream (the hour ring first, then a sample a second)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.support.proc import ServerProcess
from tests.support.raw import Raw, publish_many

SAMPLE_KEYS = {
    "t",
    "n",
    "publish_per_s",
    "delivery_per_s",
    "replay_per_s",
    "queue_ack_per_s",
    "queue_delivery_per_s",
    "commit_latency_s",
    "connections",
    "subscriptions",
    "journal_bytes",
    "disk_free_bytes",
    "cpu_percent",
    "rss_bytes",
}


class Events:
    """A raw `GET /events` reader: (event name, decoded JSON data) one at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(
            b"GET /events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: text/event-stream\r\n\r\n"
            % port
        )
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200"), head
        assert b"Content-Type: text/event-stream" in head

    def _until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("event stream closed")
            self.buf += chunk
        out, self.buf = self.buf.split(sep, 1)
        return out

    def next(self) -> tuple[str, object]:
        while True:
            block = self._until(b"\n\n").decode()
            fields = dict(
                line.split(": ", 1) for line in block.split("\n") if not line.startswith(":")
            )
            if "event" in fields:
                return fields["event"], json.loads(fields["data"])

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    """One server for the tests that only look at their own clients and topics (a start is
    most of such a test); `started` is when it began (the samples ring fills a second each)."""
    s = ServerProcess(tmp_path_factory.mktemp("console") / "srv")
    s.start()
    s.started = time.monotonic()
    yield s
    s.stop()


def test_console_files_are_served(console):
    server = console
    base = f"http://127.0.0.1:{server.admin_port}"
    for path, ctype, marker in (
        ("/", "text/html", b'<script src="console.js">'),
        ("/console.js", "text/javascript", b'new EventSource("events")'),
        ("/console.css", "text/css", b"prefers-color-scheme: dark"),
    ):
        with urllib.request.urlopen(base + path, timeout=10) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith(ctype)
            assert marker in r.read()


def test_an_open_page_does_not_keep_the_server_from_stopping(server):
    ev = Events(server.admin_port)
    assert ev.next()[0] == "history"
    assert server.stop() == 0
    ev.close()


def test_subscriptions_show_state_filter_and_lag(console):
    server = console
    publish_many(server.port, "console.s", ['{"i":1}'] * 200, name="console-s-pub").close()
    c = Raw(server.port)
    c.logon("console-sub")
    c.subscribe("console.s", sub_id="live-one", f="/i = 1")
    c.subscribe("console.s", sub_id="paused-one", bm="0", o="pause")
    ev = Events(server.admin_port)
    ev.next()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, data = ev.next()
        rows = {s["sub_id"]: s for s in data["subscriptions"] if s["client"] == "console-sub"}  # type: ignore[index]
        if len(rows) == 2:
            break
    else:
        raise AssertionError("the subscriptions never showed")
    live, paused = rows["live-one"], rows["paused-one"]
    assert live["state"] == "live" and live["filter"] == "/i = 1" and live["lag_bytes"] == 0
    assert paused["state"] == "paused" and paused["options"] == "pause"
    assert paused["position"] == 0 and paused["lag_bytes"] > 200 * 7
    c.close()
    ev.close()


def _queue(ev: Events, name: str, pred) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _, data = ev.next()
        q = data["queues"].get(name)  # type: ignore[index]
        if q is not None and pred(q):
            return q
    raise AssertionError(f"queue {name} never showed what was waited for")


def test_queue_depth_falls_as_a_consumer_acknowledges(tmp_path):
    queue = (
        "<SOW><Queue><Name>jobs</Name><UnderlyingTopic>work</UnderlyingTopic>"
        "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue></SOW>"
    )
    with ServerProcess(tmp_path / "q", extra=queue) as srv:
        publish_many(srv.port, "work", ["{}"] * 5, name="console-q-pub").close()
        ev = Events(srv.admin_port)
        assert ev.next()[0] == "history"
        time.sleep(1.2)
        q = _queue(ev, "jobs", lambda q: q["depth"] == 5)
        assert {"leased", "acked", "acked_per_s", "redelivered", "expired", "dead_lettered"} <= set(
            q
        )
        assert q["oldest_age_s"] >= 1.0 and q["consumers"] == []
        c = Raw(srv.port)
        c.logon("console-consumer")
        c.send({"c": "subscribe", "t": "jobs", "cid": "q", "a": "processed", "o": "max_backlog=10"})
        assert c.ack("processed", "q")["status"] == "success"
        got = c.messages(5)
        q = _queue(ev, "jobs", lambda q: q["leased"] == 5)
        assert q["oldest_age_s"] is None  # all leased: none waits
        (consumer,) = q["consumers"]
        assert consumer["outstanding"] == 5 and consumer["max_backlog"] == 10
        assert "console-consumer" in consumer["consumer"] and consumer["sub_id"]
        bms = ",".join(h["bm"] for h, _ in got)
        c.send({"c": "sow_delete", "t": "jobs", "bm": bms, "cid": "k", "a": "processed"})
        assert c.ack("processed", "k")["status"] == "success"
        q = _queue(ev, "jobs", lambda q: q["depth"] == 0 and q["acked"] == 5)
        assert q["leased"] == 0 and q["consumers"][0]["outstanding"] == 0
        c.close()
        ev.close()


def _post(port: int, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method="POST", headers=headers, data=b""
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_disconnect_action(console):
    server = console
    c = Raw(server.port)
    c.logon("console-victim")
    ev = Events(server.admin_port)
    ev.next()
    deadline = time.monotonic() + 10
    mine: list = []
    while not mine and time.monotonic() < deadline:
        _, data = ev.next()
        mine = [cl for cl in data["clients"] if cl["name"] == "console-victim"]  # type: ignore[index]
    assert mine, "the client never showed"
    path = f"/clients/{mine[0]['id']}/disconnect"
    action = {"X-Requested-By": "tickertape-console"}
    # without the header a page of another site could send it: refused, nothing done
    assert _post(server.admin_port, path, {})[0] == 403
    assert not c.closed(timeout=0.3)
    assert _post(server.admin_port, "/clients/999999/disconnect", action)[0] == 404
    assert _post(server.admin_port, "/clients/x/disconnect", action)[0] == 404
    status, body = _post(server.admin_port, path, action)
    assert status == 200 and b"console-victim" in body
    assert c.closed()
    server.wait_for_log(r"disconnect: .*console-victim.* reason=admin")
    server.wait_for_log(r"admin: disconnected .*console-victim")
    assert _post(server.admin_port, path, action)[0] == 404  # gone already
    ev.close()


def test_events_history_then_live_samples_with_details(console):
    server = console
    # a few samples in the ring before the page opens: the server has run 2.5 s at least
    time.sleep(max(0.0, console.started + 2.5 - time.monotonic()))
    ev = Events(server.admin_port)
    name, history = ev.next()
    assert name == "history" and isinstance(history, list) and len(history) >= 2
    assert SAMPLE_KEYS <= set(history[-1])
    assert [s["n"] for s in history] == list(range(history[0]["n"], history[-1]["n"] + 1))

    opened = time.time()
    c = publish_many(server.port, "console.t", ["{}"] * 3000, name="console-pub")
    deadline = time.monotonic() + 15
    busy = None
    while time.monotonic() < deadline:
        name, data = ev.next()
        assert name == "sample"
        assert isinstance(data, dict) and SAMPLE_KEYS <= set(data["sample"])
        mine = [cl for cl in data["clients"] if cl["name"] == "console-pub"]
        if data["sample"]["publish_per_s"] > 0 and mine:
            busy = data
            break
    assert busy is not None, "no sample showed the publishes and the publisher"
    client = next(cl for cl in busy["clients"] if cl["name"] == "console-pub")
    assert client["messages_in"] >= 3000 and client["transport"] == "json-tcp"
    assert client["bytes_in"] > 3000 * 20 and client["behind"] is False
    assert opened - 1 <= client["logon_time"] <= time.time()  # wall-clock seconds
    assert client["peer"].startswith("127.0.0.1:")
    assert busy["instance"] == "tt-test" and busy["sample"]["journal_bytes"] > 0
    assert busy["segments"] and busy["segments"][-1]["kind"] == "active"
    c.close()

    # a page opened late reads the publishes in the ring; the publisher is gone from the clients
    late = Events(server.admin_port)
    name, history = late.next()
    # (its own publishes: the module's other tests published before it opened)
    assert name == "history" and any(s["publish_per_s"] > 0 for s in history if s["t"] >= opened)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        name, data = late.next()
        if not any(cl["name"] == "console-pub" for cl in data["clients"]):  # type: ignore[index]
            break
    else:
        raise AssertionError("the closed client stayed in the clients view")
    ev.close()
    late.close()


def test_run_a_journal_action_now(tmp_path):
    """An hourly action (not due during the test) is listed with its next run, and runs when the
    console asks: the header guard, 404 for an unknown name, then it runs and says so."""
    actions = """<Actions><Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>1h</Every><Name>nightly</Name></Options></On>
      <Do><Module>amps-action-do-remove-journal</Module><Options><Age>7d</Age></Options></Do>
    </Action></Actions>"""
    with ServerProcess(tmp_path / "a", extra=actions) as srv:
        ev = Events(srv.admin_port)
        assert ev.next()[0] == "history"
        _, data = ev.next()
        (nightly,) = data["actions"]  # type: ignore[index]
        assert nightly["name"] == "nightly" and nightly["steps"] == ["remove-journal"]
        assert nightly["last"] is None and nightly["next_run"] > time.time()
        action = {"X-Requested-By": "tickertape-console"}
        assert _post(srv.admin_port, "/actions/nightly/run", {})[0] == 403
        assert _post(srv.admin_port, "/actions/nope/run", action)[0] == 404
        status, body = _post(srv.admin_port, "/actions/nightly/run", action)
        assert status == 200 and json.loads(body) == {"started": "nightly"}
        srv.wait_for_log(r"admin: ran action nightly")
        srv.wait_for_log(r"action nightly: remove-journal: nothing removed")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            _, data = ev.next()
            (nightly,) = data["actions"]  # type: ignore[index]
            if nightly["last"] is not None and nightly["last"]["ended"] is not None:
                break
        last = nightly["last"]
        assert last["ok"] is True and last["result"].startswith("remove-journal: nothing removed")
        assert nightly["next_run"] > time.time()  # the schedule is unchanged
        ev.close()


def test_a_held_step_says_why_in_the_log_the_stats_and_the_console(tmp_path):
    """remove-journal finds an old segment it cannot remove (nothing is archived): the step is
    held, and its reason is in the log (WARNING), in /stats (`maintenance`) and in the console's
    details of the action's last run."""
    actions = """<Actions><Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>1h</Every><Name>nightly</Name></Options></On>
      <Do><Module>amps-action-do-remove-journal</Module><Options><Age>0s</Age></Options></Do>
    </Action></Actions>"""
    with ServerProcess(tmp_path / "h", extra=actions, journal_size="64KB") as srv:
        pad = "y" * 200
        publish_many(srv.port, "console.t", [f'{{"p":"{pad}"}}'] * 600, name="held-pub").close()
        action = {"X-Requested-By": "tickertape-console"}
        assert _post(srv.admin_port, "/actions/nightly/run", action)[0] == 200
        line = srv.wait_for_log(r"action nightly: remove-journal held: ")
        assert "WARNING" in line and line.endswith(".seg is not archived"), line
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.admin_port}/stats", timeout=10) as r:
            maint = json.loads(r.read())["maintenance"]
        (held,) = maint["held"]
        assert held.startswith("nightly: remove-journal: ") and held.endswith("is not archived")
        (nightly,) = maint["actions"]
        (step,) = nightly["last"]["steps"]
        assert step["step"] == "remove-journal" and step["ok"] is True
        assert step["held"].endswith("is not archived")
        ev = Events(srv.admin_port)
        assert ev.next()[0] == "history"
        _, data = ev.next()
        (shown,) = data["actions"]  # type: ignore[index]
        assert shown["last"]["held"] == [f"remove-journal: {step['held']}"]
        ev.close()


def test_segments_show_their_time_ranges(tmp_path):
    """Small segments: each shows the receive time of its first message, and a sealed one the
    next one's first as its end; the active one ends now."""
    before_us = int(time.time() * 1e6)
    with ServerProcess(tmp_path / "j", journal_size="64KB") as srv:
        pad = "y" * 200
        publish_many(srv.port, "console.t", [f'{{"p":"{pad}"}}'] * 1500, name="seg-pub").close()
        ev = Events(srv.admin_port)
        assert ev.next()[0] == "history"
        deadline = time.monotonic() + 15
        segs: list = []
        while time.monotonic() < deadline:
            _, data = ev.next()
            segs = data["segments"]  # type: ignore[index]
            if len(segs) >= 3 and all(s["first_time_us"] for s in segs):
                break
        else:
            raise AssertionError(f"segments without a time range: {segs}")
        after_us = int(time.time() * 1e6)
        for s, nxt in zip(segs, segs[1:], strict=False):
            assert s["kind"] == "sealed" and s["until_time_us"] == nxt["first_time_us"]
            assert before_us <= s["first_time_us"] <= s["until_time_us"] <= after_us
        assert segs[-1]["kind"] == "active" and segs[-1]["until_time_us"] is None
        ev.close()


def test_a_client_past_the_offline_threshold_is_falling_behind(tmp_path):
    """A subscriber that does not read: once its output waiting passes <ClientOfflineThreshold>
    the clients view says it is falling behind."""
    with ServerProcess(
        tmp_path / "slow", extra="<ClientOfflineThreshold>64KB</ClientOfflineThreshold>"
    ) as srv:
        sub = Raw(srv.port)
        sub.logon("console-slow")
        sub.subscribe("console.big")
        body = json.dumps({"p": "z" * 1000})
        publish_many(srv.port, "console.big", [body] * 20000, name="big-pub").close()
        ev = Events(srv.admin_port)
        assert ev.next()[0] == "history"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            _, data = ev.next()
            slow = [cl for cl in data["clients"] if cl["name"] == "console-slow"]  # type: ignore[index]
            if slow and slow[0]["behind"]:
                break
        else:
            raise AssertionError("the subscriber that does not read never showed as behind")
        assert slow[0]["output_buffer_bytes"] > 64 * 1024
        sub.close()
        ev.close()
