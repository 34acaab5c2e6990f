"""Conflated live subscriptions (PROTOCOL.md §6 `conflation`, AMPS's conflated subscriptions):
the latest message per key per interval, on the live stream of any topic, recorded or not.

A subscription with `conflation=` and no replayed bookmark gets a `LiveConflation`: live fan-out
(server/fanout.py) hands it each message the subscription would get (topic, filter and state
already checked) instead of writing a frame. A key's window opens at its first message; at the
window's end one delivery goes out with the latest body and header fragment of that key and,
on a recorded topic, the *first* message's bookmark (as a conflated replay does, with
replay_plan.Conflater's keys and windows, on the messages' receive times). One loop timer per
subscription, armed only while something is held.

Memory: one held message per key seen in the last interval. A conflated replay (with `bm`)
reads the journal instead (server/replay.py) and never goes live.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Any

from .fanout import Message
from .frames import STORED, pack_len, timestamp_part, topic_member_text
from .replay_plan import Conflater, now_us
from .subscriptions import Subscription

__all__ = ["LiveConflation"]


@dataclass(eq=False, repr=False, slots=True)
class LiveConflation:
    sub: Subscription
    interval: InitVar[float]
    keys: InitVar[tuple[str, ...] | None]
    _call_later: Callable[[float, Callable[[], None]], asyncio.TimerHandle]
    _conf: Conflater = field(init=False)
    _timer: asyncio.TimerHandle | None = field(init=False, default=None)

    def __post_init__(self, interval: float, keys: tuple[str, ...] | None) -> None:
        self._conf = Conflater(interval, keys)

    @property
    def held(self) -> int:
        return len(self._conf.held)

    def add(self, m: Message) -> None:
        """A message for the subscription: held as its key's latest until the window ends."""
        conf = self._conf
        key = conf.key(m.topic, m.body)
        entry = conf.held.get(key)
        if entry is None:
            conf.held[key] = [m.ts, m.pub, m.seq, m]
            if self._timer is None:
                self._arm(m.ts)
        else:
            entry[3] = m

    def _arm(self, first_ts: int) -> None:
        delay = max(0.0, (first_ts + self._conf.interval - now_us()) / 1e6)
        self._timer = self._call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        out = self.sub.out
        if out.closing:
            return
        self._emit(self._conf.due(now_us()))
        held = self._conf.held
        if held:
            self._arm(next(iter(held.values()))[0])

    def _emit(self, entries: list[list[Any]]) -> None:
        sub = self.sub
        out = sub.out
        for _first_ts, first_pub, first_seq, m in entries:
            tail = timestamp_part(m.ts) if sub.timestamp else b""
            if m.position >= 0:  # recorded: the order of a delivery from stored bytes
                hdr = STORED % (
                    sub.prefix,
                    topic_member_text(m.topic),
                    m.hdr,
                    first_pub,
                    first_seq,
                    tail,
                )
            else:
                hdr = sub.prefix + m.suffix + tail + b"}"
            out.buf += (pack_len(len(hdr) + len(m.body)), hdr, m.body)
            out.sent += 1
        if entries:
            out.flush()

    def close(self, emit: bool = False) -> None:
        """The subscription leaves (or is replaced: `emit` sends what is held now)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if emit and not self.sub.out.closing:
            self._emit(self._conf.drain())
        self._conf.held.clear()
