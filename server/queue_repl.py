"""Replicated queues (docs/replication.md "Replicated queues"): who owns which queue message,
the queue events that come over replication links, and the takeover of a lost owner.

The rule: a queue message is owned by the instance where it was published (its *origin*: the
record's origin block, or this instance for a local record). Every instance keeps every
queue's state for all messages, but leases only the messages it owns. The others wait in
`QueueReplication.held`, by owner, until an event from elsewhere makes them done or this
instance takes their owner over.

Ownership moves only by takeover, an OWNER event (journal/queue_events.py) journaled in each
queue and replicated: `new` takes every message `former` owns now, and the messages that
originate at `former` with an origin time up to the event's cut (the newest it holds of
them). Later messages of `former` stay `former`'s (a takeover of an instance that came back
does not steal its new publishes); one that arrives late, while `former` is still down, is
taken over by the next check. Ownership taken over stays with the taker.

`CatchUp` says when the queues may lease at all: not while a peer's queue events are being
caught up (after this instance starts, and after a link from a peer comes back: a healed
partition), since until then a message this instance would lease may be done already there.

`Failover` decides takeovers: a peer whose link has been down for <QueueOwnerFailover>
seconds (`source_up` / `source_down`, from the replication receiver; a configured destination
is down from the start until its link comes up) is taken over by the lowest-named instance of
those that see it down: each survivor waits failover x (1 + its rank among itself and the
peers it sees up), so the lowest acts first and the others find nothing left to take.

States of a message here, besides those of server/queue.py:

    held (owned elsewhere) --event from elsewhere: acked / expired / delivered--> done
    held --takeover (OWNER event)--> waiting (returned: first in line; a lease it had elsewhere
                                     makes the next delivery a counted redelivery)
    waiting / leased --OWNER event naming another owner--> held (its lease here is dropped)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from journal.queue_events import QueueOp, append_owner, iter_events
from journal.record import raw_origin
from protocol.replication import RETRY_MAX

from .queue_state import QueueState

__all__ = ["CatchUp", "Failover", "QueueReplication", "record_origin"]

log = logging.getLogger("tickertape.queues")

DONE_OPS = (QueueOp.ACKED, QueueOp.ACKED_RUN, QueueOp.EXPIRED, QueueOp.DELIVERED_AT_MOST_ONCE)

Held = tuple[str, int, int, Any]
"""(origin instance, origin time µs, local receive time µs, the publish's `e` or None)."""


def _origin(o: Any) -> tuple[str, int] | None:
    """(instance, origin time) of an origin block (time µs, instance name, group) as
    journal/record.py hands it out, instance names as bytes or str."""
    if o is None:
        return None
    name = o[1]
    return (
        name.decode(errors="replace") if isinstance(name, bytes | bytearray) else str(name)
    ), int(o[0])


def record_origin(extra: Any, ts: int) -> tuple[str, int] | None:
    """(origin instance, origin time) of a raw record read back from the journal (`extra`:
    its optional part, journal/record.py's RawExtra), None for a record published here."""
    return _origin(raw_origin(extra))


def message_origin(m: Any) -> tuple[str, int] | None:
    """(origin instance, origin time) of a committed message (server/fanout.Message; its
    `origin`, when the pipeline gives it one, is the record's origin block), None for one
    published here."""
    return _origin(getattr(m, "origin", None))


class QueueReplication:
    """One queue's ownership: the takeovers it has journaled or applied, and the messages it
    holds for other owners. It changes the queue's state (`q`) only through the state's named
    operations."""

    def __init__(self, q: QueueState, instance: str) -> None:
        self.q = q
        self.me = instance
        # former owner -> [(cut, new owner, n)], n counting every takeover in the order applied
        self.takeovers: dict[str, list[tuple[int, str, int]]] = {}
        self._applied = 0
        self.held: dict[str, dict[int, Held]] = {}  # owner -> position -> Held
        self.stats = {"taken_over": 0, "done_elsewhere": 0, "released": 0}

    # -- ownership -------------------------------------------------------------------------

    def owner_of(self, origin: str, otime: int) -> str:
        """Who owns a message of `origin` stamped `otime` there, after every takeover so far:
        the first takeover of its origin whose cut covers it, then every later takeover of
        each owner it moved to, in the order they were applied."""
        owner = origin
        after = -1
        first = True
        while True:
            nxt = None
            for cut, new, n in self.takeovers.get(owner, ()):
                if n > after and (not first or otime <= cut):
                    nxt, after = new, n
                    break
            if nxt is None:
                return owner
            owner, first = nxt, False

    def holds_for(self, owner: str) -> bool:
        return bool(self.held.get(owner))

    def is_held(self, pos: int) -> bool:
        """Whether the message at `pos` is held here for another owner."""
        return any(pos in msgs for msgs in self.held.values())

    def place(self, position: int, ts: int, exp: Any, origin: tuple[str, int] | None) -> bool:
        """A message on the queue's topic: True if another instance owns it (held here), False
        if this instance does (the caller makes it waiting)."""
        if origin is None:
            name, otime = self.me, ts
        else:
            name, otime = origin
        owner = self.owner_of(name, otime)
        if owner == self.me:
            return False
        self.held.setdefault(owner, {})[position] = (name, otime, ts, exp)
        return True

    def cut_for(self, former: str) -> int:
        """The cut of a takeover of `former` now: the newest origin time of the messages of
        `former`'s own origin held here (0: none)."""
        return max((h[1] for h in self.held.get(former, {}).values() if h[0] == former), default=0)

    def take_over(self, former: str) -> None:
        """This instance takes over `former`: an OWNER event journaled (and replicated), then
        applied here."""
        cut = self.cut_for(former)
        buf = bytearray()
        append_owner(buf, former, self.me, cut)
        self.q.add_events(buf)
        self.apply_owner(former, self.me, cut)
        self.stats["taken_over"] += 1

    def apply_owner(self, former: str, new: str, cut: int) -> None:
        """An OWNER event (journaled here, replicated from elsewhere, or read by recovery)."""
        if former == new:
            return
        self.takeovers.setdefault(former, []).append((cut, new, self._applied))
        self._applied += 1
        q = self.q
        # messages held for other owners: those now owned here become waiting, first in line
        gained = []
        for owner in list(self.held):
            msgs = self.held[owner]
            for pos, h in list(msgs.items()):
                now_owner = self.owner_of(h[0], h[1])
                if now_owner != owner:
                    del msgs[pos]
                    if now_owner == self.me:
                        gained.append((pos, h))
                    else:
                        self.held.setdefault(now_owner, {})[pos] = h
            if not msgs:
                self.held.pop(owner, None)
        for pos, (_, _, ts, exp) in gained:
            q.return_first(pos, ts, exp)
        if gained:
            log.info(
                "queue %s: %d message(s) of %s taken over by %s", q.name, len(gained), former, new
            )
        lost_here = former == self.me or any(
            n == self.me for _, n, _ in self.takeovers[former][:-1]
        )
        if new != self.me and lost_here:
            self._release_lost()
        if gained and not q.host.loading:
            q.pump()

    def _release_lost(self) -> None:
        """Messages waiting or leased here whose owner is no longer this instance (this
        instance was taken over while it was cut off): held again, leases dropped (their
        consumers' acks find nothing; the new owner delivers them again)."""
        q = self.q
        read_origin = getattr(q.host, "origin_at", None)
        if read_origin is None:
            return
        for pos in q.waiting_or_leased():
            got = read_origin(pos)
            if got is None:
                continue
            origin, ts, exp = got
            name, otime = origin if origin is not None else (self.me, ts)
            owner = self.owner_of(name, otime)
            if owner == self.me:
                continue
            q.release(pos)
            self.held.setdefault(owner, {})[pos] = (name, otime, ts, exp)
            self.stats["released"] += 1

    # -- events from elsewhere -------------------------------------------------------------

    def apply_remote(self, body: bytes) -> None:
        """Apply a replicated event body (local positions, journal/queue_events.py) to the
        state here; the caller journals the body."""
        q = self.q
        for op, value, positions, names in iter_events(body):
            if names is not None:
                self.apply_owner(names[0], names[1], positions[0])
                continue
            for pos in positions:
                self._apply_one(q, op, value, pos)

    def _apply_one(self, q: QueueState, op: int, value: int, pos: int) -> None:
        holder = None
        for owner, msgs in self.held.items():
            if pos in msgs:
                holder = owner
                break
        if op in DONE_OPS:
            if holder is not None:
                del self.held[holder][pos]
                q.forget_counts(pos)
                self.stats["done_elsewhere"] += 1
            # leased here too (both sides delivered it, a partition) or waiting: done all the same
            elif q.apply_done(pos):
                self.stats["done_elsewhere"] += 1
            return
        q.apply_count(op, value, pos, holder is not None)

    def forget_done(self, done: set[int]) -> None:
        """Recovery: drop the held messages that events made done (the queue drops the
        waiting ones: QueueState.recovered)."""
        for owner in list(self.held):
            msgs = self.held[owner]
            for pos in [p for p in msgs if p in done]:
                del msgs[pos]
            if not msgs:
                del self.held[owner]

    def snapshot(self) -> dict[str, int]:
        return {
            "held_for_others": sum(len(m) for m in self.held.values()),
            **self.stats,
        }


class Failover:
    """When to take over a peer: its link down for `failover` seconds x (1 + this instance's
    rank among itself and the peers it sees up, by name). `clock` is monotonic seconds.

    A peer whose link has not come up since this instance started counts as down only from
    `grace` seconds after the start (default: `failover`): instances of a set started together
    do not come up at the same moment, and one that recovers a long journal is not lost."""

    def __init__(
        self,
        instance: str,
        peers: Iterable[str],
        failover: float,
        clock: Callable[[], float] = time.monotonic,
        grace: float | None = None,
    ) -> None:
        self.me = instance
        self.failover = failover
        self.clock = clock
        self.grace = failover if grace is None else grace
        start = clock() + self.grace
        self.down_since: dict[str, float] = {p: start for p in peers if p != instance}
        self.up: set[str] = set()

    def source_up(self, name: str) -> None:
        if name == self.me:
            return
        self.up.add(name)
        self.down_since.pop(name, None)

    def source_down(self, name: str) -> None:
        if name == self.me:
            return
        self.up.discard(name)
        self.down_since.setdefault(name, self.clock())

    def due(self) -> list[str]:
        """The peers this instance should take over now (if it holds messages they own)."""
        now = self.clock()
        out = []
        for peer, since in self.down_since.items():
            if now < since:
                continue
            candidates = sorted({self.me} | (self.up - {peer}))
            rank = candidates.index(self.me)
            if now - since >= self.failover * (1 + rank):
                out.append(peer)
        return out


class CatchUp:
    """The peers whose queue events this instance may not have applied yet.

    A peer is catching up from this instance's start (what it did while this instance was
    away) and again each time its link comes back up (what it did while the link was down: a
    partition that healed). Until it has, a message this instance owns may have been acked,
    delivered at most once or taken over there, in an event still on its way; leasing it now
    delivers it again, and each applied record that frees a lease here would hand out the next
    message, whose event is in the next record. A peer has caught up (`synced`) when this
    instance has applied everything below the journal end it named on its link's logon, or its
    link went idle (it sends heartbeats only when it has nothing more to send).

    A peer whose link is up is waited for until it has synced, however long its catch-up
    takes (a slow or loaded link); the link's own timer drops a dead link. So is a peer whose
    link is logging on (`logon`): its password check can outlast the bound on a loaded machine,
    and the peer is alive. A peer whose link is down, or has not come up, is waited for at most
    `failover` seconds plus RETRY_MAX (`bound`; `clock`: monotonic seconds) from the start of
    its catch-up: it may be down for good, and a live one tries its link again within
    RETRY_MAX (it may have failed its tries while this instance was down, and be backing off;
    seams campaign seed 12 round 137: a peer that had taken this instance over was given up
    30 ms before its link came, and both delivered the messages it took). A logon only prolongs
    a wait under way (one that fails ends the prolonging): an unauthenticated connection
    cannot start one."""

    def __init__(self, failover: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failover = failover
        self.bound = failover + RETRY_MAX
        self.clock = clock
        self.until: dict[str, float] = {}  # peer -> when to stop waiting for it while down
        self.up: set[str] = set()  # peers whose link is up now
        self.logging_on: dict[str, int] = {}  # peer -> its links whose logon is being checked

    def __bool__(self) -> bool:
        return bool(self.until)

    def start(self, peers: Iterable[str]) -> None:
        """This instance starts: every peer is behind until it syncs."""
        end = self.clock() + self.bound
        self.until = dict.fromkeys(peers, end)

    def listening(self) -> None:
        """This instance now takes links: a peer could not link before, so the bound of each
        wait under way counts from here (opening the journal and recovery come first)."""
        end = self.clock() + self.bound
        for peer, until in self.until.items():
            self.until[peer] = max(until, end)

    def link_up(self, peer: str) -> bool:
        """A link from `peer` came up: True if that starts a catch-up (one already running,
        the start's or an earlier link's, now waits for this link to sync)."""
        self.up.add(peer)
        if peer in self.until:
            return False
        self.until[peer] = self.clock() + self.bound
        return True

    def link_down(self, peer: str) -> None:
        """The link from `peer` is gone: a catch-up of it waits out its `failover` bound."""
        self.up.discard(peer)

    def logon(self, peer: str, checking: bool) -> None:
        """A link that names itself `peer` starts (`checking`) or ends its logon check."""
        n = self.logging_on.get(peer, 0) + (1 if checking else -1)
        if n > 0:
            self.logging_on[peer] = n
        else:
            self.logging_on.pop(peer, None)

    def synced(self, peer: str) -> bool:
        """`peer` has sent everything it had: True if it was being waited for."""
        return self.until.pop(peer, None) is not None

    def overdue(self) -> list[str]:
        """The peers without a link waited for `failover` seconds (no longer waited for)."""
        now = self.clock()
        live = self.up | self.logging_on.keys()
        late = sorted(p for p, end in self.until.items() if now >= end and p not in live)
        for p in late:
            del self.until[p]
        return late
