"""What the filter language refuses: :class:`FilterError` and the limits on filter text.

Every module of the package raises :class:`FilterError` and nothing else for bad text; the
limits live here so the lexer, the parser and the compiler read one definition.
"""

from __future__ import annotations

__all__ = ["MAX_FILTER_DEPTH", "MAX_FILTER_TEXT", "FilterError"]

MAX_FILTER_TEXT = 65536
"""Longest filter text accepted, in characters."""

MAX_FILTER_DEPTH = 200
"""Deepest nesting of parentheses, ``NOT``, unary signs and ``IN`` lists accepted."""


class FilterError(ValueError):
    """Bad filter text.

    Attributes: ``text`` (the filter), ``position`` (0-based character offset of the problem;
    ``len(text)`` when the text ended too early) and ``detail`` (what was wrong). ``str(e)`` is
    ``bad filter at position 7: <detail> (in "<text>")``.
    """

    reason = "bad filter"

    def __init__(self, text: str, position: int, detail: str) -> None:
        self.text = text
        self.position = position
        self.detail = detail
        super().__init__(
            f'bad filter at position {position}: {detail} (in "{_excerpt(text, position)}")'
        )

    def __reduce__(self) -> tuple[type[FilterError], tuple[str, int, str]]:
        # ValueError pickles by args; ours takes three
        return (type(self), (self.text, self.position, self.detail))


def _excerpt(text: str, position: int) -> str:
    """The text for an error message: control characters blanked, long texts cut around
    ``position`` (so a 64 KiB filter does not make a 64 KiB log line)."""
    if len(text) > 160:
        start = max(0, position - 60)
        end = min(len(text), position + 60)
        text = ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")
    return "".join(c if c.isprintable() else " " for c in text)
