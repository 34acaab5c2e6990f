"""Every regular expression a client or a configuration gives us, compiled in one place.

Regex subscription topics, the filter language's LIKE, queue underlying topics and the
configuration's topic patterns all go through `compile_pattern`, which uses RE2 (google-re2):
matching takes time linear in the subject, whatever the pattern, so `(a+)+$` against a long
subject costs microseconds, not seconds, and no client can stall the event loop with one.

RE2 has no backreferences and no lookaround (`\\1`, `(?=`, `(?!`, `(?<=`, `(?<!`): such a pattern is
refused with PatternError, whose message names what is not supported; every other construct
of Python's `re` that our users write (classes, alternation, anchors, repetition, non-greedy,
named groups) means the same.
"""

from __future__ import annotations

import functools
import re
from typing import TypeAlias

import re2

__all__ = ["Pattern", "PatternError", "compile_pattern", "is_pattern"]

Pattern: TypeAlias = re2._Regexp  # a compiled pattern: .search / .match / .fullmatch like re's

_OPTIONS = re2.Options()
_OPTIONS.log_errors = (
    False  # a refused pattern is the client's error: reported to it, not to stderr
)
_OPTIONS.max_mem = 8 << 20  # bounds one pattern's compiled program (a huge pattern is refused)


class PatternError(ValueError):
    """A pattern we cannot run in linear time, or that is not a regular expression at all."""

    def __init__(self, pattern: str | bytes, why: str):
        shown = pattern if isinstance(pattern, str) else pattern.decode("utf-8", "replace")
        super().__init__(
            f"pattern {shown[:200]!r} is not supported: {why}. Patterns run on RE2: no "
            "backreferences or lookaround; rewrite it without them"
        )
        self.pattern = pattern
        self.why = why


_META = re.compile(r"[\^$*+?{}\[\]\\|()]")


def is_pattern(topic: str) -> bool:
    """Whether a topic (a subscription's, a queue's, a SOW topic's) is a pattern over topic names
    rather than one name: it holds a metacharacter; a lone `.` is literal (`md.eq` means itself)."""
    return _META.search(topic) is not None


@functools.lru_cache(maxsize=10_000)
def compile_pattern(pattern: str | bytes) -> Pattern:
    """The compiled pattern (str or bytes, matching subjects of the same type). Cached."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        why = exc.args[0] if exc.args else "invalid pattern"
        raise PatternError(
            pattern, why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        ) from None
