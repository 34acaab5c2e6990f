"""At-most-once deliveries held until the events that make their messages done are durable.

An at-most-once delivery must not leave the server before its DELIVERED_AT_MOST_ONCE event
(journal/queue_events.py) is in the journal: sent first, a crash between the send and the
commit loses the event, and the restarted instance (or a peer taking over) delivers the message
again. So a queue's `QueueState` (server/queue_state.py) holds each such delivery here, its
frame built already, with its event entry:

    held (entry and frame here) --take: into a commit--> committing
    committing --durable (after the sync gate)--> sent, if still leased to its holder
    committing --failed--> not sent: the message waits again (take_back)

server/queues.py's `QueueManager` takes the entries into the batch being committed (the last
part of the queue's event record, so a failed commit can leave them out when it writes the
other events again) and the frames into that batch's `after` callback. A message acknowledged
by filter meanwhile, made done by another instance, or given up to one, is not sent; one whose
holder went away waits again (QueueState.remove_sub). A barrier message (server/queue.py) is
held the same way, one entry per subscription it goes to, and sent to those still there.
"""

from __future__ import annotations

from typing import Any, Protocol

from journal.queue_events import ENTRY, QueueOp, append_event

from .queue_types import Lease, QueueSub

__all__ = ["Held", "HeldDeliveries", "HeldState"]

Held = tuple[QueueSub, int, tuple[bytes, bytes, bytes]]
"""An at-most-once delivery waiting for its event: (holder, position, the frame's length
prefix, header and body)."""


class HeldState(Protocol):
    """What the held deliveries use of their queue's state (server/queue_state.py)."""

    host: Any  # its QueueHost: commit_soon
    leased: dict[int, Lease]
    counts: dict[int, list[int]]
    stats: dict[str, int]
    checkpoint_dirty: bool
    subs: list[QueueSub]

    def end_lease(self, pos: int) -> Lease | None: ...
    def requeue(self, position: int) -> None: ...


class HeldDeliveries:
    __slots__ = ("barriers", "events", "frames", "state", "unsent")

    def __init__(self, state: HeldState) -> None:
        self.state = state
        self.events = bytearray()  # DELIVERED_AT_MOST_ONCE entries not taken into a commit yet
        self.frames: list[Held] = []  # their deliveries, in delivery order
        self.unsent: set[int] = set()  # positions of every delivery held, here or committing
        self.barriers: set[int] = set()  # those of barrier messages (to every subscription)

    def hold(self, qs: QueueSub, pos: int, frame: tuple[bytes, bytes, bytes]) -> None:
        """The delivery of the message at `pos` (being leased to `qs`) waits for a commit,
        asked for at the end of this loop iteration."""
        append_event(self.events, QueueOp.DELIVERED_AT_MOST_ONCE, pos)
        self.frames.append((qs, pos, frame))
        self._held(pos)

    def _held(self, pos: int) -> None:
        self.unsent.add(pos)
        self.state.checkpoint_dirty = True
        self.state.host.commit_soon()

    def hold_barrier(self, pos: int, frames: list[Held]) -> None:
        """A barrier message's delivery to every subscription (`frames`) waits for a commit."""
        for _ in frames:  # one entry a frame: a failed commit drops as many (failed)
            append_event(self.events, QueueOp.DELIVERED_AT_MOST_ONCE, pos)
        self.frames += frames
        self.barriers.add(pos)
        self.state.stats["delivered"] += 1  # once, as at-least-once counts a barrier
        self._held(pos)

    def take(self) -> list[Held] | None:
        """The deliveries whose entries the queue's events body just taken ends with
        (QueueState.take_events), or None."""
        if not self.frames:
            return None
        held, self.frames = self.frames, []
        return held

    def durable(self, held: list[Held]) -> list[Held]:
        """Their entries are durable: the deliveries whose message is still leased to their
        holder, to be sent now, in order."""
        out = []
        leased, unsent = self.state.leased, self.unsent
        for h in held:
            pos = h[1]
            if pos in self.barriers:  # sent to the subscriptions still there
                if h[0] in self.state.subs:
                    out.append(h)
                unsent.discard(pos)
                continue
            lease = leased.get(pos)
            if lease is None:
                unsent.discard(pos)
            elif lease.holder is h[0] and pos in unsent:
                unsent.discard(pos)
                out.append(h)
        if self.barriers:
            self.barriers.difference_update(h[1] for h in held)
        return out

    def failed(self, body: bytes, held: list[Held]) -> bytes:
        """The commit of `body` (whose last entries are `held`'s) failed: the messages still
        leased to their holder wait again (take_back); returns the body without those entries."""
        leased = self.state.leased
        for qs, pos, _ in held:
            if pos in self.barriers:  # waits again, first in line
                self.barriers.discard(pos)
                self.unsent.discard(pos)
                self.state.stats["delivered"] -= 1
                self.state.requeue(pos)
            elif (
                pos in self.unsent and (lease := leased.get(pos)) is not None and lease.holder is qs
            ):
                self.take_back(pos)
        return body[: len(body) - ENTRY.size * len(held)]

    def take_back(self, pos: int) -> None:
        """The delivery of the message at `pos`, held, will not be sent (its commit failed, its
        holder went away): the message waits again, first in line, as if it had not been
        delivered (unless it expired meanwhile: QueueState.requeue)."""
        st = self.state
        self.unsent.discard(pos)
        lease = st.end_lease(pos)
        if lease is not None:
            counts = st.counts[pos] = lease.delivery_counts()
            counts[0] -= 1
            st.stats["delivered"] -= 1
            st.stats["redelivered"] -= counts[0] > 0
            st.requeue(pos)
