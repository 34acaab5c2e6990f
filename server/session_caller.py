"""What a session's command handlers are handed: `Caller`, one logged-on client as every
command sees it, and `Commands`, the base that unpacks it.

A `Session` (server/session.py) reads frames, logs the client on and holds frames while a check
runs off the loop; at logon it builds its command handlers (server/session_publish.py,
session_subscribe.py, session_sow.py) with a `Caller`: who the client is (fixed from the logon
on), how it answers (its Outbox, refusals with a failure ack and a log line), its
subscriptions, and the session's filter wait (a large filter is compiled off the loop while the
frames behind it wait). Each handler also gets the other handlers' commands it calls, by name;
nothing else of the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.headers import Header

from .matching import Predicate
from .outbox import Outbox
from .security.entitlements import Entitlements
from .services import SessionServices
from .subscription_table import SubscriptionTable

__all__ = ["Caller", "Commands"]


@dataclass(frozen=True, eq=False, slots=True)
class Caller:
    id: int  # the connection's
    peer: str
    user_id: str | None
    ent: Entitlements | None  # what this user may do; None: everything
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


class Commands:
    """A handler of some commands of one logged-on session: the caller's parts under the
    names its commands use (slots: a logged-on connection holds three of these)."""

    __slots__ = (
        "_ent",
        "compiled_filter",
        "describe",
        "fail",
        "filter_ready",
        "id",
        "new_sub_id",
        "not_entitled",
        "out",
        "peer",
        "svc",
        "table",
        "user_id",
    )

    def __init__(self, caller: Caller, svc: SessionServices) -> None:
        self.svc = svc
        self.id = caller.id
        self.peer = caller.peer
        self.user_id = caller.user_id
        self._ent = caller.ent
        self.out = caller.out
        self.table = caller.table
        self.describe = caller.describe
        self.fail = caller.fail
        self.not_entitled = caller.not_entitled
        self.new_sub_id = caller.new_sub_id
        self.filter_ready = caller.filter_ready
        self.compiled_filter = caller.compiled_filter
