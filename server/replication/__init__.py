"""Replication between instances (docs/replication.md): this instance's journal pushed to each
`<Replication><Destination>` (sender.py, one task per destination), and the links of other
instances received on a `replication` transport (receiver.py); link.py is the connection
handling both ends share, protocol/replication.py the frames.

`AckSink` is how a sender reports a destination's state (SyncGate, server/replication/sync.py,
implements it to hold `persisted` acks for sync destinations); `MemoryAckSink` just records it.

LMDB metadata (the journal index's `batch.meta`, u64 LE positions of the *source* journal):
`repl-from:<source name>` on a destination, committed with the records it covers (the resume
point); `repl-acked:<destination name>` on a source, the position the destination acknowledged
(at most once a second; what a restart and journal maintenance know it still needs).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Protocol

from journal.maintenance import repl_acked_key  # the key journal maintenance reads

from ..pipeline_replicate import REPL_FROM

U64 = struct.Struct("<Q")

__all__ = ["REPL_FROM", "AckSink", "DestinationState", "MemoryAckSink", "repl_acked_key"]


class AckSink(Protocol):
    """What a sender reports, on the event loop, per destination name. Positions are this
    instance's journal positions."""

    def link_up(self, dest: str) -> None: ...
    def link_down(self, dest: str) -> None: ...
    def acked(self, dest: str, position: int) -> None:
        """The destination durably holds everything below `position`."""

    def sent(
        self, dest: str, position: int, messages: int | None = None, size: int | None = None
    ) -> None:
        """Everything below `position` has been sent (or filtered out) to the destination:
        `messages` more records, `size` more bytes of them."""


@dataclass
class DestinationState:
    connected: bool = False
    acked: int = 0
    sent: int = 0
    last_ack_at: float = 0.0  # time.time() of the last ack, 0 = none yet
    connects: int = 0


@dataclass
class MemoryAckSink:
    """An AckSink that only records each destination's state (for stats), holding nothing."""

    dests: dict[str, DestinationState] = field(default_factory=dict)

    def _of(self, dest: str) -> DestinationState:
        st = self.dests.get(dest)
        if st is None:
            st = self.dests[dest] = DestinationState()
        return st

    def link_up(self, dest: str) -> None:
        st = self._of(dest)
        st.connected = True
        st.connects += 1

    def link_down(self, dest: str) -> None:
        self._of(dest).connected = False

    def acked(self, dest: str, position: int) -> None:
        st = self._of(dest)
        st.acked = max(st.acked, position)
        st.last_ack_at = time.time()

    def sent(
        self, dest: str, position: int, messages: int | None = None, size: int | None = None
    ) -> None:
        st = self._of(dest)
        st.sent = max(st.sent, position)
