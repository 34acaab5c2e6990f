"""Topic routing: which subscriptions want a message on a given topic.

A subscription's topic is literal unless it contains regular-expression metacharacters other than
`.`, in which case it is a pattern over topic names (Python `re`, full match; docs/protocol.md §6).
A lone `.` does not make a pattern: dotted names (`md.eq`, `queue.work`) are the common case and
must mean themselves.

`match(topic)` returns the matching subscriptions grouped by connection (by the connection's
Outbox), so a message matching several subscriptions of one connection is delivered once (with
`sids` listing them). Results are
cached per topic; any subscribe or unsubscribe clears the cache, and the cache is bounded.

`route(topic)` gives the same groups and, for a topic with many subscriptions whose filters
have an equality on a field, a `TopicIndex` (server/filter_index.py) that narrows them to
the candidates for one message body; the fan-out uses it instead of trying every filter.
"""

from __future__ import annotations

from typing import Any

from .filter_index import TopicIndex, equality_of
from .subscriptions import Subscription

CACHE_LIMIT = 100_000


class Router:
    def __init__(self) -> None:
        self._exact: dict[str, list[Any]] = {}
        self._patterns: list[Any] = []
        self._cache: dict[str, tuple] = {}
        self._routes: dict[str, tuple[tuple, TopicIndex | None]] = {}
        self.count = 0

    def add(self, sub: Subscription) -> None:
        if sub.filter_text:
            equality_of(sub.filter_text)  # read the text now, not while a message waits
        if sub.regex is not None:
            self._patterns.append(sub)
        else:
            self._exact.setdefault(sub.topic, []).append(sub)
        self.count += 1
        self._cache.clear()
        self._routes.clear()

    def remove(self, sub: Subscription) -> None:
        try:
            if sub.regex is not None:
                self._patterns.remove(sub)
            else:
                lst = self._exact[sub.topic]
                lst.remove(sub)
                if not lst:
                    del self._exact[sub.topic]
        except (ValueError, KeyError):
            return
        self.count -= 1
        self._cache.clear()
        self._routes.clear()

    def match(self, topic: str) -> tuple:
        """((outbox, (sub, ...)), ...) for every connection with a subscription matching `topic`."""
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        subs = self._subs_of(topic)
        groups: dict[Any, list] = {}
        for sub in subs:
            groups.setdefault(sub.out, []).append(sub)
        hit = tuple((conn, tuple(group)) for conn, group in groups.items())
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[topic] = hit
        return hit

    def route(self, topic: str) -> tuple[tuple, TopicIndex | None]:
        """(`match(topic)`, the topic's filter index or None): with an index, deliver to the
        groups of `index.select(body)` instead, a subset holding every subscription that can
        match the body (each candidate's filter still decides)."""
        hit = self._routes.get(topic)
        if hit is not None:
            return hit
        groups = self.match(topic)
        index = TopicIndex.build(self._subs_of(topic)) if groups else None
        if len(self._routes) >= CACHE_LIMIT:
            self._routes.clear()
        hit = self._routes[topic] = (groups, index)
        return hit

    def _subs_of(self, topic: str) -> list[Any]:
        subs = list(self._exact.get(topic, ()))
        for sub in self._patterns:
            if sub.regex.fullmatch(topic):
                subs.append(sub)
        return subs
