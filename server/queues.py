"""Message queues (docs/protocol.md §8): every queue of the instance, its recovery, its timers, and
where it meets the pipeline. One queue's state machine is server/queue.py's `Queue`.

`QueueManager` is each queue's `QueueHost`: it reads messages back from the journal (through
server/queue_reader.py's `QueueReader`, a one-block cache, so a run of deliveries costs one read;
the frames of a run are spliced from that block), keeps one loop timer for every lease heap,
adds the queues' events to the batch being committed (and their checkpoints, at most once a
second), and publishes dead letters.

Narrow doors: the journal it reads, the loop it sets timers on, and `Commits` (the pipeline:
committed messages in, events and dead letters out). Recovery (`recover`) runs before the
server accepts connections, off the loop: from each queue's checkpoint, messages on the
underlying topic become waiting and the events after it are applied
(journal/queue_events.py).

With replication configured, each queue has a `QueueReplication` (server/queue_repl.py: who
owns which message; only owned ones wait here), and the manager is the replication links'
door to the queues: `translate_out` (sender: an event body in the wire form), `translate_in`
(receiver: a queue's replicated events, applied and journaled here), `source_up` /
`source_synced` / `source_down` (receiver: a peer's link), and the takeover check on every
tick. While a peer's events are being caught up (after the start, and after its link comes
back: a healed partition) the queues lease nothing (`paused`, server/queue_repl.py `CatchUp`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass
from functools import partial
from typing import Any, Protocol

from config.model import QueueSpec, Replication
from journal.journal import Journal
from journal.queue_events import (
    apply_events,
    checkpoint_key,
    decode_checkpoint,
    encode_checkpoint,
    from_wire,
    to_wire,
)
from journal.record import KIND_MESSAGE, KIND_QUEUE_EVENT, encode_record

from . import frames
from .fanout import Message
from .pipeline import Batch, Publisher
from .queue import Queue
from .queue_held import Held
from .queue_reader import QueueReader
from .queue_repl import CatchUp, Failover, QueueReplication, message_origin, record_origin
from .queue_state import QueueState
from .queue_types import StoredMessage
from .replay_plan import now_us

__all__ = ["Commits", "QueueManager"]

log = logging.getLogger("tickertape.queues")

EVENT_FLUSH_DELAY = 0.005
# after a commit of at-most-once deliveries failed, their messages are offered again this much
# later: a journal that is unavailable fails every commit at once until its probe succeeds
# (journal/writer.py), and an immediate retry would spin
RETRY_DELAY = 0.1


class Commits(Protocol):
    """What the queues use of the pipeline."""

    delivered_end: int
    on_deliver: list[Callable[[list[Message], int], None]]
    before_flush: list[Callable[[Batch], None]]

    @property
    def accepted_end(self) -> int:
        """The journal end once everything accepted so far is committed."""

    def schedule(self) -> None: ...
    def publish(
        self,
        client: Publisher | None,
        pub: int,
        seq: int | None,
        topic: str,
        body: bytes,
        hdr: bytes = b"",
        exp: Any = None,
    ) -> tuple[int, int]: ...


@dataclass(eq=False, repr=False)
class QueueManager:
    """All queues of the instance: recovery, routing of committed messages, timers, commands."""

    specs: InitVar[Iterable[QueueSpec]]
    instance: str
    journal: Journal | None
    loop: asyncio.AbstractEventLoop
    commits: Commits
    replication: InitVar[Replication | None] = None

    def __post_init__(self, specs: Iterable[QueueSpec], replication: Replication | None) -> None:
        self.queues: dict[str, Queue] = {}
        self.loading = False
        self.paused = False  # replicated queues: no deliveries while a peer catches up (below)
        self.catch_up: CatchUp | None = None
        self._pump_due: set[Queue] = set()  # queues that replicated events changed (_pump_soon)
        for spec in specs:
            self.queues[spec.name] = Queue(self, spec)
        self.states = [q.state for q in self.queues.values()]
        self._timer: asyncio.TimerHandle | None = None
        self._event_timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self.reads = QueueReader(self.journal)  # messages read back (a one-block cache)
        # its reads and callbacks, as the queues' host (QueueHost): the bound methods that do them
        self.read = self.reads.read
        self.call_soon = self.loop.call_soon
        self.splice_run = self.reads.splice_run
        self.origin_at = self.reads.origin_at
        self.recovery_seconds = 0.0
        self._last_checkpoint = 0.0
        self._checkpoints: dict[str, int] = {}  # queue name -> the checkpoint last committed
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self.failover: Failover | None = None
        # replicated events not yet journaled: (queue, origin instance, group) -> event bodies
        self._repl_out: dict[tuple[QueueState, str, str], bytearray] = {}
        # replicated entries about messages not here yet: [(queue, (origin, group), wire, the
        # journal end by which the queues have taken in their message if it comes)]
        self._pending: list[tuple[Queue, tuple[str, str], bytes, int]] = []
        # the journal end below which the queues have taken in every message (recovery, then
        # each commit delivered to them): a replicated event names only a message below it. The
        # journal can hold one above (written, its commit not yet delivered here); an event
        # applied to it would find nothing to make done, and the message, placed afterwards,
        # would wait for ever (delivered again by a takeover)
        self._taken_end = 0
        self.repl_stats = {"events_in": 0, "unresolved_dropped": 0, "unnamed_dropped": 0}
        if replication is not None and replication.destinations:
            self.enable_replication(
                [d.name for d in replication.destinations], replication.queue_owner_failover
            )

    def enable_replication(
        self, peers: Iterable[str], failover: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Replicated queues with these peers (the configured destinations): before recovery.

        After a start, and after a peer's link comes back up, the queues deliver nothing until
        that peer has synced (`source_synced`), or, while its link is down, `failover` seconds
        have passed (docs/replication.md "Replicated queues"): a peer may have taken this
        instance over, or acknowledged its messages, while it was away or cut off, and says so
        only once its link has sent what this instance missed."""
        self.failover = Failover(self.instance, peers, failover, clock)
        for q in self.queues.values():
            q.state.repl = QueueReplication(q.state, self.instance)
        self.catch_up = CatchUp(failover, clock)
        self.catch_up.start(p for p in peers if p != self.instance)
        self.paused = bool(self.catch_up) and bool(self.queues)

    # -- wiring ----------------------------------------------------------------------------------

    def get(self, name: str | None) -> Queue | None:
        """The queue of that name, if there is one."""
        return self.queues.get(name or "")

    def attach(self, pipeline: Commits) -> None:
        pipeline.on_deliver.append(self.on_committed)
        pipeline.before_flush.append(self.before_flush)

    def on_committed(self, msgs: list[Message], end: int) -> None:
        for m in msgs:
            if m.position < 0:
                continue
            tb = None
            for q in self.queues.values():
                if tb is None:
                    tb = m.topic.encode()
                st = q.state
                if st.wants_topic(tb) and st.passes_filter(m.body):
                    try:
                        if st.repl is not None and st.repl.place(
                            m.position, m.ts, m.exp, message_origin(m)
                        ):
                            continue
                        q.offer_fresh(m)
                    except Exception:
                        # one message's failure must not cost the rest of the commit (nor move
                        # the checkpoint past this one): it waits, without its expiration
                        log.exception("queue %s: message at %d not taken as is", q.name, m.position)
                        st.keep_waiting(m.position, m.ts)
        self._taken_end = max(self._taken_end, end)
        if self._pending:
            self._retry_pending({(m.pub, m.seq): m.position for m in msgs if m.position >= 0}, end)

    def before_flush(self, batch: Batch) -> None:
        taken = []
        held = []
        for st in self.states:
            body = st.take_events()
            if body is not None:
                batch.data += encode_record(KIND_QUEUE_EVENT, 0, 0, 0, st.name_b, body)
                deliveries = st.amo.take()
                if deliveries is None:
                    taken.append((st, body))
                else:
                    held.append((self.queues[st.name], body, deliveries))
        if self._repl_out:
            for (st, origin, group), rbody in self._repl_out.items():
                # the origin block says where they happened: the sender's loop prevention and
                # pass-through rules apply to them as to messages
                ob = (now_us(), origin.encode(), group.encode())
                batch.data += encode_record(
                    KIND_QUEUE_EVENT, 0, 0, 0, st.name_b, bytes(rbody), origin=ob
                )
                taken.append((st, bytes(rbody)))
            self._repl_out = {}
        if taken or held:
            batch.after.append(partial(self._events_committed, taken, held))
        now = time.monotonic()
        if self.queues and now - self._last_checkpoint < 1.0:
            # not now: a commit at most a second from now carries it, even on a quiet server
            # (the checkpoint alone is committed to the index, journal/writer.py)
            if self._checkpoint_timer is None and not self.loading:
                self._checkpoint_timer = self.loop.call_later(
                    self._last_checkpoint + 1.0 - now, self._checkpoint_due
                )
        elif self.queues:
            self._last_checkpoint = now
            # a checkpoint committed with this batch covers only what this batch makes durable.
            # It moves whenever the low water does, not only when the queue changed: an idle,
            # empty queue's low water follows the journal's end, and a checkpoint left behind
            # would pin every later segment (remove-journal keeps what a checkpoint needs)
            end = self.commits.delivered_end
            meta = batch.meta or {}
            for st in self.states:
                low = st.low_water(end)
                if st.checkpoint_dirty or self._checkpoints.get(st.name) != low:
                    meta[checkpoint_key(st.name_b)] = encode_checkpoint(low)
                    self._checkpoints[st.name] = low
                    st.checkpoint_dirty = False
            if meta:
                batch.meta = meta

    def _events_committed(
        self,
        taken: list[tuple[QueueState, bytes]],
        held: list[tuple[Queue, bytes, list[Held]]],
        err: BaseException | None,
    ) -> None:
        """The commit of the queues' events (`taken`, and `held`: those that end with
        at-most-once deliveries) is done: the deliveries go out now that their events are
        durable (and past the sync gate, which holds this callback like a `persisted` ack). A
        failure writes the events again with the next commit, and puts the messages of the
        deliveries back, unsent, to be offered again RETRY_DELAY later."""
        if err is not None:
            for st, body in taken:
                st.events_failed(body)
            for q, body, deliveries in held:
                q.state.events_failed(body, deliveries)
                self.loop.call_later(RETRY_DELAY, q.pump)
            return
        for q, _, deliveries in held:
            q.send_held(q.state.amo.durable(deliveries))

    def _checkpoint_due(self) -> None:
        self._checkpoint_timer = None
        self.commits.schedule()

    def events_added(self) -> None:
        """Queue events ride with the next commit; if none comes soon, commit them anyway.

        An ack whose reply was asked for forces a commit at once (after_commit); the others are
        made durable within EVENT_FLUSH_DELAY, so a quiet server does not hold them in memory.
        """
        if self._event_timer is None and not self.loading:
            self._event_timer = self.loop.call_later(EVENT_FLUSH_DELAY, self._flush_events)

    def commit_soon(self) -> None:
        """Commit the queues' events at the end of this loop iteration: an at-most-once
        delivery waits for its event's commit (server/queue_held.py), so not EVENT_FLUSH_DELAY
        more."""
        if not self.loading:
            self.commits.schedule()

    def _flush_events(self) -> None:
        self._event_timer = None
        self.commits.schedule()

    def arm(self, deadline: float) -> None:
        if deadline >= self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = self.loop
        self._timer_at = deadline
        self._timer = loop.call_at(loop.time() + max(0.0, deadline - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        now = time.monotonic()
        for st in self.states:
            st.lease_timeouts(now)

    def stop(self) -> None:
        """No more timers (shutdown): pending events go with the pipeline's last commit."""
        for timer in (self._timer, self._event_timer, self._checkpoint_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._event_timer = self._checkpoint_timer = None
        self._timer_at = float("inf")

    def tick(self) -> None:
        """Expire waiting messages whose time is up (the server's periodic tick); take over
        the queue messages of a peer lost for <QueueOwnerFailover>."""
        now = now_us()
        self.reads.forget()
        for st in self.states:
            st.expire_due(now)
        if self.failover is not None:
            catch_up = self.catch_up
            late = catch_up.overdue() if catch_up is not None else []
            if late and catch_up is not None:
                log.warning(
                    "queues: %s not synced, and without a link, %.0fs after the start (or the link "
                    "coming back); delivering without waiting for them",
                    ", ".join(late),
                    catch_up.bound,
                )
                self._resume_if_caught_up(None)
            for peer in self.failover.due():
                for st in self.states:
                    if st.repl is not None and st.repl.holds_for(peer):
                        log.warning(
                            "queue %s: taking over the messages of %s (no link for %.0fs or more)",
                            st.name,
                            peer,
                            self.failover.failover,
                        )
                        st.repl.take_over(peer)

    # -- replication -----------------------------------------------------------------------------

    def source_up(self, name: str) -> None:
        """The replication receiver: a link from instance `name` is up. What `name` did while
        its link was down (acks, deliveries, a takeover) is on its way: the queues lease nothing
        until it has synced (a healed partition must not deliver again what `name` acked)."""
        if self.failover is not None:
            self.failover.source_up(name)
        if self.catch_up is not None and self.catch_up.link_up(name) and self.queues:
            if not self.paused:
                log.info("queues: link from %s is back; leasing nothing until it has synced", name)
            self.paused = True

    def links_listening(self) -> None:
        """The replication listeners are up: the wait for peers without a link, from the
        start, counts from now (they could not link before)."""
        if self.catch_up is not None:
            self.catch_up.listening()

    def source_logon(self, name: str, checking: bool) -> None:
        """The replication receiver: a link naming itself `name` starts (`checking`) or ends
        its logon check; while it lasts, a catch-up of `name` under way waits for it."""
        if self.catch_up is not None:
            self.catch_up.logon(name, checking)

    def source_down(self, name: str) -> None:
        """The replication receiver: the link from instance `name` is gone."""
        if self.failover is not None:
            self.failover.source_down(name)
        if self.catch_up is not None:
            self.catch_up.link_down(name)

    def source_synced(self, name: str) -> None:
        """The replication receiver: instance `name` has sent everything it had for this one
        (all below its journal end at the logon, or its link went idle), so its queue events,
        takeovers included, are applied here."""
        if self.catch_up is not None and self.catch_up.synced(name):
            self._resume_if_caught_up(f"{name} has synced")

    def _resume_if_caught_up(self, why: str | None) -> None:
        if not self.paused or self.catch_up:
            return
        if why is not None:
            log.info("queues: %s; delivering", why)
        self.paused = False
        for q in self.queues.values():
            q.pump()

    def translate_out(self, body: bytes) -> bytes:
        """The sender's hook: a queue-event record's body in the wire form (positions as the
        messages' publisher id and seq); entries about messages gone from here are counted."""
        wire, dropped = to_wire(body, self._identity_of)
        self.repl_stats["unnamed_dropped"] += dropped
        return wire

    def _identity_of(self, position: int) -> tuple[int, int] | None:
        rec = self.read(position)
        return None if rec is None else (rec[1], rec[2])

    def translate_in(
        self, queue: str | bytes, wire: bytes, origin: str, group: str | None = None
    ) -> None:
        """The receiver's hook: the events of `queue` that happened at instance `origin` (of
        `group`, default its name: the record's origin block, else the source's), in
        the wire form (raises WireEventError for a body it cannot read). Applied here at once,
        and journaled with the next commit; entries about messages that are not here yet wait
        for the next commits (the message comes first on the same link), then are dropped and
        counted. They wait until the queues have taken in everything this instance had accepted
        when they came (`accepted_end`): the commits in flight and the open batch, however many
        there are (counted in commits, the wait ended at the third, and an event whose message
        sat behind three commits in flight was dropped though its message came: seams
        campaign, seed 1 round 16). A queue not configured here ignores them."""
        q = self.get(queue.decode() if isinstance(queue, bytes) else queue)
        if q is None or self.journal is None:
            return
        self.repl_stats["events_in"] += 1
        who = (origin, group if group is not None else origin)
        local, left = from_wire(wire, self._locate_taken)
        if local:
            self._apply_replicated(q, who, local)
        if left is not None:
            self._pending.append((q, who, left, self.commits.accepted_end))

    def _apply_replicated(self, q: Queue, who: tuple[str, str], local: bytes) -> None:
        st = q.state
        if st.repl is not None:
            st.repl.apply_remote(local)
        else:  # a queue without replication here: its done-ness still follows
            apply_events(local, set(), {})
        self._repl_out.setdefault((st, *who), bytearray()).extend(local)
        st.checkpoint_dirty = True
        self.events_added()
        if not self.loading:
            self._pump_soon(q)

    def _pump_soon(self, q: Queue) -> None:
        """Pump `q` once the records in hand are applied, not after each one: a record that frees
        a lease here (done elsewhere) must not hand out a message whose event is in the next
        record of the same read."""
        if not self._pump_due:
            self.loop.call_soon(self._pump_changed)
        self._pump_due.add(q)

    def _pump_changed(self) -> None:
        due, self._pump_due = self._pump_due, set()
        for q in due:
            q.pump()

    def _locate_taken(self, pub: int, seq: int) -> int | None:
        """The position of message (pub, seq) if the queues have taken it in (None: not here,
        or not delivered to them yet: its event waits for the commit that brings it)."""
        pos = self.reads.locate(pub, seq)
        return pos if pos is not None and pos < self._taken_end else None

    def _retry_pending(self, committed: dict[tuple[int, int], int], end: int) -> None:
        journal = self.journal
        assert journal is not None

        def locate(pub: int, seq: int) -> int | None:
            pos = committed.get((pub, seq))
            return pos if pos is not None else self._locate_taken(pub, seq)

        pending, self._pending = self._pending, []
        for q, origin, wire, due in pending:
            local, left = from_wire(wire, locate)
            if local:
                self._apply_replicated(q, origin, local)
            if left is None:
                continue
            if end >= due:  # everything accepted when they came is taken in: not coming
                n = len(left) // 20  # about: runs count as one
                self.repl_stats["unresolved_dropped"] += n
                log.warning(
                    "queue %s: %d replicated event(s) from %s name messages not here; dropped",
                    q.name,
                    n,
                    origin,
                )
            else:
                self._pending.append((q, origin, left, due))

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> None:
        """Rebuild every queue from its checkpoint and the journal after it (off the loop)."""
        journal = self.journal
        if journal is None or not self.queues:
            return
        started = time.monotonic()
        self.loading = True
        starts = []
        qlist = self.states
        for q in qlist:
            raw = journal.index.get_meta(checkpoint_key(q.name_b))
            starts.append(decode_checkpoint(raw, journal.start_position))
        pos = max(journal.start_position, min(starts))
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
                if kind == KIND_MESSAGE:
                    for q in qlist:
                        if (
                            position >= qstart[q.name_b]
                            and q.wants_topic(tb)
                            and q.passes_filter(body)
                        ):
                            exp = extra[0] if extra else None
                            try:
                                if q.repl is not None and q.repl.place(
                                    position, ts, exp, record_origin(extra, ts)
                                ):
                                    continue
                                q.add_waiting(position, ts, exp)
                            except Exception:  # as on_committed: this one waits, the rest go on
                                log.exception(
                                    "queue %s: message at %d not taken as is", q.name, position
                                )
                                q.keep_waiting(position, ts)
                elif kind == KIND_QUEUE_EVENT:
                    if tb in by_name:
                        rq = by_name[tb].repl
                        apply_events(
                            body, done[tb], counts[tb], rq.apply_owner if rq is not None else None
                        )
            pos = journal.next_position(nxt)
        for q in qlist:
            d = done[q.name_b]
            q.recovered(d, counts[q.name_b])
            if q.repl is not None:
                q.repl.forget_done(d)
        self._taken_end = max(self._taken_end, pos)
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

    def dead_letter(
        self,
        q: QueueState,
        position: int,
        reason: str,
        deliveries: int,
        rec: StoredMessage | None,
    ) -> None:
        rec = rec or self.read(position)
        if rec is None:
            return
        _, pub, seq, ts, topic_b, body, extra = rec
        hdr = frames.dead_letter_fragment(reason, deliveries, q.name, pub, seq)
        assert q.spec.dead_letter_topic is not None
        self.commits.publish(None, q.dlt_pub, None, q.spec.dead_letter_topic, body, hdr, None)
        q.stats["dead_lettered"] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {name: q.snapshot() for name, q in self.queues.items()}
