"""A failed write of the SOW store, against a real server (docs/sow.md, "A failed store
write"): the store's directory is a small tmpfs of its own, filled while the server runs, so
LMDB's writes fail with ENOSPC while the journal (on another filesystem) goes on. Queries,
`sow_and_subscribe` and `delta_publish` are then refused with `catching up` and why, /stats
shows it under `sow.failed`, publishes are still acknowledged `persisted`; once the space is
back, a restart folds the journal into the store from before the lost updates and answers
exactly as a fold of the journal does."""

import json
import os
import struct
import time
import urllib.request

from server.sow.keys import KeyMaker
from tests.e2e.test_sow_consistency import answer, fold
from tests.support.disk import fill, mount_tmpfs, unmount
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

SOW = """<SOW><Topic><Name>ticks</Name><Key>/k</Key></Topic></SOW>"""


def frames(start: int, n: int, keys: int, pad: int = 0, into: dict | None = None) -> bytes:
    """Publishes start..start+n-1 to `ticks`, seq mod `keys` as the key, `pad` bytes of filler;
    `into`: record key -> seq, the state they leave (as `answer` gives it)."""
    out = []
    maker = KeyMaker(("/k",))
    for seq in range(start, start + n):
        if into is not None:
            into[maker.key(b'{"k":%d}' % (seq % keys), None)] = seq
        body = json.dumps({"k": seq % keys, "n": seq, "pad": "x" * pad}).encode()
        h = json.dumps({"c": "publish", "t": "ticks", "s": seq}).encode()
        out.append(struct.pack(">I", len(h) + len(body)) + h + body)
    return b"".join(out)


def persisted(c: Raw, data: bytes) -> dict:
    c.send_raw(data)
    cid = c.next_cid()
    c.send({"c": "flush", "cid": cid, "a": "persisted"})
    return c.ack("persisted", cid, timeout=30)


def sow_stats(srv: ServerProcess) -> dict:
    url = f"http://127.0.0.1:{srv.admin_port}/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["sow"]


def refused(c: Raw, header: dict, body: bytes = b"") -> dict:
    c.send(header, body)
    got = c.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == header["cid"])
    ack = got[-1][0]
    assert not [h for h, _b in got if h.get("c") in ("sow", "p")], got
    return ack


def test_a_failed_store_write_refuses_queries_until_a_restart_catches_up(tmp_path):
    store = tmp_path / "journal" / "sow"
    mount_tmpfs(store, "16m")  # the store alone: the journal stays on the test's disk
    srv = ServerProcess(tmp_path, extra=SOW)
    try:
        srv.start()  # ... a restart folds the journal in again from before the lost updates
        c = Raw(srv.port, timeout=30)
        c.logon("loader")
        state: dict[str, int] = {}
        assert persisted(c, frames(1, 500, 50, into=state))["status"] == "success"
        assert answer(srv.port, "ticks") == state
        assert sow_stats(srv)["failed"] is None

        fill(store / "filler")  # the store's disk is full from here on
        # new keys with large bodies: the store must grow, the journal takes them as before
        assert persisted(c, frames(501, 400, 10_000, pad=8000, into=state))["status"] == "success"
        deadline = time.monotonic() + 20
        while sow_stats(srv)["failed"] is None:  # the held rows are written within 0.25 s
            assert time.monotonic() < deadline, "the store's failed write was not reported"
            time.sleep(0.1)
        why = sow_stats(srv)["failed"]
        assert "writing updates failed" in why and "space" in why.lower(), why

        q = Raw(srv.port, timeout=30)
        q.logon("reader")
        for header, body in [
            ({"c": "sow", "t": "ticks", "cid": "q1", "a": "completed"}, b""),
            (
                {"c": "sow_and_subscribe", "t": "ticks", "cid": "q2", "sub_id": "w"},
                b"",
            ),
            ({"c": "delta_publish", "t": "ticks", "cid": "q3", "s": 1, "a": "processed"}, b""),
        ]:
            if header["c"] == "delta_publish":
                body = b'{"k":1,"extra":"d"}'
            ack = refused(q, header, body)
            assert ack["status"] == "failure" and ack["reason"] == "catching up", ack
            assert "failed to write" in ack["detail"] and "restart" in ack["detail"], ack
        # publishes go on into the journal
        assert persisted(c, frames(901, 100, 50, into=state))["status"] == "success"
        c.close()
        q.close()

        # once failed, the store is not written again (a restart folds every update in): one
        # error in the log, not one per flush while the disk stays full
        time.sleep(0.5)
        logged = [line for line in srv.lines if "writing deferred updates failed" in line]
        assert len(logged) == 1, logged

        # a restart while the disk is still full: the catch-up fails the same way; the server
        # serves publishes and refuses queries, saying why (it does not die at start)
        srv.stop()
        srv.port = None
        srv.start()
        assert srv.port is not None and srv.proc.poll() is None, srv.output()
        why = sow_stats(srv)["failed"]
        assert why is not None and "catching up from the journal failed" in why, why
        q = Raw(srv.port, timeout=30)
        q.logon("reader")
        ack = refused(q, {"c": "sow", "t": "ticks", "cid": "q4", "a": "completed"})
        assert ack["status"] == "failure" and ack["reason"] == "catching up", ack
        q.close()
        c = Raw(srv.port, timeout=30)
        c.logon("loader")
        assert persisted(c, frames(1001, 100, 50, into=state))["status"] == "success"
        c.close()

        os.remove(store / "filler")  # the cause is removed; the store stays failed until...
        assert sow_stats(srv)["failed"] is not None
        srv.stop()
        assert fold(str(tmp_path / "journal"), "ticks") == state
        srv.port = None
        srv.start()  # ... a restart folds the journal in again from before the lost updates
        assert srv.port is not None and srv.proc.poll() is None, srv.output()
        assert sow_stats(srv)["failed"] is None
        assert len(state) == 50 + 400
        assert answer(srv.port, "ticks") == state
    finally:
        srv.kill()
        unmount(store)
