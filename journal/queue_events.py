"""Queue event records and queue checkpoints: the on-disk state of message queues. This module
owns these bytes; the server's queues (server/queues.py) write them, recovery and the journal
jobs (journal/maintenance.py, journal/jobs.py) read them.

Every queue state change that must survive a restart is an *event*. The events of one queue in
one group commit are one journal record (journal/record.py) of kind 2 (`KIND_QUEUE_EVENT`),
publisher 0, sequence 0, time 0, topic = the queue's name, whose body is a run of entries:

```
offset size  field                                      (little-endian)
0      1     u8  op (QueueOp)
1      1     u8  reserved (0)
2      2     u16 value: delivery count (LEASED), cancel count (CANCELLED), expiry reason code
                 (EXPIRED, ExpiryReason), run length n (ACKED_RUN, LEASED_RUN), else 0
4      8     u64 journal position of the message the event is about
12     8*(n-1)   runs only: the other n - 1 positions, u64 each
```

Ops: 1 LEASED, 2 ACKED, 3 EXPIRED, 4 CANCELLED, 5 DELIVERED_AT_MOST_ONCE (done);
6 ACKED_RUN (all n acked) and 7 LEASED_RUN (all n leased for the first time: delivery count 1).
A run holds 1 .. 65535 positions (MAX_RUN); runs are what a batch of deliveries and a batched
ack write (8 bytes a message instead of 12). A truncated entry at the end of a body is ignored.

Recovery of a queue applies its events in journal order (`apply_events`) onto the set of done
positions and the per-message [deliveries, cancels] counts; leases are not restored.

Checkpoint: in the journal index's metadata, key `checkpoint_key(queue name)` =
b"queue-checkpoint:" + name (UTF-8) holds a u64 LE position below which every message of the
queue is done (`encode_checkpoint` / `decode_checkpoint`). It is committed in the same batch as
the events it summarizes, so a restart scans only from there.
"""

from __future__ import annotations

import array
import struct
from enum import IntEnum

__all__ = [
    "CHECKPOINT_PREFIX",
    "ENTRY",
    "MAX_RUN",
    "ExpiryReason",
    "QueueOp",
    "append_event",
    "append_run",
    "apply_events",
    "checkpoint_key",
    "decode_checkpoint",
    "encode_checkpoint",
]

ENTRY = struct.Struct("<BBHQ")
ENTRY_SIZE = ENTRY.size  # 12
MAX_RUN = 0xFFFF
CHECKPOINT_PREFIX = b"queue-checkpoint:"
_CHECKPOINT = struct.Struct("<Q")
_pack = ENTRY.pack


class QueueOp(IntEnum):
    LEASED = 1
    ACKED = 2
    EXPIRED = 3
    CANCELLED = 4
    DELIVERED_AT_MOST_ONCE = 5
    ACKED_RUN = 6
    LEASED_RUN = 7


class ExpiryReason(IntEnum):
    """The value of an EXPIRED entry; the text is what dead letters carry as `reason`."""

    EXPIRATION = 1
    MAX_DELIVERIES = 2
    MAX_CANCELS = 3
    EXPIRED_BY_CONSUMER = 4
    FILTER = 5

    @property
    def text(self) -> str:
        return self.name.lower().replace("_", " ")

    @classmethod
    def code(cls, text: str) -> int:
        """The code of a reason text, 0 for one this format does not name."""
        try:
            return cls[text.upper().replace(" ", "_")].value
        except KeyError:
            return 0


def append_event(buf: bytearray, op: int, position: int, value: int = 0) -> None:
    """One single entry (value clipped to u16)."""
    buf += _pack(op, 0, min(value, 0xFFFF), position)


def append_run(buf: bytearray, op: int, positions: array.array) -> None:
    """Run entries (ACKED_RUN, LEASED_RUN) for positions (an array('Q')), MAX_RUN a run."""
    if len(positions) == 1:
        buf += _pack(op, 0, 1, positions[0])
        return
    for k in range(0, len(positions), MAX_RUN):
        part = positions[k : k + MAX_RUN]
        buf += _pack(op, 0, len(part), part[0])
        buf += part[1:].tobytes()


def apply_events(body: bytes, done: set[int], counts: dict[int, list[int]]) -> None:
    """Apply one event record's body onto (positions done, position -> [deliveries, cancels])."""
    off = 0
    end = len(body) - (ENTRY_SIZE - 1)
    while off < end:
        op, _, value, p = ENTRY.unpack_from(body, off)
        off += ENTRY_SIZE
        if op == QueueOp.ACKED_RUN or op == QueueOp.LEASED_RUN:
            run = array.array("Q", [p])
            run.frombytes(body[off : off + 8 * (value - 1)])
            off += 8 * (value - 1)
            if op == QueueOp.ACKED_RUN:
                done.update(run)
                if counts:
                    for x in run:
                        counts.pop(x, None)
            else:
                for x in run:
                    counts[x] = [1, 0]
        elif op in (QueueOp.ACKED, QueueOp.EXPIRED, QueueOp.DELIVERED_AT_MOST_ONCE):
            done.add(p)
            counts.pop(p, None)
        elif op == QueueOp.LEASED:
            counts.setdefault(p, [0, 0])[0] = value
        elif op == QueueOp.CANCELLED:
            counts.setdefault(p, [0, 0])[1] = value


def checkpoint_key(queue: str | bytes) -> bytes:
    """The index metadata key of a queue's checkpoint."""
    return CHECKPOINT_PREFIX + (queue.encode() if isinstance(queue, str) else queue)


def encode_checkpoint(position: int) -> bytes:
    return _CHECKPOINT.pack(position)


def decode_checkpoint(raw: bytes | None, default: int = 0) -> int:
    """The checkpoint position, or `default` where none was written."""
    return _CHECKPOINT.unpack(raw)[0] if raw else default
