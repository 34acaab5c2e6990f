"""Subscription managers: the subscriptions an HAClient re-enters after every reconnect.

A `SubscriptionSpec` is what is needed to place a subscription again (no message data, no
handler): topic, filter, options, sub_id, and the bookmark it was first placed with (None for
a plain subscription). The HAClient adds a spec when a subscription is placed and removes it
when the application unsubscribes; after a reconnect it re-enters every spec it has a live
HASubscription for, bookmark subscriptions at MOST_RECENT.

`MemorySubscriptionManager` keeps specs for the life of the process. An application that
wants its set of subscriptions to survive a restart implements `SubscriptionManager` over its
own storage, or uses `FileSubscriptionManager` (a JSON file rewritten atomically on change);
after a restart `HAClient.restore_subscriptions()` places every stored spec again and returns
the HASubscriptions for the application to consume.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

import msgspec

__all__ = [
    "FileSubscriptionManager",
    "MemorySubscriptionManager",
    "SubscriptionManager",
    "SubscriptionSpec",
]


class SubscriptionSpec(msgspec.Struct, frozen=True):
    """How to place a subscription again. `bookmark` None: a plain (live-only) subscription.
    `sow`: a sow_and_subscribe (client/haplace.py says how it is placed again)."""

    sub_id: str
    topic: str
    filter: str | None = None
    options: str | None = None
    bookmark: str | None = None
    sow: bool = False


class SubscriptionManager(ABC):
    """Where an HAClient keeps its subscriptions' specs (module docstring)."""

    @abstractmethod
    def add(self, spec: SubscriptionSpec) -> None:
        """Remember `spec` (replacing one with the same sub_id)."""

    @abstractmethod
    def remove(self, sub_id: str) -> None:
        """Forget `sub_id` (the application unsubscribed)."""

    @abstractmethod
    def specs(self) -> list[SubscriptionSpec]:
        """Every remembered spec, in the order they were added."""

    def clear(self) -> None:
        for spec in self.specs():
            self.remove(spec.sub_id)


class MemorySubscriptionManager(SubscriptionManager):
    def __init__(self) -> None:
        self._specs: dict[str, SubscriptionSpec] = {}

    def add(self, spec: SubscriptionSpec) -> None:
        self._specs[spec.sub_id] = spec

    def remove(self, sub_id: str) -> None:
        self._specs.pop(sub_id, None)

    def specs(self) -> list[SubscriptionSpec]:
        return list(self._specs.values())


class FileSubscriptionManager(SubscriptionManager):
    """Specs in a JSON file (a list of objects), rewritten with temp file + rename on every
    change. A file that does not decode raises msgspec.DecodeError naming the problem."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._specs: dict[str, SubscriptionSpec] = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                data = f.read()
            if data.strip():
                for spec in msgspec.json.decode(data, type=list[SubscriptionSpec]):
                    self._specs[spec.sub_id] = spec

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(msgspec.json.encode(list(self._specs.values())))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def add(self, spec: SubscriptionSpec) -> None:
        if self._specs.get(spec.sub_id) != spec:
            self._specs[spec.sub_id] = spec
            self._save()

    def remove(self, sub_id: str) -> None:
        if self._specs.pop(sub_id, None) is not None:
            self._save()

    def specs(self) -> list[SubscriptionSpec]:
        return list(self._specs.values())
