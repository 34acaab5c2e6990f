"""One group commit's contents (`Batch`) and the door of what holds committed batches back
(`AckGate`).

A `Batch` is what `Pipeline` fills between two commits: the journal bytes, the messages to fan
out once durable, the acks, flush markers and callbacks owed at the commit, and what to roll
back if it fails (docs/architecture.md, "The path of a publish"). The pipeline owns the open
batch and the batches in flight; the queues add their events to it (`Pipeline.before_flush`).
`AckGate` is what the pipeline sees of the sync gate (server/replication/sync.py), which holds
a committed batch's acks until the sync destinations have it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .batch_row import BatchTuple

if TYPE_CHECKING:
    from .pipeline_publish import Publisher


class AckGate(Protocol):
    """What the pipeline sees of the sync gate (`SyncGate`, server/replication/sync.py): the
    replication package imports the pipeline, so the pipeline names only this much of it."""

    release: Callable[[Any], None]  # set by attach_gate: hands a held batch back, in order
    wake: Callable[[], None]  # set by attach_gate: the durable end moved

    has_sync: bool  # a sync destination is configured: durable means acked by it too

    def committed(self, batch: Any, end: int) -> bool: ...

    @property
    def durable_end(self) -> int: ...

    def durable_bm(self) -> tuple[int, int] | None: ...


class Batch:
    __slots__ = (
        "acks",
        "after",
        "data",
        "doomed",
        "durable",
        "entries",
        "first_seq",
        "flushes",
        "last",
        "meta",
        "msgs",
        "origins",
    )

    def __init__(self) -> None:
        self.data = bytearray()
        self.entries: list[tuple[int, int, int, int]] = []  # (pub, seq, ts, offset in data)
        self.msgs: list[BatchTuple] = []  # server/batch_row.py
        # index in msgs -> origin block, for replicated messages only (replicate())
        self.origins: dict[int, tuple[int, bytes, bytes]] | None = None
        self.acks: dict[Publisher, int] = {}  # highest seq to ack as persisted
        # (publisher, cid, ack types) waiting for everything before them
        self.flushes: list[tuple[Publisher, Any, list[str]]] = []
        self.first_seq: dict[int, int] = {}  # pub -> lowest seq in this batch (for rollback)
        self.last: dict[int, tuple[int, int]] = {}  # pub -> (highest seq, offset in data or -1)
        # callables(err) once this batch is durable (err None) or failed
        self.after: list[Callable[[BaseException | None], None]] = []
        self.meta: dict[bytes, bytes] | None = None  # index metadata committed with this batch
        self.doomed = False  # failed with an earlier batch (Pipeline._failed): rolled back already
        # f(end, err) at the local commit (end: journal position after the batch) or failure;
        # never held back for replication acks: a replication link's own ack (replicate())
        self.durable: list[Callable[[int, BaseException | None], None]] = []

    def empty(self) -> bool:
        return not (
            self.data
            or self.msgs
            or self.acks
            or self.flushes
            or self.after
            or self.durable
            or self.meta
        )
