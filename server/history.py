"""The last hour of the server's one-second samples, for the web console (docs/console.md).

`History` is a fixed ring: at most `size` samples (3600: one an hour at one a second), each a
small flat dict of numbers that `Stats.sample` builds. Memory is bounded whatever runs or for how
long; a page opened late reads the whole ring, then waits for each new sample with `next()`.
Nothing is computed for a page that is not open: the ring is filled once a second by the
server's ticker, and waiting pages are woken by one future per sample.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

HOUR = 3600

Sample = dict[str, Any]


class History:
    def __init__(self, size: int = HOUR) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)
        self.count = 0  # samples recorded since start (also each sample's "n")
        self._next: asyncio.Future[Sample] | None = None

    def record(self, sample: Sample) -> None:
        """Append a sample (the oldest falls out past `size`) and wake whoever waits."""
        self.count += 1
        sample["n"] = self.count
        self.samples.append(sample)
        waiting, self._next = self._next, None
        if waiting is not None and not waiting.done():
            waiting.set_result(sample)

    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    async def next(self) -> Sample:
        """The next sample recorded (one shared future for every waiting page)."""
        if self._next is None or self._next.done():
            self._next = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._next)
