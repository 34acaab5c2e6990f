"""The commit order's invariants, checked as the pipeline's steps run (server/pipeline.py,
`Pipeline._committed`): off unless asked for, so production pays one `is None` test per step.

A pipeline checks when `TICKERTAPE_CHECK_COMMITS=1` is in its environment (the tests' servers
can set it) or when a test gives it a `CommitChecks` (`pipeline.checks = CommitChecks()`):

- the end (`delivered_end`) only moves forward, and a batch starts at or after it;
- a batch's `persisted` acks, durable sequences, flush markers and callbacks are released only
  once its end is below the durable end: the local one, and with a sync gate every active sync
  destination's ack (`AckGate.durable_end`);
- committed messages reach the fan-out and the queues in journal order, each once, and only
  below the end (durable).

A broken invariant raises `CommitOrderError`, naming the step and the positions.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["CHECK_COMMITS", "CommitChecks", "CommitOrderError"]

CHECK_COMMITS = os.environ.get("TICKERTAPE_CHECK_COMMITS", "") == "1"


class CommitOrderError(AssertionError):
    """A commit step ran out of order: a bug in server/pipeline.py's commit path (the message
    names the step; report it with the positions)."""


class CommitChecks:
    def __init__(self) -> None:
        self.ends: dict[int, int] = {}  # id(batch) -> its end, from its commit to its acks
        self.delivered = -1  # position of the last message delivered

    def committed(self, batch: Any, end: int) -> None:
        self.ends[id(batch)] = end

    def advance(self, old: int, base: int, size: int) -> None:
        if base < old:
            raise CommitOrderError(
                f"advance_end: a batch at {base} is before the end {old} (the end went back)"
            )

    def acks(self, batch: Any, durable_end: int) -> None:
        end = self.ends.pop(id(batch), None)
        if end is None:
            raise CommitOrderError("release_acks: acks of a batch that was never committed")
        if end > durable_end:
            raise CommitOrderError(
                f"release_acks: acks of a batch ending at {end} above the durable end"
                f" {durable_end} (not durable, or not acked by a sync destination)"
            )

    def deliver(self, msgs: list[Any], end: int) -> None:
        for m in msgs:
            pos = m.position
            if pos < 0:  # not recorded: nothing to order it by
                continue
            if pos <= self.delivered or pos >= end:
                raise CommitOrderError(
                    f"deliver: message at {pos} after {self.delivered}, end {end}"
                    " (twice, out of journal order, or not durable)"
                )
            self.delivered = pos
