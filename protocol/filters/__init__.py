"""Content filters (docs/protocol.md §7): filter text compiled into a predicate over a JSON body.

:func:`compile_filter` parses the text once and builds nested Python closures; evaluating a
message is a few closure calls, with no tree walking and no ``eval``. The package is a small
pipeline, one module per stage, each pure (no I/O, no asyncio):

===============  ============================================================================
``errors``       :class:`FilterError` and the limits on filter text
``lexer``        text -> tokens
``tree``         the syntax tree's node types
``parser``       tokens -> syntax tree; the grammar is written out at its top
``kernels``      the three-valued evaluation rules (NULL semantics written out at its top)
``compiler``     syntax tree -> closures, with fast paths for the common shapes
``program``      the fields a filter reads, and its simple forms as the block scanner's program
``api``          :func:`compile_filter`, :func:`compile_body_filter`, :func:`cached_filter`:
                 limits, the compile cache (bounded in entries and text),
                 the guarantee that a predicate never raises, and :class:`CompiledFilter`
``scan``         a filter over a block of journal records: the C scanner
                 (server/_filterscan.c) with the Python evaluator as reference and fallback
===============  ============================================================================

One evaluator for every path: live delivery, replay and queues call the predicate on a decoded
body or ``compiled(predicate).match_raw`` on the raw one (server/matching.py), and filtered
replay runs ``scan.filter_frames`` over a block of records, whose C scanner hands every body it
cannot decide exactly back to ``match_raw``.

Evaluation never raises: the body is whatever ``msgspec.json.decode`` returns (exact ``dict``,
``list``, ``str``, ``int``, ``float``, ``bool``, ``None``; values of other types are NULL).

Limits: text over :data:`MAX_FILTER_TEXT` characters or nesting (parentheses, ``NOT``, unary
signs, ``IN`` lists) deeper than :data:`MAX_FILTER_DEPTH` fails. Every failure raises
:class:`FilterError` (``reason = "bad filter"``, the stable failure reason of docs/protocol.md §3)
with the 0-based character position of the problem. ``LIKE`` patterns are compiled at compile
time, with RE2 (``protocol.patterns``): matching takes time linear in the subject.
"""

from .api import (
    CHEAP_TEXT,
    NOT_JSON,
    CompiledFilter,
    cached_filter,
    compile_body_filter,
    compile_filter,
    compile_path,
    compiled,
)
from .errors import MAX_FILTER_DEPTH, MAX_FILTER_TEXT, FilterError

__all__ = [
    "CHEAP_TEXT",
    "MAX_FILTER_DEPTH",
    "MAX_FILTER_TEXT",
    "NOT_JSON",
    "CompiledFilter",
    "FilterError",
    "cached_filter",
    "compile_body_filter",
    "compile_filter",
    "compile_path",
    "compiled",
]
