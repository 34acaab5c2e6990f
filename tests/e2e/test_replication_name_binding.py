"""A client name bound to a user on one instance is bound on its replication peers too (issue
23; docs/security.md "client name binding", docs/replication.md): carol publishes under
`carol-feed` on tt-a; alice's logon under that name on tt-b is refused `name in use`, also after
tt-b restarts, while carol's is accepted there. Real server processes with <Authentication>,
the links logging on as an admin user."""

from __future__ import annotations

import os
import time

from tests.security.servers import users_file
from tests.support.cluster import Cluster
from tests.support.raw import Raw

PASSWORDS = {"alice": "alice-secret-1", "carol": "carol-secret-3", "repl": "repl-secret-9"}
ROLES = """<Entitlement>
  <Role><Name>links</Name><Users>repl</Users><Admin>true</Admin></Role>
  <Role><Name>desks</Name><Users>alice,carol</Users><Publish>orders</Publish></Role>
</Entitlement>"""


def logon(port: int, name: str, user: str) -> dict:
    c = Raw(port)
    try:
        c.send({"c": "logon", "cid": "l", "client_name": name, "a": "processed",
                "user_id": user, "pw": PASSWORDS[user]})  # fmt: skip
        return c.ack("processed", "l")
    finally:
        c.close()


def refused_within(port: int, name: str, user: str, wait: float) -> bool:
    """True once a logon of `user` under `name` is refused `name in use` (within `wait`)."""
    deadline = time.monotonic() + wait
    while True:
        ack = logon(port, name, user)
        if ack.get("status") == "failure":
            assert ack["reason"] == "name in use", ack
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_a_name_bound_on_one_instance_is_refused_to_another_user_on_its_peer(tmp_path):
    users_file(tmp_path / "users.db", PASSWORDS)
    pw = os.path.join(tmp_path, "repl.pw")
    with open(os.open(pw, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(PASSWORDS["repl"] + "\n")
    auth = f"<Authentication><PasswordFile>{tmp_path}/users.db</PasswordFile></Authentication>"
    cl = Cluster(
        tmp_path, ["tt-a", "tt-b"], sync=False, topics=("orders",), link_user=("repl", pw),
        extra=auth + ROLES,
    )  # fmt: skip
    cl.start()
    try:
        a, b = cl["tt-a"], cl["tt-b"]
        carol = Raw(a.port)
        carol.send({"c": "logon", "cid": "l", "client_name": "carol-feed", "a": "processed",
                    "user_id": "carol", "pw": PASSWORDS["carol"]})  # fmt: skip
        assert carol.ack("processed", "l")["status"] == "success"
        carol.send({"c": "publish", "t": "orders", "s": 1, "a": "persisted"}, b'{"n":1}')
        assert carol.ack("persisted")["status"] == "success"
        carol.close()
        assert logon(a.port, "carol-feed", "alice")["status"] == "failure"  # as before
        assert refused_within(b.port, "carol-feed", "alice", 10), "not bound on tt-b"
        assert logon(b.port, "carol-feed", "carol")["status"] == "success"
        # durable on tt-b: it holds across a restart, whatever tt-a does
        cl.link("tt-a", "tt-b").drop()
        b.stop()
        b.start()
        assert refused_within(b.port, "carol-feed", "alice", 0)
        # a name bound on tt-b (alice's) comes to tt-a the same way
        cl.link("tt-a", "tt-b").pass_()
        alice = Raw(b.port)
        alice.send({"c": "logon", "cid": "l", "client_name": "alice-feed", "a": "processed",
                    "user_id": "alice", "pw": PASSWORDS["alice"]})  # fmt: skip
        assert alice.ack("processed", "l")["status"] == "success"
        alice.send({"c": "publish", "t": "orders", "s": 1, "a": "persisted"}, b'{"n":2}')
        assert alice.ack("persisted")["status"] == "success"
        alice.close()
        assert refused_within(a.port, "alice-feed", "carol", 10), "not bound on tt-a"
    finally:
        cl.close()
