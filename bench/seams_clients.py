"""The clients of a seams round (bench/fault_seams.py): what each one records for the oracle.

- `body(name, seq)`: a payload that carries its own hash and a desk ("A" or "B", fixed by the
  hash), so any delivered byte can be checked, and each desk's user can be checked to see only
  its desk.
- `QueueConsumer`: one per queue per instance, always on its own instance (it waits there while
  the instance is down). At-least-once consumers acknowledge each delivery (sow_delete) and note
  when the server confirmed it; at-most-once consumers acknowledge too (that frees their
  backlog). Every delivery and every confirmed at-least-once acknowledgement goes into the
  round's `Ledger`, with its time and instance.
- `DeskSubscriber`: a user with a content-filter entitlement (alice: desk A, bob: desk B)
  replaying the topic from the start on one instance, moving to the next one whenever its
  connection is lost; any message of the other desk is a violation.
- `FilterDeleter`: a desk user acknowledging the other desk's queue messages by filter; its
  content filter must make that delete nothing.
- `HASubscriber`: the project's HAClient over every instance, a bookmark subscription resumed
  from its bookmark store after each failover; it must get every message exactly once.
- `stored_ids(port, logon)`: the (publisher, sequence) ids an instance serves in a replay.

Users and their passwords are `USERS` (fault_seams.py writes the password file and roles).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field

from fault_campaign import Violation, connect, frame

TOPIC = "fc"
ALO_QUEUE = "fcq"  # at-least-once, over TOPIC
AMO_QUEUE = "fcm"  # at-most-once, over TOPIC
USERS = {
    "repl": "repl-pw",  # the replication links (admin)
    "pub": "pub-pw",  # publishers; replays for the oracle
    "cons": "cons-pw",  # queue consumers: every desk
    "hasub": "hasub-pw",  # the HA subscriber: every desk
    "alice": "alice-pw",  # desk A only
    "bob": "bob-pw",  # desk B only
}


def login(user: str) -> dict:
    return {"user_id": user, "pw": USERS[user]}


def desk_of(name: str, seq: int) -> str:
    return "AB"[hashlib.blake2b(b"%s/%d" % (name.encode(), seq), digest_size=1).digest()[0] & 1]


def body(name: str, seq: int) -> bytes:
    h = hashlib.blake2b(b"%s|%d" % (name.encode(), seq), digest_size=8).hexdigest()
    d = {"p": name, "s": seq, "h": h, "desk": desk_of(name, seq), "pad": "x" * (seq % 97)}
    return json.dumps(d).encode()


def body_ok(data: bytes) -> tuple[str, int, str] | None:
    """(publisher name, sequence, desk) of a payload published byte for byte, else None."""
    try:
        d = json.loads(data)
        if body(d["p"], d["s"]) != data:
            return None
        return d["p"], d["s"], d["desk"]
    except (ValueError, KeyError, TypeError):
        return None


def msg_id(bm: str) -> tuple[int, int]:
    """(publisher id, sequence) of a bookmark `pub|seq|`."""
    pub, seq = bm.split("|")[:2]
    return int(pub), int(seq)


@dataclass
class Ledger:
    """Every queue delivery and confirmed acknowledgement of a round, in time order."""

    # (time, instance, queue, bookmark)
    delivered: list[tuple[float, str, str, str]] = field(default_factory=list)
    acked: list[tuple[float, str, str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)  # the round's start, for messages


class QueueConsumer:
    def __init__(self, instance: str, port: int, queue: str, ledger: Ledger, user: str = "cons"):
        self.instance, self.port, self.queue, self.ledger = instance, port, queue, ledger
        self.user = user
        # at-most-once deliveries are acknowledged too: that frees the subscription's backlog
        # (docs/protocol.md); only the at-least-once acknowledgements go into the ledger
        self.ledger_acks = queue == ALO_QUEUE
        self.got = 0
        self.desks: set[str] = set()  # desks delivered (entitlement check for a desk user)

    async def run(self, stop: asyncio.Event) -> None:
        name = f"fc-{self.queue}-{self.instance}-{self.user}"
        while not stop.is_set():
            try:
                f, w, _ = await connect(self.port, name, **login(self.user))
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.1)
                continue
            try:
                w.write(frame({"c": "subscribe", "t": self.queue, "cid": "s", "a": "processed",
                               "o": "max_backlog=20"}))  # fmt: skip
                pending: dict[str, str] = {}
                n = 0
                while not stop.is_set():
                    try:
                        h, data = await asyncio.wait_for(f.next(), 0.3)
                    except TimeoutError:
                        continue
                    if h.get("c") == "p":
                        self._delivered(h.get("bm", ""), data)
                        n += 1
                        pending[f"a{n}"] = h.get("bm", "")
                        w.write(frame({"c": "sow_delete", "t": self.queue, "bm": h.get("bm"),
                                       "cid": f"a{n}", "a": "processed"}))  # fmt: skip
                    elif h.get("c") == "ack" and h.get("cid", "").startswith("a"):
                        bm = pending.pop(h["cid"], None)
                        if bm and h.get("status") == "success" and self.ledger_acks:
                            self.ledger.acked.append((time.monotonic(), self.instance,
                                                      self.queue, bm))  # fmt: skip
            except Violation as exc:
                self.ledger.violations.append(f"{self.queue}@{self.instance}: {exc}")
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()
            await asyncio.sleep(0.05)

    def _delivered(self, bm: str, data: bytes) -> None:
        self.got += 1
        self.ledger.delivered.append((time.monotonic(), self.instance, self.queue, bm))
        got = body_ok(data)
        if got is None:
            self.ledger.violations.append(
                f"{self.queue}@{self.instance}: delivered a message that was not published: "
                f"{data[:80]!r}"
            )
        else:
            self.desks.add(got[2])


class DeskSubscriber:
    """A desk user's bookmark subscription, replayed from the start on each instance it moves
    to; `wrong` counts messages of another desk it was handed."""

    def __init__(self, user: str, desk: str, ports: list[tuple[str, int]], start: int):
        self.user, self.desk, self.ports = user, desk, ports
        self.i = start
        self.got = 0
        self.wrong: list[str] = []
        self.foreign: list[str] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            inst, port = self.ports[self.i % len(self.ports)]
            try:
                f, w, _ = await connect(port, f"fc-desk-{self.user}", **login(self.user))
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                self.i += 1
                await asyncio.sleep(0.1)
                continue
            try:
                w.write(frame({"c": "subscribe", "t": TOPIC, "cid": "s", "bm": "0",
                               "a": "processed"}))  # fmt: skip
                while not stop.is_set():
                    try:
                        h, data = await asyncio.wait_for(f.next(), 0.3)
                    except TimeoutError:
                        continue
                    if h.get("c") != "p":
                        continue
                    self.got += 1
                    got = body_ok(data)
                    if got is None:
                        self.foreign.append(f"{self.user}@{inst}: not published: {data[:60]!r}")
                    elif got[2] != self.desk:
                        self.wrong.append(f"{self.user}@{inst} (desk {self.desk}) got {h.get('bm')} "
                                          f"of desk {got[2]}")  # fmt: skip
            except Violation as exc:
                self.foreign.append(f"{self.user}@{inst}: {exc}")
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                w.close()
            self.i += 1  # lost: the next instance, from the start
            await asyncio.sleep(0.05)


class FilterDeleter:
    """A desk user acknowledging by filter, every 0.3 s, the other desk's messages on the
    at-least-once queue: its content filter must leave it nothing to delete (`records_deleted`
    0, or a refusal). Anything deleted is an entitlement breach."""

    def __init__(self, user: str, other_desk: str, instance: str, port: int):
        self.user, self.other, self.instance, self.port = user, other_desk, instance, port
        self.deleted = 0
        self.sent = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                f, w, _ = await connect(self.port, f"fc-del-{self.user}", **login(self.user))
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(0.2)
                continue
            try:
                while not stop.is_set():
                    self.sent += 1
                    w.write(frame({"c": "sow_delete", "t": ALO_QUEUE, "cid": "d", "a": "processed",
                                   "f": f"/desk = '{self.other}'"}))  # fmt: skip
                    while True:
                        h, _ = await asyncio.wait_for(f.next(), 5)
                        if h.get("c") == "ack" and h.get("cid") == "d":
                            self.deleted += int(h.get("records_deleted") or 0)
                            break
                    await asyncio.sleep(0.3)
            except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, Violation):
                pass
            finally:
                w.close()
            await asyncio.sleep(0.1)


class HASubscriber:
    """An HAClient bookmark subscriber over every instance (`addresses` in failover order)."""

    def __init__(self, addresses: list[str], trace=lambda what: None):
        self.addresses = addresses
        self.trace = trace
        self.seen: list[str] = []
        self.errors: list[str] = []
        self.failovers = 0

    async def run(self, stop: asyncio.Event) -> None:
        from client import MOST_RECENT, HAClient

        ha = HAClient("fc-ha-sub", servers=self.addresses, user_id="hasub",
                      password=USERS["hasub"], heartbeat=1.0)  # fmt: skip
        try:
            await ha.connect_and_logon(timeout=30)
            self.trace(f"HA subscriber logged on to {ha.current_uri}; subscribing")
            hs = await ha.subscribe(TOPIC, bookmark=MOST_RECENT, sub_id="fc-ha", timeout=30)
            self.trace("HA subscriber subscribed")
            while not stop.is_set():
                try:
                    m = await hs.next(timeout=0.3)
                except TimeoutError:
                    continue
                if m is None:
                    self.errors.append("the HA subscription ended")
                    return
                if m.bookmark:
                    self.seen.append(m.bookmark)
                if body_ok(m.body) is None:
                    self.errors.append(f"HA subscriber got what was not published: {m.body[:60]!r}")
                hs.discard(m)
        except Exception as exc:  # the oracle reports it: the subscriber must survive failovers
            self.errors.append(f"HA subscriber failed: {type(exc).__name__}: {exc}")
        finally:
            self.failovers = ha.reconnects
            await ha.close()


async def stored_ids(port: int, timeout: float = 10.0) -> set[tuple[int, int]]:
    """(publisher id, sequence) of every message of TOPIC an instance replays from the start."""
    f, w, _ = await connect(port, f"fc-oracle-{time.monotonic_ns()}", **login("pub"))
    try:
        w.write(frame({"c": "subscribe", "t": TOPIC, "bm": "0", "cid": "r",
                       "a": "processed,completed", "o": "bookmark_not_found=epoch"}))  # fmt: skip
        out: set[tuple[int, int]] = set()
        while True:
            h, _ = await asyncio.wait_for(f.next(), timeout)
            if h.get("c") == "p":
                out.add(msg_id(h["bm"]))
            elif h.get("c") == "ack" and h.get("a") == "completed":
                return out
            elif h.get("c") == "ack" and h.get("status") == "failure":
                raise ConnectionError(f"replay refused: {h}")
    finally:
        w.close()
