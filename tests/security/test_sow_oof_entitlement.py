"""Out-of-focus `entitlement` (docs/sow.md "Out of focus") on a real server with roles: an
update the subscriber's content entitlement does not admit gives `entitlement` with the last
message it was sent (never the new one), an update its own filter leaves out gives `match`, and
a reload of the roles (SIGHUP) whose filter leaves records out tells it of each of them."""

from __future__ import annotations

import json
import signal
import time

from tests.security.servers import secure_config, start, users_file
from tests.security.test_server_entitlements import ROLES, USERS, User, auth, entitlement

BOOK = "<Topic><Name>orders.book</Name><Key>/id</Key></Topic>"


def config(tmp_path, pki, roles: str = ROLES) -> str:
    xml = secure_config(
        tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement(roles)
    )
    return xml.replace("<SOW><Queue>", f"<SOW>{BOOK}<Queue>")


def oofs(user: User, n: int) -> list[tuple[str, dict]]:
    got: list[tuple[str, dict]] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        h, b = user.conn.recv()
        assert h.get("c") != "p", (h, b)  # nothing here is delivered as a message
        if h.get("c") == "oof":
            assert h["sub_id"] == "book"
            got.append((h["reason"], json.loads(b)))
    return got


def test_entitlement_out_of_focus_on_update_and_on_reload(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    server = start(tmp_path, config(tmp_path, pki))
    try:
        feeder = User(server, pki, "feeder")
        alice = User(server, pki, "alice")
        feeder.publish_all(
            "orders.book",
            [{"id": 1, "desk": "A", "px": 1}, {"id": 2, "desk": "A", "px": 2},
             {"id": 3, "desk": "A", "px": 500}, {"id": 4, "desk": "B", "px": 3}],
        )  # fmt: skip
        alice.conn.send({"c": "sow_and_subscribe", "t": "orders.book", "sub_id": "book",
                         "cid": "s", "f": "/px > 0", "o": "oof", "a": "completed"})  # fmt: skip
        frames = alice.conn.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == "s")
        assert sorted(json.loads(b)["id"] for h, b in frames if h["c"] == "sow") == [1, 2, 3]
        time.sleep(0.3)  # the subscription joins the live stream
        feeder.publish_all("orders.book", [{"id": 1, "desk": "B", "px": 9}])
        assert oofs(alice, 1) == [("entitlement", {"id": 1, "desk": "A", "px": 1})]
        feeder.publish_all("orders.book", [{"id": 2, "desk": "A", "px": -1}])
        assert oofs(alice, 1) == [("match", {"id": 2, "desk": "A", "px": -1})]
        # the reload narrows desk-a's filter: record 3 (px 500) leaves alice's scope
        roles = ROLES.replace("<Expression>/desk = 'A'</Expression></Filter>\n  </Role>",
                              "<Expression>/desk = 'A' AND /px &lt; 100</Expression></Filter>\n"
                              "  </Role>")  # fmt: skip
        assert roles != ROLES
        (tmp_path / "tickertape.xml").write_text(config(tmp_path, pki, roles))
        server.proc.send_signal(signal.SIGHUP)
        assert oofs(alice, 1) == [("entitlement", {"id": 3, "desk": "A", "px": 500})]
        assert alice.nothing_more() and alice.still_open()
        feeder.close()
        alice.close()
    finally:
        server.stop()
