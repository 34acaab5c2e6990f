"""Queue event records and queue checkpoints: the on-disk state of message queues. This module
owns these bytes; the server's queues (server/queues.py) write them, recovery and the journal
jobs (journal/maintenance.py, journal/spark/jobs.py) read them.

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

8 OWNER (replicated queues, docs/replication.md): an instance took over the queue's messages
owned by another: every message the former owner owns, and the former owner's own later
messages up to the cut. The u64 is the cut: an origin receive time (µs since the epoch, as the
former owner stamped it); value = P, the length of the payload that follows the 12 bytes:

```
12     1     u8  n, then n bytes: the former owner's instance name (UTF-8)
13+n   1     u8  m, then m bytes: the new owner's instance name (UTF-8)
```

Recovery of a queue applies its events in journal order (`apply_events`) onto the set of done
positions and the per-message [deliveries, cancels] counts, and hands OWNER entries to
`on_owner(former, new, cut)`; leases are not restored. `iter_events` walks a body entry by
entry for those that apply events one at a time (replicated events, server/queue_repl.py).

Replication wire form (server/replication: the body of a queue-event record on a replication
link). Positions are local to one journal, so the sender translates each to the message's
identity (`to_wire`) and the receiver back to its own position (`from_wire`):

```
offset size  field                                      (little-endian)
0      4     magic b"TQW\x01" (the last byte is the wire form's version)
then entries, back to back:
0      1     u8  op (QueueOp)
1      1     u8  reserved (0)
2      2     u16 value, as above (OWNER: the payload length P)
4      8     u64 publisher id of the message (OWNER: the takeover time)
12     8     u64 publisher sequence of the message (OWNER: 0)
20     16*(n-1)  runs only: the other n - 1 messages, (u64 publisher id, u64 seq) each
20     P     OWNER only: the payload, as above
```

An entry about a position the sender cannot name (the message is no longer in its journal) is
left out and counted. An entry about a message the receiver does not hold (yet) comes back
from `from_wire` as a wire body of its own, for the caller to keep aside and translate again
once the message is there (server/queue_repl.py: at the next commit, then dropped and counted).

Checkpoint: in the journal index's metadata, key `checkpoint_key(queue name)` =
b"queue-checkpoint:" + name (UTF-8) holds a u64 LE position below which every message of the
queue is done (`encode_checkpoint` / `decode_checkpoint`). It is committed in the same batch as
the events it summarizes, so a restart scans only from there. The server moves it with the
queue's low water, at most once a second, also when the queue is idle and empty (then it
follows the journal's end, alone in a commit on a quiet server), so it pins no old segment.
"""

from __future__ import annotations

import array
import struct
from collections.abc import Callable, Iterator
from enum import IntEnum

__all__ = [
    "CHECKPOINT_PREFIX",
    "ENTRY",
    "MAX_RUN",
    "WIRE_MAGIC",
    "ExpiryReason",
    "QueueOp",
    "WireEventError",
    "append_event",
    "append_owner",
    "append_run",
    "apply_events",
    "checkpoint_key",
    "decode_checkpoint",
    "encode_checkpoint",
    "from_wire",
    "iter_events",
    "to_wire",
]

ENTRY = struct.Struct("<BBHQ")
ENTRY_SIZE = ENTRY.size  # 12
MAX_RUN = 0xFFFF
CHECKPOINT_PREFIX = b"queue-checkpoint:"
_CHECKPOINT = struct.Struct("<Q")
_pack = ENTRY.pack
WIRE_MAGIC = b"TQW\x01"
WIRE_ENTRY = struct.Struct("<BBHQQ")
WIRE_ENTRY_SIZE = WIRE_ENTRY.size  # 20
_RUN_OPS = (6, 7)
_KNOWN_OPS = frozenset(range(1, 9))


class WireEventError(ValueError):
    """A queue-event body on a replication link that this version cannot read; `reason` says
    why. The link is closed (the sender is a different version or sends damaged bodies)."""

    def __init__(self, reason: str):
        super().__init__(f"bad replicated queue events: {reason}")
        self.reason = reason


class QueueOp(IntEnum):
    LEASED = 1
    ACKED = 2
    EXPIRED = 3
    CANCELLED = 4
    DELIVERED_AT_MOST_ONCE = 5
    ACKED_RUN = 6
    LEASED_RUN = 7
    OWNER = 8


class ExpiryReason(IntEnum):
    """The value of an EXPIRED entry; a member's name, lower case with spaces, is the text dead
    letters carry as `reason`."""

    EXPIRATION = 1
    MAX_DELIVERIES = 2
    MAX_CANCELS = 3
    EXPIRED_BY_CONSUMER = 4
    FILTER = 5

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


def append_owner(buf: bytearray, former: str, new: str, cut_us: int) -> None:
    """One OWNER entry: `new` took over the messages `former` owns, its own up to origin time
    cut_us (names of <= 255 bytes)."""
    a, b = former.encode(), new.encode()
    if len(a) > 255 or len(b) > 255:
        raise ValueError("instance names of more than 255 bytes cannot be queue owners")
    payload = bytes([len(a)]) + a + bytes([len(b)]) + b
    buf += _pack(QueueOp.OWNER, 0, len(payload), cut_us)
    buf += payload


def _owner_names(payload: bytes) -> tuple[str, str] | None:
    if not payload:
        return None
    n = payload[0]
    if 1 + n >= len(payload):
        return None
    m = payload[1 + n]
    if 2 + n + m > len(payload):
        return None
    former, new = payload[1 : 1 + n], payload[2 + n : 2 + n + m]
    return former.decode(errors="replace"), new.decode(errors="replace")


def apply_events(
    body: bytes,
    done: set[int],
    counts: dict[int, list[int]],
    on_owner: Callable[[str, str, int], None] | None = None,
) -> None:
    """Apply one event record's body onto (positions done, position -> [deliveries, cancels]);
    OWNER entries go to on_owner(former, new, cut) in their order."""
    off = 0
    end = len(body) - (ENTRY_SIZE - 1)
    while off < end:
        op, _, value, p = ENTRY.unpack_from(body, off)
        off += ENTRY_SIZE
        if op == QueueOp.OWNER:
            names = _owner_names(body[off : off + value])
            off += value
            if names is not None and on_owner is not None:
                on_owner(names[0], names[1], p)
        elif op == QueueOp.ACKED_RUN or op == QueueOp.LEASED_RUN:
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


Event = tuple[int, int, array.array, tuple[str, str] | None]
"""(op, value, positions, OWNER's (former, new) or None): for OWNER, positions = [cut]."""


def iter_events(body: bytes) -> Iterator[Event]:
    """Every entry of a local event body, in order (a truncated last entry is left out)."""
    off = 0
    end = len(body) - (ENTRY_SIZE - 1)
    while off < end:
        op, _, value, p = ENTRY.unpack_from(body, off)
        off += ENTRY_SIZE
        run = array.array("Q", [p])
        if op == QueueOp.OWNER:
            names = _owner_names(body[off : off + value])
            off += value
            if names is not None:
                yield op, value, run, names
            continue
        if op in _RUN_OPS:
            run.frombytes(body[off : off + 8 * (value - 1)])
            off += 8 * (value - 1)
        yield op, value, run, None


def checkpoint_key(queue: str | bytes) -> bytes:
    """The index metadata key of a queue's checkpoint."""
    return CHECKPOINT_PREFIX + (queue.encode() if isinstance(queue, str) else queue)


def encode_checkpoint(position: int) -> bytes:
    return _CHECKPOINT.pack(position)


def decode_checkpoint(raw: bytes | None, default: int = 0) -> int:
    """The checkpoint position, or `default` where none was written."""
    return _CHECKPOINT.unpack(raw)[0] if raw else default


def to_wire(body: bytes, identity_of: Callable[[int], tuple[int, int] | None]) -> tuple[bytes, int]:
    """The wire form of a local event body: each position replaced by identity_of(position),
    the message's (publisher id, seq). Returns (wire body, entries left out because
    identity_of had no answer). Runs stay runs (of the messages it could name)."""
    out = bytearray(WIRE_MAGIC)
    dropped = 0
    off = 0
    end = len(body) - (ENTRY_SIZE - 1)
    wpack = WIRE_ENTRY.pack
    while off < end:
        op, _, value, p = ENTRY.unpack_from(body, off)
        off += ENTRY_SIZE
        if op == QueueOp.OWNER:
            out += wpack(op, 0, value, p, 0)
            out += body[off : off + value]
            off += value
        elif op in _RUN_OPS:
            run = array.array("Q", [p])
            run.frombytes(body[off : off + 8 * (value - 1)])
            off += 8 * (value - 1)
            ids = []
            for x in run:
                ident = identity_of(x)
                if ident is None:
                    dropped += 1
                else:
                    ids.append(ident)
            if ids:
                out += wpack(op, 0, len(ids), ids[0][0], ids[0][1])
                for pub, seq in ids[1:]:
                    out += _PAIR.pack(pub, seq)
        else:
            ident = identity_of(p)
            if ident is None:
                dropped += 1
            else:
                out += wpack(op, 0, value, ident[0], ident[1])
    return bytes(out), dropped


_PAIR = struct.Struct("<QQ")


def from_wire(body: bytes, locate: Callable[[int, int], int | None]) -> tuple[bytes, bytes | None]:
    """The local event body of a wire body: each (publisher id, seq) replaced by
    locate(pub, seq), the message's position here. Returns (local body, the entries whose
    message locate did not find, as a wire body of their own, or None when there are none).
    Raises WireEventError for a body that is not this wire form or is cut inside an entry."""
    if body[:4] != WIRE_MAGIC:
        raise WireEventError(f"magic {bytes(body[:4])!r}, expected {WIRE_MAGIC!r}")
    local = bytearray()
    left = bytearray()
    off = 4
    n = len(body)
    wpack = WIRE_ENTRY.pack
    while off < n:
        if off + WIRE_ENTRY_SIZE > n:
            raise WireEventError(f"entry cut at byte {off} of {n}")
        op, _, value, pub, seq = WIRE_ENTRY.unpack_from(body, off)
        off += WIRE_ENTRY_SIZE
        if op not in _KNOWN_OPS:
            raise WireEventError(f"unknown op {op} at byte {off - WIRE_ENTRY_SIZE}")
        if op == QueueOp.OWNER:
            if off + value > n or _owner_names(body[off : off + value]) is None:
                raise WireEventError(f"OWNER payload cut at byte {off} of {n}")
            local += _pack(op, 0, value, pub)
            local += body[off : off + value]
            off += value
        elif op in _RUN_OPS:
            if value < 1 or off + 16 * (value - 1) > n:
                raise WireEventError(f"run of {value} cut at byte {off} of {n}")
            pairs = [(pub, seq)] + [_PAIR.unpack_from(body, off + 16 * k) for k in range(value - 1)]
            off += 16 * (value - 1)
            found = array.array("Q")
            missing = []
            for ps in pairs:
                pos = locate(*ps)
                if pos is None:
                    missing.append(ps)
                else:
                    found.append(pos)
            if found:
                append_run(local, op, found)
            if missing:
                left += wpack(op, 0, len(missing), *missing[0])
                for ps in missing[1:]:
                    left += _PAIR.pack(*ps)
        else:
            pos = locate(pub, seq)
            if pos is None:
                left += wpack(op, 0, value, pub, seq)
            else:
                local += _pack(op, 0, value, pos)
    return bytes(local), (WIRE_MAGIC + bytes(left)) if left else None
