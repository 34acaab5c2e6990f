"""What a session's command handlers are handed: `Caller`, one logged-on client as every
command sees it.

A `Session` (server/session.py) reads frames, logs the client on and holds frames while a check
runs off the loop; at logon it builds its command handlers (server/session_publish.py,
session_subscribe.py, session_sow.py) with a `Caller`: who the client is (fixed from the logon
on), how it answers (its Outbox, refusals with a failure ack and a log line), its
subscriptions, and the session's filter wait (a large filter is compiled off the loop while the
frames behind it wait). Each handler keeps, in its constructor, the parts of the caller it
uses (there is no base class that hands it all of them), and gets the other handlers' commands
it calls, by name; nothing else of the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.headers import Header

from .guard import Grant, Guard
from .matching import Predicate
from .outbox import Outbox
from .security.entitlements import Entitlements
from .subscription_table import SubscriptionTable

__all__ = ["Caller"]


@dataclass(frozen=True, eq=False, slots=True)
class Caller:
    id: int  # the connection's
    peer: str
    user_id: str | None
    ent: Entitlements | None  # what this user may do; None: everything
    guard: Guard  # what it may read (content entitlements, reloaded by SIGHUP)
    pub: int  # publisher id of the client name (client-sequenced publishes)
    server_pub: int  # publisher id of the server's sequence for this client
    out: Outbox
    table: SubscriptionTable
    describe: Callable[[], str]
    # refuse a command: a failure ack if one was asked for, and always a log line
    fail: Callable[[Header, str, str], None]
    not_entitled: Callable[[Header, str, str], None]  # (header, right, topic)
    new_sub_id: Callable[[], str]  # a sub_id for a subscription the client did not name
    # the filter wait (Session.filter_ready, compiled_filter)
    filter_ready: Callable[[Header, Any], bool]
    compiled_filter: Callable[[Header], Predicate | None]

    def may(self, h: Header, right: str, topic: str, command: str) -> bool:
        """Whether the user's roles allow `right` on `topic` (audited); if not, `h` is refused
        `not entitled` and the connection stays open."""
        ent = self.ent
        if ent is None or ent.check(self.peer, self.user_id or "", right, topic, command):
            return True
        self.not_entitled(h, right, topic)
        return False

    def grant(
        self,
        h: Header,
        right: str,
        topic: str,
        pattern: bool,
        own: Predicate | None,
        command: str,
        also: tuple[str, ...] = (),
    ) -> Grant | None:
        """What a subscription of `h` may read (Guard.grant); None when refused, and `h` is
        refused `not entitled`."""
        grant = self.guard.grant(self.peer, self.user_id, right, topic, pattern, own, command, also)
        if grant is None:
            self.not_entitled(h, right, topic)
        return grant
