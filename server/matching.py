"""Content filters (server/filters.py) applied to message bodies as stored.

A filter is a predicate over the decoded JSON body. Every path that filters (live fan-out,
replay, queues, sow_delete) goes through here, so they agree on what a body that is not JSON
means: it matches no filter. A body is decoded at most once however many filters look at it
(`Body`); `body_matches` is the one-filter case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["Body", "DecodeError", "Predicate", "body_matches", "decode_body"]

Predicate = Callable[[Any], Any]
"""A compiled filter: decoded body -> truthy when the message matches."""

_decode = msgspec.json.Decoder().decode
# For a loop that filters every record itself (replay's tuple path): `f(decode_body(raw))`
# inside `try ... except DecodeError: no match` is body_matches without a call per record.
decode_body = _decode
DecodeError = msgspec.DecodeError
_UNSET: Any = object()
_NOT_JSON: Any = object()


def body_matches(f: Predicate, body: bytes) -> bool:
    """Whether one filter matches a body (False if the body is not JSON)."""
    try:
        doc = _decode(body)
    except msgspec.DecodeError:
        return False
    return bool(f(doc))


class Body:
    """One message body, decoded on the first filter that asks and kept for the others."""

    __slots__ = ("_doc", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._doc = _UNSET

    def matches(self, f: Predicate) -> bool:
        doc = self._doc
        if doc is _UNSET:
            try:
                doc = _decode(self.raw)
            except msgspec.DecodeError:
                doc = _NOT_JSON
            self._doc = doc
        return doc is not _NOT_JSON and bool(f(doc))
