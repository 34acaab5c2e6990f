"""Delta subscriptions (docs/protocol.md §14 `delta_subscribe`, `sow_and_delta_subscribe`): a
change to a record the subscriber has been sent arrives as only the fields that changed; a new
record arrives whole.

- **The delta** (`delta_body`, a pure function): the members of the new JSON object whose values
  differ from the old one's; a nested object that changed is itself given as its changed
  members; arrays and other values are given whole. A member the new message lacks is not
  expressed (a SOW record changes by `publish`, which replaces it, or `delta_publish`, which
  never removes a member). `send_keys` adds the topic's key fields (their paths' values) to the
  delta. The header carries `k` either way, so the record is always named. With `no_empties` a
  change that changes nothing is not sent; without it, it arrives as `{}`.
- **The previous version**: the SOW manager, while it applies a commit and any delta
  subscription exists, keeps the replaced body of each record of the commit (by journal
  position) until the commit's deliveries are done (`Deltas`, server/sow/deltas.py).
- **"Has been sent"** is judged from the record as it was: it matched the subscription's filter
  (as for out-of-focus notices). A record that did not exist, or did not match, arrives whole.
- **Where**: a `DeltaFeed` is the subscription's per-message hook of the live fan-out
  (`Subscription.conflation`, server/fanout.py: the fan-out hands it each message the
  subscription takes, topic, filter and state checked, instead of writing the frame). So only
  live deliveries are deltas: the messages a `sow_and_delta_subscribe` replays from the journal
  between its answer and the live stream arrive whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..fanout import Message
from ..frames import timestamp_part, write_live
from ..matching import TopicFilter, body_matches
from ..subscriptions import Subscription

__all__ = ["DeltaFeed", "delta_body"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.encode
_MISSING = object()


def _diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in new.items():
        was = old.get(key, _MISSING)
        if was is _MISSING:
            out[key] = v
        elif isinstance(v, dict) and isinstance(was, dict):
            sub = _diff(was, v)
            if sub:
                out[key] = sub
        elif was != v or type(was) is not type(v):  # 1 and 1.0, 1 and True differ on the wire
            out[key] = v
    return out


def _put_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.split("/") if p]
    for p in parts[:-1]:
        nxt = doc.get(p)
        if not isinstance(nxt, dict):
            nxt = doc[p] = {}
        doc = nxt
    if parts:
        doc[parts[-1]] = value


def _get_path(doc: Any, path: str) -> Any:
    for p in (p for p in path.split("/") if p):
        if not isinstance(doc, dict) or p not in doc:
            return _MISSING
        doc = doc[p]
    return doc


def delta_body(old: bytes, new: bytes, keys: tuple[str, ...] = ()) -> bytes | None:
    """The delta from `old` to `new` (JSON objects) with the fields at the paths `keys` added,
    or None when nothing changed (keys aside). A body that is not a JSON object has no delta:
    `new` itself is returned. Keys are added only to a delta that changes something."""
    try:
        a, b = _decode(old), _decode(new)
    except (ValueError, RecursionError):
        return new
    if not isinstance(a, dict) or not isinstance(b, dict):
        return new
    d = _diff(a, b)
    if not d:
        return None
    for path in keys:
        v = _get_path(b, path)
        if v is not _MISSING:
            _put_path(d, path, v)
    return _encode(d)


@dataclass(eq=False, repr=False, slots=True)
class DeltaFeed:
    """The live fan-out's hook of one delta subscription (module docstring)."""

    sub: Subscription
    _previous: Callable[[int], bytes | None]  # journal position -> the body that message replaced
    _keys_of: Callable[[str], tuple[str, ...]]  # topic -> its key paths (for send_keys)
    _on_close: Callable[[], None]
    no_empties: bool = field(init=False)

    def __post_init__(self) -> None:
        self.no_empties = self.sub.opts.no_empties

    def add(self, m: Message) -> None:
        sub = self.sub
        out = sub.out
        body = m.body
        old = self._previous(m.position) if m.position >= 0 else None
        if old is not None:
            f = sub.filter
            if f is not None and f.__class__ is TopicFilter:
                f = f.at(m.topic)
            if f is None or body_matches(f, old):  # it was sent: only what changed
                d = delta_body(old, body, self._keys_of(m.topic) if sub.opts.send_keys else ())
                if d is None:
                    if self.no_empties:
                        return
                    d = b"{}"
                body = d
        tail = timestamp_part(m.ts) if sub.timestamp else b""
        write_live(out.buf, sub.prefix, m.suffix, tail, body)
        out.sent += 1
        out.flush()

    def close(self, emit: bool = False) -> None:
        """The subscription leaves or is replaced (nothing is held: `emit` changes nothing)."""
        if self._on_close is not None:
            self._on_close()
            self._on_close = None  # type: ignore[assignment]
