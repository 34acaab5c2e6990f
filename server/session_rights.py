"""A reload of the roles (SIGHUP) applied to one session's open subscriptions.

Each subscription is granted again as if it were made now (`Guard.grant`, server/guard.py):

- refused now: it is ended with a failure ack (`not entitled`, with its `sub_id`), a log line and
  an audit line; the connection stays open;
- granted: it takes the new content filter and, for a regex, the new gate on its topics, in
  place: its state and place in the stream do not change. A live `oof` subscription to SOW
  topics is told `entitlement` for each record the new filter leaves out (server/sow/oof.py). A queue subscription whose content
  filter appears or goes away is ended instead (the queue counts its filtered subscribers when
  they join), and the client subscribes again.
"""

from __future__ import annotations

import logging

from protocol.filters import compile_filter

from .reasons import Failure
from .session import Session
from .sow.oof import refocus
from .subscriptions import Subscription

__all__ = ["recheck"]

log = logging.getLogger("tickertape.connection")


def recheck(session: Session) -> int:
    """Grant every subscription of `session` again; returns how many were ended."""
    guard = session.svc.guard
    if guard.entitlements is None or not session.logged_on:
        return 0
    index = session.svc.index
    ended = 0
    for sub in session.table:
        queue = sub.queue
        own = compile_filter(sub.filter_text) if sub.filter_text else None
        also: tuple[str, ...] = ()
        if queue is not None:
            right, also = "consume", (queue.spec.underlying_topic,)
        else:
            right = "replay" if sub.bookmark is not None else "subscribe"
        grant = guard.grant(
            session.peer,
            session.user_id,
            right,
            sub.topic,
            sub.regex is not None,
            own,
            "subscribe",
            also,
        )
        if grant is None:
            _end(session, sub, f"user {session.user_id!r} has no {right} right on {sub.topic!r}")
            ended += 1
        elif queue is not None:
            if (grant.filter is None) != (sub.filter is None):
                _end(session, sub, "its content entitlement changed; subscribe again")
                ended += 1
            else:
                sub.filter = grant.filter
        else:
            index.remove(sub)  # the router caches matches by topic
            old = sub.filter
            grant.apply(sub)
            index.add(sub)
            if sub.opts.oof and session.svc.sow is not None:
                refocus(session.svc.sow, sub, old)  # records the new filter leaves out
    if ended:
        session.out.flush()
    return ended


def _end(session: Session, sub: Subscription, detail: str) -> None:
    session.table.remove(sub)
    session.svc.counters.not_entitled += 1
    log.warning(
        "%s: subscription %s on %s ended by a reload of the roles: %s",
        session.describe(),
        sub.sub_id,
        sub.topic,
        detail,
    )
    session.out.send_ack(
        "processed", None, "failure", Failure.NOT_ENTITLED, detail=detail, sub_id=sub.sub_id
    )
