"""The replays' owner: starts, pauses, resumes and ends the bookmark replays (server/replay.py)
of every connection, and the journal passes of lagging connections (`fall_back`)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from journal.journal import Journal
from protocol.bookmarks import BookmarkSpec, Now
from protocol.options import SubscribeOptions

from .replay import Cursor, Feed, Replay
from .replay_plan import Plan, plan_replay
from .subscriptions import Subscription

__all__ = ["ReplayEngine"]


@dataclass(eq=False)
class ReplayEngine:
    """Starts, pauses and resumes the replays of bookmark subscriptions; knows those running.

    Narrow doors: the journal it reads, the executor it reads on (reads never run on the
    loop), and the live stream it joins (`Feed`). What a replay changes in a subscription's
    state it reports to the subscription's owner. `durable_end`: with sync replication
    destinations, the position below which everything is acked by them
    (SyncGate.durable_end); `fully_durable` subscriptions read only below it
    (server/replay.py).
    """

    journal: Journal | None
    readers: Executor
    feed: Feed
    durable_end: Callable[[], int] | None = None
    replays: set[Replay] = field(default_factory=set, init=False)
    # live subscriptions that lagged and read the journal instead
    fallbacks: int = field(default=0, init=False)
    rejoins: int = field(default=0, init=False)  # ... and caught up to the live stream again

    def plan(self, spec: BookmarkSpec | None, opts: SubscribeOptions) -> Plan:
        """Resolve a bookmark (None: conflation from now on) against the journal."""
        end_now = self.feed.delivered_end
        if spec is None or isinstance(spec, Now):
            return Plan(("at", end_now))
        assert self.journal is not None  # subscribe checks the topic is recorded first
        return plan_replay(self.journal, spec, opts.bookmark_not_found, end_now)

    def start(self, sub: Subscription, plan: Plan) -> None:
        opts = sub.opts
        end = self.feed.delivered_end
        wait = None
        if plan.start is None:
            start = end
        elif plan.start[0] == "wait":
            start, wait = end, plan.start[1]
        else:
            start = plan.start[1]
        cursor = Cursor(sub, start, plan.end)
        cursor.skip, cursor.skip_until = plan.skip, plan.skip_until
        Replay(
            self,
            [cursor],
            start,
            paused=opts.pause,
            wait_until=wait,
            rate=opts.rate,
            rate_max_gap=opts.rate_max_gap,
        ).start()

    def pause_live(self, sub: Subscription) -> None:
        """A bookmark subscription that went live keeps its place in the journal: a paused
        replay from the live end."""
        pos = self.feed.delivered_end
        Replay(
            self,
            [Cursor(sub, pos, None)],
            pos,
            paused=True,
            rate=sub.opts.rate,
            rate_max_gap=sub.opts.rate_max_gap,
        ).start()

    def fall_back(self, subs: list[Subscription]) -> None:
        """Live subscriptions of one connection that lag: they read the journal from the live
        end instead, in one pass per connection (one read block), until they catch up.

        Live delivery has given them every message below `delivered_end` whenever an Outbox
        flushes (the pipeline moves it just before the fan-out, with no flush in between), so
        starting there is starting after the last message each was sent: no gap, no duplicate.
        """
        pos = self.feed.delivered_end
        out = subs[0].out
        running = next(
            (r for r in self.replays if r.lagging and r.cursors and r.out is out and not r.paused),
            None,
        )
        self.fallbacks += len(subs)
        if running is not None:
            for sub in subs:
                running.add(Cursor(sub, pos, None, lagging=True))
            return
        Replay(
            self, [Cursor(sub, pos, None, lagging=True) for sub in subs], pos, lagging=True
        ).start()

    def split_paused(self, sub: Subscription) -> None:
        """Pause one subscription of a lagging connection's shared pass: it goes on alone,
        paused, from where the pass is; the others keep reading."""
        shared = sub.replay
        assert shared is not None
        cursor = next(c for c in shared.cursors if c.sub is sub)
        shared.detach(sub)
        cursor.start = max(cursor.start, shared.position)
        Replay(self, [cursor], shared.position, paused=True).start()

    def resume(self, subs: list[Subscription]) -> None:
        """Resume; subscriptions resumed together share one replay pass so they stay in step."""
        replays = list(dict.fromkeys(sub.replay for sub in subs if sub.replay is not None))
        if not replays:
            return
        if len(replays) == 1 and {c.sub for c in replays[0].cursors} <= set(subs):
            replays[0].resume()
            return
        wanted = set(subs)
        cursors = []
        for r in replays:
            for c in list(r.cursors):
                if c.sub in wanted:
                    c.start = max(c.start, r.position)
                    r.cursors.remove(c)
                    cursors.append(c)
            if not r.cursors:
                r.cancel()
        first = subs[0].opts
        Replay(
            self,
            cursors,
            min(c.start for c in cursors),
            rate=first.rate,
            rate_max_gap=first.rate_max_gap,
        ).start()

    def cancel_all(self) -> None:
        for r in list(self.replays):
            r.cancel()

    def floor(self) -> int | None:
        """The lowest position a running replay still reads (journal maintenance keeps it)."""
        return min((r.position for r in self.replays), default=None)
