"""The state of one message queue: what waits, what is leased, the events that make it durable.

server/queue.py's `Queue` delivers and takes acknowledgements; it holds one of these as its
`state`, and so does replication (server/queue_repl.py). The state diagram is in
server/queue.py. This part keeps the bookkeeping: the waiting arrays, leases and their heap,
delivery counts, expirations, the queue's pending events (journal/queue_events.py; `amo`
holds at-most-once deliveries), and the ways a message leaves a lease (returned, expired,
forgotten). Its invariants (a lease is in
`leased` and `by_bm` and counted in its holder's `outstanding`; a message waits in one place)
are kept by its named operations, which the Queue and replication call.

A queue talks to the rest of the server only through its `QueueHost` (the QueueManager of
server/queues.py): the journal reads, the timers, the commit of its events, dead letters.
"""

from __future__ import annotations

import array
import bisect
import collections
import heapq
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from config.model import QueueSpec
from journal.queue_events import ExpiryReason, QueueOp, append_event, append_run
from protocol.filters import compile_filter
from protocol.patterns import compile_pattern, is_pattern

from .ids import publisher_id
from .matching import body_matches
from .queue_held import Held, HeldDeliveries
from .queue_types import (
    Lease,
    QueueSub,
    StoredMessage,
    expiration_us,
    new_lease,
    put_leases,
)
from .replay_plan import now_us

__all__ = ["QueueHost", "QueueState"]

log = logging.getLogger("tickertape.queues")


class QueueHost(Protocol):
    """What a queue uses of the server around it (server/queues.py's QueueManager)."""

    instance: str
    loading: bool  # recovery in progress: no deliveries, no event timers
    # replicated queues after a start: no deliveries until the peers have said what happened
    # while this instance was away (server/queues.py `source_synced`)
    paused: bool

    def events_added(self) -> None: ...
    def commit_soon(self) -> None: ...
    def arm(self, deadline: float) -> None: ...
    def call_soon(self, fn: Callable[[], object]) -> None: ...
    def read(self, position: int) -> StoredMessage | None: ...
    def splice_run(
        self, positions: array.array, head: bytes, tail: bytes
    ) -> tuple[bytes, list[str], int] | None: ...
    def dead_letter(
        self, q: QueueState, position: int, reason: str, deliveries: int, rec: StoredMessage | None
    ) -> None: ...


class QueueState:
    def __init__(self, host: QueueHost, spec: QueueSpec, pump: Callable[[], None]) -> None:
        self.host = host
        self.spec = spec
        # delivers waiting messages while some subscription has room (server/queue.py's
        # `Queue.pump`): called when a message is returned or freed here
        self.pump = pump
        self.name = spec.name
        self.name_b = spec.name.encode()
        t = spec.underlying_topic
        self.topic_b = t.encode()
        self.topic_rx = compile_pattern(t.encode()) if is_pattern(t) else None
        self.filter = compile_filter(spec.filter) if spec.filter else None
        self.avail_pos = array.array("Q")
        self.avail_ts = array.array("Q")
        self.head = 0
        self.returned: list[int] = []  # heap of positions: returned messages go first, oldest first
        self.gone: set[int] = set()  # removed from the middle of the arrays (acked by filter, `e`)
        self.counts: dict[int, list[int]] = {}  # position -> [deliveries, cancels]
        self.expiry: dict[int, int] = {}  # position -> deadline (us) from the message's own `e`
        self.exp_heap: list[tuple[int, int]] = []  # (deadline, position): messages with an `e`
        self.leased: dict[int, Lease] = {}  # position -> its lease
        self.by_bm: dict[str, int] = {}  # "pub|seq|" -> position, for leased / outstanding
        self.subs: list[QueueSub] = []
        self.lease_heap: list[tuple[float, int, Any]] = []  # (deadline, generation, positions)
        self.gen = 0
        self.events = bytearray()
        self.failed_events = bytearray()  # events of commits that failed, to be written again
        self.amo = HeldDeliveries(self)  # at-most-once deliveries, until their event is durable
        self.parked: collections.deque[int] = collections.deque()  # no subscription's filter
        self.barrier_wait = False
        self.stats = dict.fromkeys("acked expired redelivered delivered dead_lettered".split(), 0)
        self.repl: Any = None  # server/queue_repl.QueueReplication when replication is configured
        self.dlt_pub = publisher_id(f"{host.instance}\x00queue:{self.name}\x00dead-letter")
        self.checkpoint_dirty = True

    def wants_topic(self, topic_b: bytes) -> bool:
        if self.topic_rx is not None:
            return self.topic_rx.fullmatch(topic_b) is not None
        return topic_b == self.topic_b

    def passes_filter(self, body: bytes) -> bool:
        return self.filter is None or body_matches(self.filter, body)

    @property
    def depth(self) -> int:
        return (
            len(self.avail_pos) - self.head - len(self.gone) + len(self.returned) + len(self.parked)
        )

    def oldest_waiting_us(self) -> int | None:
        """Receive time (us) of the oldest message waiting for a consumer (not leased), or None.
        For the console, once a second: positions grow with receive time, so the oldest is the
        lowest position among the three places a message waits."""
        pos, i = self.avail_pos, self.head
        while i < len(pos) and pos[i] in self.gone:
            i += 1
        waiting = [pos[i]] if i < len(pos) else []
        waiting += self.returned[:1]  # a heap: its lowest first
        if self.parked:
            waiting.append(self.parked[0])
        oldest = min(waiting, default=None)
        if oldest is None:
            return None
        k = bisect.bisect_left(pos, oldest)
        if k < len(pos) and pos[k] == oldest:
            return int(self.avail_ts[k])
        rec = self.host.read(oldest)  # trimmed from the arrays: the journal has its time
        return int(rec[3]) if rec is not None else None

    def consumers(self) -> list[dict[str, Any]]:
        """Each consumer's backlog: messages leased to it (outstanding) of its max_backlog."""
        return [
            {
                "consumer": qs.sub.owner.describe(),
                "sub_id": qs.sub.sub_id,
                "outstanding": qs.outstanding,
                "max_backlog": qs.backlog,
            }
            for qs in self.subs
        ]

    def deadline_for(self, ts: int, exp: float | None) -> int:
        """When a message received at `ts` (us) expires; 0 = never. Seed 004's ExpirationModel
        default: the message's own `e` when it has one (longer or shorter than the queue's),
        else the queue's <Expiration>, both counted from the receive time."""
        if exp is not None:
            return ts + expiration_us(exp)
        if self.spec.expiration:
            return ts + int(self.spec.expiration * 1e6)
        return 0

    def add_waiting(self, position: int, ts: int, exp: float | None) -> None:
        dl = self.deadline_for(ts, exp) if exp is not None else 0  # before any change
        self.avail_pos.append(position)
        self.avail_ts.append(ts)
        if exp is not None:
            self.expiry[position] = dl
            heapq.heappush(self.exp_heap, (dl, position))

    def keep_waiting(self, pos: int, ts: int) -> None:
        """A committed message whose way into the queue failed midway: it waits (without an
        expiration) unless it got somewhere already (leased, waiting, held for its owner)."""
        held = self.repl is not None and self.repl.is_held(pos)
        if pos not in self.leased and not held and not self.is_waiting(pos):
            self.add_waiting(pos, ts, None)

    def waiting(self) -> list[int]:
        """Positions of the messages that wait for a consumer (returned, parked, in the
        arrays): neither leased nor done, nor held for another owner."""
        self.advance_head()
        return (
            list(self.returned)
            + list(self.parked)
            + [p for p in self.avail_pos[self.head :] if p not in self.gone]
        )

    def is_waiting(self, pos: int) -> bool:
        """Whether the message at `pos` waits here (returned, parked, or in the arrays)."""
        if pos in self.returned or pos in self.parked:
            return True
        if pos in self.gone:
            return False
        arr = self.avail_pos
        k = bisect.bisect_left(arr, pos, self.head)
        return k < len(arr) and arr[k] == pos

    # -- events ----------------------------------------------------------------------------

    def event(self, op: int, position: int, value: int = 0) -> None:
        append_event(self.events, op, position, value)
        self.checkpoint_dirty = True
        self.host.events_added()

    def event_run(self, op: int, positions: array.array) -> None:
        """Run entries (ACKED_RUN, LEASED_RUN) for positions (an array('Q'))."""
        append_run(self.events, op, positions)
        self.checkpoint_dirty = True
        self.host.events_added()

    def take_events(self) -> bytes | None:
        """The events since the last call (the failed ones first, `amo`'s last), or None."""
        amo = self.amo.events
        if not self.events and not self.failed_events and not amo:
            return None
        body = bytes(self.failed_events + self.events + amo)
        self.failed_events.clear()
        self.events.clear()
        amo.clear()
        return body

    def events_failed(self, body: bytes, held: list[Held] | None = None) -> None:
        """A commit carrying `body` failed. The state in memory has moved on already (an acked
        message left its lease), so the events go out again with the next commit rather than
        being lost: else an ack whose commit failed strands its message until a restart.
        Batches fail in the order they were built, so appending keeps the events in order;
        but not the entries of `held`, at-most-once deliveries not sent (HeldDeliveries)."""
        if held:
            body = self.amo.failed(body, held)
        if not body:
            return
        self.failed_events += body
        self.checkpoint_dirty = True
        self.host.events_added()

    def low_water(self, end: int) -> int:
        """Every message of this queue below this position is done."""
        lo = end
        self.advance_head()
        if self.head < len(self.avail_pos):
            lo = min(lo, self.avail_pos[self.head])
        if self.returned:
            lo = min(lo, self.returned[0])
        if self.parked:
            lo = min(lo, min(self.parked))
        if self.leased:
            lo = min(lo, min(self.leased))
        return lo

    # -- what delivery does (server/queue.py) ----------------------------------------------

    def add_sub(self, qs: QueueSub) -> None:
        """A new consumer: the parked messages (no subscription's filter took them) may suit
        it, so they wait first in line again."""
        self.subs.append(qs)
        for p in self.parked:
            heapq.heappush(self.returned, p)
        self.parked.clear()

    def remove_sub(self, qs: QueueSub, keep_counts: bool) -> None:
        """A consumer leaves: its leases end, lowest position first; with `keep_counts`
        (at-least-once) each message waits again, with its delivery counts."""
        self.subs.remove(qs)
        for p in sorted(p for p, lease in self.leased.items() if lease.holder is qs):
            if not keep_counts and p in self.amo.unsent:  # at-most-once, unsent: waits again
                self.amo.take_back(p)
                continue
            lease = self.end_lease(p)
            if keep_counts and lease is not None:
                self.counts[p] = lease.delivery_counts()
                self.requeue(p)

    def pop_next(self, from_returned: bool, park: bool = False) -> None:
        """The next waiting message (the front of `returned`, else the head) leaves its place;
        `park`: to wait for a subscription whose filter takes it (add_sub)."""
        if from_returned:
            pos = heapq.heappop(self.returned)
        else:
            pos = self.avail_pos[self.head]
            self.head += 1
        if park:
            self.parked.append(pos)

    def hold_for_barrier(self) -> None:
        """A barrier message waits until every leased message is done (forget wakes the pump)."""
        self.barrier_wait = True

    def lease(self, qs: QueueSub, pos: int, bm: str, ts: int, deadline: float | None) -> None:
        """The message at `pos` (out of its place already, received at `ts`) is leased to `qs`
        until `deadline` (monotonic), or delivered at most once (`deadline` None: the lease only
        holds the consumer's backlog place until its ack; its event is `amo.hold`'s)."""
        counts = self.counts.pop(pos, None) or [0, 0]  # kept on the lease while it lasts
        counts[0] += 1
        if self.spec.expiration and deadline is not None and pos not in self.expiry:
            # the lease's end looks at the expiration (requeue); the receive time is here only
            self.expiry[pos] = self.deadline_for(ts, None)
        if counts[0] > 1:
            self.stats["redelivered"] += 1
        self.stats["delivered"] += 1
        qs.outstanding += 1
        self.by_bm[bm] = pos
        if deadline is None:
            self.leased[pos] = new_lease((qs, 0, bm, counts))
            return
        self.gen += 1
        self.leased[pos] = new_lease((qs, self.gen, bm, counts))
        heapq.heappush(self.lease_heap, (deadline, self.gen, (pos,)))
        self.event(QueueOp.LEASED, pos, counts[0])

    def lease_run(
        self, qs: QueueSub, positions: array.array, bms: list[str], deadline: float
    ) -> None:
        """The messages at the head, `positions`, leased to `qs` in one go (one heap entry,
        one LEASED_RUN event), first deliveries all."""
        n = len(positions)
        self.head += n
        self.gen += 1
        gen = self.gen
        if n == 1:  # backlog 1: one round trip a message, so no iterator machinery
            # new_lease: Lease(...) is a Python call, new_lease((...)) is not (the hot path)
            self.leased[positions[0]] = new_lease((qs, gen, bms[0], None))
            self.by_bm[bms[0]] = positions[0]
        else:
            put_leases(self.leased, self.by_bm, positions, bms, Lease, qs, gen)
        qs.outstanding += n
        self.stats["delivered"] += n
        heapq.heappush(self.lease_heap, (deadline, gen, positions))
        self.event_run(QueueOp.LEASED_RUN, positions)

    def extend(self, pos: int, lease: Lease, deadline: float) -> None:
        """The lease on `pos` ends at `deadline` instead (a new generation names it)."""
        self.gen += 1
        self.leased[pos] = Lease(lease.holder, self.gen, lease.bm, lease.counts)
        heapq.heappush(self.lease_heap, (deadline, self.gen, (pos,)))

    def ack_leased(self, bms: Iterable[str]) -> array.array:
        """The leased messages of the bookmarks `bms` are acknowledged: their leases end and one
        ACKED_RUN event holds them all. A bookmark leased to no one here (acked before, or
        twice in `bms`) is passed over. Returns the positions acknowledged.

        The plain ack's hot path: one loop here instead of an end_lease call per message (a
        backlog-100 ack is 100 of them, bench_queue)."""
        pop_bm = self.by_bm.pop
        pop_lease = self.leased.pop
        acked = array.array("Q")
        add = acked.append
        for bm in bms:
            pos = pop_bm(bm, None)
            if pos is not None:
                pop_lease(pos)[0].outstanding -= 1  # [0]: Lease.holder, by index on the hot path
                add(pos)
        if acked:
            self.acked_run(acked)
        return acked

    def acked_run(self, acked: array.array) -> None:
        """The messages at `acked`, whose leases ended (end_lease), are acknowledged: one
        ACKED_RUN event."""
        self.event_run(QueueOp.ACKED_RUN, acked)
        self.stats["acked"] += len(acked)
        if self.counts:
            for pos in acked:
                self.counts.pop(pos, None)
        if self.expiry:
            for pos in acked:
                self.expiry.pop(pos, None)
        if self.barrier_wait and not self.leased:
            self.barrier_wait = False
            self.host.call_soon(self.pump)

    def acked(self, pos: int, delivered: bool = False) -> None:
        """The message at `pos`, out of its lease or its place in line, is acknowledged
        (`delivered`: it was delivered to every consumer at once, a barrier)."""
        self.event(QueueOp.ACKED, pos)
        if delivered:
            self.stats["delivered"] += 1
        self.stats["acked"] += 1
        self.forget(pos)

    def given_back(self, pos: int, lease: Lease, cancel: bool) -> None:
        """The consumer gave back the message at `pos` (its lease ended): cancelled, it waits
        again unless past MaxCancels; else it expires (to the dead-letter topic)."""
        counts = self.counts[pos] = lease.delivery_counts()
        if not cancel:
            self.expire(pos, "expired by consumer", None)
            return
        counts[1] += 1
        self.event(QueueOp.CANCELLED, pos, counts[1])
        if self.spec.max_cancels and counts[1] > self.spec.max_cancels:
            self.expire(pos, "max cancels", None)
        else:
            self.requeue(pos)

    # -- what replication and recovery do (server/queue_repl.py, server/queues.py) -----------

    def end_lease(self, pos: int) -> Lease | None:
        """The message at `pos` leaves its lease, if it has one (a place in its holder's
        backlog frees); the caller says where the message goes. None: it was not leased."""
        lease = self.leased.pop(pos, None)
        if lease is not None:
            self.by_bm.pop(lease.bm, None)
            lease.holder.outstanding -= 1
        return lease

    def waiting_or_leased(self) -> list[int]:
        """The positions of the messages that wait or are leased here."""
        self.advance_head()
        out = [p for p in self.avail_pos[self.head :] if p not in self.gone]
        out += list(self.returned) + list(self.parked) + list(self.leased)
        return out

    def release(self, pos: int) -> None:
        """The message at `pos` (waiting or leased here) is no longer this instance's to
        deliver: its lease is dropped, its delivery counts kept; or it stops waiting."""
        lease = self.end_lease(pos)
        if lease is not None:
            self.counts[pos] = lease.delivery_counts()
        else:
            self.take_waiting(pos)

    def apply_done(self, pos: int) -> bool:
        """The message at `pos` was made done elsewhere (acked, expired, delivered at most
        once): it leaves its lease or its place in line. False: it was neither here."""
        if self.end_lease(pos) is None:
            if not self.is_waiting(pos):
                return False
            self.take_waiting(pos)
        self.forget(pos)
        return True

    def apply_count(self, op: int, value: int, pos: int, held: bool) -> None:
        """A LEASED, LEASED_RUN or CANCELLED event from elsewhere: the message's counts keep
        the highest seen. Only for a message held for its owner, or delivered here before."""
        if not held and pos not in self.counts:
            return  # a message this instance owns and has not delivered: nothing to keep
        counts = self.counts.setdefault(pos, [0, 0])
        if op == QueueOp.LEASED_RUN:
            counts[0] = max(counts[0], 1)
        elif op == QueueOp.LEASED:
            counts[0] = max(counts[0], value)
        elif op == QueueOp.CANCELLED:
            counts[1] = max(counts[1], value)

    def forget_counts(self, pos: int) -> None:
        """A message held for another owner is done: its counts go."""
        self.counts.pop(pos, None)

    def return_first(self, pos: int, ts: int, exp: float | None) -> None:
        """A message held for another owner becomes this instance's (a takeover): it waits
        first in line, with its expiration."""
        heapq.heappush(self.returned, pos)
        if exp is not None:
            dl = self.deadline_for(ts, exp)
            self.expiry[pos] = dl
            heapq.heappush(self.exp_heap, (dl, pos))

    def add_events(self, body: bytes | bytearray) -> None:
        """Encoded events (journal/queue_events.py), e.g. an OWNER event, to commit."""
        self.events += body
        self.checkpoint_dirty = True
        self.host.events_added()

    def recovered(self, done: set[int], counts: dict[int, list[int]]) -> None:
        """Recovery read every event: the messages they made `done` stop waiting, and the
        delivery counts of the others are `counts`."""
        if done:
            keep = [(p, t) for p, t in zip(self.avail_pos, self.avail_ts) if p not in done]
            self.avail_pos = array.array("Q", (p for p, _ in keep))
            self.avail_ts = array.array("Q", (t for _, t in keep))
            for p in done:
                self.expiry.pop(p, None)
            self.gone.difference_update(done)
            if self.returned:
                self.returned = [p for p in self.returned if p not in done]
                heapq.heapify(self.returned)
        self.counts = {p: c for p, c in counts.items() if p not in done}

    # -- leaving a lease, expiring ---------------------------------------------------------

    def advance_head(self) -> None:
        pos = self.avail_pos
        while self.head < len(pos) and pos[self.head] in self.gone:
            self.gone.discard(pos[self.head])
            self.head += 1
        if self.head > 65536 and self.head * 2 > len(pos):
            del self.avail_pos[: self.head]
            del self.avail_ts[: self.head]
            self.head = 0

    def requeue(self, position: int) -> None:
        """A message leaves its lease (ended, cancelled, holder gone): it waits again at the
        front, unless it is past its expiration or MaxDeliveries (seed 004, at-least-once
        flow, step 6): then it expires instead and is never redelivered."""
        dl = self.expiry.get(position)
        if dl and now_us() >= dl:
            self.expire(position, "expiration", None)
            return
        counts = self.counts.get(position, [0, 0])
        maxd = self.spec.max_deliveries
        if maxd and counts[0] >= maxd:
            self.expire(position, "max deliveries", None)
            return
        heapq.heappush(self.returned, position)
        if dl:  # it may expire while it waits again (expire_due)
            heapq.heappush(self.exp_heap, (dl, position))

    def take_waiting(self, pos: int) -> None:
        """Remove a waiting message from wherever it waits."""
        if pos in self.returned:
            self.returned.remove(pos)
            heapq.heapify(self.returned)
        elif pos in self.parked:
            self.parked.remove(pos)
        else:
            self.gone.add(pos)

    def forget(self, position: int) -> None:
        self.counts.pop(position, None)
        self.expiry.pop(position, None)
        if self.barrier_wait and not self.leased:
            self.barrier_wait = False
            self.host.call_soon(self.pump)

    def expire(self, position: int, reason: str, rec: StoredMessage | None) -> None:
        counts = self.counts.get(position, [0, 0])
        self.event(QueueOp.EXPIRED, position, ExpiryReason.code(reason))
        self.stats["expired"] += 1
        if self.spec.dead_letter_topic:
            self.host.dead_letter(self, position, reason, counts[0], rec)
        self.forget(position)

    def expire_due(self, now_us: int) -> None:
        """Expire waiting messages whose time is up, even with no subscriber (a tick). A leased
        message is left alone here: its expiration is looked at when its lease ends."""
        changed = False
        if self.spec.expiration:
            exp_us = int(self.spec.expiration * 1e6)
            self.advance_head()
            avail_pos, avail_ts, gone, own = self.avail_pos, self.avail_ts, self.gone, self.expiry
            i = self.head
            while i < len(avail_pos) and avail_ts[i] + exp_us <= now_us:
                pos = avail_pos[i]
                i += 1
                if pos in gone or pos in own:  # taken already, or its own `e` rules (the heap)
                    continue
                if i - 1 == self.head:
                    self.head = i
                else:
                    gone.add(pos)
                self.expire(pos, "expiration", None)
                changed = True
        heap = self.exp_heap
        while heap and heap[0][0] <= now_us:
            dl, pos = heapq.heappop(heap)
            if self.expiry.get(pos) != dl or pos in self.leased or pos in self.gone:
                continue
            self.take_waiting(pos)
            self.expire(pos, "expiration", None)
            changed = True
        if changed:
            self.pump()

    def lease_timeouts(self, now: float) -> None:
        """Return the messages whose lease ended at `now` (monotonic), and re-arm the timer."""
        heap = self.lease_heap
        changed = False
        leased = self.leased
        while heap and heap[0][0] <= now:
            _, gen, positions = heapq.heappop(heap)
            ended = 0
            for pos in positions:
                lease = leased.get(pos)
                if lease is None or lease.gen != gen:
                    continue
                self.end_lease(pos)
                if not ended:
                    first = (lease.bm, lease.holder.sub.owner.describe())
                ended += 1
                self.counts[pos] = lease.delivery_counts()
                self.requeue(pos)
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
            self.host.arm(heap[0][0])
