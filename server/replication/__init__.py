"""Replication between instances (docs/replication.md): this instance's journal pushed to each
`<Replication><Destination>` (sender.py, one task per destination), and the links of other
instances received on a `replication` transport (receiver.py); link.py is the connection
handling both ends share, protocol/replication.py the frames.

`AckSink` is how a sender reports a destination's state (SyncGate, server/replication/sync.py,
implements it to hold `persisted` acks for sync destinations); `NullAckSink` holds nothing.

LMDB metadata (the journal index's `batch.meta`, u64 LE positions of the *source* journal):
`repl-from:<source name>` on a destination, committed with the records it covers (the resume
point); `repl-acked:<destination name>` on a source, the position the destination acknowledged
(at most once a second; what a restart and journal maintenance know it still needs).
"""

from __future__ import annotations

import struct
from typing import Protocol

from journal.maintenance import repl_acked_key  # the key journal maintenance reads

from ..pipeline_replicate import REPL_FROM

U64 = struct.Struct("<Q")

__all__ = ["REPL_FROM", "AckSink", "NullAckSink", "repl_acked_key"]


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


class NullAckSink:
    """An AckSink that holds nothing and records nothing: the server's before a sync gate
    (SyncGate) takes its place."""

    def link_up(self, dest: str) -> None:
        pass

    def link_down(self, dest: str) -> None:
        pass

    def acked(self, dest: str, position: int) -> None:
        pass

    def sent(
        self, dest: str, position: int, messages: int | None = None, size: int | None = None
    ) -> None:
        pass
