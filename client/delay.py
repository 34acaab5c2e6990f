"""Reconnect delay strategies: how long an HAClient waits before each connection attempt.

Contract: `next_delay(uri)` returns the seconds to wait before the next attempt to `uri`, or
raises ReconnectGaveUp once the give-up time has passed since the first failed attempt after
the last success; `reset()` is called after every successful logon. The first attempt to each
URI after a reset is immediate (a dropped connection is retried at once; a server that is not
back yet refuses quickly on the same host).

- `FixedDelayStrategy(delay)`: the same delay before every later attempt.
- `ExponentialDelayStrategy(initial, multiplier, maximum)`: `initial`, then times
  `multiplier` per failed attempt to that URI, capped at `maximum`, plus up to `jitter` times
  the delay at random.

Both take `give_up_after` (seconds, None: never). The HAClient's default is
`ExponentialDelayStrategy()`: 50 ms doubling to at most 250 ms, so a restarted server is
reached within a quarter of a second of listening again (about four refused connection
attempts a second while a local server is down: cheap, and the first message arrives well
within a second of the server coming back).
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from .errors import ReconnectGaveUp

__all__ = ["ExponentialDelayStrategy", "FixedDelayStrategy", "ReconnectDelayStrategy"]


class ReconnectDelayStrategy(ABC):
    """See the module docstring. Subclasses implement `_delay(attempt)` for attempt >= 1."""

    def __init__(
        self, give_up_after: float | None = None, *, clock: Callable[[], float] = time.monotonic
    ):
        if give_up_after is not None and give_up_after < 0:
            raise ValueError(f"give_up_after must be >= 0 seconds, got {give_up_after!r}")
        self.give_up_after = give_up_after
        self._clock = clock
        self._attempts: dict[str, int] = {}
        self._first_failure: float | None = None

    def next_delay(self, uri: str) -> float:
        now = self._clock()
        if self._first_failure is None:
            self._first_failure = now
        elif self.give_up_after is not None and now - self._first_failure > self.give_up_after:
            raise ReconnectGaveUp(now - self._first_failure, self.give_up_after, None)
        attempt = self._attempts.get(uri, 0)
        self._attempts[uri] = attempt + 1
        if attempt == 0:
            return 0.0
        delay = self._delay(attempt)
        if self.give_up_after is not None:  # never sleep past the give-up time
            delay = min(delay, max(0.0, self._first_failure + self.give_up_after - now) + 0.001)
        return delay

    def reset(self) -> None:
        self._attempts.clear()
        self._first_failure = None

    @abstractmethod
    def _delay(self, attempt: int) -> float:
        """Seconds before attempt number `attempt` (1 = the second attempt) to one URI."""


class FixedDelayStrategy(ReconnectDelayStrategy):
    def __init__(
        self,
        delay: float = 0.2,
        give_up_after: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(give_up_after, clock=clock)
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        self.delay = delay

    def _delay(self, attempt: int) -> float:
        return self.delay


class ExponentialDelayStrategy(ReconnectDelayStrategy):
    def __init__(
        self,
        initial: float = 0.05,
        multiplier: float = 2.0,
        maximum: float = 0.25,
        give_up_after: float | None = None,
        jitter: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(give_up_after, clock=clock)
        if not (initial >= 0 and multiplier >= 1 and maximum >= initial and jitter >= 0):
            raise ValueError(
                "need initial >= 0, multiplier >= 1, maximum >= initial and jitter >= 0; got "
                f"initial={initial!r} multiplier={multiplier!r} maximum={maximum!r} "
                f"jitter={jitter!r}"
            )
        self.initial = initial
        self.multiplier = multiplier
        self.maximum = maximum
        self.jitter = jitter

    def _delay(self, attempt: int) -> float:
        delay = min(self.maximum, self.initial * self.multiplier ** min(attempt - 1, 64))
        if self.jitter:
            delay += random.uniform(0, self.jitter * delay)
        return delay
