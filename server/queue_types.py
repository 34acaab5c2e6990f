"""What a queue's parts (server/queue.py, queue_state.py, queues.py) share: a consumer's place
(`QueueSub`), a lease (`Lease`; `new_lease` makes one without a Python call, `put_leases` a run's
leases straight into the state's dicts), a message read back from the journal
(`StoredMessage`), and the clock and expiration arithmetic."""

from __future__ import annotations

import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

from journal.accelerators import load

from .subscriptions import Subscription

__all__ = [
    "Lease",
    "QueueSub",
    "StoredMessage",
    "expiration_us",
    "new_lease",
    "put_leases",
    "put_leases_py",
]

StoredMessage = tuple[int, int, int, int, bytes, bytes, bytes]
"""(position, publisher id, seq, receive time, topic, body, header fragment) of a message read
back from the journal."""


@dataclass(slots=True, eq=False)
class QueueSub:
    sub: Subscription
    backlog: int
    outstanding: int = 0
    head: tuple[bytes | None, bytes] = (None, b"")  # (sub.prefix, prefix + topic member)


class Lease(NamedTuple):
    """One leased message: who holds it, and what its end and a return need.

    A NamedTuple rather than a slotted class: a run of deliveries makes its leases in C
    (`put_leases`), and reading a field is a C getter either way."""

    holder: QueueSub
    gen: int  # names the lease-heap entry that ends it (an extension makes a new one)
    bm: str  # its bookmark, the key of QueueState.by_bm
    # [deliveries, cancels], or None for a first delivery never cancelled ([1, 0]); it goes
    # back to QueueState.counts if the message returns
    counts: list[int] | None

    def delivery_counts(self) -> list[int]:
        c = self.counts
        return [1, 0] if c is None else c


# Leases from iterables of their fields, without a Python call each (a run of deliveries):
# tuple.__new__ makes the NamedTuple straight from the fields, in order.
new_lease: Callable[[Iterable[Any]], Lease] = partial(tuple.__new__, Lease)


def put_leases_py(
    leased: dict[int, Lease],
    by_bm: dict[str, int],
    positions: array.array,
    bms: list[str],
    lease_type: type[Lease],
    holder: QueueSub,
    gen: int,
) -> None:
    """The leases of a run, first deliveries all: leased[p] = Lease(holder, gen, bm, None) and
    by_bm[bm] = p for each position p and its bookmark bm. The reference of the C `put_leases`
    (server/_splice.c), which the queue's delivery uses: through tuple.__new__ each lease costs
    two argument tuples and a copy, three to four times a plain tuple (measured)."""
    if len(positions) != len(bms):
        raise ValueError(f"{len(bms)} bookmarks for {len(positions)} positions")
    leased.update(
        zip(
            positions,
            map(
                partial(tuple.__new__, lease_type),
                zip(repeat(holder), repeat(gen), bms, repeat(None)),
            ),
        )
    )
    by_bm.update(zip(bms, positions))


_c = load("server._splice")
put_leases: Callable[..., None] = _c.put_leases if _c else put_leases_py


# The longest expiration a queue counts with, in seconds: what a journal record can hold (u32,
# journal/record.py). Publishes are refused above 10 years (protocol/headers.py); this bound
# keeps an `e` from elsewhere (an older peer, a hand-made record) from overflowing a deadline.
MAX_EXPIRATION_S = 0xFFFFFFFF


def expiration_us(exp: float) -> int:
    """`e` seconds as microseconds, within 0..MAX_EXPIRATION_S (NaN and above: the bound)."""
    if exp <= 0:
        return 0
    if not exp < MAX_EXPIRATION_S:  # NaN too
        exp = MAX_EXPIRATION_S
    return int(exp * 1_000_000)
