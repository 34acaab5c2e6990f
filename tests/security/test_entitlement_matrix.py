"""The entitlement matrix: every command path × every right, against one real server.

Each column is a user whose roles give exactly one thing (docs/security.md, "Roles"):

    Publish, Subscribe, Replay   that right on `mx\\..*`
    Consume                      consume on the queues `mq\\..*` (their topics are `mx.q.*`)
    Admin                        the admin endpoint
    Deny                         every right above, each also denied (deny wins)
    Filter                       every topic right, with the content filter /desk = 'A' on mx.*

Each row is a way in (a `RUNNERS` entry): it runs the command as the column's user on topics of
its own (`mx.<path>.<column>`, queues `mq.<path>.<column>`), with three messages published by a
feeder: n=1 and n=3 on desk A, n=2 on desk B, and says what happened:

    ALL      accepted, and the whole effect: the three messages delivered / stored / deleted;
             for the admin endpoint, the request served
    A_ONLY   accepted, with the content filter: only n=1 and n=3
    NONE     accepted, nothing delivered (a regex allowed topic by topic, none of them readable)
    REFUSED  `not entitled` (a 403 on the admin endpoint), an audit line naming the user and the
             right, and no effect at all

`TABLE` declares the expected outcome of every cell. `test_every_cell_is_declared` enumerates
RUNNERS × RIGHTS, so a new path or a new right without expectations fails; `test_cell` runs each.
A cell that fails on this branch for a known, reported hole is marked xfail(strict=True) in
`HOLES`, so the fix of the hole turns it into a failure here until the mark is removed.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.security.servers import admin_get, ports, secure_config, start, users_file
from tests.support.raw import Raw

ALL, A_ONLY, NONE, REFUSED = "ALL", "A_ONLY", "NONE", "REFUSED"
RIGHTS = ("Publish", "Subscribe", "Replay", "Consume", "Admin", "Deny", "Filter")
DOCS = [{"desk": "A", "n": 1}, {"desk": "B", "n": 2}, {"desk": "A", "n": 3}]
SEEN = {ALL: [1, 2, 3], A_ONLY: [1, 3], NONE: []}

_TOPIC_RIGHTS = (
    r"<Publish>mx\..*</Publish><Subscribe>mx\..*</Subscribe><Replay>mx\..*</Replay>"
    r"<Consume>mq\..*</Consume>"
)
ROLES = rf"""
  <Role><Name>r-publish</Name><Users>u-publish</Users><Publish>mx\..*</Publish></Role>
  <Role><Name>r-subscribe</Name><Users>u-subscribe</Users><Subscribe>mx\..*</Subscribe></Role>
  <Role><Name>r-replay</Name><Users>u-replay</Users><Replay>mx\..*</Replay></Role>
  <Role><Name>r-consume</Name><Users>u-consume</Users><Consume>mq\..*</Consume></Role>
  <Role><Name>r-admin</Name><Users>u-admin</Users><Admin>true</Admin></Role>
  <Role><Name>r-deny</Name><Users>u-deny</Users><Admin>true</Admin>{_TOPIC_RIGHTS}
    <Deny><Admin>true</Admin>{_TOPIC_RIGHTS}</Deny></Role>
  <Role><Name>r-filter</Name><Users>u-filter</Users>{_TOPIC_RIGHTS}
    <Filter><Topic>mx\..*</Topic><Expression>/desk = 'A'</Expression></Filter></Role>
  <Role><Name>feed</Name><Users>feeder</Users><Publish>.*</Publish></Role>
  <Role><Name>audit</Name><Users>auditor</Users><Subscribe>.*</Subscribe><Replay>.*</Replay>
    <Consume>.*</Consume></Role>
"""
USER = {right: f"u-{right.lower()}" for right in RIGHTS}
PASSWORDS = {user: f"{user}-pw" for user in [*USER.values(), "feeder", "auditor"]}
QUEUE_PATHS = (
    "queue delivery",
    "sow_delete by bookmark",
    "sow_delete by filter",
    "queue replay",
    "sow on a queue",
)
# the SOW topics of the SOW rows: `mx.<path>.<column>`, keyed by /n (three records)
SOW_TOPICS = r"<Topic><Name>mx\.(sow|delta|adminsow)[a-z]*\.[a-z]+</Name><Key>/n</Key></Topic>"


def slug(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", path.lower())


def queues_xml() -> str:
    return "".join(
        f"<Queue><Name>mq.{slug(p)}.{r.lower()}</Name>"
        f"<UnderlyingTopic>mx.q.{slug(p)}.{r.lower()}</UnderlyingTopic>"
        "<MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>"
        for p in QUEUE_PATHS
        for r in RIGHTS
    )


# -- connections --------------------------------------------------------------------------------


class Conn:
    """A raw-protocol connection logged on as one user (plain TCP on loopback)."""

    def __init__(self, port: int, user: str, name: str) -> None:
        self.raw = Raw(port)
        self.raw.send({"c": "logon", "cid": "l", "client_name": name, "user_id": user,
                       "pw": PASSWORDS[user], "a": "processed"})  # fmt: skip
        ack = self.raw.ack("processed", "l")
        assert ack["status"] == "success", ack
        self.seq = ack.get("s", 0)

    def request(self, header: dict, body: bytes = b"", ack: str = "processed") -> dict:
        cid = self.raw.next_cid()
        self.raw.send({**header, "cid": cid, "a": ack}, body)
        return self.raw.ack(ack, cid)

    def until(self, pred, timeout: float = 10.0) -> tuple[list[int], dict]:
        """Deliveries (their `n`) up to the first frame that matches pred, and that frame."""
        frames = self.raw.recv_until(pred, timeout)  # deliveries an ack() put back come first
        return [json.loads(b)["n"] for h, b in frames[:-1] if h["c"] == "p"], frames[-1][0]

    def drained(self, wait: float = 0.0) -> list[int]:
        """Deliveries that arrive before a round trip (a flush) completes, after `wait` s."""
        if wait:
            time.sleep(wait)
        cid = self.raw.next_cid()
        self.raw.send({"c": "flush", "cid": cid, "a": "completed"})
        got, _ = self.until(lambda h, b: h.get("c") == "ack" and h.get("cid") == cid)
        return got

    def close(self) -> None:
        self.raw.close()


def refusal(ack: dict) -> bool:
    if ack.get("status") == "success":
        return False
    assert ack.get("reason") == "not entitled", f"refused for another reason: {ack}"
    return True


@dataclass
class Ctx:
    """The module's server and its helpers."""

    server: Any  # a ServerProcess
    port: int
    feeder: Conn
    auditor: Conn
    refusals: list[tuple[str, str, str]] = field(default_factory=list)  # (user, right, topic)

    def conn(self, right: str, path: str) -> Conn:
        return Conn(self.port, USER[right], f"{slug(path)}-{right.lower()}")

    def publish(self, topic: str) -> None:
        for doc in DOCS:
            self.feeder.seq += 1
            self.feeder.raw.send({"c": "publish", "t": topic, "s": self.feeder.seq},
                                 json.dumps(doc))  # fmt: skip
        assert self.feeder.request({"c": "flush"}, ack="persisted")["status"] == "success"

    def stored(self, topic: str) -> list[int]:
        """What the journal holds on `topic` (the auditor replays it to the live end)."""
        cid = self.auditor.raw.next_cid()
        self.auditor.raw.send({"c": "subscribe", "t": topic, "bm": "[0:0|1|]", "cid": cid,
                               "a": "completed"})  # fmt: skip
        got, ack = self.auditor.until(lambda h, b: h.get("c") == "ack" and h.get("cid") == cid)
        assert ack.get("status", "success") == "success", ack
        return got


Observed = tuple[str, list[int]]  # ("accepted" | "refused", the n's of the effect)
Runner = Callable[[Ctx, str, str], Observed]  # (ctx, right, the cell's topic) -> Observed


# -- the ways in --------------------------------------------------------------------------------


def _live(ctx: Ctx, right: str, topic: str, header: dict, wait: float = 0.0) -> Observed:
    c = ctx.conn(right, topic)
    try:
        refused = refusal(c.request({"c": "subscribe", **header}))
        if refused:
            ctx.refusals.append((USER[right], "subscribe", header["t"]))
        ctx.publish(topic)
        # after a wait (conflation windows), a second round trip: a loop that took the first
        # flush before its due timers has sent the rest by then
        got = c.drained(wait) + (c.drained(wait) if wait else [])
        return ("refused" if refused else "accepted"), got
    finally:
        c.close()


def live_subscribe(ctx: Ctx, right: str, topic: str) -> Observed:
    return _live(ctx, right, topic, {"t": topic})


def regex_subscribe(ctx: Ctx, right: str, topic: str) -> Observed:
    return _live(ctx, right, topic, {"t": re.escape(topic) + ".*"})


def conflation(ctx: Ctx, right: str, topic: str) -> Observed:
    # a key per message: what conflation keeps is all three, once their window ends
    header = {"t": topic, "o": "conflation=50ms,conflation_key=/n"}
    return _live(ctx, right, topic, header, wait=0.3)


def replace(ctx: Ctx, right: str, topic: str) -> Observed:
    """A subscription replaced in place (a new filter): the replace is granted again."""
    c = ctx.conn(right, topic)
    try:
        c.request({"c": "subscribe", "t": topic, "sub_id": "r"})  # refused without the right
        ack = c.request({"c": "subscribe", "t": topic, "sub_id": "r", "o": "replace",
                         "f": "/n > 0"})  # fmt: skip
        ctx.publish(topic)
        if refusal(ack):
            ctx.refusals.append((USER[right], "subscribe", topic))
            return "refused", c.drained()
        return "accepted", c.drained()
    finally:
        c.close()


def _replay(ctx: Ctx, right: str, topic: str, bm: str, opts: str = "", name: str = "") -> Observed:
    """A bookmark subscription to `name` (default: `topic`), whose messages are on `topic`,
    with options `opts` (`pause`: resumed once it is accepted)."""
    extra = {"o": opts} if opts else {}
    ctx.publish(topic)
    c = ctx.conn(right, topic)
    try:
        cid = c.raw.next_cid()
        c.raw.send({"c": "subscribe", "t": name or topic, "bm": bm, "cid": cid, "sub_id": "b",
                    "a": "processed,completed", **extra})  # fmt: skip
        got, ack = c.until(lambda h, b: h.get("c") == "ack" and h.get("cid") == cid)
        if refusal(ack):
            ctx.refusals.append((USER[right], "replay", topic))
            return "refused", got + c.drained()
        if opts == "pause":  # nothing until it is resumed
            assert c.drained() == []
            assert c.request({"c": "subscribe", "sub_id": "b", "o": "resume"})["status"] == (
                "success"
            )
        got, ack = c.until(lambda h, b: h.get("a") == "completed")
        return "accepted", got + c.drained()
    finally:
        c.close()


def bookmark_replay(ctx: Ctx, right: str, topic: str) -> Observed:
    return _replay(ctx, right, topic, "0")


def range_replay(ctx: Ctx, right: str, topic: str) -> Observed:
    return _replay(ctx, right, topic, "[0:0|1|]")


def pause_resume(ctx: Ctx, right: str, topic: str) -> Observed:
    return _replay(ctx, right, topic, "0", "pause")


def conflated_replay(ctx: Ctx, right: str, topic: str) -> Observed:
    # conflation on the replayed timeline (server/replay_plan.py's Conflater), a key per message
    return _replay(ctx, right, topic, "[0:0|1|]", "conflation=10ms,conflation_key=/n")


def queue_replay(ctx: Ctx, right: str, topic: str) -> Observed:
    """A bookmark subscription to a queue's name: a plain replay of its underlying topic,
    decided (replay) and filtered on that topic, not a queue subscription."""
    queue, underlying = _queue(topic)
    return _replay(ctx, right, underlying, "0", name=queue)


def _queue(topic: str) -> tuple[str, str]:
    """(queue name, its underlying topic) of a cell."""
    _, path, col = topic.split(".")
    return f"mq.{path}.{col}", f"mx.q.{path}.{col}"


def queue_delivery(ctx: Ctx, right: str, topic: str) -> Observed:
    queue, underlying = _queue(topic)
    c = ctx.conn(right, topic)
    try:
        refused = refusal(c.request({"c": "subscribe", "t": queue, "o": "max_backlog=10"}))
        if refused:
            ctx.refusals.append((USER[right], "consume", queue))
        ctx.publish(underlying)
        return ("refused" if refused else "accepted"), c.drained()
    finally:
        c.close()


def _deleted(ack: dict, survivors: list[int]) -> Observed:
    deleted = [n for n in SEEN[ALL] if n not in survivors]
    if not deleted and refusal(ack):
        return "refused", deleted
    return "accepted", deleted


def sow_delete_by_bookmark(ctx: Ctx, right: str, topic: str) -> Observed:
    """The auditor holds the three leases; the user acknowledges them by bookmark (`Leasing`
    sublet lets any entitled consumer do that). What is still leased afterwards is what the
    auditor gets back when it cancels its leases."""
    queue, underlying = _queue(topic)
    sub = ctx.auditor.request({"c": "subscribe", "t": queue, "o": "max_backlog=10"})
    assert sub["status"] == "success"
    ctx.publish(underlying)
    held = ctx.auditor.raw.messages(3)
    bms = ",".join(h["bm"] for h, _ in held)
    c = ctx.conn(right, topic)
    try:
        ack = c.request({"c": "sow_delete", "t": queue, "bm": bms})
    finally:
        c.close()
    cid = ctx.auditor.raw.next_cid()
    ctx.auditor.raw.send({"c": "sow_delete", "t": queue, "bm": bms, "o": "cancel",
                          "cid": cid, "a": "processed"})  # fmt: skip
    survivors, _ = ctx.auditor.until(lambda h, b: h.get("c") == "ack" and h.get("cid") == cid)
    ctx.auditor.request({"c": "unsubscribe", "sub_id": sub["sub_id"]})
    out = _deleted(ack, survivors)
    if out[0] == "refused":
        ctx.refusals.append((USER[right], "consume", queue))
    return out


def _delete_by_filter(ctx: Ctx, right: str, topic: str, publish_to: str, target: str) -> dict:
    """The three messages published to `publish_to`, then a sow_delete of `/n > 0` on
    `target` (a queue or a SOW topic) as the cell's user: its ack."""
    ctx.publish(publish_to)
    c = ctx.conn(right, topic)
    try:
        return c.request({"c": "sow_delete", "t": target, "f": "/n > 0"})
    finally:
        c.close()


def sow_delete_by_filter(ctx: Ctx, right: str, topic: str) -> Observed:
    """Three messages waiting (no subscriber); the user acknowledges every one its filter
    matches; the auditor then subscribes and gets what is left."""
    queue, underlying = _queue(topic)
    ack = _delete_by_filter(ctx, right, topic, underlying, queue)
    sub = ctx.auditor.request({"c": "subscribe", "t": queue, "o": "max_backlog=10"})
    assert sub["status"] == "success"
    survivors = ctx.auditor.drained()
    ctx.auditor.request({"c": "unsubscribe", "sub_id": sub["sub_id"]})
    out = _deleted(ack, survivors)
    if out[0] == "refused":
        ctx.refusals.append((USER[right], "consume", queue))
    return out


def publish_slow(ctx: Ctx, right: str, topic: str) -> Observed:
    """Publishes with a `processed` ack each: the ordinary path (Session.cmd_publish)."""
    return _acked_publishes(ctx, right, topic, "publish")


def _acked_publishes(ctx: Ctx, right: str, topic: str, command: str) -> Observed:
    c = ctx.conn(right, topic)
    try:
        acks = [
            c.request({"c": command, "t": topic, "s": i}, json.dumps(doc).encode())
            for i, doc in enumerate(DOCS, start=c.seq + 1)
        ]
        c.request({"c": "flush"}, ack="persisted")
    finally:
        c.close()
    refused = [refusal(a) for a in acks]
    assert len(set(refused)) == 1, f"some publishes refused, some not: {acks}"
    if refused[0]:
        ctx.refusals.append((USER[right], "publish", topic))
    return ("refused" if refused[0] else "accepted"), ctx.stored(topic)


def publish_fast(ctx: Ctx, right: str, topic: str) -> Observed:
    """Plain publishes (no ack, no expiry, no extra fields): the first in the first read after
    the logon (a run of decoded publishes, Session._publish_run), the other two in one later
    write (frames the decoder leaves whole once logged on, stored straight from the bytes by
    Session._raw_publishes) when nothing is checked."""
    c = ctx.conn(right, topic)
    try:
        frames = [
            json.dumps({"c": "publish", "t": topic, "s": i}, separators=(",", ":")).encode()
            + json.dumps(doc).encode()
            for i, doc in enumerate(DOCS, start=c.seq + 1)
        ]
        framed = [len(f).to_bytes(4, "big") + f for f in frames]
        c.raw.send_raw(framed[0])
        assert c.request({"c": "flush"}, ack="completed")["status"] == "success"
        c.raw.send_raw(b"".join(framed[1:]))
        flushed = c.request({"c": "flush"}, ack="persisted")
        assert flushed["status"] == "success", flushed
    finally:
        c.close()
    stored = ctx.stored(topic)
    if stored:
        return "accepted", stored
    ctx.refusals.append((USER[right], "publish", topic))
    return "refused", stored


def _answer(ctx: Ctx, c: Conn, header: dict) -> tuple[dict, list[int]]:
    """Send a query (`sow` family) and read its answer: the ack and the records' `n`s."""
    cid = c.raw.next_cid()
    c.raw.send({**header, "cid": cid, "a": "completed"})
    frames = c.raw.recv_until(lambda h, b: h.get("c") == "ack" and h.get("cid") == cid)
    return frames[-1][0], sorted(json.loads(b)["n"] for h, b in frames if h["c"] == "sow")


def _query(ctx: Ctx, right: str, topic: str, header: dict, need: str, on: str) -> Observed:
    c = ctx.conn(right, topic)
    try:
        ack, got = _answer(ctx, c, header)
        if refusal(ack):
            ctx.refusals.append((USER[right], need, on))
            return "refused", got + c.drained()
        if header["c"] != "sow":  # the subscription goes on: the next changes, live
            if "delta" in header["c"]:  # a change to each record (a delta: `v` and its key)
                for doc in DOCS:
                    ctx.feeder.seq += 1
                    ctx.feeder.raw.send({"c": "publish", "t": topic, "s": ctx.feeder.seq},
                                        json.dumps({**doc, "v": 2}))  # fmt: skip
                ctx.feeder.request({"c": "flush"}, ack="persisted")
            else:
                ctx.publish(topic)
            live = c.drained(0.3) + c.drained()
            assert sorted(live) == got, f"live changes {live} after an answer of {got}"
        return "accepted", got
    finally:
        c.close()


def sow_query(ctx: Ctx, right: str, topic: str) -> Observed:
    ctx.publish(topic)
    return _query(ctx, right, topic, {"c": "sow", "t": topic}, "subscribe", topic)


def sow_and_subscribe(ctx: Ctx, right: str, topic: str) -> Observed:
    ctx.publish(topic)
    header = {"c": "sow_and_subscribe", "t": topic}
    return _query(ctx, right, topic, header, "subscribe", topic)


def sow_and_delta_subscribe(ctx: Ctx, right: str, topic: str) -> Observed:
    ctx.publish(topic)
    # each live delta carries the record's key fields (send_keys): its `n`
    header = {"c": "sow_and_delta_subscribe", "t": topic, "o": "send_keys"}
    return _query(ctx, right, topic, header, "subscribe", topic)


def delta_subscribe(ctx: Ctx, right: str, topic: str) -> Observed:
    return _live(ctx, right, topic, {"c": "delta_subscribe", "t": topic})


def sow_on_a_queue(ctx: Ctx, right: str, topic: str) -> Observed:
    """`sow` on a queue's name: its available messages, read as a consumer reads them."""
    queue, underlying = _queue(topic)
    ctx.publish(underlying)
    return _query(ctx, right, topic, {"c": "sow", "t": queue}, "consume", queue)


def delta_publish(ctx: Ctx, right: str, topic: str) -> Observed:
    """delta_publish to a SOW topic (a new key each: inserted whole), with a processed ack."""
    return _acked_publishes(ctx, right, topic, "delta_publish")


def sow_delete_records(ctx: Ctx, right: str, topic: str) -> Observed:
    """sow_delete by filter on a SOW topic; the auditor's query then shows what is left."""
    ack = _delete_by_filter(ctx, right, topic, topic, topic)
    _, survivors = _answer(ctx, ctx.auditor, {"c": "sow", "t": topic})
    out = _deleted(ack, survivors)
    if out[0] == "refused":
        ctx.refusals.append((USER[right], "publish", topic))
    return out


def admin_sow_query(ctx: Ctx, right: str, topic: str) -> Observed:
    """GET /sow/<topic> on the admin endpoint: admin, and the Subscribe right on the topic."""
    ctx.publish(topic)
    user = USER[right]
    status, _, body = admin_get(ctx.server, f"/sow/{topic}", user, PASSWORDS[user])
    if status == 403:
        need, on = ("admin", "") if b"no admin right" in body else ("subscribe", topic)
        ctx.refusals.append((user, need, on))
        return "refused", []
    assert status == 200, (status, body)
    return "accepted", sorted(r["body"]["n"] for r in json.loads(body)["records"])


ACTION_HEADER = {"X-Requested-By": "tickertape-console"}


def admin_http(ctx: Ctx, right: str, topic: str) -> Observed:
    """GET /stats, and a console action (POST; the job named does not exist: 404 once past
    the admin check)."""
    user = USER[right]
    status, _, _ = admin_get(ctx.server, "/stats", user, PASSWORDS[user])
    conn = http.client.HTTPConnection("127.0.0.1", ctx.server.admin_port, timeout=10)
    try:
        pair = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        conn.request("POST", "/actions/no-such-action/run",
                     headers={**ACTION_HEADER, "Authorization": f"Basic {pair}"})  # fmt: skip
        action = conn.getresponse().status
    finally:
        conn.close()
    if (status, action) == (403, 403):
        ctx.refusals.append((user, "admin", ""))
        return "refused", []
    assert (status, action) == (200, 404), f"/stats {status}, action {action}"
    return "accepted", SEEN[ALL]


RUNNERS: dict[str, Runner] = {
    "live subscribe": live_subscribe,
    "bookmark replay": bookmark_replay,
    "range replay": range_replay,
    "regex subscribe": regex_subscribe,
    "conflation": conflation,
    "conflated replay": conflated_replay,
    "replace": replace,
    "pause/resume": pause_resume,
    "queue delivery": queue_delivery,
    "queue replay": queue_replay,
    "sow_delete by bookmark": sow_delete_by_bookmark,
    "sow_delete by filter": sow_delete_by_filter,
    "publish (slow path)": publish_slow,
    "publish (fast path)": publish_fast,
    "admin over HTTP": admin_http,
    "sow query": sow_query,
    "sow_and_subscribe": sow_and_subscribe,
    "sow_and_delta_subscribe": sow_and_delta_subscribe,
    "delta_subscribe": delta_subscribe,
    "delta_publish": delta_publish,
    "sow_delete on a SOW topic": sow_delete_records,
    "sow on a queue": sow_on_a_queue,
    "admin SOW query": admin_sow_query,
}
PATHS = tuple(RUNNERS)

# -- the expected outcomes ---------------------------------------------------------------------

R, A = REFUSED, A_ONLY
TABLE: dict[str, tuple[str, ...]] = {
    #                          Publish Subscribe Replay Consume Admin Deny  Filter
    "live subscribe":         (R,      ALL,      R,     R,      R,    R,    A),
    "bookmark replay":        (R,      R,        ALL,   R,      R,    R,    A),
    "range replay":           (R,      R,        ALL,   R,      R,    R,    A),
    # a regex that is not exactly a deny regex is allowed topic by topic: Deny reads nothing
    "regex subscribe":        (R,      ALL,      R,     R,      R,    NONE, A),
    "conflation":             (R,      ALL,      R,     R,      R,    R,    A),
    "conflated replay":       (R,      R,        ALL,   R,      R,    R,    A),
    "replace":                (R,      ALL,      R,     R,      R,    R,    A),
    "pause/resume":           (R,      R,        ALL,   R,      R,    R,    A),
    "queue delivery":         (R,      R,        R,     ALL,    R,    R,    A),
    # a bookmark on a queue's name replays its underlying topic: replay, not consume
    "queue replay":           (R,      R,        ALL,   R,      R,    R,    A),
    "sow_delete by bookmark": (R,      R,        R,     ALL,    R,    R,    A),
    "sow_delete by filter":   (R,      R,        R,     ALL,    R,    R,    A),
    # content filters limit reading, not publishing
    "publish (slow path)":    (ALL,    R,        R,     R,      R,    R,    ALL),
    "publish (fast path)":    (ALL,    R,        R,     R,      R,    R,    ALL),
    "admin over HTTP":        (R,      R,        R,     R,      ALL,  R,    R),
    "sow query":              (R,      ALL,      R,     R,      R,    R,    A),
    "sow_and_subscribe":      (R,      ALL,      R,     R,      R,    R,    A),
    "sow_and_delta_subscribe": (R,     ALL,      R,     R,      R,    R,    A),
    "delta_subscribe":        (R,      ALL,      R,     R,      R,    R,    A),
    # content filters limit reading, not writing (as for publish)
    "delta_publish":          (ALL,    R,        R,     R,      R,    R,    ALL),
    "sow_delete on a SOW topic": (ALL, R,        R,     R,      R,    R,    ALL),
    # a queue's available messages, read as its consumers read them
    "sow on a queue":         (R,      R,        R,     ALL,    R,    R,    A),
    # admin alone does not read a topic: the console's query needs Subscribe on it too
    "admin SOW query":        (R,      R,        R,     R,      R,    R,    R),
}  # fmt: skip
CELLS = {
    (path, right): outcome
    for path, row in TABLE.items()
    for right, outcome in zip(RIGHTS, row, strict=False)
}

HOLES: dict[tuple[str, str], pytest.MarkDecorator] = {}  # none open


def test_every_cell_is_declared():
    """Every path × every right has an expected outcome, and every row is a path we run."""
    missing = [(p, r) for p in PATHS for r in RIGHTS if (p, r) not in CELLS]
    assert missing == [], f"no expected outcome for {missing}"
    assert set(TABLE) == set(PATHS), f"rows without a runner: {set(TABLE) - set(PATHS)}"
    assert all(len(row) == len(RIGHTS) for row in TABLE.values())
    assert set(CELLS.values()) <= {ALL, A_ONLY, NONE, REFUSED}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, pki):
    d = tmp_path_factory.mktemp("matrix")
    users_file(d / "users.db", PASSWORDS)
    config = secure_config(
        d,
        pki,
        authentication=f"<Authentication><PasswordFile>{d}/users.db</PasswordFile>"
        "</Authentication>",
        entitlement=f"<Entitlement>{ROLES}</Entitlement>",
    ).replace("<SOW>", f"<SOW>{SOW_TOPICS}{queues_xml()}", 1)
    server = start(d, config)
    port = ports(server)["plain"]
    c = Ctx(server, port, Conn(port, "feeder", "feeder"), Conn(port, "auditor", "auditor"))
    yield c
    c.feeder.close()
    c.auditor.close()
    server.stop()


@pytest.mark.parametrize(
    "path,right",
    [
        pytest.param(p, r, marks=HOLES.get((p, r), ()), id=f"{slug(p)}-{r.lower()}")
        for p in PATHS
        for r in RIGHTS
    ],
)
def test_cell(ctx, path, right):
    expected = CELLS.get((path, right))
    assert expected is not None, f"TABLE has no outcome for {path} × {right}"
    topic = f"mx.{slug(path)}.{right.lower()}"
    ctx.refusals.clear()
    kind, effect = RUNNERS[path](ctx, right, topic)
    got = REFUSED if kind == "refused" and effect == [] else None
    if kind == "accepted":
        got = next((o for o, ns in SEEN.items() if ns == effect), None)
    assert got == expected, f"{path} as {USER[right]}: {kind}, effect {effect}; want {expected}"
    for user, need, where in ctx.refusals:  # every refusal is audited
        line = rf"audit: refused peer=\S+ user={re.escape(user)} right={need}"
        ctx.server.wait_for_log(line + (rf" topic={re.escape(where)}(?:\s|$)" if where else ""))
