"""One subscription's place in a replay pass (server/replay.py): the `Cursor`.

A `Replay` feeds one or more subscriptions of one connection; each has a `Cursor`: where it
starts (records before are skipped), where it ends (ranges), the publishers' sequences a
bookmark list skips, its conflation state, the last bookmark it was sent, and whether it may
join the live stream (not a range, not conflated, not `fully_durable`) and say `completed`
(not a lagging connection's pass). The engine makes cursors, the pass moves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .replay_plan import Conflater, End
from .subscriptions import Subscription

__all__ = ["Cursor"]


@dataclass(eq=False, repr=False, slots=True)
class Cursor:
    sub: Subscription
    start: int
    end: End | None
    # a live subscription that lags reads the journal unasked: no `completed` when it rejoins
    lagging: bool = False
    # a bookmark list's publishers: their messages at or below these sequences are not
    # delivered, below skip_until (server/replay_plan.py; set by the engine)
    skip: dict[int, int] | None = field(default=None, init=False)
    skip_until: int = field(default=0, init=False)
    conflater: Conflater | None = field(init=False)
    completed_sent: bool = field(init=False)
    last_bm: tuple[int, int] | None = field(default=None, init=False)
    # ranges and conflation never hand over to the live path: they keep reading the journal
    tail_only: bool = field(init=False)
    # fully_durable under sync replication (set by the Replay): reads only below the
    # durable end, never joins the live stream
    durable_only: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        o = self.sub.opts
        self.conflater = Conflater(o.conflation, o.conflation_key) if o.conflation else None
        self.completed_sent = self.lagging
        self.tail_only = self.end is not None or self.conflater is not None
