"""What the configuration says about topics: which are recorded (and so can be replayed),
which name a queue, which are literal (publish needs one), and where a publish to a queue's
name goes (`<DefaultPublishTarget>`)."""

from __future__ import annotations

from typing import Any

from config.model import Config
from protocol.patterns import is_pattern

__all__ = ["TopicPolicy", "never"]

LITERAL_CACHE_LIMIT = 50_000


def never(topic: str) -> bool:
    """The recorded-topic test of an instance without a transaction log."""
    return False


class TopicPolicy:
    def __init__(self, config: Config, has_journal: bool) -> None:
        self._config = config
        self._tl = config.transaction_log if has_journal else None
        self._literal: dict[str, str | None] = {}
        self._targets = {
            q.name: q.default_publish_target for q in config.queues if q.default_publish_target
        }

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

    def publish_topic(self, topic: str) -> str | None:
        """Where a publish to `topic` is stored: None when `topic` is a pattern (publish needs a
        literal topic), a queue's `<DefaultPublishTarget>` for its name, else `topic`. Cached:
        this runs per publish."""
        got = self._literal.get(topic, "")
        if got == "":
            if len(self._literal) > LITERAL_CACHE_LIMIT:
                self._literal.clear()
            got = self._literal[topic] = (
                None if is_pattern(topic) else self._targets.get(topic, topic)
            )
        return got
