"""Sync replication: publishers' acks wait for sync destinations; downgrade, upgrade; durable end.

`SyncGate` is the `AckSink` the replication senders report to (`link_up`, `link_down`,
`acked`, `sent`, all with the destination's name; positions are this instance's journal
positions). The pipeline hands it every committed batch (`committed`): when an *active* sync
destination has not yet acked the batch's end E, the batch's `persisted` acks, flush markers and
`after_commit` callbacks are held, in commit order, and released (`release(batch)`, the
pipeline's) once every active sync destination has acked >= E. Nothing is held when no sync
destination is active, and the pipeline skips the gate altogether when no destination is
configured.

States of one destination (`Destination.mode`):

    async      <SyncType>async: never holds anything
    sync       holds publishers' acks until it acks
    downgraded a sync destination acting as async:
        sync --silent for <DowngradeAfter> s (timer), or admin `downgrade`--> downgraded
        downgraded --connected and caught up (an ack that moves to within UPGRADE_WITHIN
                     bytes of the local durable end, or one at it), or admin `upgrade`--> sync

A destination downgraded by the admin while connected is upgraded automatically only after its
link has gone down and come back (a reconnect): the operator took it out on purpose, so its next
ack does not undo that; one downgraded by the timer (or by the admin while down) is upgraded as
soon as it has caught up.

*Silent* is how long a destination has not been acknowledging: since its acked position last
moved (or the gate started), while its link is down or it lacks something committed here; when
it lacks only what was committed after that, since the oldest such commit. A link that comes up
and goes down again without an ack that moves (a destination whose commits fail, reconnecting
every 100 ms) stays silent: reconnects do not restart the count. A connected destination that
lacks nothing is not silent. The timer looks at the count when it may have run out, and again
after that.

`durable_end` is the position below which everything is durable here and acked by every active
sync destination (monotonic); `durable_bm()` the bookmark of the newest message below it:
`fully_durable` subscriptions deliver only below it, and the periodic `persisted` ack of bookmark
subscriptions carries that bookmark (server/replay.py, server/subscription_table.py).

Lag per destination is computed from the marks of committed batches (end position, messages so
far, time): message counts and seconds cover what was committed since this instance started
(older history is counted in bytes only).
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass
from typing import Any, Protocol

__all__ = ["UPGRADE_WITHIN", "Destination", "SyncGate", "UnknownDestination"]

log = logging.getLogger("tickertape.replication")

UPGRADE_WITHIN = 1 << 20  # "caught up": within one sender batch (<= 1 MiB) of the durable end
MAX_MARKS = 20_000  # committed batches remembered (~5 MB); past it the oldest are forgotten


class Handle(Protocol):
    def cancel(self) -> None: ...


class UnknownDestination(KeyError):
    """No `<Destination>` of that name is configured."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"no replication destination named {self.name!r} is configured"


@dataclass(slots=True, eq=False)
class Destination:
    """One configured destination's live state (the gate's; stats read it)."""

    name: str
    sync: bool
    downgrade_after: float | None
    connected: bool = False
    downgraded: bool = False
    auto_upgrade: bool = True  # False after an admin downgrade, until the next reconnect
    acked: int = 0  # journal position up to which it holds everything (its last ack)
    sent_position: int = 0
    sent_bytes: int = 0
    sent_messages: int = 0
    last_ack_time: float | None = None  # wall clock
    progress_at: float = 0.0  # monotonic: when `acked` last moved (or the gate started)
    timer: Handle | None = None
    downgrades: int = 0
    upgrades: int = 0

    @property
    def active(self) -> bool:
        """Holds publishers' acks: a sync destination not downgraded."""
        return self.sync and not self.downgraded

    @property
    def mode(self) -> str:
        if not self.sync:
            return "async"
        return "downgraded" if self.downgraded else "sync"


@dataclass(eq=False, repr=False)
class SyncGate:
    """Holds acks for sync destinations; tracks every destination's link, acks and lag.

    `destinations`: (name, sync, downgrade_after) per configured destination. `local_end()`:
    the local durable end (the pipeline's `delivered_end`). `call_later(delay, fn)` schedules
    the downgrade timers (the loop's; tests pass a fake clock), `monotonic` and `wall` read
    the clocks. The pipeline sets `release` (and `wake`, called when `durable_end` advances).
    """

    destinations: InitVar[Iterable[tuple[str, bool, float | None]]]
    local_end: Callable[[], int]
    call_later: Callable[[float, Callable[[], None]], Handle]
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def __post_init__(self, destinations: Iterable[tuple[str, bool, float | None]]) -> None:
        self.dests: dict[str, Destination] = {
            name: Destination(name, sync, after) for name, sync, after in destinations
        }
        self.release: Callable[[Any], None] = lambda batch: None
        self.wake: Callable[[], None] = lambda: None
        self.has_sync = any(d.sync for d in self.dests.values())
        self._active = [d for d in self.dests.values() if d.active]
        self._held: collections.deque[tuple[int, Any]] = collections.deque()  # (end, batch)
        # a sync destination has acked nothing yet: the senders report where it stands
        self._durable_end = 0 if self._active else self.local_end()
        self._woken_end = self._durable_end
        # marks of committed batches: end positions, messages committed so far, time, bookmark
        self._ends: collections.deque[int] = collections.deque()
        self._marks: collections.deque[tuple[int, float, tuple[int, int] | None]] = (
            collections.deque()
        )
        self._messages = 0
        # what the forgotten marks leave: the newest (end, messages, time, bookmark)
        self._base: tuple[int, int, float, tuple[int, int] | None] = (
            self._durable_end,
            0,
            self.monotonic(),
            None,
        )

    def start(self) -> None:
        """Every destination starts down: arm the downgrade timers of the sync ones."""
        now = self.monotonic()
        for d in self.dests.values():
            d.progress_at = now
            self._arm(d)

    def stop(self) -> None:
        for d in self.dests.values():
            if d.timer is not None:
                d.timer.cancel()
                d.timer = None

    # -- from the pipeline --------------------------------------------------------------------

    def committed(self, batch: Any, end: int) -> bool:
        """A batch is durable locally, ending at journal position `end`: True when its acks are
        held (`release(batch)` follows, in order), False when they may go out now."""
        entries = batch.entries
        if entries:
            self._messages += len(entries)
            last = entries[-1]
            self._ends.append(end)
            self._marks.append((self._messages, self.monotonic(), (last[0], last[1])))
            if len(self._ends) > MAX_MARKS:
                self._forget()
        active = self._active
        if not active or (not self._held and min(d.acked for d in active) >= end):
            return False  # the commit itself wakes the tailing replays
        self._held.append((end, batch))
        return True

    # -- AckSink (from the senders) -------------------------------------------------------------

    def link_up(self, dest: str) -> None:
        d = self._dest(dest)
        if d.connected:
            return
        d.connected = True
        d.auto_upgrade = True

    def link_down(self, dest: str) -> None:
        d = self._dest(dest)
        if not d.connected:
            return
        d.connected = False
        self._arm(d)

    def acked(self, dest: str, source_position: int) -> None:
        d = self._dest(dest)
        moved = source_position > d.acked
        if moved:
            d.progress_at = self.monotonic()
        d.acked = source_position
        d.last_ack_time = self.wall()
        # a reconnect that answers with the same resume point is no sign of health (a
        # destination whose commits fail does that every 100 ms): only an ack that moves, or
        # one at the very end, upgrades; else it would flap back to sync and hold every
        # publisher for another <DowngradeAfter>
        if (
            d.downgraded
            and d.auto_upgrade
            and d.connected
            and self._caught_up(d)
            and (moved or d.acked >= self.local_end())
        ):
            self._set_downgraded(d, False, "caught up")
            self._arm(d)
        self._prune()
        if d.active:
            self._release_ready()

    def sent(
        self, dest: str, position: int, messages: int | None = None, size: int | None = None
    ) -> None:
        """The sender sent up to `position` (+ `messages` records of `size` bytes, when it
        counts them; else the bytes are the positions passed)."""
        d = self._dest(dest)
        if size is None:
            size = max(0, position - d.sent_position)
        d.sent_bytes += size
        if messages:
            d.sent_messages += messages
        d.sent_position = position

    # -- admin -----------------------------------------------------------------------------------

    def downgrade(self, dest: str, by: str = "the admin") -> bool:
        """Admin `downgrade`: the destination acts as async now. False: it was not sync-active
        (async, or downgraded already). Raises UnknownDestination."""
        d = self._dest(dest)
        if not d.active:
            return False
        d.auto_upgrade = not d.connected
        self._set_downgraded(d, True, f"downgraded by {by}")
        return True

    def upgrade(self, dest: str, by: str = "the admin") -> bool:
        """Admin `upgrade`: a downgraded destination holds acks again now (a down one re-arms
        its timer). False: it was not downgraded. Raises UnknownDestination."""
        d = self._dest(dest)
        if not d.downgraded:
            return False
        self._set_downgraded(d, False, f"upgraded by {by}")
        d.progress_at = self.monotonic()  # its silence counts from now
        self._arm(d)
        return True

    # -- reading ---------------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Committed batches whose acks wait for a sync destination."""
        return len(self._held)

    @property
    def durable_end(self) -> int:
        """Everything below is durable here and acked by every active sync destination."""
        end = self.local_end()
        active = self._active
        if active:
            end = min(end, *(d.acked for d in active))
        if end > self._durable_end:
            self._durable_end = end
        return self._durable_end

    def durable_bm(self) -> tuple[int, int] | None:
        """(publisher, seq) of the newest message below `durable_end` (committed since start),
        or None when none is known."""
        end = self.durable_end
        i = bisect.bisect_right(self._ends, end)
        if i:
            return self._marks[i - 1][2]
        # forgotten at MAX_MARKS while a destination was far behind: maybe past the end
        return self._base[3] if self._base[0] <= end else None

    def lag(self, d: Destination) -> tuple[int, int, float]:
        """(bytes, messages, seconds) destination `d` is behind the local durable end."""
        local = self.local_end()
        acked = d.acked
        behind = max(0, local - acked)
        if not behind:
            return 0, 0, 0.0
        i = bisect.bisect_right(self._ends, acked)
        done = self._marks[i - 1][0] if i else self._base[1]
        if acked >= self._base[0] and i < len(self._marks):
            since = self._marks[i][1]  # the oldest batch it lacks is mark i
        else:
            since = self._base[2]  # it lacks history older than the marks: at least this old
        return behind, max(0, self._messages - done), max(0.0, self.monotonic() - since)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per destination, as /stats shows it."""
        out = {}
        local = self.local_end()
        for name, d in self.dests.items():
            lag_bytes, lag_messages, lag_s = self.lag(d)
            out[name] = {
                "connected": d.connected,
                "mode": d.mode,
                "acked_position": d.acked,
                "lag_bytes": lag_bytes,
                "lag_messages": lag_messages,
                "lag_seconds": round(lag_s, 3),
                "last_ack_time": d.last_ack_time,
                "catching_up": d.connected and local - d.acked > UPGRADE_WITHIN,
                "sent_bytes": d.sent_bytes,
                "sent_messages": d.sent_messages,
                "downgrades": d.downgrades,
                "upgrades": d.upgrades,
            }
        return out

    # -- inside ----------------------------------------------------------------------------------

    def _dest(self, name: str) -> Destination:
        d = self.dests.get(name)
        if d is None:
            raise UnknownDestination(name)
        return d

    def _caught_up(self, d: Destination) -> bool:
        return d.acked + UPGRADE_WITHIN >= self.local_end()

    def _arm(self, d: Destination, delay: float | None = None) -> None:
        if d.active and d.downgrade_after is not None and d.timer is None:
            wait = d.downgrade_after if delay is None else delay
            d.timer = self.call_later(wait, lambda: self._timed_out(d))

    def silent_for(self, d: Destination) -> float:
        """Seconds `d` has not been acknowledging (module docstring)."""
        since = self.monotonic() - d.progress_at
        if not d.connected:
            return since
        if d.acked >= self.local_end():
            return 0.0
        return min(since, self.lag(d)[2])

    def _timed_out(self, d: Destination) -> None:
        d.timer = None
        after = d.downgrade_after
        if not d.active or after is None:
            return
        silent = self.silent_for(d)
        if silent < after:
            self._arm(d, after - silent)  # not yet: look again when it may have run out
            return
        d.auto_upgrade = True
        state = "down" if not d.connected else "connected, not acknowledging"
        self._set_downgraded(
            d, True, f"silent for {silent:.1f}s ({state}; <DowngradeAfter> {after:g}s)"
        )

    def _set_downgraded(self, d: Destination, downgraded: bool, why: str) -> None:
        d.downgraded = downgraded
        self._active = [x for x in self.dests.values() if x.active]
        if downgraded:
            d.downgrades += 1
            if d.timer is not None:
                d.timer.cancel()
                d.timer = None
            log.warning(
                "replication destination %s downgraded to async (%s): publishers' acks no "
                "longer wait for it (%d batches released)",
                d.name,
                why,
                self._release_ready(),
            )
        else:
            d.upgrades += 1
            lag_bytes, lag_messages, _ = self.lag(d)
            log.info(
                "replication destination %s upgraded to sync again (%s; %d bytes, %d messages "
                "behind)",
                d.name,
                why,
                lag_bytes,
                lag_messages,
            )

    def _release_ready(self) -> int:
        """Release held batches every active sync destination has acked, in order."""
        active = self._active
        floor = min(d.acked for d in active) if active else None
        held = self._held
        n = 0
        while held and (floor is None or held[0][0] <= floor):
            end, batch = held.popleft()
            n += 1
            self.release(batch)
        self._advance()
        return n

    def _advance(self) -> None:
        """Wake tailing fully_durable replays when the durable end moved."""
        end = self.durable_end
        if end > self._woken_end:
            self._woken_end = end
            self.wake()

    def _prune(self) -> None:
        """Forget marks every destination has acked (nothing reads them any more)."""
        if not self._ends:
            return
        floor = min(min(d.acked for d in self.dests.values()), self.durable_end)
        ends = self._ends
        if ends[0] > floor:
            return
        i = bisect.bisect_right(ends, floor)
        for _ in range(i):
            self._forget()

    def _forget(self) -> None:
        end = self._ends.popleft()
        messages, at, bm = self._marks.popleft()
        self._base = (end, messages, at, bm)
