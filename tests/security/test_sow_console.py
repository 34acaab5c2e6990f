"""The SOW topics on the admin endpoint (server/admin.py `/sow`, server/sow/query_console.py)
against real servers: the topics' records, keys, update rate and store size; a query with
filter, order and top_n; and the endpoint's rules on these paths: Host and Origin, admin
credentials, the Subscribe right on the topic and its content entitlement."""

from __future__ import annotations

import base64
import http.client
import json
import time
from urllib.parse import quote

from tests.security.servers import secure_config, start, users_file
from tests.security.test_server_entitlements import USERS, User, auth, entitlement
from tests.support.proc import ServerProcess
from tests.support.raw import publish_many

SOW = "<SOW><Topic><Name>md.book</Name><Key>/sym</Key></Topic></SOW>"

ROLES = r"""
  <Role><Name>ops</Name><Users>root</Users><Admin>true</Admin><Subscribe>md\..*</Subscribe>
    <Filter><Topic>md\..*</Topic><Expression>/desk = 'A'</Expression></Filter></Role>
  <Role><Name>ops2</Name><Users>carol</Users><Admin>true</Admin></Role>
  <Role><Name>md</Name><Users>bob</Users><Subscribe>md\..*</Subscribe></Role>
  <Role><Name>feed</Name><Users>feeder</Users><Publish>.*</Publish></Role>
"""

BOOK = [{"sym": f"S{i}", "px": i, "desk": "A" if i % 2 else "B"} for i in range(10)]


def get(port: int, path: str, user: str | None = None, **headers: str):
    if user is not None:
        pair = base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def q(topic: str, **args: str) -> str:
    return f"/sow/{quote(topic, safe='')}?" + "&".join(f"{k}={quote(v)}" for k, v in args.items())


def test_sow_topics_and_queries_on_the_admin_endpoint(tmp_path):
    s = ServerProcess(tmp_path, extra=SOW).start()
    try:
        publish_many(s.port, "md.book", [json.dumps(d) for d in BOOK], name="feed")
        time.sleep(1.2)  # a sample: the update rate
        code, body = get(s.admin_port, "/sow")
        assert code == 200
        view = json.loads(body)
        book = view["topics"]["md.book"]
        assert (book["records"], book["keys"], book["updates"]) == (10, ["/sym"], 10)
        assert view["store_bytes"] > 0 and "updates_per_s" in book
        assert (
            json.loads(get(s.admin_port, "/stats")[1])["sow"]["topics"]["md.book"]["records"] == 10
        )
        code, body = get(
            s.admin_port, q("md.book", filter="/px > 2", order_by="/px DESC", top_n="3")
        )
        ans = json.loads(body)
        assert code == 200 and (ans["matches"], ans["returned"]) == (7, 3)
        assert [r["body"]["px"] for r in ans["records"]] == [9, 8, 7]
        assert all(r["k"] and r["bm"].endswith("|") for r in ans["records"])
        assert get(s.admin_port, q("nope"))[0] == 404
        assert get(s.admin_port, q("md.book", filter="/px >"))[0] == 400
        assert get(s.admin_port, q("md.book", order_by="/px SIDEWAYS"))[0] == 400
        assert get(s.admin_port, q("md.book"), Host="evil.example")[0] == 421
        assert get(s.admin_port, q("md.book"), Origin="http://evil.example")[0] == 403
        host = f"127.0.0.1:{s.admin_port}"
        assert get(s.admin_port, q("md.book"), Host=host, Origin=f"http://{host}")[0] == 200
    finally:
        s.stop()


def test_sow_queries_need_admin_and_the_topic_and_apply_entitlements(tmp_path, pki):
    users_file(tmp_path / "users.db", USERS)
    xml = secure_config(
        tmp_path, pki, authentication=auth(tmp_path), entitlement=entitlement(ROLES)
    ).replace("<SOW><Queue>", f"{SOW[:-6]}<Queue>")
    server = start(tmp_path, xml)
    try:
        feeder = User(server, pki, "feeder")
        feeder.publish_all("md.book", BOOK)
        feeder.close()
        port = server.admin_port
        assert get(port, q("md.book"))[0] == 401  # no credentials
        assert get(port, q("md.book"), "bob")[0] == 403  # no admin
        assert get(port, q("md.book"), "carol")[0] == 403  # admin, but may not read md.book
        code, body = get(port, q("md.book", order_by="/px"), "root")
        assert code == 200  # admin, reads md.* through its desk A filter
        assert [r["body"]["px"] for r in json.loads(body)["records"]] == [1, 3, 5, 7, 9]
        code, body = get(port, q("md.book", filter="/px < 4", order_by="/px"), "root")
        assert [r["body"]["px"] for r in json.loads(body)["records"]] == [1, 3]
        assert get(port, "/sow", "root")[0] == 200
    finally:
        server.stop()
