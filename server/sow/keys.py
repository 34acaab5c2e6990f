"""A SOW record's key (docs/sow.md "Keys").

With `<Key>` paths the key is made from the values at those paths: the JSON array of the
values, in the order of the paths, encoded with URL-safe base64 without padding. Two messages
with the same values get the same `k`, different values never share one (the encoding is
one-to-one), and a `k` is plain text that needs no escaping in a header or a `sow_keys` list.
Without `<Key>` the publisher gives `k` on every publish; it must be 1 .. 1,024 bytes of
printable text without a comma (`sow_keys` is a comma list).

The key goes into the journal with the message: the publish path appends the member
`,"k":"<key>"` to the record's header fragment (journal/record.py), so every delivery of the
message carries `k`, and the store, a restart and a replica read the key from the record rather
than compute it again. It is always the fragment's last member (`key_from_fragment`).

A record published with `e` (seconds; the journal keeps it in whole seconds, rounded up) has
the member `,"e":<seconds>` just before `k` in the header fragment the *store* keeps
(`with_expiration`; the journal keeps `e` in its own field): so the store alone says when each
record expires, and a restart rebuilds the expiry heap from it (server/sow/manager.py).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import msgspec

from protocol.filters import compile_path
from protocol.filters.lexer import lex

__all__ = [
    "K_MEMBER",
    "MAX_KEY_BYTES",
    "BadSowKey",
    "KeyMaker",
    "check_key",
    "expiration_from_fragment",
    "expires_at",
    "k_fragment",
    "key_from_fragment",
    "with_expiration",
]

MAX_KEY_BYTES = 1024
K_MEMBER = _K = b',"k":'
_E = b',"e":'
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.encode


class BadSowKey(ValueError):
    """A publish (or sow_delete body) without a usable key; refused with `bad sow key`."""

    reason = "bad sow key"


def check_key(k: str) -> str:
    """A publisher-given or listed key: 1 .. MAX_KEY_BYTES bytes, printable, no comma."""
    if not k:
        raise BadSowKey("the sow key k is empty; give the record's key")
    if len(k.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise BadSowKey(f"the sow key is longer than {MAX_KEY_BYTES} bytes")
    if "," in k or not k.isprintable():
        raise BadSowKey(
            f"the sow key {k[:40]!r} has a comma or a control character; keys are listed "
            "in comma lists (sow_keys), so use neither"
        )
    return k


class KeyMaker:
    """The keys of one SOW topic: `key(body, given)` returns the record's `k`."""

    __slots__ = ("_getters", "paths", "steps")

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        self._getters: list[Callable[[Any], Any]] = [compile_path(p) for p in paths]
        # each path's member names, UTF-8, for the publish scanner (server/publish_scan.py);
        # None when a path has an array index, or there are no paths (the publisher's `k`)
        steps = tuple(tuple(lex(p)[0].value) for p in paths)  # type: ignore[arg-type]
        self.steps: tuple[tuple[bytes, ...], ...] | None = (
            tuple(tuple(s.encode("utf-8") for s in path) for path in steps)  # type: ignore[union-attr]
            if steps and all(isinstance(s, str) for path in steps for s in path)
            else None
        )

    def key(self, body: bytes, given: str | None) -> str:
        if not self._getters:
            if given is None:
                raise BadSowKey(
                    "this SOW topic has no <Key>: give the record's key in k on every publish"
                )
            return check_key(given)
        try:
            doc = _decode(body)
        except (msgspec.DecodeError, ValueError, RecursionError):
            raise BadSowKey(
                f"the body is not JSON, so it has no key at {', '.join(self.paths)}"
            ) from None
        return self.key_of(doc)

    def fragment(self, body: bytes) -> bytes | None:
        """The header fragment `,"k":...` of a publish of `body` (no `k` of its own), or None
        when the body has no key here (the ordinary path then refuses it with the reason).
        server/publish_scan.py's Python scan asks this through the topic's key spec, so the
        scanner (a lower layer) never imports this package."""
        try:
            return k_fragment(self.key(body, None))
        except BadSowKey:
            return None

    def key_of(self, doc: Any) -> str:
        """The key of a decoded body (raises BadSowKey)."""
        values = []
        for path, get in zip(self.paths, self._getters, strict=True):
            v = get(doc)
            if v is None:
                raise BadSowKey(
                    f"the message has no value at {path}; every message of this SOW topic "
                    f"needs its key fields {', '.join(self.paths)}"
                )
            if isinstance(v, (dict, list)):
                raise BadSowKey(f"the key field {path} is an object or an array; keys are values")
            values.append(v)
        return base64.urlsafe_b64encode(_encode(values)).rstrip(b"=").decode("ascii")

    def fields(self, doc: Any) -> dict[str, Any] | None:
        """The key fields of a decoded body as a nested object (`send_keys`), or None."""
        if not self._getters or not isinstance(doc, dict):
            return None
        out: dict[str, Any] = {}
        for path, get in zip(self.paths, self._getters, strict=True):
            steps = [s for s in path.split("/") if s]
            if any("[" in s for s in steps):
                continue
            node = out
            for s in steps[:-1]:
                node = node.setdefault(s, {})
            node[steps[-1]] = get(doc)
        return out


def k_fragment(k: str) -> bytes:
    """The header-fragment member that carries `k` (always the fragment's last member)."""
    return _K + _encode(k)


def key_from_fragment(hdr: bytes) -> str | None:
    """The `k` of a record's header fragment, or None when it has none."""
    i = hdr.rfind(_K)
    if i < 0:
        return None
    try:
        k = _decode(hdr[i + len(_K) :])
    except (msgspec.DecodeError, ValueError):
        return None
    return k if isinstance(k, str) else None


def with_expiration(hdr: bytes, seconds: int) -> bytes:
    """`hdr` with the member `,"e":<seconds>` just before `k` (a fragment without `k` gets it
    last). A quote inside a JSON string is escaped, so `,"e":` and `,"k":` found in a fragment
    are members, never text inside a value."""
    i = hdr.rfind(_K)
    if i < 0:
        i = len(hdr)
    return hdr[:i] + _E + b"%d" % seconds + hdr[i:]


def expiration_from_fragment(hdr: bytes) -> int | None:
    """The `e` (whole seconds) `with_expiration` put in a stored fragment, or None."""
    end = hdr.rfind(_K)
    if end < 0:
        end = len(hdr)
    i = hdr.rfind(_E, 0, end)
    if i < 0:
        return None
    digits = hdr[i + len(_E) : end]
    return int(digits) if digits.isdigit() else None


def expires_at(topic_ttl: float | None, ts: int, hdr: bytes) -> int | None:
    """When a record received at `ts` (µs) with stored fragment `hdr` leaves: the sooner of the
    topic's <Expiration> (`topic_ttl`, seconds) and the record's own `e`; None when neither."""
    own = expiration_from_fragment(hdr) if hdr else None
    ttls = [t for t in (topic_ttl, own) if t]
    return ts + int(min(ttls) * 1e6) if ttls else None
