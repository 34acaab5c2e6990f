"""A replica whose journal was replaced catches up from its peers before it serves clients
(docs/replication.md "A replica that lost its journal").

An instance that lost its journal (its data directory) and starts empty knows nothing of what
its peers hold from it: its publishers' highest sequence numbers, the messages first published
on it. Serving clients then would tell a reconnecting publisher it has stored nothing, and a
publisher without a store of its own would reuse sequence numbers its peers already hold
(dropped there as duplicates, so acknowledged `persisted` while existing only here).

It learns that it is such a replica from a peer that knew another journal of it: the answer to
its own link's logon, or a peer's link logging on, names the journal identity the peer last saw
of this instance (`seen`, server/replication/identity.py), and that is not this journal's. From
then on, until every such peer has *synced* its link into this instance (the link went idle:
the peer has sent everything it holds, including what came from here, which it sends back to a
new journal), client connections are closed and logons refused with the reason `catching up`
and a text that says what to do; a client with several servers goes to another instance.

    starting (journal made at this start: until every destination answered a first logon, or
              could not be reached; the server's start waits for it, at most FIRST_ANSWERS_WAIT)
    serving --a peer knew another journal of this instance--> catching up {peers}
    catching up --every such peer synced--> serving (logged, INFO)

A peer whose link into this instance does not come up within LINK_WAIT of being waited for
(it replicates one way only, or it is down again) is not waited for any longer (WARNING).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["FIRST_ANSWERS_WAIT", "LINK_WAIT", "CatchUp"]

log = logging.getLogger("tickertape.replication")

FIRST_ANSWERS_WAIT = 10.0  # a connect timeout and a logon answer's
LINK_WAIT = 30.0


class CatchUp:
    """`jid`: this journal's identity; `first`: the destinations whose first answer a journal
    made at this start waits for; `begin()`: closes the open client connections when catching
    up begins; `call_later(delay, fn)`: the loop's."""

    def __init__(
        self,
        jid: str,
        first: Iterable[str] = (),
        begin: Callable[[], None] = lambda: None,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
    ) -> None:
        self.jid = jid
        self.begin = begin
        self.call_later = call_later
        self.first = set(first)
        self.waiting: set[str] = set()
        self.linked: set[str] = set()  # peers whose link into this instance logged on
        self._answered = asyncio.Event()
        if not self.first:
            self._answered.set()

    async def first_answers(self, timeout: float = FIRST_ANSWERS_WAIT) -> None:
        """Until every destination answered a first logon (or could not be reached)."""
        try:
            await asyncio.wait_for(self._answered.wait(), timeout)
        except TimeoutError:
            log.warning(
                "replication: no answer from %s within %.0fs of the start; serving clients",
                ", ".join(sorted(self.first)),
                timeout,
            )
            self.first.clear()
            self._answered.set()

    def answered(self, dest: str, seen: str | None) -> None:
        """This instance's link to `dest` logged on (`seen`: the identity it knew of this
        journal), or could not (None)."""
        self.first.discard(dest)
        if not self.first:
            self._answered.set()
        self._knew(dest, seen)

    def source_knew(self, source: str, seen: str | None) -> None:
        """A link from `source` logged on, having last seen this instance's journal `seen`."""
        self.linked.add(source)
        self._knew(source, seen)

    def synced(self, source: str) -> None:
        """The link from `source` went idle: it has sent everything it has."""
        if source in self.waiting:
            self.waiting.discard(source)
            log.info("replication: caught up from %s", source)
            if not self.waiting:
                log.info("replication: caught up from every peer; accepting logons again")

    def reason(self) -> str | None:
        """Why a logon is refused now, or None."""
        if self.first:
            return (
                "this instance is starting with a new journal and asks its replication peers "
                f"({', '.join(sorted(self.first))}) whether they hold its messages; log on "
                "again in a moment"
            )
        if not self.waiting:
            return None
        return (
            "this instance lost its journal and is catching up from "
            f"{', '.join(sorted(self.waiting))} (replication); log on to another instance of "
            "the set, or here again in a moment"
        )

    def _knew(self, peer: str, seen: str | None) -> None:
        if seen is None or seen == self.jid or peer in self.waiting:
            return
        first = not self.waiting
        self.waiting.add(peer)
        log.warning(
            "replication: %s knew another journal of this instance (identity %s, this one is "
            "%s): this journal was replaced; refusing logons until %s has sent what it holds",
            peer,
            seen,
            self.jid,
            peer,
        )
        if self.call_later is not None:
            self.call_later(LINK_WAIT, lambda: self._link_overdue(peer))
        if first:
            self.begin()

    def _link_overdue(self, peer: str) -> None:
        if peer in self.waiting and peer not in self.linked:
            self.waiting.discard(peer)
            log.warning(
                "replication: %s has not linked to this instance within %.0fs: not waiting for "
                "what it holds any longer (does it replicate to this instance?)",
                peer,
                LINK_WAIT,
            )
