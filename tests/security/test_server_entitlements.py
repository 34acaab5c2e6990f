"""Entitlements on a real server process (docs/security.md, "Roles and content
entitlements"): every command kind for a user whose roles allow it and one whose roles do not
(`not entitled`, the connection stays open, an audit line), the admin endpoint, regex
subscriptions across entitlement boundaries, content filters during live delivery, replay and
queue delivery, and a reload (SIGHUP) that revokes a running subscription or changes a filter."""

from __future__ import annotations

import json
import re
import signal
import struct

import pytest

from tests.security.servers import (
    TlsRaw,
    admin_get,
    secure_config,
    start,
    trusting,
    users_file,
    wait_until,
)

USERS = {
    "alice": "alice-pw-1",
    "bob": "bob-pw-2",
    "carol": "carol-pw-3",
    "root": "root-pw-4",
    "feeder": "feeder-pw-5",
}

ROLES = r"""
  <Role><Name>desk-a</Name><Users>alice</Users>
    <Publish>orders\..*</Publish>
    <Subscribe>orders\..*</Subscribe>
    <Replay>orders\..*</Replay>
    <Consume>queue\.work</Consume>
    <Deny><Subscribe>orders\.secret</Subscribe></Deny>
    <Filter><Topic>orders\..*</Topic><Expression>/desk = 'A'</Expression></Filter>
  </Role>
  <Role><Name>market-data</Name><Users>alice,bob,root</Users><Subscribe>md\..*</Subscribe></Role>
  <Role><Name>queue-desk</Name><Users>carol</Users><Consume>queue\.work</Consume>
    <Filter><Topic>work</Topic><Expression>/desk = 'A'</Expression></Filter></Role>
  <Role><Name>feed</Name><Users>feeder</Users><Publish>.*</Publish></Role>
  <Role><Name>ops</Name><Users>root</Users><Admin>true</Admin></Role>
"""


def entitlement(roles: str = ROLES) -> str:
    return f"<Entitlement>{roles}</Entitlement>"


def auth(directory) -> str:
    return f"<Authentication><PasswordFile>{directory}/users.db</PasswordFile></Authentication>"


@pytest.fixture(scope="module")
def pkix(pki):
    return pki


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def ent_server(request, tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("ent")
    tokens = users_file(d / "users.db", USERS, tokens=("root", "alice"))
    config = secure_config(d, pki, authentication=auth(d), entitlement=entitlement())
    s = start(d, config, request.param)
    s.tokens = tokens
    yield s
    s.stop()


class User:
    """A logged-on TLS connection as one user."""

    def __init__(self, server, pki, user: str, name: str | None = None):
        self.conn = TlsRaw(server.port, trusting(pki))
        self.conn.send({"c": "logon", "cid": "l", "client_name": name or f"{user}-app",
                        "user_id": user, "pw": USERS[user], "a": "processed"})  # fmt: skip
        ack = self.conn.ack("processed", "l")
        assert ack["status"] == "success"
        self.seq = ack["s"]  # the last sequence stored for this client name

    def request(self, header: dict, body: bytes = b"", ack: str = "processed") -> dict:
        cid = self.conn.next_cid()
        self.conn.send({**header, "cid": cid, "a": ack}, body)
        return self.conn.ack(ack, cid)

    def publish(self, topic: str, doc: dict) -> dict:
        self.seq += 1
        return self.request({"c": "publish", "t": topic, "s": self.seq}, json.dumps(doc).encode())

    def publish_all(self, topic: str, docs: list[dict]) -> None:
        for doc in docs:
            assert self.publish(topic, doc)["status"] == "success"
        assert self.request({"c": "flush"}, ack="persisted")["status"] == "success"

    def still_open(self) -> bool:
        return self.request({"c": "flush"}, ack="completed")["status"] == "success"

    def bodies(self, n: int) -> list[dict]:
        return [json.loads(b) for _, b in self.conn.messages(n)]

    def nothing_more(self) -> bool:
        """No delivery before a round trip (a flush) completes."""
        cid = self.conn.next_cid()
        self.conn.send({"c": "flush", "cid": cid, "a": "completed"})
        frames = self.conn.recv_until(lambda h, b: h.get("cid") == cid and h.get("c") == "ack")
        return [h for h, _ in frames if h.get("c") == "p"] == []

    def close(self) -> None:
        self.conn.close()


def refused(ack: dict) -> bool:
    return ack["status"] == "failure" and ack["reason"] == "not entitled"


# ---------------------------------------------------------------------------------------------
# The matrix: every command kind, entitled and not


def test_publish(ent_server, pki):
    alice, bob = User(ent_server, pki, "alice"), User(ent_server, pki, "bob")
    assert alice.publish("orders.pub", {"desk": "A"})["status"] == "success"
    assert refused(bob.publish("orders.pub", {"desk": "A"}))
    assert bob.still_open()
    ent_server.wait_for_log(
        r"audit: refused peer=127\.0\.0\.1:\d+ user=bob right=publish topic=orders\.pub "
        r"command=publish"
    )
    alice.close()
    bob.close()


def test_a_run_of_plain_publishes_needs_the_publish_right(ent_server, pki):
    """Plain publishes sent in one write (the fast path's shape: c, t, s only, compact, taken
    from the bytes as a run) by a user without the publish right are refused like any other:
    nothing of them is stored, the connection stays open."""
    feeder = User(ent_server, pki, "feeder")
    feeder.publish_all("orders.run", [{"desk": "A", "n": 99}])  # the topic is a known one now
    bob = User(ent_server, pki, "bob")
    assert bob.still_open()  # a read after the logon: the decoder leaves runs whole from here
    run = b""
    for i in range(1, 21):
        h = json.dumps({"c": "publish", "t": "orders.run", "s": bob.seq + i}, separators=(",", ":"))
        body = json.dumps({"desk": "A", "n": i}).encode()
        run += struct.pack(">I", len(h) + len(body)) + h.encode() + body
    bob.conn.send_raw(run)
    assert bob.still_open()
    alice = User(ent_server, pki, "alice")
    ack = alice.request({"c": "subscribe", "t": "orders.run", "bm": "0"}, ack="completed")
    assert ack["status"] == "success"
    assert [d["n"] for d in alice.bodies(1)] == [99]  # the one message stored
    assert alice.nothing_more()
    for u in (bob, feeder, alice):
        u.close()


def test_live_subscribe(ent_server, pki):
    alice, bob = User(ent_server, pki, "alice"), User(ent_server, pki, "bob")
    assert alice.request({"c": "subscribe", "t": "orders.live"})["status"] == "success"
    assert refused(bob.request({"c": "subscribe", "t": "orders.live"}))
    assert refused(alice.request({"c": "subscribe", "t": "orders.secret"}))  # deny wins
    assert bob.still_open() and alice.still_open()
    alice.close()
    bob.close()


def test_bookmark_subscribe_needs_replay(ent_server, pki):
    alice, bob = User(ent_server, pki, "alice"), User(ent_server, pki, "bob")
    ok = alice.request({"c": "subscribe", "t": "orders.replay", "bm": "0"})
    assert ok["status"] == "success"
    assert refused(bob.request({"c": "subscribe", "t": "md.quotes", "bm": "0"}))  # live only
    assert bob.request({"c": "subscribe", "t": "md.quotes"})["status"] == "success"
    alice.close()
    bob.close()


def test_queue_subscribe_and_sow_delete_need_consume(ent_server, pki):
    feeder = User(ent_server, pki, "feeder")
    alice, bob = User(ent_server, pki, "alice"), User(ent_server, pki, "bob")
    assert refused(bob.request({"c": "subscribe", "t": "queue.work"}))
    assert alice.request({"c": "subscribe", "t": "queue.work"})["status"] == "success"
    feeder.publish_all("work", [{"job": 1, "desk": "A"}])
    [(header, _)] = alice.conn.messages(1)
    bm = header["bm"]
    denied = bob.request({"c": "sow_delete", "t": "queue.work", "bm": bm})
    assert refused(denied)
    done = alice.request({"c": "sow_delete", "t": "queue.work", "bm": bm})
    assert done["status"] == "success" and done["records_deleted"] == 1
    for u in (feeder, alice, bob):
        u.close()


def test_flush_is_always_allowed(ent_server, pki):
    bob = User(ent_server, pki, "bob")
    assert bob.request({"c": "flush"}, ack="completed")["status"] == "success"
    bob.close()


def test_admin_endpoint(ent_server):
    status, headers, _ = admin_get(ent_server, "/stats")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert admin_get(ent_server, "/stats", "root", "wrong-pw")[0] == 401
    assert admin_get(ent_server, "/stats", "alice", USERS["alice"])[0] == 403
    status, _, body = admin_get(ent_server, "/stats", "root", USERS["root"])
    assert status == 200 and json.loads(body)["instance"] == "tt-sec"
    assert admin_get(ent_server, "/metrics", token=ent_server.tokens["root"])[0] == 200
    assert admin_get(ent_server, "/metrics", token=ent_server.tokens["alice"])[0] == 403
    assert admin_get(ent_server, "/metrics", token="tt1.cm9vdA.bm9wZQ")[0] == 401
    ent_server.wait_for_log(
        r"audit: admin_request peer=127\.0\.0\.1:\d+ user=root method=GET path=/stats status=200"
    )
    ent_server.wait_for_log(r"audit: refused .* user=alice right=admin")


def test_refusals_are_counted(ent_server, pki):
    bob = User(ent_server, pki, "bob")
    assert refused(bob.publish("orders.count", {}))
    snap = json.loads(admin_get(ent_server, "/stats", "root", USERS["root"])[2])
    assert snap["security"]["not_entitled"] >= 1
    bob.close()


# ---------------------------------------------------------------------------------------------
# Regex subscriptions across entitlement boundaries


def test_regex_subscriptions_deliver_only_entitled_topics(ent_server, pki):
    feeder = User(ent_server, pki, "feeder")
    alice, bob, carol = (User(ent_server, pki, u) for u in ("alice", "bob", "carol"))
    # alice may read orders.* but not orders.secret, and md.*: her regexes get per-topic gates
    assert alice.request({"c": "subscribe", "t": ".*", "sub_id": "all"})["status"] == "success"
    assert bob.request({"c": "subscribe", "t": r"(md|orders)\..*"})["status"] == "success"
    assert refused(carol.request({"c": "subscribe", "t": r"md\..*"}))  # no subscribe at all
    feeder.publish_all(
        "orders.rx", [{"desk": "A", "n": 1}, {"desk": "B", "n": 2}]
    )  # alice: desk A only (her content filter)
    feeder.publish_all("orders.secret", [{"desk": "A", "n": 3}])  # nobody
    feeder.publish_all("md.rx", [{"n": 4}])  # alice and bob
    feeder.publish_all("other.rx", [{"n": 5}])  # nobody
    assert [d["n"] for d in alice.bodies(2)] == [1, 4]
    assert alice.nothing_more()
    assert [d["n"] for d in bob.bodies(1)] == [4]
    assert bob.nothing_more()
    for u in (feeder, alice, bob, carol):
        u.close()


# ---------------------------------------------------------------------------------------------
# Content filters: live, replay, queue


def test_content_filter_on_live_delivery_is_anded_to_the_subscribers(ent_server, pki):
    feeder = User(ent_server, pki, "feeder")
    alice = User(ent_server, pki, "alice")
    assert alice.request({"c": "subscribe", "t": "orders.cf"})["status"] == "success"
    assert alice.request({"c": "subscribe", "t": "orders.cf2", "f": "/n > 1"})["status"] == (
        "success"
    )
    feeder.publish_all("orders.cf", [{"desk": "B", "n": 1}, {"desk": "A", "n": 2}])
    feeder.publish_all("orders.cf2", [{"desk": "A", "n": 1}, {"desk": "B", "n": 5},
                                      {"desk": "A", "n": 6}])  # fmt: skip
    assert [d["n"] for d in alice.bodies(2)] == [2, 6]
    assert alice.nothing_more()
    feeder.close()
    alice.close()


def test_content_filter_during_replay(ent_server, pki):
    feeder = User(ent_server, pki, "feeder")
    feeder.publish_all("orders.hist", [{"desk": d, "n": i} for i, d in enumerate("ABAB")])
    alice = User(ent_server, pki, "alice")
    ack = alice.request({"c": "subscribe", "t": "orders.hist", "bm": "0"}, ack="completed")
    assert ack["status"] == "success"
    assert [d["n"] for d in alice.bodies(2)] == [0, 2]
    feeder.publish_all("orders.hist", [{"desk": "B", "n": 4}, {"desk": "A", "n": 5}])
    assert [d["n"] for d in alice.bodies(1)] == [5]  # and live after the replay
    assert alice.nothing_more()
    feeder.close()
    alice.close()


def test_content_filter_on_queue_delivery(ent_server, pki):
    feeder = User(ent_server, pki, "feeder")
    carol = User(ent_server, pki, "carol")
    ack = carol.request({"c": "subscribe", "t": "queue.work", "o": "max_backlog=10"})
    assert ack["status"] == "success"
    feeder.publish_all("work", [{"desk": "B", "job": 1}, {"desk": "A", "job": 2}])
    [(header, body)] = carol.conn.messages(1)
    assert json.loads(body)["job"] == 2
    assert carol.nothing_more()
    carol.request({"c": "sow_delete", "t": "queue.work", "bm": header["bm"]})
    feeder.close()
    carol.close()


QUEUE_DESKS = r"""
  <Role><Name>queue-desk-a</Name><Users>carol</Users><Consume>queue\.work</Consume>
    <Filter><Topic>work</Topic><Expression>/desk = 'A'</Expression></Filter></Role>
  <Role><Name>queue-desk-b</Name><Users>bob</Users><Consume>queue\.work</Consume>
    <Filter><Topic>work</Topic><Expression>/desk = 'B'</Expression></Filter></Role>
  <Role><Name>feed</Name><Users>feeder</Users><Publish>.*</Publish></Role>
"""


def test_sow_delete_acts_only_on_messages_the_content_entitlement_shows(tmp_path, pki):
    """Issue 23, finding 6: a desk-A user's sow_delete, by filter or by bookmark, neither
    acknowledges nor expires the desk-B messages it can never be delivered (leased to a desk-B
    consumer or waiting), and counts only what it did."""
    users_file(tmp_path / "users.db", USERS)
    config = secure_config(
        tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement(QUEUE_DESKS)
    )
    server = start(tmp_path, config)
    try:
        feeder, carol, bob = (User(server, pki, u) for u in ("feeder", "carol", "bob"))
        desks = "BABABB"  # jobs 1..6
        feeder.publish_all("work", [{"job": j, "desk": d} for j, d in enumerate(desks, 1)])
        sub = {"c": "subscribe", "t": "queue.work", "sub_id": "w"}
        assert bob.request(sub)["status"] == "success"
        [(h, b)] = bob.conn.messages(1)  # a backlog of 1: job 1 leased, the others wait
        assert json.loads(b)["job"] == 1
        by_bm = carol.request({"c": "sow_delete", "t": "queue.work", "bm": h["bm"]})
        assert refused(by_bm) and by_bm["records_deleted"] == 0
        assert "content entitlement" in json.dumps(by_bm)
        expired = carol.request(
            {"c": "sow_delete", "t": "queue.work", "f": "/job >= 5", "o": "expire"}
        )
        assert expired["status"] == "success" and expired["records_deleted"] == 0
        acked = carol.request({"c": "sow_delete", "t": "queue.work", "f": "1=1"})
        assert acked["status"] == "success" and acked["records_deleted"] == 2  # jobs 2 and 4
        jobs = []
        for _ in range(4):  # bob's own: 1, then 3, 5, 6 one at a time
            mine = bob.request({"c": "sow_delete", "t": "queue.work", "bm": h["bm"]})
            assert mine["status"] == "success" and mine["records_deleted"] == 1
            jobs.append(json.loads(b)["job"])
            if len(jobs) < 4:
                [(h, b)] = bob.conn.messages(1)
        assert jobs == [1, 3, 5, 6] and bob.nothing_more()
        assert carol.request(sub)["status"] == "success" and carol.nothing_more()
        for u in (feeder, carol, bob):
            u.close()
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Reload


def test_a_reload_revokes_a_running_subscription_and_changes_filters(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    config = secure_config(tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement())
    server = start(tmp_path, config)
    try:
        feeder = User(server, pki, "feeder")
        alice = User(server, pki, "alice")
        assert alice.request({"c": "subscribe", "t": "orders.r", "sub_id": "o"})["status"] == (
            "success"
        )
        assert alice.request({"c": "subscribe", "t": "md.r", "sub_id": "m"})["status"] == (
            "success"
        )
        feeder.publish_all("orders.r", [{"desk": "A", "n": 1}])
        assert [d["n"] for d in alice.bodies(1)] == [1]
        # alice loses subscribe on orders.*; the market-data role now filters md.*
        roles = ROLES.replace(r"<Subscribe>orders\..*</Subscribe>", "").replace(
            r"<Subscribe>md\..*</Subscribe>",
            r"<Subscribe>md\..*</Subscribe><Filter><Topic>md\..*</Topic>"
            r"<Expression>/n > 10</Expression></Filter>",
        )
        new = secure_config(
            tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement(roles)
        )
        (tmp_path / "tickertape.xml").write_text(new)
        server.proc.send_signal(signal.SIGHUP)
        ended = alice.conn.ack("processed", timeout=10)
        assert (ended["status"], ended["reason"], ended["sub_id"]) == (
            "failure",
            "not entitled",
            "o",
        )
        server.wait_for_log(r"subscription o on orders\.r ended by a reload of the roles")
        server.wait_for_log(r"reload: .* 1 subscription\(s\) ended as no longer entitled")
        feeder.publish_all("orders.r", [{"desk": "A", "n": 2}])
        feeder.publish_all("md.r", [{"n": 3}, {"n": 30}])
        assert [d["n"] for d in alice.bodies(1)] == [30]
        assert alice.nothing_more() and alice.still_open()
        assert refused(alice.request({"c": "subscribe", "t": "orders.r"}))
        feeder.close()
        alice.close()
    finally:
        server.stop()


def test_a_configuration_that_no_longer_loads_changes_nothing(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    config = secure_config(tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement())
    server = start(tmp_path, config)
    try:
        alice = User(server, pki, "alice")
        assert alice.request({"c": "subscribe", "t": "orders.k"})["status"] == "success"
        (tmp_path / "tickertape.xml").write_text(config.replace("<Users>alice</Users>", "<Users>"))
        server.proc.send_signal(signal.SIGHUP)
        server.wait_for_log(r"reload: .* no longer loads; nothing changed")
        assert alice.request({"c": "subscribe", "t": "orders.k2"})["status"] == "success"
        alice.close()
    finally:
        server.stop()


def test_the_audit_trail_can_go_to_its_own_file(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    audit_target = (
        "<Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target>"
        f"<Target><Protocol>file</Protocol><FileName>{tmp_path}/audit.log</FileName>"
        "<Level>info</Level><Logger>tickertape.audit</Logger></Target></Logging>"
    )
    config = secure_config(tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement())
    config = config.replace(
        "<Logging><Target><Protocol>stdout</Protocol><Level>info</Level></Target></Logging>",
        audit_target,
    )
    server = start(tmp_path, config)
    try:
        bob = User(server, pki, "bob")
        assert refused(bob.publish("orders.f", {}))
        bob.close()
        wait_until(lambda: "refused" in (tmp_path / "audit.log").read_text())
        lines = (tmp_path / "audit.log").read_text().splitlines()
        assert all(re.search(r"(logon|refused|admin_request|logon_failure) ", x) for x in lines)
        assert any("user=bob right=publish topic=orders.f" in x for x in lines)
    finally:
        server.stop()


def test_content_filter_during_a_regex_replay(ent_server, pki):
    feeder = User(ent_server, pki, "feeder")
    feeder.publish_all("orders.rxa", [{"desk": "B", "n": 1}, {"desk": "A", "n": 2}])
    feeder.publish_all("orders.rxb", [{"desk": "A", "n": 3}, {"desk": "B", "n": 4}])
    alice = User(ent_server, pki, "alice")
    ack = alice.request({"c": "subscribe", "t": r"orders\.rx[ab]", "bm": "0"}, ack="completed")
    assert ack["status"] == "success"
    assert [d["n"] for d in alice.bodies(2)] == [2, 3]
    assert alice.nothing_more()
    feeder.close()
    alice.close()


def test_the_admin_endpoint_over_https(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    admin = (
        f"<Admin><InetAddr>127.0.0.1:0</InetAddr><Certificate>{pki.server_cert}</Certificate>"
        f"<PrivateKey>{pki.server_key}</PrivateKey></Admin>"
    )
    config = secure_config(
        tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement(), admin=admin
    )
    server = start(tmp_path, config)
    try:
        server.wait_for_log(r"admin endpoint on https://127\.0\.0\.1:\d+/stats")
        ctx = trusting(pki)
        status, _, body = admin_get(server, "/stats", "root", USERS["root"], ctx=ctx)
        assert status == 200 and json.loads(body)["security"]["auth_failures"] == 0
        assert admin_get(server, "/stats", ctx=ctx)[0] == 401
        bad = TlsRaw(server.port, trusting(pki))
        bad.send({"c": "logon", "cid": "l", "client_name": "x", "user_id": "bob", "pw": "no",
                  "a": "processed"})  # fmt: skip
        assert bad.ack("processed", "l")["reason"] == "auth failure"
        bad.close()
        snap = json.loads(admin_get(server, "/stats", "root", USERS["root"], ctx=ctx)[2])
        assert snap["security"]["auth_failures"] == 1
        _, _, text = admin_get(server, "/metrics", "root", USERS["root"], ctx=ctx)
        assert b"tickertape_auth_failures_total 1" in text
    finally:
        server.stop()
