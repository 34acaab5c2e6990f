"""The delta side of the SOW (docs/sow.md "delta_publish", "Delta subscriptions"): a `Deltas`
object owned by `SowManager` (server/sow/manager.py), handed the topic's spec and key maker
lookups and `committed`, the manager's read of a record's committed body.

- **delta_publish**: `merge_delta` merges a delta into the latest message *accepted* for its
  key: the newest in a batch not yet committed (each batch indexed once, by `current`), else
  the committed body (`committed`: a put held and not yet written, else the store's record).
- **delta subscriptions**: `delta_feed` makes a subscription's live fan-out hook
  (server/sow/delta.py); while any exists (`feeds`), the fold keeps the body each put of a
  commit replaced (`note_replaced`, by journal position) until the commit's deliveries are
  done (`after_commit` hands `_forget` to the batch as a `Batch.after` callback).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from config.model import SowTopicSpec

from .delta import DeltaFeed
from .keys import K_MEMBER, KeyMaker, k_fragment

__all__ = ["Deltas"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.encode


class Deltas:
    def __init__(
        self,
        spec: Callable[[str], SowTopicSpec | None],
        maker: Callable[[SowTopicSpec], KeyMaker],
        committed: Callable[[str, str], bytes | None],
    ) -> None:
        self.spec = spec
        self.maker = maker
        self.committed = committed  # (topic, k) -> the body committed for the record, or None
        # id(batch) -> (batch, [messages indexed], (topic, `k` fragment) -> body): `_uncommitted`
        self._seen: dict[int, tuple[Any, list[int], dict[tuple[str, bytes], bytes]]] = {}
        self.feeds = 0  # delta subscriptions open
        # while any is open: the body each put of a commit replaced, by journal position
        self._replaced: dict[int, bytes] = {}
        self._replaced_now: list[int] = []  # the positions of the commit being applied

    # -- delta_publish --------------------------------------------------------------------------

    def current(self, commits: Any, topic: str, k: str) -> bytes | None:
        """The latest body of record `k`: of a publish accepted and not yet committed (the
        open batch, then the batches in flight of `commits`, newest first), else committed
        (`committed`); None when none."""
        if commits is not None:
            got = self._uncommitted(commits, topic, k_fragment(k))
            if got is not None:
                return got
        return self.committed(topic, k)

    def _uncommitted(self, commits: Any, topic: str, kf: bytes) -> bytes | None:
        """The body of the newest publish to (topic, `k` fragment) in a batch not yet
        committed. Each batch's SOW messages are indexed once, as far as it has grown since
        the last look, so a stream of delta_publishes costs one dict store per message."""
        batches = [commits.batch, *reversed(commits.inflight)]
        seen = self._seen
        found = None
        for b in batches:
            entry = seen.get(id(b))
            if entry is None or entry[0] is not b:
                entry = seen[id(b)] = (b, [0], {})
            _b, done, index = entry
            msgs = b.msgs
            for m in msgs[done[0] :]:
                hdr = m[6]
                i = hdr.rfind(K_MEMBER) if hdr else -1
                if i >= 0:
                    index[(m[0], hdr[i:])] = m[4]
            done[0] = len(msgs)
            if found is None:
                found = index.get((topic, kf))
        if len(seen) > len(batches):
            live = {id(b) for b in batches}
            for key in [key for key in seen if key not in live]:
                del seen[key]
        return found

    def merge_delta(self, commits: Any, topic: str, delta: bytes, given: str | None) -> bytes:
        """The message a delta_publish stores: `delta` (a JSON object) merged into the record
        with its key (fields replace fields, nested objects merge, arrays are replaced whole),
        or `delta` itself when there is no record; `commits`: the pipeline whose batches hold
        the publishes not yet committed (None before it is attached). Raises BadSowKey, or ValueError for a delta
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
        old = self.current(commits, topic, k)
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
        self.feeds += 1
        return DeltaFeed(sub, self._replaced.get, self.key_paths, self._feed_closed)

    def _feed_closed(self) -> None:
        self.feeds -= 1
        if not self.feeds:
            self._replaced.clear()

    def note_replaced(self, position: int, old_body: bytes) -> None:
        """The fold's put at `position` replaced a record whose body was `old_body` (called
        only while `feeds`): kept for the delta feeds until the commit's deliveries are done."""
        self._replaced[position] = old_body
        self._replaced_now.append(position)

    def after_commit(self, batch: Any) -> None:
        """The commit being applied is in the store: forget its replaced bodies once its
        deliveries are done."""
        if self._replaced_now:
            batch.after.append(partial(self._forget, self._replaced_now))
            self._replaced_now = []

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
