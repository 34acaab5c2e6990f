"""Where a bookmark replay starts and ends, and how conflation holds messages back.

Pure planning over the journal's index (docs/protocol.md §5, §6): `plan_replay` turns a parsed
bookmark (protocol/bookmarks.py) into a `Plan`: a start position (or a begin time still in the
future, or NOW) and, for a range, an `End`. A list of bookmarks starts after its oldest member
and also says, per publisher it names, what the subscriber has: the plan's `skip` (publisher ->
the lowest sequence the list names for it) leaves out that publisher's messages at or below it,
up to `skip_until` (past it, no such message is left). That is what makes a list the resume
point of a subscriber that moves to another instance of a replicated set, where publishers'
messages interleave in another order (docs/replication.md "Clients across a set"). `Conflater` keeps the latest message per key per
interval on the records' own timeline. server/replay.py runs the pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from journal.journal import Journal
from protocol.bookmarks import (
    Bookmark,
    BookmarkList,
    BookmarkSpec,
    Epoch,
    InvalidBookmark,
    Now,
    Range,
    Timestamp,
)
from protocol.options import Rate

log = logging.getLogger("tickertape.replay")
_decode = msgspec.json.Decoder().decode

__all__ = [
    "Conflater",
    "End",
    "Pacer",
    "Plan",
    "UnknownBookmark",
    "now_us",
    "plan_replay",
    "resolve_end",
]


class UnknownBookmark(InvalidBookmark):
    pass


Start = tuple[str, int] | None
"""("at", position), ("wait", micros of a begin time in the future), or None for NOW."""

# -- start and end points -----------------------------------------------------------------------


def now_us() -> int:
    return int(time.time() * 1_000_000)


def _point_position(
    journal: Journal,
    point: BookmarkSpec,
    inclusive: bool,
    not_found: str | None,
    memo: dict[tuple[int, int], int | None] | None = None,
) -> Start:
    """Position where a replay beginning at `point` starts, or None for NOW.

    Returns ("at", position) or ("wait", micros) for a begin time in the future.
    """
    if isinstance(point, Now):
        return None
    if isinstance(point, Epoch):
        return ("at", journal.start_position)
    if isinstance(point, Timestamp):
        if point.micros > now_us():
            return ("wait", point.micros if inclusive else point.micros + 1)
        return ("at", journal.locate_time(point.micros - 1 if inclusive else point.micros))
    if isinstance(point, Bookmark):
        pos = journal.locate(point.publisher_id, point.seq)
        if pos is not None:
            return ("at", pos if inclusive else journal.after(pos))
        return _not_found(journal, point, not_found)
    if isinstance(point, BookmarkList):
        found = []
        waits = []
        for item in point.items:
            if isinstance(item, Bookmark):
                pos = journal.locate(item.publisher_id, item.seq)
                if memo is not None:
                    memo[(item.publisher_id, item.seq)] = pos
                if pos is not None:
                    found.append(pos if inclusive else journal.after(pos))
                continue
            r = _point_position(journal, item, inclusive, "now")
            if r is None:
                found.append(journal.end_position)
            elif r[0] == "at":
                found.append(r[1])
            else:
                waits.append(r[1])
        if found:
            return ("at", min(found))
        if waits:
            return ("wait", min(waits))
        return _not_found(journal, point, not_found)
    raise InvalidBookmark(f"{type(point).__name__} cannot be a start point")


def _not_found(journal: Journal, spec: BookmarkSpec, not_found: str | None) -> Start:
    mode = not_found or "now"
    log.info("bookmark %s is not in the transaction log; starting at %s", spec, mode.upper())
    if mode == "epoch":
        return ("at", journal.start_position)
    if mode == "fail":
        raise UnknownBookmark(
            f"bookmark {spec} is not in the transaction log (bookmark_not_found=fail); "
            "subscribe from a stored bookmark, a time, or 0 (EPOCH)"
        )
    return None


@dataclass(slots=True, eq=False)
class End:
    """Where a range stops. check(position, pub, seq, ts) -> (deliver_this, stop_after)."""

    position: int | None = None
    pub: int | None = None
    seq: int | None = None
    ts: int | None = None
    inclusive: bool = True

    def check(self, position: int, pub: int, seq: int, ts: int) -> tuple[bool, bool]:
        if self.position is not None:
            if position < self.position:
                return True, False
            if position == self.position:
                return self.inclusive, True
            return False, True
        if self.ts is not None:
            if ts < self.ts or (ts == self.ts and self.inclusive):
                return True, False
            return False, True
        if pub == self.pub and seq == self.seq:
            return self.inclusive, True
        return True, False

    def expired(self, now_us: int) -> bool:
        """A time end that has passed: nothing later can still belong to the range."""
        return self.ts is not None and now_us > self.ts

    def reached(self, position: int) -> bool:
        """A position end that a pass standing at `position` has read past (a `0|1|` end is
        the live end when the range began: no record is ever stored there to stop at)."""
        if self.position is None:
            return False
        return position > self.position or (position == self.position and not self.inclusive)


def resolve_end(journal: Journal, point: BookmarkSpec, inclusive: bool, end_now: int) -> End:
    if isinstance(point, Now):
        return End(position=end_now, inclusive=False)
    if isinstance(point, Epoch):
        return End(position=journal.start_position, inclusive=False)
    if isinstance(point, Timestamp):
        return End(ts=point.micros, inclusive=inclusive)
    if isinstance(point, Bookmark):
        pos = journal.locate(point.publisher_id, point.seq)
        if pos is not None:
            return End(position=pos, inclusive=inclusive)
        return End(pub=point.publisher_id, seq=point.seq, inclusive=inclusive)
    if isinstance(point, BookmarkList):
        # a list ends at its newest member: a range never stops before a point it names
        ends = [resolve_end(journal, item, inclusive, end_now) for item in point.items]
        known = [e for e in ends if e.position is not None]
        if len(known) == len(ends):
            return max(known, key=lambda e: e.position or 0)
        pending = [e for e in ends if e.position is None]
        return pending[0]
    raise InvalidBookmark(f"{type(point).__name__} cannot be an end point")


NO_END = 1 << 64  # a skip that lasts the whole replay


def _skip_end(
    journal: Journal, points: dict[int, int], memo: dict[tuple[int, int], int | None]
) -> int:
    """The position past which no message of a listed publisher at or below its point is left
    (the skip can end there)."""
    until = 0
    highest: dict[int, tuple[int, int]] | None = None
    for pub, seq in points.items():
        pos = memo[(pub, seq)] if (pub, seq) in memo else journal.locate(pub, seq)
        if pos is None:  # not here (never received, or removed): where do its messages end?
            if highest is None:
                highest = journal.publishers()
            h = highest.get(pub)
            if h is None:
                continue  # no message of it here at all
            if h[0] > seq:
                return NO_END  # some of it above the point, some maybe below: to the end
            pos = h[1]
        until = max(until, pos + 1)
    return until


@dataclass(slots=True, eq=False)
class Plan:
    """Resolved bookmark: start ("at", pos) / ("wait", micros) / None (NOW), an optional End,
    and for a list the per-publisher `skip` up to `skip_until` (module docstring)."""

    start: Start
    end: End | None = None
    skip: dict[int, int] | None = None
    skip_until: int = 0


def plan_replay(journal: Journal, spec: BookmarkSpec, not_found: str | None, end_now: int) -> Plan:
    """The plan of a bookmark subscription; UnknownBookmark with bookmark_not_found=fail."""
    if isinstance(spec, Range):
        start = _point_position(journal, spec.begin, spec.begin_inclusive, not_found)
        if start is None:
            start = ("at", end_now)
        return Plan(start, resolve_end(journal, spec.end, spec.end_inclusive, end_now))
    if isinstance(spec, BookmarkList):
        memo: dict[tuple[int, int], int | None] = {}
        start = _point_position(journal, spec, False, not_found, memo)
        points: dict[int, int] = {}
        for item in spec.items:
            if isinstance(item, Bookmark) and item.seq < points.get(item.publisher_id, NO_END):
                points[item.publisher_id] = item.seq
        if not points or start is None or start[0] != "at":
            return Plan(start)
        return Plan(start, skip=points, skip_until=_skip_end(journal, points, memo))
    return Plan(_point_position(journal, spec, False, not_found))


# -- conflation -----------------------------------------------------------------------------------


class Conflater:
    """Latest message per key per interval, on the records' own timeline.

    A key's window opens at its first message; the delivery at the window's end carries the
    latest body and the *first* message's bookmark (as AMPS does).
    """

    __slots__ = ("held", "interval", "paths")

    def __init__(self, interval_s: float, keys: tuple[str, ...] | list[str] | None) -> None:
        self.interval = int(interval_s * 1_000_000)
        self.paths = tuple(
            tuple(int(p) if p.isdigit() else p for p in k.strip("/").split("/")) for k in keys or ()
        )
        self.held: dict[Any, list[Any]] = {}  # key -> [first_ts, first_pub, first_seq, record]

    def key(self, topic: bytes | str, body: bytes) -> Any:
        if not self.paths:
            return topic
        try:
            doc = _decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            # a body that is not JSON (bad UTF-8, nesting past msgspec's depth) has no key
            # fields: it conflates with the topic's other unreadable bodies, never raises
            return (topic, None)
        out: list[Any] = [topic]
        for path in self.paths:
            v = doc
            for step in path:
                try:
                    v = v[step]
                except (KeyError, IndexError, TypeError):
                    v = None
                    break
            out.append(v if isinstance(v, (str, int, float, bool)) or v is None else repr(v))
        return tuple(out)

    def due(self, now_ts: int) -> list[list[Any]]:
        """Pop every held message whose window ended at or before now_ts, oldest first."""
        out = []
        held = self.held
        for key in list(held):
            entry = held[key]
            if entry[0] + self.interval > now_ts:
                break
            del held[key]
            out.append(entry)
        return out

    def add(self, rec: tuple[Any, ...]) -> None:
        k = self.key(rec[5], rec[6])
        entry = self.held.get(k)
        if entry is None:
            self.held[k] = [rec[4], rec[2], rec[3], rec]
        else:
            entry[3] = rec

    def drain(self) -> list[list[Any]]:
        out = list(self.held.values())
        self.held.clear()
        return out


# -- rate -----------------------------------------------------------------------------------------


@dataclass(eq=False, repr=False, slots=True)
class Pacer:
    """The `rate` option: how long to wait before sending the next record.

    `N` msgs/s and `NKB` bytes/s are token budgets (a bucket of one second's worth, starting
    with a hundredth of it); `kX` keeps k times the original pace (the gaps between records'
    receive times, divided by k), never waiting longer than `max_gap` for one record.
    """

    rate: Rate
    max_gap: float | None
    _wall: float | None = field(init=False, default=None)
    _ts: int = field(init=False, default=0)
    _tokens: float = field(init=False, default=0.0)
    _last_refill: float = field(init=False, default=0.0)

    def restart(self) -> None:
        """After a pause: pace from the next record on, with no debt from before."""
        self._wall = None

    def delay(self, ts: int, size: int) -> float:
        """Seconds to wait before sending a record received at `ts` of `size` body bytes."""
        rate = self.rate
        now = time.monotonic()
        if rate.kind == "multiple":
            if self._wall is None:
                self._wall, self._ts = now, ts
                return 0.0
            due = self._wall + (ts - self._ts) / 1e6 / rate.value
            gap = self.max_gap
            if gap is not None and due - now > gap:
                # skip ahead over a long idle stretch of the original stream
                self._wall, self._ts = now + gap, ts
                due = now + gap
            return due - now
        cost = 1.0 if rate.kind == "msgs" else float(size)
        if self._wall is None:
            self._wall = now
            self._tokens = min(rate.value, max(cost, rate.value / 100))
            self._last_refill = now
        self._tokens = min(rate.value, self._tokens + (now - self._last_refill) * rate.value)
        self._last_refill = now
        self._tokens -= cost
        return -self._tokens / rate.value if self._tokens < 0 else 0.0
