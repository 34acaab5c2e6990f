"""Message queues (PROTOCOL.md §8): views over recorded topics with leases, backlogs and fairness.

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
import asyncio
import collections
import heapq
import logging
import time
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING

import msgspec

from journal.queue_events import (
    MAX_RUN,
    ExpiryReason,
    QueueOp,
    append_event,
    append_run,
    apply_events,
    checkpoint_key,
    decode_checkpoint,
    encode_checkpoint,
)
from journal.record import (
    KIND_MESSAGE,
    KIND_QUEUE_EVENT,
    RECORD_HEADER_SIZE,
    encode_record,
    record_length_at,
    scan_records,
)

from . import frames
from .filters import compile_filter
from .ids import publisher_id
from .matching import Body, body_matches
from .splice import splice_at

if TYPE_CHECKING:  # pragma: no cover
    from .app import Server

log = logging.getLogger("tickertape.queues")

DEFAULT_LEASE = 30.0
EVENT_FLUSH_DELAY = 0.005
CACHE_BLOCK = 256 * 1024
_json = msgspec.json.encode


class QueueSub:
    __slots__ = ("backlog", "head", "outstanding", "sub")

    def __init__(self, sub, backlog: int):
        self.sub = sub
        self.backlog = backlog
        self.outstanding = 0
        self.head = (None, b"")  # (sub.prefix it was made from, prefix + topic member)


# A lease is a tuple (holder QueueSub, generation, bookmark str, counts): a batch of deliveries
# makes them without a Python call each. The generation names the lease-heap entry that ends it
# (an extension makes a new one); counts is [deliveries, cancels], or None for a first delivery
# never cancelled ([1, 0]); it goes back to Queue.counts if the message returns.
L_HOLDER, L_GEN, L_BM, L_COUNTS = 0, 1, 2, 3


def _counts(lease) -> list:
    c = lease[L_COUNTS]
    return [1, 0] if c is None else c


class Queue:
    def __init__(self, manager: QueueManager, spec):
        self.m = manager
        self.spec = spec
        self.name = spec.name
        self.name_b = spec.name.encode()
        self.at_most_once = spec.semantics == "at-most-once"
        self.fairness = "round-robin" if self.at_most_once else spec.fairness_model
        self.lease_period = spec.lease_period or DEFAULT_LEASE
        from protocol.patterns import compile_pattern

        from .router import is_pattern

        t = spec.underlying_topic
        self._topic_b = t.encode()
        self._topic_rx = compile_pattern(t.encode()) if is_pattern(t) else None
        self.filter = compile_filter(spec.filter) if spec.filter else None
        self.barrier = compile_filter(spec.barrier_expression) if spec.barrier_expression else None
        self.avail_pos = array.array("Q")
        self.avail_ts = array.array("Q")
        self.head = 0
        self.returned: list[int] = []  # heap of positions: returned messages go first, oldest first
        self.gone: set[int] = set()  # removed from the middle of the arrays (acked by filter, `e`)
        self.counts: dict[int, list] = {}  # position -> [deliveries, cancels]
        self.expiry: dict[int, int] = {}  # position -> deadline (us) from the message's own `e`
        self.exp_heap: list = []  # (deadline, position) for messages with their own `e`
        self.leased: dict[int, tuple] = {}  # position -> lease tuple (L_HOLDER, L_GEN, ...)
        self.by_bm: dict[str, int] = {}  # "pub|seq|" -> position, for leased / outstanding
        self.subs: list[QueueSub] = []
        self._filtered = 0  # subscriptions with a content filter
        self._lp = (0.0, b"")  # (monotonic second, `lp` header part) cache
        self._tj = (b"", b"")  # (topic, its header part): most queues see one topic
        self.rr = 0
        self.lease_heap: list = []
        self.gen = 0
        self.events = bytearray()
        self.failed_events = bytearray()  # events of commits that failed, to be written again
        self.parked: collections.deque[int] = (
            collections.deque()
        )  # no subscription's filter matches
        self.barrier_wait = False
        self.stats = {
            "acked": 0,
            "expired": 0,
            "redelivered": 0,
            "delivered": 0,
            "dead_lettered": 0,
        }
        self.dlt_pub = publisher_id(f"{manager.server.name}\x00queue:{self.name}\x00dead-letter")
        self.checkpoint_dirty = True

    # -- membership ----------------------------------------------------------------------------

    def wants_topic(self, topic_b: bytes) -> bool:
        if self._topic_rx is not None:
            return self._topic_rx.fullmatch(topic_b) is not None
        return topic_b == self._topic_b

    def passes_filter(self, body: bytes) -> bool:
        return self.filter is None or body_matches(self.filter, body)

    @property
    def depth(self) -> int:
        return (
            len(self.avail_pos) - self.head - len(self.gone) + len(self.returned) + len(self.parked)
        )

    def deadline_for(self, ts: int, exp) -> int:
        d = 0
        if self.spec.expiration:
            d = ts + int(self.spec.expiration * 1e6)
        if exp is not None:
            e = ts + int(exp * 1e6)
            d = e if not d else min(d, e)
        return d

    def add_waiting(self, position: int, ts: int, exp) -> None:
        self.avail_pos.append(position)
        self.avail_ts.append(ts)
        if exp is not None:
            dl = self.deadline_for(ts, exp)
            self.expiry[position] = dl
            heapq.heappush(self.exp_heap, (dl, position))

    # -- events ----------------------------------------------------------------------------------

    def event(self, op: int, position: int, value: int = 0) -> None:
        append_event(self.events, op, position, value)
        self.checkpoint_dirty = True
        self.m.events_added()

    def event_run(self, op: int, positions) -> None:
        """Run entries (ACKED_RUN, LEASED_RUN) for positions (an array('Q'))."""
        append_run(self.events, op, positions)
        self.checkpoint_dirty = True
        self.m.events_added()

    def take_events(self) -> bytes | None:
        """The events since the last call (the failed ones first), as one body, or None."""
        if not self.events and not self.failed_events:
            return None
        body = bytes(self.failed_events + self.events)
        self.failed_events.clear()
        self.events.clear()
        return body

    def events_failed(self, body: bytes) -> None:
        """A commit carrying `body` failed. The state in memory has moved on already (an acked
        message left its lease), so the events go out again with the next commit rather than
        being lost: else an ack whose commit failed strands its message until a restart.
        Batches fail in the order they were built, so appending keeps the events in order."""
        self.failed_events += body
        self.checkpoint_dirty = True
        self.m.events_added()

    def low_water(self, end: int) -> int:
        """Every message of this queue below this position is done."""
        lo = end
        self._advance_head()
        if self.head < len(self.avail_pos):
            lo = min(lo, self.avail_pos[self.head])
        if self.returned:
            lo = min(lo, self.returned[0])
        if self.parked:
            lo = min(lo, min(self.parked))
        if self.leased:
            lo = min(lo, min(self.leased))
        return lo

    # -- subscribers ----------------------------------------------------------------------------

    @property
    def filtered_subs(self) -> bool:
        return self._filtered > 0

    def add_sub(self, sub, max_backlog: int | None) -> None:
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

    def remove_sub(self, sub) -> None:
        qs = next((q for q in self.subs if q.sub is sub), None)
        if qs is None:
            return
        self.subs.remove(qs)
        if sub.filter is not None:
            self._filtered -= 1
        returned = sorted(p for p, lease in self.leased.items() if lease[L_HOLDER] is qs)
        for p in returned:
            lease = self.leased.pop(p)
            self.by_bm.pop(lease[L_BM], None)
            if not self.at_most_once:
                self.counts[p] = _counts(lease)
                self._return(p, "disconnect")
        self.pump()

    # -- delivery --------------------------------------------------------------------------------

    def _advance_head(self) -> None:
        pos = self.avail_pos
        while self.head < len(pos) and pos[self.head] in self.gone:
            self.gone.discard(pos[self.head])
            self.head += 1
        if self.head > 65536 and self.head * 2 > len(pos):
            del self.avail_pos[: self.head]
            del self.avail_ts[: self.head]
            self.head = 0

    def _pick(self, body_doc_fn):
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

    def any_matching_sub(self, doc_fn) -> bool:
        return any(qs.sub.filter is None or doc_fn(qs.sub.filter) for qs in self.subs)

    def offer_fresh(self, m) -> None:
        """A committed message on the underlying topic: deliver at once or keep it waiting."""
        if (
            self.head >= len(self.avail_pos)
            and not self.returned
            and not self.barrier_wait
            and self.subs
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

    def _lease_run(self, touched) -> int:
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
        got = self.m.splice_run(positions, head[1], self._lease_end_part())
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
            self.leased[positions[0]] = (qs, gen, bm, None)
            self.by_bm[bm] = positions[0]
        else:
            self.leased.update(zip(positions, zip(repeat(qs), repeat(gen), bms, repeat(None))))
            self.by_bm.update(zip(bms, positions))
        qs.outstanding += n
        self.stats["delivered"] += n
        heapq.heappush(self.lease_heap, (deadline, gen, positions))
        self.m.arm(deadline)
        self.event_run(QueueOp.LEASED_RUN, positions)
        out = sub.out
        out.buf.append(spliced)
        out.sent += n
        touched.add(out)
        return n

    def pump(self) -> None:
        """Deliver waiting messages while some subscription has room."""
        if not self.subs or self.m.loading:
            return
        touched = set()
        avail_pos = self.avail_pos
        exp_us = int(self.spec.expiration * 1e6) if self.spec.expiration else 0
        expiry = self.expiry
        now = _now_us() if exp_us or expiry else 0
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
            rec = self.m.read(pos)
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

    def _try_deliver(self, rec, from_returned=False, touched=None, pop=False) -> bool:
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

    def _deliver_barrier(self, rec) -> None:
        position, pub, seq, ts, topic_b, body, extra = rec
        for qs in self.subs:
            self._send(qs.sub, topic_b, pub, seq, body, extra, b"", None)
        self.event(QueueOp.ACKED, position)
        self.stats["delivered"] += 1
        self.stats["acked"] += 1
        self._forget(position)

    def _lease(self, qs: QueueSub, rec, touched) -> None:
        position, pub, seq, ts, topic_b, body, extra = rec
        counts = self.counts.pop(position, None) or [0, 0]  # kept on the lease while it lasts
        counts[0] += 1
        if counts[0] > 1:
            self.stats["redelivered"] += 1
        self.stats["delivered"] += 1
        qs.outstanding += 1
        bm = f"{pub}|{seq}|"
        self.by_bm[bm] = position
        sub = qs.sub
        if self.at_most_once:
            self.event(QueueOp.DELIVERED_AT_MOST_ONCE, position)
            self.leased[position] = (qs, 0, bm, counts)
            lp = b""
        else:
            self.gen += 1
            deadline = time.monotonic() + self.lease_period
            self.leased[position] = (qs, self.gen, bm, counts)
            heapq.heappush(self.lease_heap, (deadline, self.gen, (position,)))
            self.m.arm(deadline)
            self.event(QueueOp.LEASED, position, counts[0])
            lp = self._lease_end_part()
        self._send(sub, topic_b, pub, seq, body, extra, lp, touched)

    def _send(self, sub, topic_b, pub, seq, body, extra, lp, touched) -> None:
        """One queue delivery, the frame built in place (the hot path: no intermediate objects)."""
        out = sub.out
        tj = self._tj
        if tj[0] != topic_b:
            tj = self._tj = (topic_b, frames.topic_member(topic_b))
        hdr = frames.STORED % (sub.prefix, tj[1], extra or b"", pub, seq, lp)
        out.buf += (frames.pack_len(len(hdr) + len(body)), hdr, body)
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
        part = frames.lease_part(_now_us() + int(self.lease_period * 1e6))
        self._lp = (now, part)
        return part

    # -- leaving the lease -------------------------------------------------------------------------

    def _return(self, position: int, why: str) -> None:
        counts = self.counts.get(position, [0, 0])
        maxd = self.spec.max_deliveries
        if maxd and counts[0] >= maxd:
            self._expire(position, "max deliveries", None)
            return
        heapq.heappush(self.returned, position)

    def _take_waiting(self, pos: int) -> None:
        """Remove a waiting message from wherever it waits."""
        if pos in self.returned:
            self.returned.remove(pos)
            heapq.heapify(self.returned)
        elif pos in self.parked:
            self.parked.remove(pos)
        else:
            self.gone.add(pos)

    def _forget(self, position: int) -> None:
        self.counts.pop(position, None)
        self.expiry.pop(position, None)
        if self.barrier_wait and not self.leased:
            self.barrier_wait = False
            self.m.server.loop.call_soon(self.pump)

    def _expire(self, position: int, reason: str, rec) -> None:
        counts = self.counts.get(position, [0, 0])
        self.event(QueueOp.EXPIRED, position, ExpiryReason.code(reason))
        self.stats["expired"] += 1
        if self.spec.dead_letter_topic:
            self.m.dead_letter(self, position, reason, counts[0], rec)
        self._forget(position)

    def expire_due(self, now_us: int) -> None:
        """Expire waiting messages whose time is up, even with no subscriber (a tick)."""
        changed = False
        if self.spec.expiration:
            while True:
                self._advance_head()
                if self.head >= len(self.avail_pos):
                    break
                if now_us < self.avail_ts[self.head] + int(self.spec.expiration * 1e6):
                    break
                pos = self.avail_pos[self.head]
                self.head += 1
                self._expire(pos, "expiration", None)
                changed = True
        heap = self.exp_heap
        while heap and heap[0][0] <= now_us:
            dl, pos = heapq.heappop(heap)
            if self.expiry.get(pos) != dl or pos in self.leased or pos in self.gone:
                continue
            self._take_waiting(pos)
            self._expire(pos, "expiration", None)
            changed = True
        if changed:
            self.pump()

    def lease_timeouts(self, now: float) -> None:
        heap = self.lease_heap
        changed = False
        leased = self.leased
        while heap and heap[0][0] <= now:
            _, gen, positions = heapq.heappop(heap)
            ended = 0
            for pos in positions:
                lease = leased.get(pos)
                if lease is None or lease[L_GEN] != gen:
                    continue
                del leased[pos]
                self.by_bm.pop(lease[L_BM], None)
                holder = lease[L_HOLDER]
                holder.outstanding -= 1
                if not ended:
                    first = (lease[L_BM], holder.sub.conn.describe())
                ended += 1
                self.counts[pos] = _counts(lease)
                self._return(pos, "lease")
            if ended:
                changed = True
                log.info(
                    "queue %s: %d lease(s) expired, first on %s (holder %s)",
                    self.name,
                    ended,
                    *first,
                )
        if changed:
            self.pump()
        if heap:
            self.m.arm(heap[0][0])

    # -- acknowledgements -------------------------------------------------------------------------

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
            parts = item.strip().split("|")
            try:
                out.append(f"{int(parts[0])}|{int(parts[1])}|")
            except (ValueError, IndexError):
                raise ValueError(item.strip()) from None
        return out

    def ack(
        self, conn, bms: list[str], cancel=False, expire=False, extend=None
    ) -> tuple[int, list]:
        """Apply a sow_delete by bookmarks ("pub|seq|", normalize_bookmarks). Returns (records
        affected, refusal details)."""
        if not (cancel or expire or extend is not None or self.at_most_once):
            return self._ack_plain(conn, bms)
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
            if strict and lease[L_HOLDER].sub.conn is not conn:
                refused.append(f"{bm} is leased to another client (Leasing strict)")
                continue
            if extend is not None and not self.at_most_once:
                self.gen += 1
                deadline = time.monotonic() + extend
                self.leased[pos] = (lease[L_HOLDER], self.gen, bm, lease[L_COUNTS])
                heapq.heappush(self.lease_heap, (deadline, self.gen, (pos,)))
                self.m.arm(deadline)
                done += 1
                continue
            del self.leased[pos]
            del self.by_bm[bm]
            lease[L_HOLDER].outstanding -= 1
            done += 1
            if self.at_most_once:
                self._forget(pos)
                continue
            if cancel or expire:
                self.counts[pos] = _counts(lease)
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

    def _ack_plain(self, conn, bms: list[str]) -> tuple[int, list]:
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
            lease = leased[pos]
            holder = lease[L_HOLDER]
            if strict and holder.sub.conn is not conn:
                refused.append(f"{bm} is leased to another client (Leasing strict)")
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
                self.m.server.loop.call_soon(self.pump)
        self.pump()
        return n, refused

    def ack_filter(self, conn, f, expire=False) -> int:
        """sow_delete with a filter: every message in the queue that matches, leased or not."""
        n = 0
        for pos, lease in list(self.leased.items()):
            rec = self.m.read(pos)
            if rec is not None and body_matches(f, rec[5]):
                n += self.ack(conn, [lease[L_BM]], expire=expire)[0]
        self._advance_head()
        waiting = (
            list(self.returned)
            + list(self.parked)
            + [p for p in self.avail_pos[self.head :] if p not in self.gone]
        )
        for pos in waiting:
            rec = self.m.read(pos)
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
        self.pump()
        return n

    def snapshot(self) -> dict:
        return {
            "depth": self.depth,
            "leased": len(self.leased),
            "subscribers": len(self.subs),
            **self.stats,
        }


def _events_committed(taken: list, err) -> None:
    if err is not None:
        for q, body in taken:
            q.events_failed(body)


def _now_us() -> int:
    return int(time.time() * 1_000_000)


class QueueManager:
    """All queues of the instance: recovery, routing of committed messages, timers, commands."""

    def __init__(self, server: Server, specs):
        self.server = server
        self.queues: dict[str, Queue] = {}
        self.loading = False
        for spec in specs:
            self.queues[spec.name] = Queue(self, spec)
        self._timer: asyncio.TimerHandle | None = None
        self._event_timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._block: tuple[bytes, int] | None = (
            None  # stored journal bytes of the last read (_block_at)
        )
        self._compacted: dict[int, tuple] = {}  # records of the last compacted block read
        self.recovery_seconds = 0.0
        self._last_checkpoint = 0.0

    # -- wiring ----------------------------------------------------------------------------------

    def attach(self, pipeline) -> None:
        pipeline.on_deliver.append(self.on_committed)
        pipeline.before_flush.append(self.before_flush)

    def on_committed(self, msgs, end: int) -> None:
        for m in msgs:
            if m.position < 0:
                continue
            tb = None
            for q in self.queues.values():
                if tb is None:
                    tb = m.topic.encode()
                if q.wants_topic(tb) and q.passes_filter(m.body):
                    q.offer_fresh(m)

    def before_flush(self, batch) -> None:
        taken = []
        for q in self.queues.values():
            body = q.take_events()
            if body is not None:
                batch.data += encode_record(KIND_QUEUE_EVENT, 0, 0, 0, q.name_b, body)
                taken.append((q, body))
        if taken:
            batch.after.append(partial(_events_committed, taken))
        now = time.monotonic()
        if now - self._last_checkpoint >= 1.0 and any(
            q.checkpoint_dirty for q in self.queues.values()
        ):
            self._last_checkpoint = now
            # a checkpoint committed with this batch covers only what this batch makes durable
            end = self.server.pipeline.delivered_end
            meta = batch.meta or {}
            for q in self.queues.values():
                meta[checkpoint_key(q.name_b)] = encode_checkpoint(q.low_water(end))
                q.checkpoint_dirty = False
            batch.meta = meta

    def events_added(self) -> None:
        """Queue events ride with the next commit; if none comes soon, commit them anyway.

        An ack whose reply was asked for forces a commit at once (after_commit); the others are
        made durable within EVENT_FLUSH_DELAY, so a quiet server does not hold them in memory.
        """
        if self._event_timer is None and not self.loading:
            self._event_timer = self.server.loop.call_later(EVENT_FLUSH_DELAY, self._flush_events)

    def _flush_events(self) -> None:
        self._event_timer = None
        self.server.pipeline.schedule()

    def arm(self, deadline: float) -> None:
        if deadline >= self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = self.server.loop
        self._timer_at = deadline
        self._timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        now = time.monotonic()
        for q in self.queues.values():
            q.lease_timeouts(now)

    def tick(self) -> None:
        now = _now_us()
        for q in self.queues.values():
            q.expire_due(now)

    # -- reads -----------------------------------------------------------------------------------

    def _block_at(self, position: int):
        """The journal block (bytes, base) holding the whole record at position: the cached one,
        else the block read from there (and kept). None where the bytes are not stored as
        written (a compacted segment) or no longer stored."""
        blk = self._block
        if blk is not None:
            buf, base = blk
            off = position - base
            if 0 <= off <= len(buf) - RECORD_HEADER_SIZE and off + record_length_at(
                buf, off
            ) <= len(buf):
                return blk
        journal = self.server.journal
        if position < journal.start_position:
            return None
        got = journal.read_block(position, CACHE_BLOCK)
        if got is None or got[1] != position or not got[0]:
            return None
        self._block = got
        return got

    def splice_run(self, positions, head: bytes, tail: bytes):
        """splice_at over the journal block holding positions[0], or None where the bytes are
        not stored as written (compacted, removed): the caller then reads record by record."""
        blk = self._block_at(positions[0])
        if blk is None:
            return None
        try:
            return splice_at(blk[0], blk[1], positions, head, tail)  # the first record is whole
        except ValueError:
            log.exception("queue delivery from the journal block at %d", blk[1])
            self._block = None
            return None

    def read(self, position: int):
        """(position, pub, seq, ts, topic_b, body, header fragment) of the message at position,
        or None if the journal no longer holds one there."""
        if position < self.server.journal.start_position:
            return None
        blk = self._block_at(position)
        if blk is not None:
            buf, base = blk
            off = position - base
            r = scan_records(buf[off : off + record_length_at(buf, off)], position)[0][0]
            if r[1] != KIND_MESSAGE:
                return None
            return (r[0], r[2], r[3], r[4], r[5], r[6], r[7][1] if r[7] else b"")
        rec = self._compacted.get(
            position
        )  # a compacted segment: its retained records, by position
        if rec is not None:
            return rec
        recs, _ = self.server.journal.read_raw(position, CACHE_BLOCK)
        self._compacted = {
            r[0]: (r[0], r[2], r[3], r[4], r[5], r[6], r[7][1] if r[7] else b"")
            for r in recs
            if r[1] == 1
        }
        return self._compacted.get(position)

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> None:
        journal = self.server.journal
        if journal is None or not self.queues:
            return
        started = time.monotonic()
        self.loading = True
        starts = []
        for q in self.queues.values():
            raw = journal.index.get_meta(checkpoint_key(q.name_b))
            starts.append(decode_checkpoint(raw, journal.start_position))
        pos = max(journal.start_position, min(starts))
        qlist = list(self.queues.values())
        by_name = {q.name_b: q for q in qlist}
        qstart = {q.name_b: max(s, journal.start_position) for q, s in zip(qlist, starts)}
        done: dict[bytes, set] = {q.name_b: set() for q in qlist}
        counts: dict[bytes, dict] = {q.name_b: {} for q in qlist}
        scanned = 0
        while True:
            recs, nxt = journal.read_raw(pos, 4 * 1024 * 1024)
            if not recs:
                nxt2 = journal.next_position(nxt)
                if nxt2 == pos:
                    break
                pos = nxt2
                continue
            for position, kind, _pub, _seq, ts, tb, body, extra in recs:
                scanned += 1
                if kind == 1:
                    for q in qlist:
                        if (
                            position >= qstart[q.name_b]
                            and q.wants_topic(tb)
                            and q.passes_filter(body)
                        ):
                            q.add_waiting(position, ts, extra[0] if extra else None)
                elif kind == KIND_QUEUE_EVENT:
                    q = by_name.get(tb)
                    if q is None:
                        continue
                    d = done[q.name_b]
                    c = counts[q.name_b]
                    apply_events(body, d, c)
            pos = journal.next_position(nxt)
        for q in qlist:
            d = done[q.name_b]
            if d:
                keep = [(p, t) for p, t in zip(q.avail_pos, q.avail_ts) if p not in d]
                q.avail_pos = array.array("Q", (p for p, _ in keep))
                q.avail_ts = array.array("Q", (t for _, t in keep))
                for p in d:
                    q.expiry.pop(p, None)
            q.counts = {p: c for p, c in counts[q.name_b].items() if p not in d}
        self.loading = False
        self.recovery_seconds = time.monotonic() - started
        for q in qlist:
            log.info(
                "queue %s: recovered %d waiting messages (%d delivered before) in %.3fs",
                q.name,
                q.depth,
                len(q.counts),
                self.recovery_seconds,
            )
        log.info("queues: recovery scanned %d records in %.3fs", scanned, self.recovery_seconds)

    # -- dead letters --------------------------------------------------------------------------------

    def dead_letter(self, q: Queue, position: int, reason: str, deliveries: int, rec) -> None:
        rec = rec or self.read(position)
        if rec is None:
            return
        _, pub, seq, ts, topic_b, body, extra = rec
        hdr = b',"reason":%s,"deliveries":%d,"queue":%s,"source_bm":"%d|%d|"' % (
            _json(reason),
            deliveries,
            _json(q.name),
            pub,
            seq,
        )
        self.server.pipeline.publish(
            None, q.dlt_pub, None, q.spec.dead_letter_topic, body, hdr, None
        )
        q.stats["dead_lettered"] += 1

    def snapshot(self) -> dict:
        return {name: q.snapshot() for name, q in self.queues.items()}
