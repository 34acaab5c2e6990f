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

At-most-once: delivered is done; the consumer's ack only frees its backlog. A delivery is sent
only once its DELIVERED_AT_MOST_ONCE event is durable (and past the sync replication gate, like a
publish's `persisted` ack): the state holds its frame until the commit of that event
(server/queue_held.py), so a crash before that commit never lets the message
out, and the restarted instance (or a peer taking over) delivers it once. The cost is one group
commit of latency. A commit that fails sends nothing: the messages wait again, first in line.

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

`Queue` is the delivery: who gets the next message (fairness, filters, barriers), the frames,
and what a consumer's acknowledgement does. What waits and what is leased is its `state`
(server/queue_state.py's `QueueState`), changed only through the state's named operations,
which replication (server/queue_repl.py) calls too.
"""

from __future__ import annotations

import time
from typing import Any

from config.model import QueueSpec
from journal.queue_events import MAX_RUN
from protocol.bookmarks import format_bookmark, publisher_bookmark
from protocol.filters import compile_filter

from . import frames
from .fanout import Message
from .frames import STORED, pack_len
from .matching import Body, Predicate, body_matches
from .outbox import Outbox
from .queue_held import Held
from .queue_state import QueueHost, QueueState
from .queue_types import QueueSub, StoredMessage
from .replay_plan import now_us
from .subscriptions import Subscription, SubscriptionOwner

__all__ = ["Queue"]

_HIDDEN = "%s is a message this user's content entitlement does not show (not entitled)"


class Queue:
    def __init__(self, host: QueueHost, spec: QueueSpec) -> None:
        self.host = host
        self.spec = spec
        self.name = spec.name
        self.state = QueueState(host, spec, self.pump)
        self.waiting = self.state.waiting  # a sow over the queue lists these
        self.at_most_once = spec.semantics == "at-most-once"
        self.fairness = "round-robin" if self.at_most_once else spec.fairness_model
        self.lease_period = spec.lease_period
        self.barrier = compile_filter(spec.barrier_expression) if spec.barrier_expression else None
        self._filtered = 0  # subscriptions with a content filter
        self._lp = (0.0, b"")  # (monotonic second, `lp` header part) cache
        self._tj = (b"", b"")  # (topic, its header part): most queues see one topic
        self.rr = 0

    # -- subscribers -----------------------------------------------------------------------

    def add_sub(self, sub: Subscription, max_backlog: int | None) -> None:
        cap = self.spec.max_per_subscription_backlog or 1
        self.state.add_sub(QueueSub(sub, max(1, min(max_backlog or 1, cap))))
        if sub.filter is not None:
            self._filtered += 1
        sub.queue = self
        self.pump()

    def remove_sub(self, sub: Subscription) -> None:
        qs = next((q for q in self.state.subs if q.sub is sub), None)
        if qs is None:
            return
        if sub.filter is not None:
            self._filtered -= 1
        self.state.remove_sub(qs, keep_counts=not self.at_most_once)
        self.pump()

    def _pick(self, body_doc_fn: Any) -> QueueSub | None:
        """The subscription that gets the next message, by the fairness model (None if full)."""
        subs = self.state.subs
        if not subs:
            return None
        limit = self.spec.max_backlog
        if limit and len(self.state.leased) >= limit:
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
        return any(qs.sub.filter is None or doc_fn(qs.sub.filter) for qs in self.state.subs)

    # -- delivery --------------------------------------------------------------------------

    def offer_fresh(self, m: Message) -> None:
        """A committed message on the underlying topic: deliver at once or keep it waiting."""
        st = self.state
        if (
            st.head >= len(st.avail_pos)
            and not st.returned
            and not st.barrier_wait
            and st.subs
            and not self.host.paused
        ):
            rec = (m.position, m.pub, m.seq, m.ts, m.topic.encode(), m.body, m.hdr)
            if self._try_deliver(rec):
                return
        st.add_waiting(m.position, m.ts, m.exp)
        self.pump()

    def _runs_possible(self) -> bool:
        """Whether waiting messages can go out in runs (_lease_run): at-least-once, one literal
        topic, no barrier, no expirations, no content filters, and one subscriber or the fast
        fairness model (which fills the first subscriber with room: a run is what it would do
        one message at a time)."""
        return (
            not self.at_most_once
            and self.state.topic_rx is None
            and self.barrier is None
            and not self._filtered
            and not self.spec.expiration
            and not self.state.expiry
            and (len(self.state.subs) == 1 or self.fairness == "fast")
        )

    def _lease_run(self, touched: set[Outbox]) -> int:
        """Lease the next waiting messages (from the head, none removed in between) to the first
        subscription with room, in one go: frames spliced from the journal's bytes, one
        LEASED_RUN event. Returns how many; 0 when it cannot (the caller goes one by one), -1
        when no subscription has room (nothing to do: no record is read)."""
        qs = self._pick(None)
        if qs is None:
            return -1
        st = self.state
        room = qs.backlog - qs.outstanding
        limit = self.spec.max_backlog
        if limit:
            room = min(room, limit - len(st.leased))
        if room <= 0:
            return -1
        positions = st.avail_pos[st.head : st.head + min(room, MAX_RUN)]
        if not positions:
            return 0
        counts = st.counts
        if counts:  # delivered before (a restart): those go one by one, with their counts
            k = next((i for i, p in enumerate(positions) if p in counts), len(positions))
            if k == 0:
                return 0
            positions = positions[:k]
        sub = qs.sub
        head = qs.head
        if head[0] is not sub.prefix:
            head = qs.head = (sub.prefix, sub.prefix + frames.topic_member(st.topic_b))
        got = self.host.splice_run(positions, head[1], self._lease_end_part())
        if got is None:
            return 0
        spliced, bms, n = got
        if n < len(positions):
            positions = positions[:n]
        deadline = time.monotonic() + self.lease_period
        st.lease_run(qs, positions, bms, deadline)
        self.host.arm(deadline)
        out = sub.out
        out.buf.append(spliced)
        out.sent += n
        touched.add(out)
        return n

    def pump(self) -> None:
        """Deliver waiting messages while some subscription has room."""
        st = self.state
        subs = st.subs
        if not subs or self.host.loading or self.host.paused:
            return
        touched: set[Outbox] = set()
        exp_us = int(self.spec.expiration * 1e6) if self.spec.expiration else 0
        expiry = st.expiry
        now = now_us() if exp_us or expiry else 0
        runs = self._runs_possible()
        while True:
            if runs and not st.returned and not st.barrier_wait:
                if st.gone:
                    st.advance_head()
                if not st.gone:
                    k = self._lease_run(touched)
                    if k > 0:
                        if len(subs) == 1 and subs[0].outstanding >= subs[0].backlog:
                            break  # full: no need to ask again
                        continue
                    if k < 0:
                        break
            if st.returned:
                pos = st.returned[0]
                from_returned = True
                dl = expiry.get(pos, 0) if expiry else 0
            else:
                if st.gone or st.head > 65536:
                    st.advance_head()
                if st.head >= len(st.avail_pos):
                    break
                pos = st.avail_pos[st.head]
                from_returned = False
                dl = expiry.get(pos, 0) if expiry else 0
                if not dl and exp_us:
                    dl = st.avail_ts[st.head] + exp_us
            if dl and now >= dl:  # a returned one's time may run out while it waits again
                st.pop_next(from_returned)
                st.expire(pos, "expiration", None)
                continue
            if st.barrier_wait:
                break
            rec = self.host.read(pos)
            if rec is None:  # archived away: nothing to deliver
                st.pop_next(from_returned)
                continue
            if not self._try_deliver(rec, from_returned, touched, pop=True):
                break
        for out in touched:
            out.flush()

    def _try_deliver(
        self,
        rec: StoredMessage,
        from_returned: bool = False,
        touched: set[Outbox] | None = None,
        pop: bool = False,
    ) -> bool:
        st = self.state
        doc_fn = None  # the common case: no content to look at, so no decode and no closure
        if self.barrier is not None or self._filtered:
            doc_fn = Body(rec[5]).matches
            if self.barrier is not None and doc_fn(self.barrier):
                if st.leased:
                    st.hold_for_barrier()
                    return False
                if pop:
                    st.pop_next(from_returned)
                self._deliver_barrier(rec)
                return True
            if not self.any_matching_sub(doc_fn):
                if pop:
                    st.pop_next(from_returned, park=True)
                return pop
        qs = self._pick(doc_fn)
        if qs is None:
            return False
        if pop:
            st.pop_next(from_returned)
        self._lease(qs, rec, touched)
        return True

    def _deliver_barrier(self, rec: StoredMessage) -> None:
        position, pub, seq, ts, topic_b, body, extra = rec
        if self.at_most_once:  # held until its events are durable, as a delivery is (_lease)
            st = self.state
            st.amo.hold_barrier(
                position, [(qs, position, self._frame(qs.sub, rec)) for qs in st.subs]
            )
            st.forget(position)
            return
        for qs in self.state.subs:
            self._send(qs.sub, topic_b, pub, seq, body, extra, b"", None)
        self.state.acked(position, delivered=True)

    def _lease(self, qs: QueueSub, rec: StoredMessage, touched: set[Outbox] | None) -> None:
        position, pub, seq, ts, topic_b, body, extra = rec
        bm = format_bookmark(pub, seq)
        if self.at_most_once:  # held until its event is durable (send_held)
            self.state.amo.hold(qs, position, self._frame(qs.sub, rec))
            self.state.lease(qs, position, bm, ts, None)
            return
        deadline = time.monotonic() + self.lease_period
        self.state.lease(qs, position, bm, ts, deadline)
        self.host.arm(deadline)
        self._send(qs.sub, topic_b, pub, seq, body, extra, self._lease_end_part(), touched)

    def _frame(self, sub: Subscription, rec: StoredMessage) -> tuple[bytes, bytes, bytes]:
        """An at-most-once delivery's frame (no `lp`): length prefix, header, body."""
        _, pub, seq, _, topic_b, body, extra = rec
        hdr = STORED % (sub.prefix, frames.topic_member(topic_b), extra or b"", pub, seq, b"")
        return pack_len(len(hdr) + len(body)), hdr, body

    def send_held(self, held: list[Held]) -> None:
        """At-most-once deliveries whose events are durable (HeldDeliveries.durable)."""
        touched: set[Outbox] = set()
        for qs, _, frame in held:
            out = qs.sub.out
            out.buf += frame
            out.sent += 1
            touched.add(out)
        for out in touched:
            out.flush()

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
        by_bm = self.state.by_bm
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
        st = self.state
        done = 0
        refused = []
        strict = self.spec.leasing == "strict"
        for bm in bms:
            pos = st.by_bm.get(bm)
            if pos is None:
                continue
            lease = st.leased.get(pos)
            if lease is None:
                continue
            if strict and lease.holder.sub.owner is not client:
                refused.append(f"{bm} is leased to another client (Leasing strict)")
                continue
            if visible is not None and not self._shows(visible, pos):
                refused.append(_HIDDEN % bm)
                continue
            if extend is not None and not self.at_most_once:
                deadline = time.monotonic() + extend
                st.extend(pos, lease, deadline)
                self.host.arm(deadline)
                done += 1
                continue
            st.end_lease(pos)
            done += 1
            if self.at_most_once:
                st.forget(pos)
            elif cancel or expire:
                st.given_back(pos, lease, cancel)
            else:
                st.acked(pos)
        self.pump()
        return done, refused

    def _shows(self, visible: Predicate, pos: int) -> bool:
        rec = self.host.read(pos)
        return rec is not None and body_matches(visible, rec[5])

    def _ack_plain(
        self, client: SubscriptionOwner, bms: list[str], visible: Predicate | None
    ) -> tuple[int, list[str]]:
        """The common ack: at-least-once, no cancel / expire / extend; one event run for all."""
        st = self.state
        refused = []
        if self.spec.leasing == "strict" or visible is not None:
            # the checks only read: the leases end together below, as in the unchecked case
            by_bm = st.by_bm
            leased = st.leased
            strict = self.spec.leasing == "strict"
            kept = []
            for bm in bms:
                pos = by_bm.get(bm)
                if pos is None:
                    continue
                if strict and leased[pos].holder.sub.owner is not client:
                    refused.append(f"{bm} is leased to another client (Leasing strict)")
                    continue
                if visible is not None and not self._shows(visible, pos):
                    refused.append(_HIDDEN % bm)
                    continue
                kept.append(bm)
            bms = kept
        acked = st.ack_leased(bms)
        self.pump()
        return len(acked), refused

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
        st = self.state
        n = 0
        if not cancel and extend is None:
            # waiting ones first: acking the leased ones pumps, which would lease a waiting match
            for pos in st.waiting():
                rec = self.host.read(pos)
                if rec is None or not body_matches(f, rec[5]):
                    continue
                st.take_waiting(pos)
                if expire:
                    st.expire(pos, "expired by consumer", rec)
                else:
                    st.acked(pos)
                n += 1
        bms = []
        for pos, lease in list(st.leased.items()):
            rec = self.host.read(pos)
            if rec is not None and body_matches(f, rec[5]):
                bms.append(lease.bm)
        done, refused = self.ack(client, bms, cancel=cancel, expire=expire, extend=extend)
        return n + done, refused

    def snapshot(self) -> dict[str, int]:
        st = self.state
        return {
            "depth": st.depth,
            "leased": len(st.leased),
            "subscribers": len(st.subs),
            **st.stats,
            **(st.repl.snapshot() if st.repl is not None else {}),
        }
