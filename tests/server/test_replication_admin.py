"""A real server (in-process, in a thread of its own) with a sync destination that never answers:
publishers' `persisted` acks wait; the admin endpoint and `tickertape replication
downgrade|upgrade` change the destination's mode; /stats and /metrics show it. The senders are
not involved: nothing connects to the destination, so the gate sees it down from the start."""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest

from config.loader import load_config_text
from config.model import Replication, ReplicationAddress, ReplicationDestination, TopicSpec
from server.app import Server
from server.cli import build_parser
from server.stats_replication import (
    QUEUE_EVENT_METRICS,
    QUEUE_REPLICATION_METRICS,
    REPLICATION_METRICS,
    REPLICATION_TOTALS,
    SOURCE_METRICS,
)
from tests.support.proc import make_config
from tests.support.raw import Raw

DOC = Path(__file__).resolve().parents[2] / "docs" / "replication.md"


def destination(name: str, sync: bool, downgrade_after: float | None = None):
    return ReplicationDestination(
        name=name,
        group=name,
        sync=sync,
        addresses=(ReplicationAddress(host="127.0.0.1", port=9),),
        topics=(TopicSpec(name=".*"),),
        downgrade_after=downgrade_after,
    )


class Running:
    """A Server on its own loop in a thread; ports read once it listens."""

    def __init__(self, tmp_path, dests) -> None:
        cfg = load_config_text(make_config(str(tmp_path)))
        self.config = msgspec.structs.replace(cfg, replication=Replication(destinations=dests))
        self.loop = asyncio.new_event_loop()
        self.server = Server(self.config)
        started = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_until_complete(self.server.wait_stopped())

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        assert started.wait(20)
        self.port = self.server.addresses[0][2]
        admin = self.server.admin
        assert admin is not None
        self.admin = f"http://{admin.host}:{admin.port}"

    def call(self, fn):
        """Run fn() on the server's loop and return its result."""
        done = threading.Event()
        box: list = []
        self.loop.call_soon_threadsafe(lambda: (box.append(fn()), done.set()))
        assert done.wait(10)
        return box[0]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(), self.loop).result(30)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def running(tmp_path):
    made: list[Running] = []

    def make(*dests):
        r = Running(tmp_path / f"s{len(made)}", dests)
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop()


def post(url: str, header: bool = True) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"", method="POST")
    if header:
        req.add_header("X-Requested-By", "tickertape-console")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def publish(c: Raw, seq: int) -> None:
    c.send({"c": "publish", "t": "orders", "s": seq}, b"{}")


def no_ack(c: Raw, cid: str, wait: float = 0.5) -> bool:
    """True when no `persisted` ack for cid comes within `wait` seconds."""
    c.sock.settimeout(wait)
    try:
        c.ack("persisted", cid, timeout=wait)
    except TimeoutError:
        return True
    finally:
        c.sock.settimeout(10.0)
    return False


def cli(*argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["replication", *argv])
    out, err = io.StringIO(), io.StringIO()
    return args.run(args, out, err), out.getvalue(), err.getvalue()


def test_admin_downgrade_releases_held_acks_and_upgrade_holds_again(running):
    r = running(destination("b", True), destination("c", False))
    pub = Raw(r.port)
    pub.logon("publisher")
    cid = pub.next_cid()
    publish(pub, 1)
    pub.send({"c": "flush", "cid": cid, "a": "persisted"})
    assert no_ack(pub, cid)  # durable here, but b has not acked
    stats = json.loads(get(r.admin + "/stats"))["replication"]
    assert stats["held_batches"] >= 1
    b = stats["destinations"]["b"]
    assert b["mode"] == "sync" and b["connected"] is False and b["lag_messages"] == 1
    assert stats["destinations"]["c"]["mode"] == "async"

    assert post(r.admin + "/replication/b/downgrade", header=False)[0] == 403
    assert post(r.admin + "/replication/zz/downgrade")[0] == 404
    assert post(r.admin + "/replication/c/downgrade")[0] == 409  # async already
    code, text = post(r.admin + "/replication/b/downgrade")
    assert code == 200 and json.loads(text) == {"destination": "b", "mode": "downgraded"}
    assert pub.ack("persisted", cid, timeout=5)["a"] == "persisted"
    assert post(r.admin + "/replication/b/downgrade")[0] == 409

    metrics = get(r.admin + "/metrics")
    assert 'tickertape_replication_mode{destination="b",mode="downgraded"} 1' in metrics
    assert 'tickertape_replication_downgrades_total{destination="b"} 1' in metrics
    assert 'tickertape_replication_connected{destination="b"} 0' in metrics

    # upgraded by the CLI: the next publish waits again
    status, out, err = cli("upgrade", "b", "--admin", r.admin)
    assert status == 0 and "destination b is sync now" in out, err
    cid = pub.next_cid()
    publish(pub, 2)
    pub.send({"c": "flush", "cid": cid, "a": "persisted"})
    assert no_ack(pub, cid)
    status, out, _ = cli("downgrade", "b", "--admin", r.admin)
    assert status == 0 and "async (downgraded)" in out
    assert pub.ack("persisted", cid, timeout=5)["a"] == "persisted"
    status, _, err = cli("downgrade", "nope", "--admin", r.admin)
    assert status == 1 and "404" in err and "no replication destination named nope" in err
    pub.close()


def test_downgrade_after_releases_by_itself(running):
    r = running(destination("b", True, downgrade_after=0.5))
    pub = Raw(r.port)
    pub.logon("publisher")
    cid = pub.next_cid()
    publish(pub, 1)
    pub.send({"c": "flush", "cid": cid, "a": "persisted"})
    assert pub.ack("persisted", cid, timeout=5)["a"] == "persisted"  # after ~0.5 s
    assert r.call(lambda: r.server.gate.dests["b"].mode) == "downgraded"
    pub.close()


def test_cli_cannot_reach_the_endpoint():
    status, _, err = cli("downgrade", "b", "--admin", "http://127.0.0.1:9")
    assert status == 1 and "cannot reach the admin endpoint" in err


def test_cli_password_file_needs_user(tmp_path):
    (tmp_path / "pw").write_text("secret\n")
    status, _, err = cli("downgrade", "b", "--password-file", str(tmp_path / "pw"))
    assert status == 2 and "--password-file needs --user" in err


def test_the_docs_list_every_replication_metric():
    text = DOC.read_text()
    names = ["tickertape_replication_held_batches", "tickertape_replication_mode"]
    names += [f"tickertape_{m}" for _k, m, _h in REPLICATION_METRICS + SOURCE_METRICS]
    names += [f"tickertape_{m}" for _k, m, _h in REPLICATION_TOTALS + QUEUE_EVENT_METRICS]
    queue_names = [
        f"tickertape_queue_{k}" + ("" if t == "gauge" else "_total")
        for k, t, _h in QUEUE_REPLICATION_METRICS
    ]
    missing = [n for n in names + queue_names if n not in text]
    assert not missing, missing
    documented = set(re.findall(r"tickertape_replication_\w+", text))
    assert documented <= set(names), documented - set(names)
