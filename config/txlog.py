"""The `<TransactionLog>` section: the journal, and which topics it records.

docs/configuration.md ("`<TransactionLog>`") describes every element.
"""

from __future__ import annotations

from typing import cast

from protocol.patterns import PatternError, compile_pattern

from .model import DEFAULT_JOURNAL_SIZE, Durability, MessageType, TopicSpec, TransactionLog
from .rules import Checker, Section, enum, message_type, size_between
from .schema import TOPIC, TRANSACTION_LOG
from .xmltree import Node

__all__ = ["MIN_JOURNAL_SIZE", "read_transaction_log", "topic_pattern"]

MIN_JOURNAL_SIZE = 64 << 10


def read_transaction_log(
    checker: Checker, node: Node | None
) -> tuple[TransactionLog | None, Node | None]:
    """The journal and the element it came from (for line numbers); (None, None) without one."""
    if node is None:
        return None, None
    sec = Section(checker, node, TRANSACTION_LOG)
    directory = sec.text("JournalDirectory", required=True, hint=" (where segments live)")
    archive = sec.text("JournalArchiveDirectory")
    size = sec.value(
        "JournalSize",
        size_between(MIN_JOURNAL_SIZE, None, "JournalSize"),
        DEFAULT_JOURNAL_SIZE,
    )
    durability = sec.value("Durability", enum("fsync", "write"), "fsync")
    topics = []
    for tnode in sec.many("Topic"):
        t = Section(checker, tnode, TOPIC)
        pattern = t.value("Name", topic_pattern, None, required=True, hint=" (a topic regex)")
        mtype = t.value("MessageType", message_type, "json")
        if pattern is not None:
            topics.append(TopicSpec(name=pattern, message_type=cast(MessageType, mtype)))
    tlog = TransactionLog(
        journal_directory=directory or "",
        archive_directory=archive,
        journal_size=size,
        durability=cast(Durability, durability),
        topics=tuple(topics),
    )
    return tlog, node


def topic_pattern(text: str) -> str:
    """A recorded topic's `<Name>`: a regular expression RE2 can run (matched whole)."""
    try:
        compile_pattern(text)
    except PatternError as e:
        raise ValueError(
            f"invalid regular expression {text!r}: {e.why}; topic names here are "
            r"regular expressions (escape a literal dot as \.; RE2 syntax: no backreferences "
            "or lookaround)"
        ) from None
    return text
