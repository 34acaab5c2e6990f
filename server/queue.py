"""A message queue (docs/protocol.md §8): a view over recorded topics with leases, backlogs and fairness.

A queue never copies a message body. Per waiting message it keeps the journal position and the
receive time (16 bytes in two `array('Q')`s); messages that were delivered at least once also
have a small entry in `counts`. Bodies are read back from the journal when a message is
delivered from the backlog (through a one-block cache, so a run of deliveries costs one read),
or taken from memory when a fresh message can go straight to a consumer.

Message states:

    waiting --deliver--> leased --ack / expire--> done
       ^                   |
       +---- lease ends, cancel, holder disconnects (back at the front, redelivered first)
    waiting --expiration, max deliveries, max cancels--> done (to the dead-letter topic)

At-most-once: delivered is done; the consumer's ack only frees its backlog.

Durability: every state change that must survive a restart is a queue *event*, written to the
journal in the same group commit as publishes, as one record per queue per batch; the event
format and the recovery checkpoint are journal/queue_events.py's. The runs (LEASED_RUN,
ACKED_RUN) are what a batch of deliveries and a batched ack write. Acks to clients are sent only
once the event is durable. The checkpoint (the position below which every message of the queue
is done) is committed with the events, so a restart scans only from there: messages on the
underlying topic become waiting, events are applied, leases are not restored (a leased message
is waiting again, with its delivery count).

Leases expire on one heap with one loop timer; not one task per message. The common case
delivers in runs (`Queue._lease_run`): the next waiting messages go to one subscriber at once,
their frames spliced from the journal block (server/splice.py), with one heap entry and one
LEASED_RUN event for the whole run; a batched ack is one dict lookup per bookmark string and one
ACKED_RUN event.
"""

from __future__ import annotations

import array
import heapq
import time
from itertools import repeat
from typing import Any

from config.model import QueueSpec
from journal.queue_events import MAX_RUN, QueueOp
from protocol.bookmarks import format_bookmark, publisher_bookmark

from . import frames
from .fanout import Message
from .frames import STORED, pack_len
from .matching import Body, Predicate, body_matches
from .outbox import Outbox
from .queue_state import (
    Lease,
    QueueHost,
    QueueState,
    QueueSub,
    StoredMessage,
    new_lease,
    now_us,
)
from .subscriptions import Subscription, SubscriptionOwner

__all__ = ["Queue"]

_HIDDEN = "%s is a message this user's content entitlement does not show (not entitled)"


class Queue(QueueState):
    def __init__(self, host: QueueHost, spec: QueueSpec) -> None:
        super().__init__(host, spec, self.pump)

    # -- subscribers -----------------------------------------------------------------------

    @property
    def filtered_subs(self) -> bool:
        return self._filtered > 0

    def add_sub(self, sub: Subscription, max_backlog: int | None) -> None:
        cap = self.spec.max_per_subscription_backlog or 1
        self.subs.append(QueueSub(sub, max(1, min(max_backlog or 1, cap))))
        if sub.filter is not None:
            self._filtered += 1
        sub.queue = self
        if self.parked:
            for p in self.parked:
                heapq.heappush(self.returned, p)
            self.parked.clear()
        self.pump()

    def remove_sub(self, sub: Subscription) -> None:
        qs = next((q for q in self.subs if q.sub is sub), None)
        if qs is None:
            return
        self.subs.remove(qs)
        if sub.filter is not None:
            self._filtered -= 1
        returned = sorted(p for p, lease in self.leased.items() if lease.holder is qs)
        for p in returned:
            lease = self.leased.pop(p)
            self.by_bm.pop(lease.bm, None)
            if not self.at_most_once:
                self.counts[p] = lease.delivery_counts()
                self._return(p, "disconnect")
        self.pump()

    def _pick(self, body_doc_fn: Any) -> QueueSub | None:
        """The subscription that gets the next message, by the fairness model (None if full)."""
        subs = self.subs
        if not subs:
            return None
        limit = self.spec.max_backlog
        if limit and len(self.leased) >= limit:
            return None
        best = None
        n = len(subs)
        if self.fairness == "proportional":
            ratio = 2.0
            for qs in subs:
                if qs.outstanding < qs.backlog and (
                    qs.sub.filter is None or body_doc_fn(qs.sub.filter)
                ):
                    r = qs.outstanding / qs.backlog
                    if r == 0.0:
                        return qs  # nothing outstanding: no one can beat it
                    if r < ratio:
                        ratio, best = r, qs
            return best
        start = self.rr if self.fairness == "round-robin" else 0
        for k in range(n):
            qs = subs[(start + k) % n]
            if qs.outstanding < qs.backlog and (
                qs.sub.filter is None or body_doc_fn(qs.sub.filter)
            ):
                if self.fairness == "round-robin":
                    self.rr = (start + k + 1) % n
                return qs
        return None

    def any_matching_sub(self, doc_fn: Any) -> bool:
        return any(qs.sub.filter is None or doc_fn(qs.sub.filter) for qs in self.subs)

    # -- delivery --------------------------------------------------------------------------

    def offer_fresh(self, m: Message) -> None:
        """A committed message on the underlying topic: deliver at once or keep it waiting."""
        if (
            self.head >= len(self.avail_pos)
            and not self.returned
            and not self.barrier_wait
            and self.subs
            and not self.host.paused
        ):
            rec = (m.position, m.pub, m.seq, m.ts, m.topic.encode(), m.body, m.hdr)
            if self._try_deliver(rec):
                return
        self.add_waiting(m.position, m.ts, m.exp)
        self.pump()

    def _runs_possible(self) -> bool:
        """Whether waiting messages can go out in runs (_lease_run): at-least-once, one literal
        topic, no barrier, no expirations, no content filters, and one subscriber or the fast
        fairness model (which fills the first subscriber with room: a run is what it would do
        one message at a time)."""
        return (
            not self.at_most_once
            and self._topic_rx is None
            and self.barrier is None
            and not self._filtered
            and not self.spec.expiration
            and not self.expiry
            and (len(self.subs) == 1 or self.fairness == "fast")
        )

    def _lease_run(self, touched: set[Outbox]) -> int:
        """Lease the next waiting messages (from the head, none removed in between) to the first
        subscription with room, in one go: frames spliced from the journal's bytes, one
        LEASED_RUN event. Returns how many; 0 when it cannot (the caller goes one by one), -1
        when no subscription has room (nothing to do: no record is read)."""
        qs = self._pick(None)
        if qs is None:
            return -1
        room = qs.backlog - qs.outstanding
        limit = self.spec.max_backlog
        if limit:
            room = min(room, limit - len(self.leased))
        if room <= 0:
            return -1
        positions = self.avail_pos[self.head : self.head + min(room, MAX_RUN)]
        if not positions:
            return 0
        counts = self.counts
        if counts:  # delivered before (a restart): those go one by one, with their counts
            k = next((i for i, p in enumerate(positions) if p in counts), len(positions))
            if k == 0:
                return 0
            positions = positions[:k]
        sub = qs.sub
        head = qs.head
        if head[0] is not sub.prefix:
            head = qs.head = (sub.prefix, sub.prefix + frames.topic_member(self._topic_b))
        got = self.host.splice_run(positions, head[1], self._lease_end_part())
        if got is None:
            return 0
        spliced, bms, n = got
        if n < len(positions):
            positions = positions[:n]
        self.head += n
        self.gen += 1
        gen = self.gen
        deadline = time.monotonic() + self.lease_period
        if n == 1:  # backlog 1: one round trip a message, so no iterator machinery
            bm = bms[0]
            # new_lease: Lease(...) is a Python call, new_lease((...)) is not (the hot path)
            self.leased[positions[0]] = new_lease((qs, gen, bm, None))
            self.by_bm[bm] = positions[0]
        else:
            leases = map(new_lease, zip(repeat(qs), repeat(gen), bms, repeat(None)))
            self.leased.update(zip(positions, leases))
            self.by_bm.update(zip(bms, positions))
        qs.outstanding += n
        self.stats["delivered"] += n
        heapq.heappush(self.lease_heap, (deadline, gen, positions))
        self.host.arm(deadline)
        self.event_run(QueueOp.LEASED_RUN, positions)
        out = sub.out
        out.buf.append(spliced)
        out.sent += n
        touched.add(out)
        return n

    def pump(self) -> None:
        """Deliver waiting messages while some subscription has room."""
        if not self.subs or self.host.loading or self.host.paused:
            return
        touched: set[Outbox] = set()
        avail_pos = self.avail_pos
        exp_us = int(self.spec.expiration * 1e6) if self.spec.expiration else 0
        expiry = self.expiry
        now = now_us() if exp_us or expiry else 0
        runs = self._runs_possible()
        while True:
            if runs and not self.returned and not self.barrier_wait:
                if self.gone:
                    self._advance_head()
                    avail_pos = self.avail_pos
                if not self.gone:
                    k = self._lease_run(touched)
                    if k > 0:
                        if len(self.subs) == 1 and self.subs[0].outstanding >= self.subs[0].backlog:
                            break  # full: no need to ask again
                        continue
                    if k < 0:
                        break
            if self.returned:
                pos = self.returned[0]
                from_returned = True
                dl = expiry.get(pos, 0) if expiry else 0
                if dl and now >= dl:  # it came back, then its time ran out while it waited
                    heapq.heappop(self.returned)
                    self._expire(pos, "expiration", None)
                    continue
            else:
                if self.gone or self.head > 65536:
                    self._advance_head()
                    avail_pos = self.avail_pos
                if self.head >= len(avail_pos):
                    break
                pos = avail_pos[self.head]
                from_returned = False
                dl = expiry.get(pos, 0) if expiry else 0
                if not dl and exp_us:
                    dl = self.avail_ts[self.head] + exp_us
                if dl and now >= dl:
                    self.head += 1
                    self._expire(pos, "expiration", None)
                    continue
            if self.barrier_wait:
                break
            rec = self.host.read(pos)
            if rec is None:  # archived away: nothing to deliver
                self._pop(from_returned)
                continue
            if not self._try_deliver(rec, from_returned, touched, pop=True):
                break
        for out in touched:
            out.flush()

    def _pop(self, from_returned: bool) -> None:
        if from_returned:
            heapq.heappop(self.returned)
        else:
            self.head += 1

    def _try_deliver(
        self,
        rec: StoredMessage,
        from_returned: bool = False,
        touched: set[Outbox] | None = None,
        pop: bool = False,
    ) -> bool:
        position, pub, seq, ts, topic_b, body, extra = rec
        if self.barrier is None and not self.filtered_subs:
            # the common case: no content to look at, so no decode and no closure
            qs = self._pick(None)
            if qs is None:
                return False
            if pop:
                self._pop(from_returned)
            self._lease(qs, rec, touched)
            return True
        doc_fn = Body(body).matches

        if self.barrier is not None and doc_fn(self.barrier):
            if self.leased:
                self.barrier_wait = True  # held until every earlier message is acked
                return False
            if pop:
                self._pop(from_returned)
            self._deliver_barrier(rec)
            return True
        if not self.any_matching_sub(doc_fn):
            if pop:
                self._pop(from_returned)
                self.parked.append(position)
                return True
            return False
        qs = self._pick(doc_fn)
        if qs is None:
            return False
        if pop:
            self._pop(from_returned)
        self._lease(qs, rec, touched)
        return True

    def _deliver_barrier(self, rec: StoredMessage) -> None:
        position, pub, seq, ts, topic_b, body, extra = rec
        for qs in self.subs:
            self._send(qs.sub, topic_b, pub, seq, body, extra, b"", None)
        self.event(QueueOp.ACKED, position)
        self.stats["delivered"] += 1
        self.stats["acked"] += 1
        self._forget(position)

    def _lease(self, qs: QueueSub, rec: StoredMessage, touched: set[Outbox] | None) -> None:
        position, pub, seq, ts, topic_b, body, extra = rec
        counts = self.counts.pop(position, None) or [0, 0]  # kept on the lease while it lasts
        counts[0] += 1
        if self.spec.expiration and not self.at_most_once and position not in self.expiry:
            # the lease's end looks at the expiration (_return); the receive time is here only
            self.expiry[position] = self.deadline_for(ts, None)
        if counts[0] > 1:
            self.stats["redelivered"] += 1
        self.stats["delivered"] += 1
        qs.outstanding += 1
        bm = format_bookmark(pub, seq)
        self.by_bm[bm] = position
        sub = qs.sub
        if self.at_most_once:
            self.event(QueueOp.DELIVERED_AT_MOST_ONCE, position)
            self.leased[position] = new_lease((qs, 0, bm, counts))
            lp = b""
        else:
            self.gen += 1
            deadline = time.monotonic() + self.lease_period
            self.leased[position] = new_lease((qs, self.gen, bm, counts))
            heapq.heappush(self.lease_heap, (deadline, self.gen, (position,)))
            self.host.arm(deadline)
            self.event(QueueOp.LEASED, position, counts[0])
            lp = self._lease_end_part()
        self._send(sub, topic_b, pub, seq, body, extra, lp, touched)

    def _send(
        self,
        sub: Subscription,
        topic_b: bytes,
        pub: int,
        seq: int,
        body: bytes,
        extra: bytes,
        lp: bytes,
        touched: set[Outbox] | None,
    ) -> None:
        """One queue delivery, the frame built in place (the hot path: no intermediate objects)."""
        out = sub.out
        tj = self._tj
        if tj[0] != topic_b:
            tj = self._tj = (topic_b, frames.topic_member(topic_b))
        hdr = STORED % (sub.prefix, tj[1], extra or b"", pub, seq, lp)
        out.buf += (pack_len(len(hdr) + len(body)), hdr, body)
        out.sent += 1
        if touched is not None:
            touched.add(out)
        else:
            out.flush()

    def _lease_end_part(self) -> bytes:
        """`lp` for a lease starting now; recomputed at most every millisecond."""
        now = time.monotonic()
        cached_at, part = self._lp
        if now - cached_at < 0.001:
            return part
        part = frames.lease_part(now_us() + int(self.lease_period * 1e6))
        self._lp = (now, part)
        return part

    # -- acknowledgements ------------------------------------------------------------------

    def normalize_bookmarks(self, items: list[str]) -> list[str]:
        """The bookmarks of a sow_delete as the keys of by_bm; ValueError names one that is not a
        bookmark. Clients send back what they were given, so this is nearly always a lookup."""
        by_bm = self.by_bm
        if not [b for b in items if b not in by_bm]:
            return items
        out = []
        for item in items:
            if item in by_bm:
                out.append(item)
                continue
            point = publisher_bookmark(item)
            if point is None:
                raise ValueError(item.strip())
            out.append(format_bookmark(*point))
        return out

    def ack(
        self,
        client: SubscriptionOwner,
        bms: list[str],
        cancel: bool = False,
        expire: bool = False,
        extend: float | None = None,
        visible: Predicate | None = None,
    ) -> tuple[int, list[str]]:
        """Apply a sow_delete by bookmarks ("pub|seq|", normalize_bookmarks). `visible`: the
        messages the client may act on (its content entitlement; None: all); others are
        refused. Returns (records affected, refusal details)."""
        if not (cancel or expire or extend is not None or self.at_most_once):
            return self._ack_plain(client, bms, visible)
        done = 0
        refused = []
        strict = self.spec.leasing == "strict"
        for bm in bms:
            pos = self.by_bm.get(bm)
            if pos is None:
                continue
            lease = self.leased.get(pos)
            if lease is None:
                continue
            if strict and lease.holder.sub.owner is not client:
                refused.append(f"{bm} is leased to another client (Leasing strict)")
                continue
            if visible is not None and not self._shows(visible, pos):
                refused.append(_HIDDEN % bm)
                continue
            if extend is not None and not self.at_most_once:
                self.gen += 1
                deadline = time.monotonic() + extend
                self.leased[pos] = Lease(lease.holder, self.gen, bm, lease.counts)
                heapq.heappush(self.lease_heap, (deadline, self.gen, (pos,)))
                self.host.arm(deadline)
                done += 1
                continue
            self.end_lease(pos)
            done += 1
            if self.at_most_once:
                self._forget(pos)
                continue
            if cancel or expire:
                self.counts[pos] = lease.delivery_counts()
            if cancel:
                counts = self.counts[pos]
                counts[1] += 1
                self.event(QueueOp.CANCELLED, pos, counts[1])
                if self.spec.max_cancels and counts[1] > self.spec.max_cancels:
                    self._expire(pos, "max cancels", None)
                else:
                    self._return(pos, "cancel")
            elif expire:
                self._expire(pos, "expired by consumer", None)
            else:
                self.event(QueueOp.ACKED, pos)
                self.stats["acked"] += 1
                self._forget(pos)
        self.pump()
        return done, refused

    def _shows(self, visible: Predicate, pos: int) -> bool:
        rec = self.host.read(pos)
        return rec is not None and body_matches(visible, rec[5])

    def _ack_plain(
        self, client: SubscriptionOwner, bms: list[str], visible: Predicate | None
    ) -> tuple[int, list[str]]:
        """The common ack: at-least-once, no cancel / expire / extend; one event run for all."""
        by_bm = self.by_bm
        leased = self.leased
        strict = self.spec.leasing == "strict"
        refused = []
        acked = array.array("Q")
        for bm in bms:
            pos = by_bm.get(bm)
            if pos is None:
                continue
            holder = leased[pos].holder
            if strict and holder.sub.owner is not client:
                refused.append(f"{bm} is leased to another client (Leasing strict)")
                continue
            if visible is not None and not self._shows(visible, pos):
                refused.append(_HIDDEN % bm)
                continue
            del by_bm[bm]
            del leased[pos]
            holder.outstanding -= 1
            acked.append(pos)
        n = len(acked)
        if n:
            self.event_run(QueueOp.ACKED_RUN, acked)
            self.stats["acked"] += n
            if self.counts:
                for pos in acked:
                    self.counts.pop(pos, None)
            if self.expiry:
                for pos in acked:
                    self.expiry.pop(pos, None)
            if self.barrier_wait and not leased:
                self.barrier_wait = False
                self.host.call_soon(self.pump)
        self.pump()
        return n, refused

    def ack_filter(
        self,
        client: SubscriptionOwner,
        f: Predicate,
        cancel: bool = False,
        expire: bool = False,
        extend: float | None = None,
    ) -> tuple[int, list[str]]:
        """sow_delete with a filter: each option does to every matching message what it does by
        bookmark. A plain ack and `expire` take every matching message, leased or waiting (AMPS
        acknowledges by filter whoever holds the lease, within `Leasing`); `cancel` and
        `lease_extend` act on the matching leased messages, since a waiting message has no lease
        to give back or extend. On an at-most-once queue the options change nothing: matching
        messages are acknowledged. `f` includes the client's content entitlement (the session
        ANDs it in). Returns (records affected, refusal details)."""
        if self.at_most_once:
            cancel = expire = False
            extend = None
        n = 0
        if not cancel and extend is None:
            # waiting ones first: acking the leased ones pumps, which would lease a waiting match
            for pos in self.waiting():
                rec = self.host.read(pos)
                if rec is None or not body_matches(f, rec[5]):
                    continue
                self._take_waiting(pos)
                if expire:
                    self._expire(pos, "expired by consumer", rec)
                else:
                    self.event(QueueOp.ACKED, pos)
                    self.stats["acked"] += 1
                    self._forget(pos)
                n += 1
        bms = []
        for pos, lease in list(self.leased.items()):
            rec = self.host.read(pos)
            if rec is not None and body_matches(f, rec[5]):
                bms.append(lease.bm)
        done, refused = self.ack(client, bms, cancel=cancel, expire=expire, extend=extend)
        return n + done, refused

    def snapshot(self) -> dict[str, int]:
        return {
            "depth": self.depth,
            "leased": len(self.leased),
            "subscribers": len(self.subs),
            **self.stats,
            **(self.repl.snapshot() if self.repl is not None else {}),
        }
