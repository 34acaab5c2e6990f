"""Content filters (protocol/filters.py) applied to message bodies as stored.

A filter is a predicate over the decoded JSON body. Every path that filters (live fan-out,
replay, queues, sow_delete) goes through here, so they agree on what a body that is not JSON
means: it matches no filter. `body_matches` is the one-filter case: it uses the filter's
`match_raw` (protocol/filters/api.py), which decodes only the fields the filter reads. `Body`
serves many filters of one message: it decodes the fields of each set of fields once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from protocol.filters import NOT_JSON, CompiledFilter

__all__ = ["Body", "DecodeError", "Predicate", "TopicFilter", "body_matches", "filter_at"]

Predicate = Callable[[Any], Any]
"""A compiled filter: decoded body -> truthy when the message matches."""

_decode = msgspec.json.Decoder().decode
DecodeError = (ValueError, RecursionError)
"""What decoding a body that is not JSON raises (msgspec.DecodeError is a ValueError; bad UTF-8
in a string raises UnicodeDecodeError, very deep nesting RecursionError)."""
_UNSET: Any = object()
_NOT_JSON: Any = object()


def body_matches(f: Predicate, body: bytes) -> bool:
    """Whether one filter matches a body (False if the body is not JSON)."""
    info = getattr(f, "__self__", None)  # compiled(f), inlined
    if info.__class__ is CompiledFilter:
        return info.match_raw(body)
    try:
        doc = _decode(body)
    except DecodeError:
        return False
    return bool(f(doc))


class Body:
    """One message body, decoded for the filters that ask: a compiled filter gets the body
    decoded into the fields it reads (once per set of fields, so filters on the same fields
    share one decode); any other predicate the fully decoded body, decoded once."""

    __slots__ = ("_doc", "_docs", "_kdoc", "_key", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._doc = _UNSET
        self._key: Any = None  # the decoder of the first field set asked for, and its doc
        self._kdoc: Any = None
        self._docs: dict[Any, Any] | None = None  # the other field sets' docs

    def matches(self, f: Predicate) -> bool:
        info = getattr(f, "__self__", None)  # compiled(f), inlined: once per message and filter
        if info.__class__ is CompiledFilter:
            dec = info.decode  # one decoder per field set (cached), so it names the set
            if self._key is dec:
                doc = self._kdoc
            elif self._key is None:
                self._key = dec
                doc = self._kdoc = dec(self.raw)
            else:
                docs = self._docs
                if docs is None:
                    docs = self._docs = {}
                doc = docs.get(dec, _UNSET)
                if doc is _UNSET:
                    doc = docs[dec] = dec(self.raw)
            return doc is not NOT_JSON and bool(f(doc))
        doc = self._doc
        if doc is _UNSET:
            try:
                doc = _decode(self.raw)
            except DecodeError:
                doc = _NOT_JSON
            self._doc = doc
        return doc is not _NOT_JSON and bool(f(doc))


class TopicFilter:
    """A filter that depends on the message's topic: a regex subscription of a user whose
    content entitlements (docs/security.md) differ from topic to topic.

    The engines that deliver to regex subscriptions (live fan-out, replay) resolve it per
    message with `at(topic)`: the predicate for that topic, or None when nothing filters it.
    Each topic is resolved once (bounded cache). Called as a plain predicate it matches
    nothing, so a path that does not resolve it fails closed.
    """

    __slots__ = ("_resolve", "_seen")

    LIMIT = 4096

    def __init__(self, resolve: Callable[[str], Predicate | None]) -> None:
        self._resolve = resolve
        self._seen: dict[str | bytes, Predicate | None] = {}

    def at(self, topic: str | bytes) -> Predicate | None:
        seen = self._seen
        if topic in seen:
            return seen[topic]
        name = topic if isinstance(topic, str) else topic.decode("utf-8", "replace")
        if len(seen) >= self.LIMIT:
            seen.clear()
        found = seen[topic] = self._resolve(name)
        return found

    def __call__(self, doc: Any) -> bool:
        return False


def filter_at(f: Predicate | None, topic: str) -> Predicate | None:
    """`f` for the messages of `topic`: a TopicFilter resolved (`at`), any other as it is."""
    return f.at(topic) if isinstance(f, TopicFilter) else f
