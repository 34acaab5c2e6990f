"""`sow` on a queue (docs/sow.md "Queries on a queue"): the messages a queue holds available
to its consumers, as AMPS lists them.

"Available" is a message that waits for a consumer: not leased, not acknowledged or expired,
not held for another instance of a replicated pair (`QueueState.waiting`). The list of those
positions is taken in the loop step of the command, so the answer is the queue as it was at
that instant; the messages themselves are read back from the journal as the answer streams
(a journal position never changes, and one the journal no longer holds is left out).

`WaitingReader` stands in for a store snapshot (server/sow/store.py `Reader`), so a queue's
answer is a `SowQuery` like any other (filter, `sow_keys`, `order_by`, `skip_n`, `top_n`,
`group_begin` / `group_end`, `completed` and `stats`). A record's key is the message's
bookmark (`<publisher>|<seq>|`): what `sow_keys` names on a queue. Records go out in the
queue's order of arrival (journal order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .store import Stored

__all__ = ["WaitingReader"]

Read = Callable[[int], Any]
"""position -> (position, pub, seq, ts, topic, body, header fragment) or None"""


def _key(pub: int, seq: int) -> str:
    return "%d|%d|" % (pub, seq)


class WaitingReader:
    """The available messages of one queue at one instant, read as a SOW query reads."""

    def __init__(self, positions: list[int], read: Read) -> None:
        self.positions = sorted(positions)
        self.read = read
        self.position = 0  # (a store reader's position; a queue's answer has none)
        self._by_key: dict[str, int] | None = None

    def _record(self, pos: int) -> tuple[str, Stored] | None:
        got = self.read(pos)
        if got is None:
            return None
        _pos, pub, seq, ts, _topic, body, hdr = got
        return _key(pub, seq), (pos, pub, seq, ts, hdr, body)

    def keys(self, topic: str, after: str | None = None) -> Iterator[tuple[str, Stored]]:
        for pos in self.positions:
            kr = self._record(pos)
            if kr is not None:
                yield kr

    def get(self, topic: str, k: str) -> Stored | None:
        by_key = self._by_key
        if by_key is None:  # sow_keys or order_by: every key once, then by key
            by_key = self._by_key = {}
            for pos in self.positions:
                got = self.read(pos)
                if got is not None:
                    by_key[_key(got[1], got[2])] = pos
        at = by_key.get(k)
        if at is None:
            return None
        kr = self._record(at)
        return kr[1] if kr is not None else None

    def close(self) -> None:
        self.positions = []
