"""A replica whose journal was replaced catches up from its peers before it serves clients
(docs/replication.md "A replica that lost its journal").

An instance that lost its journal (its data directory) and starts empty knows nothing of what
its peers hold from it: its publishers' highest sequence numbers, the messages first published
on it. Serving clients then would tell a reconnecting publisher it has stored nothing, and a
publisher without a store of its own would reuse sequence numbers its peers already hold
(dropped there as duplicates, so acknowledged `persisted` while existing only here).

It learns that it is such a replica from a peer: a source's link logs on naming the journal
identity it last saw of this instance (server/replication/identity.py), and that identity is not
this journal's. From then on, until every such peer has *synced* its link into this instance
(the link went idle: the peer has sent everything it holds, including what came from here,
which it sends back to a new journal), client connections are closed and logons refused with
the reason `catching up` and a text that says what to do; a client with several servers goes to
another instance meanwhile.

    serving --a peer knew another journal of this instance--> catching up {peers}
    catching up --every such peer synced--> serving (logged, INFO)

A client that logged on between the start and the first peer's logon (the peers connect within
their reconnect back-off, 0.1 s to 2 s) is disconnected when catching up begins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["CatchUp"]

log = logging.getLogger("tickertape.replication")


class CatchUp:
    """`jid`: this journal's identity; `begin()`: closes the open client connections when
    catching up begins."""

    def __init__(self, jid: str, begin: Callable[[], None] = lambda: None) -> None:
        self.jid = jid
        self.begin = begin
        self.waiting: set[str] = set()

    def source_knew(self, source: str, seen: str | None) -> None:
        """A link from `source` logged on, having last seen this instance's journal `seen`."""
        if seen is None or seen == self.jid or source in self.waiting:
            return
        first = not self.waiting
        self.waiting.add(source)
        log.warning(
            "replication: %s knew another journal of this instance (identity %s, this one is "
            "%s): this journal was replaced; refusing logons until %s has sent what it holds",
            source,
            seen,
            self.jid,
            source,
        )
        if first:
            self.begin()

    def synced(self, source: str) -> None:
        """The link from `source` went idle: it has sent everything it has."""
        if source in self.waiting:
            self.waiting.discard(source)
            log.info("replication: caught up from %s", source)
            if not self.waiting:
                log.info("replication: caught up from every peer; accepting logons again")

    def reason(self) -> str | None:
        """Why a logon is refused now, or None."""
        if not self.waiting:
            return None
        return (
            "this instance lost its journal and is catching up from "
            f"{', '.join(sorted(self.waiting))} (replication); log on to another instance of "
            "the set, or here again in a moment"
        )
