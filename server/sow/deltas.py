"""The delta side of the SOW manager (docs/sow.md "delta_publish", "Delta subscriptions"),
mixed into `SowManager` (server/sow/manager.py), which provides the attributes declared here.

- **delta_publish**: `merge_delta` merges a delta into the latest message *accepted* for its
  key (`accepted` remembers publishes until their commit is applied, at most MAX_RECENT), else
  into the store's record.
- **delta subscriptions**: `delta_feed` makes a subscription's live fan-out hook
  (server/sow/delta.py); while any exists, the fold keeps the body each put of a commit
  replaced (`_replaced`, by journal position) until the commit's deliveries are done
  (`_forget`, a `Batch.after` callback).
"""

from __future__ import annotations

from typing import Any

import msgspec

from config.model import SowTopicSpec

from .delta import DeltaFeed
from .keys import KeyMaker
from .store import SowStore

__all__ = ["MAX_RECENT", "Deltas"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.encode

MAX_RECENT = 100_000  # accepted publishes remembered for delta_publish until applied


class Deltas:
    # provided by SowManager
    store: SowStore | None
    _recent: dict[tuple[str, str], tuple[int, int, bytes]]
    delta_feeds: int
    _replaced: dict[int, bytes]

    def spec(self, topic: str) -> SowTopicSpec | None:
        raise NotImplementedError

    def maker(self, spec: SowTopicSpec) -> KeyMaker:
        raise NotImplementedError

    # -- delta_publish --------------------------------------------------------------------------

    def accepted(self, topic: str, k: str, pub: int, seq: int, body: bytes) -> None:
        """A publish to a SOW topic was accepted (not yet durable): a delta_publish that
        follows it merges into it, not into the older record of the store."""
        recent = self._recent
        if len(recent) >= MAX_RECENT:
            recent.clear()  # a bound: merges then read the store (what is durable)
        recent[(topic, k)] = (pub, seq, body)

    def current(self, topic: str, k: str) -> bytes | None:
        """The latest body of record `k`: accepted, else in the store; None when none."""
        got = self._recent.get((topic, k))
        if got is not None:
            return got[2]
        store = self.store
        if store is None:
            return None
        reader = store.reader(0)
        try:
            rec = reader.get(topic, k)
        finally:
            reader.close()
        return None if rec is None else rec[5]

    def merge_delta(self, topic: str, delta: bytes, given: str | None) -> bytes:
        """The message a delta_publish stores: `delta` (a JSON object) merged into the record
        with its key (fields replace fields, nested objects merge, arrays are replaced whole),
        or `delta` itself when there is no record. Raises BadSowKey, or ValueError for a delta
        that is not a JSON object."""
        try:
            doc = _decode(delta)
        except (ValueError, RecursionError):
            raise ValueError("a delta_publish body must be a JSON object") from None
        if not isinstance(doc, dict):
            raise ValueError("a delta_publish body must be a JSON object")
        spec = self.spec(topic)
        assert spec is not None
        k = self.maker(spec).key(delta, given)
        old = self.current(topic, k)
        if old is None:
            return delta
        try:
            base = _decode(old)
        except (ValueError, RecursionError):
            return delta
        if not isinstance(base, dict):
            return delta
        return _encode(_merge(base, doc))

    # -- delta subscriptions --------------------------------------------------------------------

    def delta_feed(self, sub: Any) -> DeltaFeed:
        """The live fan-out hook that makes `sub` a delta subscription (server/sow/delta.py)."""
        self.delta_feeds += 1
        return DeltaFeed(sub, self._replaced.get, self.key_paths, self._feed_closed)

    def _feed_closed(self) -> None:
        self.delta_feeds -= 1
        if not self.delta_feeds:
            self._replaced.clear()

    def key_paths(self, topic: str) -> tuple[str, ...]:
        spec = self.spec(topic)
        return tuple(spec.keys) if spec is not None else ()

    def _forget(self, positions: list[int], err: BaseException | None = None) -> None:
        """The commit's deliveries are done: its replaced bodies are not needed any more."""
        replaced = self._replaced
        for p in positions:
            replaced.pop(p, None)


def _merge(base: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """delta_publish's merge: fields replace fields, nested objects merge, arrays are replaced."""
    for key, v in delta.items():
        old = base.get(key)
        if isinstance(v, dict) and isinstance(old, dict):
            _merge(old, v)
        else:
            base[key] = v
    return base
