"""A client name belongs to the user that first published under it (finding 5), on a real
server with two users: alice may not log on with carol's client name while carol is offline
(she was told carol's sequence, published at 2^63-1 under carol's publisher id, and carol's
next publishes were acked `duplicate` and never stored). The binding is durable: it holds
across a restart. Without authentication nothing changes."""

from __future__ import annotations

from tests.security.servers import ports, secure_config, start, users_file
from tests.support.proc import ServerProcess
from tests.support.raw import Raw

PASSWORDS = {"alice": "alice-secret-1", "carol": "carol-secret-3"}
MAX_SEQ = (1 << 63) - 1


def auth_xml(directory) -> str:
    return (
        f"<Authentication><PasswordFile>{directory}/users.db</PasswordFile>"
        "<AllowAnonymous>false</AllowAnonymous></Authentication>"
    )


def logon(conn: Raw, name: str, user: str) -> dict:
    conn.send(
        {
            "c": "logon",
            "cid": "l",
            "client_name": name,
            "a": "processed",
            "user_id": user,
            "pw": PASSWORDS[user],
        }
    )
    return conn.ack("processed", "l")


def publish(conn: Raw, seq: int, body: bytes) -> dict:
    conn.send({"c": "publish", "t": "orders", "s": seq, "a": "persisted"}, body)
    return conn.ack("persisted")


def test_another_user_cannot_take_an_offline_publishers_name(tmp_path, pki):
    d = tmp_path / "srv"
    d.mkdir()
    users_file(d / "users.db", PASSWORDS)
    srv = start(d, secure_config(d, pki, authentication=auth_xml(d)))
    try:
        port = ports(srv)["plain"]
        carol = Raw(port)
        assert logon(carol, "carol-feed", "carol")["status"] == "success"
        assert publish(carol, 1, b'{"n":1}')["status"] == "success"
        carol.close()

        # carol is offline: alice tries her name, and is refused without learning her sequence
        alice = Raw(port)
        ack = logon(alice, "carol-feed", "alice")
        assert (ack["status"], ack["reason"]) == ("failure", "name in use")
        assert "s" not in ack or ack["s"] in (0, None)
        assert alice.closed()

        # the binding survives a restart (it is stored with the publisher's sequence)
        srv.restart()
        port = ports(srv)["plain"]
        alice = Raw(port)
        assert logon(alice, "carol-feed", "alice")["reason"] == "name in use"
        alice.close()

        # carol herself goes on where she was, and every publish of hers is stored
        carol = Raw(port)
        ack = logon(carol, "carol-feed", "carol")
        assert ack["status"] == "success" and ack["s"] == 1
        assert publish(carol, 2, b'{"n":2}')["status"] == "success"
        carol.close()
        r = Raw(port)
        assert logon(r, "alice-reader", "alice")["status"] == "success"
        r.send({"c": "subscribe", "t": "orders", "bm": "0", "cid": "r", "a": "completed"})
        got = r.recv_until(lambda h, b: h.get("c") == "ack" and h.get("a") == "completed")
        assert [b for h, b in got if h.get("c") == "p"] == [b'{"n":1}', b'{"n":2}']
        r.close()

        # a name nobody published under is free for anyone; alice's own name is hers
        alice = Raw(port)
        assert logon(alice, "alice-feed", "alice")["status"] == "success"
        assert publish(alice, MAX_SEQ, b"{}")["status"] == "success"
        alice.close()
        carol = Raw(port)
        assert logon(carol, "alice-feed", "carol")["reason"] == "name in use"
        carol.close()
    finally:
        srv.kill()


def test_without_authentication_a_name_is_not_bound(tmp_path):
    srv = ServerProcess(tmp_path / "srv").start()
    try:
        a = Raw(srv.port)
        assert a.logon("shared-name", user_id="carol")["status"] == "success"
        a.send({"c": "publish", "t": "orders", "s": 1, "a": "persisted"}, b"{}")
        assert a.ack("persisted")["status"] == "success"
        a.close()
        b = Raw(srv.port)
        ack = b.logon("shared-name", user_id="alice")
        assert ack["status"] == "success" and ack["s"] == 1
        b.close()
    finally:
        srv.kill()
