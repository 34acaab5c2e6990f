"""Out-of-focus notices (docs/protocol.md §14 `oof`): a subscription with the `oof` option on a
SOW topic is told when a record it was sent leaves its scope.

Reasons: `deleted` and `expired` (the record was removed; the body is its last message) and
`match` (an update no longer matches the subscription's filter; the body is the new message).
"Was sent" is judged from the record as it was: it matched the subscription's filter (every
record matches a subscription without one, which therefore gets no `match` notice).

Notices are computed while a commit is applied to the store and sent after the commit's live
deliveries (`Batch.after`), so a subscriber sees a message before the notice that it left.
Only LIVE subscriptions get them: one still replaying reads the journal, where deletes are
invisible.
"""

from __future__ import annotations

from typing import Any

from .. import frames
from ..matching import TopicFilter, body_matches
from ..router import Router
from ..subscriptions import Subscription, SubState

__all__ = ["OofNotices", "send_notices"]

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

    @staticmethod
    def _filter(sub: Subscription, topic: str) -> Any:
        f = sub.filter
        return f.at(topic) if isinstance(f, TopicFilter) else f

    def changed(
        self, subs: list[Subscription], topic: str, k: str, old: bytes | None, new: bytes
    ) -> None:
        if old is None:
            return
        for s in subs:
            f = self._filter(s, topic)
            if f is not None and body_matches(f, old) and not body_matches(f, new):
                self.pending.append((s, topic, k, "match", new))

    def left(self, subs: list[Subscription], topic: str, k: str, old: bytes, reason: str) -> None:
        for s in subs:
            f = self._filter(s, topic)
            if f is None or body_matches(f, old):
                self.pending.append((s, topic, k, reason, old))

    def take(self) -> list[Notice]:
        got, self.pending = self.pending, []
        return got


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
