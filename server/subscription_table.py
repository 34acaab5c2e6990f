"""The subscriptions of one session and every change of their state, in one place.

States of a subscription (`Subscription.state`, server/subscriptions.py) and what moves it:

    subscribe (no bm, or bm NOW) ──────────────────────────────────────────────> LIVE
    subscribe bm (a replay plan) ──> REPLAYING ──caught up──> LIVE, or LIVE_EARLY (`live` option)
    subscribe bm (NOW too), o=pause ──> PAUSED
                                     REPLAYING ──pause──> PAUSED ──resume──> REPLAYING
    LIVE / LIVE_EARLY (a bookmark subscription) ──pause──> PAUSED (its place: the live end)
    LIVE ──lagging (fall_back)──> REPLAYING ──caught up──> LIVE (no `completed`)
    REPLAYING ──range end (completed ack)──> REMOVED
    subscribe on a queue ──────────> QUEUED
    any ──unsubscribe / disconnect──> REMOVED
    replace: the new subscription takes the old one's state and place in the stream

Replays that feed several subscriptions pause and resume together, so a pause or resume moves
every subscription of that replay; except a lagging connection's replay (`fall_back`), from
which a paused subscription is split off, since the others never asked for it.

Lagging: when the connection's output passes <ClientOfflineThreshold> (the Outbox calls
`fall_back`), every LIVE subscription that the journal can feed (`journal_fed`, not conflated)
stops getting live messages in memory and reads the journal from the live end, that is from
the last message it was sent; all of the connection's such subscriptions share one replay (one
read block), and each rejoins LIVE when the replay catches up. Everything else keeps queueing,
up to <ClientMaxBufferSize>. The engines report the events that are theirs through the
owner methods: `went_live` (server/replay.py caught up) and `range_done` (a range ended).

Server-wide, a subscription is found by the engines through `LiveIndex`: the router (live
fan-out matches topics there), the early-delivery count of the fan-out, and the bookmark
subscriptions that asked for periodic `persisted` acks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from protocol.bookmarks import format_bookmark

from .fanout import Fanout
from .pipeline import Pipeline
from .queue import Queue
from .replay_engine import ReplayEngine
from .replay_plan import Plan
from .router import Router
from .subscriptions import LIVE_STATES, Subscription, SubState

__all__ = ["LiveIndex", "SubscriptionTable"]


@dataclass(eq=False, repr=False)
class LiveIndex:
    """Where the engines find subscriptions: the router, early fan-out, persisted-ack subs."""

    router: Router
    fanout: Fanout
    pipeline: Pipeline
    # subscription -> the live end when it was added (its acks never name older bookmarks)
    persist_acks: dict[Subscription, int] = field(default_factory=dict, init=False)

    def add(self, sub: Subscription) -> None:
        self.router.add(sub)
        if sub.bookmark is not None and "persisted" in sub.acks:
            self.persist_acks[sub] = self.pipeline.delivered_end

    def remove(self, sub: Subscription) -> None:
        self.router.remove(sub)
        self.persist_acks.pop(sub, None)

    def send_bookmark_acks(self) -> None:
        """Periodic `persisted` acks on bookmark subscriptions that asked for them: the newest
        durable bookmark the subscription has passed, so a client's bookmark store can advance
        even when a filter lets nothing through. With sync replication destinations, durable
        means below the gate's durable end: acked by every active sync destination too."""
        last_bm = self.pipeline.last_bm
        gate = self.pipeline.gate
        durable_end = None
        if gate is not None and gate.has_sync:
            durable_end = gate.durable_end
            last_bm = gate.durable_bm()
        for sub, added_at in list(self.persist_acks.items()):
            out = sub.out
            if out.closing:
                continue
            if sub.replay is not None:
                if durable_end is None:
                    bm = sub.replay.last_bm_of(sub)
                else:
                    bm = sub.replay.durable_bm_of(sub, durable_end, last_bm)
            elif sub.state in LIVE_STATES:
                # live since `added_at` at the latest: a durable end below it names a message
                # the subscription may not have passed
                bm = last_bm if durable_end is None or durable_end >= added_at else None
            else:
                bm = None
            if bm is None or bm == sub.acked_bm:
                continue
            sub.acked_bm = bm
            out.send_ack("persisted", None, sub_id=sub.sub_id, bm=format_bookmark(*bm))
            out.flush()


@dataclass(eq=False, repr=False)
class SubscriptionTable:
    """A session's subscriptions by sub_id; the owner (`SubscriptionOwner`) of each."""

    describe: Callable[[], str]
    index: LiveIndex
    replays: ReplayEngine
    subs: dict[str, Subscription] = field(default_factory=dict, init=False)

    def __len__(self) -> int:
        return len(self.subs)

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self.subs

    def __iter__(self) -> Iterator[Subscription]:
        return iter(list(self.subs.values()))

    def get(self, sub_id: str) -> Subscription | None:
        return self.subs.get(sub_id)

    # -- subscribing -----------------------------------------------------------------------

    def add_live(self, sub: Subscription) -> None:
        """new -> LIVE"""
        self.subs[sub.sub_id] = sub
        sub.state = SubState.LIVE
        self.index.add(sub)

    def add_replay(self, sub: Subscription) -> None:
        """new -> REPLAYING (PAUSED with the pause option); the caller acks first, then
        `start_replay`, so `processed` goes out before the first replayed message."""
        self.subs[sub.sub_id] = sub
        sub.state = SubState.PAUSED if sub.opts.pause else SubState.REPLAYING
        self.index.add(sub)

    def start_replay(self, sub: Subscription, plan: Plan) -> None:
        self.replays.start(sub, plan)

    def add_queued(self, sub: Subscription, queue: Queue, max_backlog: int | None) -> None:
        """new -> QUEUED: its queue delivers, never the live fan-out."""
        self.subs[sub.sub_id] = sub
        sub.state = SubState.QUEUED
        queue.add_sub(sub, max_backlog)

    def replace(self, old: Subscription, new: Subscription) -> None:
        """`replace`: new filter / options, same state and place in the stream."""
        self.index.remove(old)
        if old.conflation is not None:
            old.conflation.close(emit=True)  # what it held goes out under the old options
        new.state = old.state
        new.replay = old.replay
        new.acked_bm = old.acked_bm
        if old.replay is not None:
            old.replay.replace(old, new)
        self.subs[new.sub_id] = new
        self.index.add(new)

    # -- leaving -----------------------------------------------------------------------------

    def remove(self, sub: Subscription) -> None:
        """any -> REMOVED (unsubscribe, a queue subscription replaced, disconnect)."""
        if self.subs.get(sub.sub_id) is sub:
            del self.subs[sub.sub_id]
        self._leave(sub)

    def remove_all(self) -> None:
        subs = list(self.subs.values())
        self.subs.clear()
        for sub in subs:
            self._leave(sub)

    def _leave(self, sub: Subscription) -> None:
        if sub.state is SubState.REMOVED:
            return
        if sub.queue is not None:
            sub.state = SubState.REMOVED
            sub.queue.remove_sub(sub)
            sub.queue = None
            return
        self.index.remove(sub)
        if sub.state is SubState.LIVE_EARLY:
            self.index.fanout.leave_early()
        if sub.conflation is not None:
            sub.conflation.close()
        sub.state = SubState.REMOVED
        if sub.replay is not None:
            sub.replay.detach(sub)
            sub.replay = None

    # -- pause and resume (bookmark subscriptions) -----------------------------------------------

    def fall_back(self) -> None:
        """The connection lags (Outbox.on_lag): its live subscriptions that the journal can feed
        read the journal from where live delivery is, until they catch up (ReplayEngine)."""
        subs = [
            s
            for s in self.subs.values()
            if s.state is SubState.LIVE and s.journal_fed and s.conflation is None
        ]
        if subs:
            self.replays.fall_back(subs)
            for s in subs:
                s.state = SubState.REPLAYING

    def pause(self, subs: list[Subscription]) -> None:
        for sub in subs:
            if sub.replay is not None and sub.replay.lagging and len(sub.replay.cursors) > 1:
                self.replays.split_paused(sub)
                sub.state = SubState.PAUSED
            elif sub.replay is not None:
                sub.replay.pause()
                for s in sub.replay.subs():
                    s.state = SubState.PAUSED
            elif sub.state in LIVE_STATES:
                if sub.state is SubState.LIVE_EARLY:
                    self.index.fanout.leave_early()
                sub.state = SubState.PAUSED
                self.replays.pause_live(sub)

    def resume(self, subs: list[Subscription]) -> None:
        self.replays.resume(subs)
        for sub in subs:
            if sub.replay is not None and not sub.replay.paused:
                for s in sub.replay.subs():
                    s.state = SubState.REPLAYING

    # -- from the replay engine (SubscriptionOwner) ---------------------------------------------

    def went_live(self, sub: Subscription) -> None:
        """REPLAYING -> LIVE, or LIVE_EARLY with the `live` option (joined at publish time)."""
        sub.replay = None
        if sub.opts.live:
            sub.state = SubState.LIVE_EARLY
            self.index.pipeline.join_early(sub)
        else:
            sub.state = SubState.LIVE

    def range_done(self, sub: Subscription) -> None:
        """REPLAYING -> REMOVED: the range reached its end (the completed ack went out)."""
        sub.replay = None
        if self.subs.get(sub.sub_id) is sub:
            del self.subs[sub.sub_id]
            self._leave(sub)
