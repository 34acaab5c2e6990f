"""A reload of the roles (SIGHUP) re-grants each open subscription with the right it was made
with (server/session_rights.py): a bookmark subscription needs `replay` still, even after its
replay has joined the live stream, while a plain subscription on the same topic needs only
`subscribe`."""

from __future__ import annotations

import signal

from tests.security.servers import secure_config, start, users_file
from tests.security.test_server_entitlements import ROLES, USERS, User, auth, entitlement


def test_a_reload_that_revokes_replay_ends_a_running_replay(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    config = secure_config(tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement())
    server = start(tmp_path, config)
    try:
        feeder = User(server, pki, "feeder")
        alice = User(server, pki, "alice")
        feeder.publish_all("orders.rr", [{"desk": "A", "n": 1}])
        ok = alice.request(
            {"c": "subscribe", "t": "orders.rr", "bm": "0", "sub_id": "r"}, ack="completed"
        )
        assert ok["status"] == "success"
        assert [d["n"] for d in alice.bodies(1)] == [1]
        assert alice.request({"c": "subscribe", "t": "orders.rr", "sub_id": "l"})["status"] == (
            "success"
        )
        # alice keeps subscribe on orders.* and loses replay
        roles = ROLES.replace(r"<Replay>orders\..*</Replay>", "")
        (tmp_path / "tickertape.xml").write_text(
            secure_config(
                tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement(roles)
            )
        )
        server.proc.send_signal(signal.SIGHUP)
        ended = alice.conn.ack("processed", timeout=10)
        assert (ended["status"], ended["reason"], ended["sub_id"]) == (
            "failure",
            "not entitled",
            "r",
        )
        server.wait_for_log(r"subscription r on orders\.rr ended by a reload of the roles")
        feeder.publish_all("orders.rr", [{"desk": "A", "n": 2}])
        [(header, _)] = alice.conn.messages(1)
        assert header["sids"] == "l"  # the plain one stays; the replay is gone
        assert alice.nothing_more() and alice.still_open()
        feeder.close()
        alice.close()
    finally:
        server.stop()
