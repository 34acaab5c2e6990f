"""What the configuration says about topics: which are recorded (and so can be replayed),
which name a queue, and which are literal (publish needs one)."""

from __future__ import annotations

from typing import Any

from config.model import Config

from .router import is_pattern

__all__ = ["TopicPolicy", "never"]

LITERAL_CACHE_LIMIT = 50_000


def never(topic: str) -> bool:
    """The recorded-topic test of an instance without a transaction log."""
    return False


class TopicPolicy:
    def __init__(self, config: Config, has_journal: bool) -> None:
        self._config = config
        self._tl = config.transaction_log if has_journal else None
        self._literal: dict[str, bool] = {}

    def replayable(self, topic: str, regex: Any) -> bool:
        """Whether a bookmark subscription (or conflation) on `topic` can read the journal."""
        tl = self._tl
        if tl is None:
            return False
        if regex is None:
            return tl.records_topic(topic)
        # a pattern replays only the logged topics it matches; accept it if anything is logged
        return bool(tl.topics)

    def journal_fed(self, topic: str, regex: Any, bookmark: bool) -> bool:
        """Whether every message a live subscription gets is in the journal, so that it can read
        the journal instead when it lags (server/subscription_table.py `fall_back`): a recorded
        literal topic; a pattern of a bookmark subscription (it gets only recorded topics); a
        plain pattern only when every topic is recorded."""
        tl = self._tl
        if tl is None:
            return False
        if regex is None:
            return tl.records_topic(topic)
        return bookmark or any(t.name in (".*", ".+") for t in tl.topics)

    def replay_topic(self, topic: str) -> str:
        """A bookmark subscription to a queue name replays the queue's underlying topic."""
        q = self._config.queue(topic)
        return q.underlying_topic if q is not None else topic

    def literal_topic(self, topic: str) -> bool:
        """Publish needs a literal topic (cached: this runs per publish)."""
        ok = self._literal.get(topic)
        if ok is None:
            if len(self._literal) > LITERAL_CACHE_LIMIT:
                self._literal.clear()
            ok = self._literal[topic] = not is_pattern(topic)
        return ok
