"""Out-of-focus notices (docs/protocol.md §14 `oof`): a subscription with the `oof` option on a
SOW topic is told when a record it was sent leaves its scope.

Reasons: `deleted` and `expired` (the record was removed; the body is its last message),
`match` (an update no longer matches the subscription's filter; the body is the new message)
and `entitlement` (the subscriber's content entitlement does not admit the record any more:
an update it does not admit, whose body is then the last message it was sent, never the new
one it may not read; or a reload of the roles, `refocus`, whose new filter leaves the record
out). "Was sent" is judged from the record as it was: it matched the subscription's filter
(every record matches a subscription without one, which therefore gets no `match` notice).

Notices are computed while a commit is applied to the store and sent after the commit's live
deliveries (`Batch.after`), so a subscriber sees a message before the notice that it left.
Only LIVE subscriptions get them: one still replaying reads the journal, where deletes are
invisible.
"""

from __future__ import annotations

from typing import Any, Protocol

from .. import frames
from ..matching import body_matches, filter_at
from ..router import Router
from ..subscriptions import Subscription, SubState

__all__ = ["OofNotices", "refocus", "send_notices"]

Notice = tuple[Subscription, str, str, str, bytes]
"""(subscription, topic, key, reason, body)"""


class OofNotices:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.pending: list[Notice] = []

    def watching(self, topic: str) -> list[Subscription]:
        """The live `oof` subscriptions of `topic` (the router caches its match per topic)."""
        return [
            s
            for _out, group in self.router.match(topic)
            for s in group
            if s.opts.oof and s.state is SubState.LIVE
        ]

    _filter = staticmethod(lambda sub, topic: filter_at(sub.filter, topic))

    def changed(
        self, subs: list[Subscription], topic: str, k: str, old: bytes | None, new: bytes
    ) -> None:
        if old is None:
            return
        for s in subs:
            f = self._filter(s, topic)
            if f is not None and body_matches(f, old) and not body_matches(f, new):
                e = filter_at(s.entitled, topic)
                if e is not None and not body_matches(e, new):
                    self.pending.append((s, topic, k, "entitlement", old))
                else:
                    self.pending.append((s, topic, k, "match", new))

    def left(self, subs: list[Subscription], topic: str, k: str, old: bytes, reason: str) -> None:
        for s in subs:
            f = self._filter(s, topic)
            if f is None or body_matches(f, old):
                self.pending.append((s, topic, k, reason, old))

    def take(self) -> list[Notice]:
        got, self.pending = self.pending, []
        return got


class _Records(Protocol):
    """What `refocus` reads of the SOW manager (server/sow/manager.py)."""

    def snapshot(self) -> tuple[Any, int, Any]: ...

    def topics(self) -> list[str]: ...

    def is_sow(self, topic: str) -> bool: ...


def refocus(sow: _Records, sub: Subscription, old: Any) -> int:
    """A reload of the roles changed the filter of `sub` (a live `oof` subscription) from
    `old`: tell it, with `entitlement`, of every record of its topics it was sent (`old`
    admitted it) that its new filter leaves out; the body is the record's last message. Reads
    one snapshot of the store now, so the notices describe the state at the reload; returns
    how many were sent."""
    if not sub.opts.oof or sub.state is not SubState.LIVE or sub.out.closing:
        return 0
    if old is sub.filter:  # the same compiled filter (they are cached by text): nothing left
        return 0
    regex = sub.regex
    if regex is None:
        topics = [sub.topic] if sow.is_sow(sub.topic) else []
    else:
        topics = [t for t in sow.topics() if regex.fullmatch(t) and sow.is_sow(t)]
    if not topics:
        return 0
    reader = sow.snapshot()[0]
    notices: list[Notice] = []
    try:
        for topic in topics:
            was, now = filter_at(old, topic), filter_at(sub.filter, topic)
            if now is None:
                continue
            for k, rec in reader.keys(topic):
                body = rec[5]
                if (was is None or body_matches(was, body)) and not body_matches(now, body):
                    notices.append((sub, topic, k, "entitlement", body))
    finally:
        reader.close()
    send_notices(notices)
    return len(notices)


def send_notices(notices: list[Notice], err: BaseException | None = None) -> None:
    """Write the notices (a `Batch.after` callback: after the commit's live deliveries)."""
    outs = set()
    for sub, topic, k, reason, body in notices:
        out = sub.out
        if sub.state is SubState.REMOVED or out.closing:
            continue
        out.buf.append(frames.oof(topic, k, sub.sub_id, reason, body))
        outs.add(out)
    for out in outs:
        out.flush()
