"""One subscription's place in a replay pass (server/replay.py): the `Cursor`.

A `Replay` feeds one or more subscriptions of one connection; each has a `Cursor`: where it
starts (records before are skipped), where it ends (ranges), the publishers' sequences a
bookmark list skips, its conflation state, the last bookmark it was sent, and whether it may
join the live stream (not a range, not conflated, not `fully_durable`) and say `completed`
(not a lagging connection's pass). The engine makes cursors, the pass moves them.
"""

from __future__ import annotations

from .replay_plan import Conflater, End
from .subscriptions import Subscription

__all__ = ["Cursor"]


class Cursor:
    __slots__ = (
        "completed_sent",
        "conflater",
        "durable_only",
        "end",
        "lagging",
        "last_bm",
        "skip",
        "skip_until",
        "start",
        "sub",
        "tail_only",
    )

    def __init__(
        self, sub: Subscription, start: int, end: End | None, lagging: bool = False
    ) -> None:
        self.sub = sub
        self.start = start
        self.end = end
        # a bookmark list's publishers: their messages at or below these sequences are not
        # delivered, below skip_until (server/replay_plan.py; set by the engine)
        self.skip: dict[int, int] | None = None
        self.skip_until = 0
        o = sub.opts
        self.conflater = Conflater(o.conflation, o.conflation_key) if o.conflation else None
        # a live subscription that lags reads the journal unasked: no `completed` when it rejoins
        self.lagging = lagging
        self.completed_sent = lagging
        self.last_bm: tuple[int, int] | None = None
        # ranges and conflation never hand over to the live path: they keep reading the journal
        self.tail_only = end is not None or self.conflater is not None
        # fully_durable under sync replication (set by the Replay): reads only below the
        # durable end, never joins the live stream
        self.durable_only = False
