"""The state a Journal holds, declared once for the parts that use it.

Journal (journal.py) is put together from parts, one module each: JournalReader (reading.py),
JournalWriter (writer.py) and JournalRecovery (recovery.py). `Journal.__init__` sets every
attribute below; the parts only use them. Declaring them here lets each part be type-checked on
its own and says in one place what the journal's state is. The types of what waits for the
writer thread (`Pending`) and of its counters (`CommitStats`) live here too, so that this
declaration imports none of the parts.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .index import IndexEntry, JournalIndex

if TYPE_CHECKING:
    from .errors import JournalUnavailable
    from .fileio import FileIO
    from .integrity import Integrity
    from .manifest import Manifest
    from .segments import Segment


class _Control:
    """A maintenance call queued on the writer thread (run_in_writer)."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[], Any], future: concurrent.futures.Future[Any]):
        self.fn = fn
        self.future = future

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # handed to the caller
            self.future.set_exception(exc)


@dataclass
class CommitStats:
    commits: int = 0
    records: int = 0
    bytes: int = 0
    last_latency_s: float = 0.0
    failures: int = 0
    unavailable_since: float = 0.0  # time.time() when it became unavailable; 0 while available
    recoveries: int = 0


DoneCallback = Callable[[int | None, BaseException | None], None]
IndexMeta = dict[bytes, bytes]

# what waits for the writer thread: a batch of records, a fence, or a maintenance call
Batch = tuple[bytes, list[IndexEntry], DoneCallback, IndexMeta | None]
Fence = tuple[None, list[IndexEntry], None, None]
Control = tuple[_Control, list[IndexEntry], None, None]
Pending = Batch | Fence | Control


class JournalState:
    # set up at open
    directory: str
    segment_size: int
    durability: str  # "fsync" or "write"
    _io: FileIO  # the writer's file operations
    index: JournalIndex
    manifest: Manifest
    stats: CommitStats
    integrity: Integrity
    recovery: dict[str, Any]  # what the open did (recovery.py)
    _lock_fd: int  # holds the directory's lock

    # the layout: every segment in position order, the last one written; replaced in one
    # assignment by a layout change, so a reader works on the list it took
    segments: list[Segment]
    _bases: list[int]
    _end: int  # position after the last durable record

    # readers
    _read_fds: dict[str, int]  # by path: a compacted file may reuse a base
    _read_lock: threading.Lock
    _retired: list[tuple[float, Segment, int | None]]  # (when, segment, its cached fd)

    # the writer thread
    _fd: int  # the segment being written
    _pending: list[Pending]
    _pending_bytes: int
    _cond: threading.Condition
    _closing: bool
    _closed: bool
    _failure: JournalUnavailable | None  # fails batches until the next fence
    _unavailable: JournalUnavailable | None  # fails batches until a probe succeeds
    _next_probe: float
    _dirty_tail: bool  # a failed write could not be cut off; the probe must first
    _thread: threading.Thread
