"""Which of a topic's many filtered subscriptions can want a message, without trying them all.

A filter that is, or is ANDed with, an equality between a field and constants — `/id = 42`,
`/sym = 'IBM'`, `/sym IN ('IBM', 'MSFT') AND /qty > 5` — can be TRUE only for a message whose
field holds one of those constants. `TopicIndex` groups the subscriptions of one topic by
(field path, key of the constant); for a message it reads each indexed field once and returns
the subscriptions found under the field's keys, plus every subscription it could not index
(no filter, or a filter with no such equality).

Contract: `TopicIndex.select(body)` returns a superset of the subscriptions whose filter is TRUE
for `body`, grouped by Outbox in the order `Router.match` gives them. The caller still applies
each candidate's filter (`sub.filter`), so the index decides nothing by itself: a key that
is too generous costs a filter call, never a wrong delivery. Safe because the subscription's
filter is its own text's filter, or that ANDed with content entitlements (server/guard.py):
FALSE for its own equality means never TRUE.

Keys follow the equality rules of the filter language (protocol/filters/kernels.py): booleans
equal only booleans; numbers equal numbers and numeric strings; strings equal strings. So a
value has the key `("b", v)`, `("n", v)` or `("s", v)`, and a numeric string also `("n",
number)` (`'12' = 12` is TRUE); an array has its scalar elements' keys (a comparison on an
array holds for any element). NULL, objects and empty arrays have none (never equal).

Only equalities on a path of names (`/a/b`, not `/a[0]`) are indexed; the filter text is read
with the filter package's parser (`protocol.filters.parser.parse`), once per distinct text.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from protocol.filters import FilterError
from protocol.filters.kernels import to_num
from protocol.filters.parser import parse
from protocol.filters.tree import Compare, Const, Field, In, Junction, Node, Unary

__all__ = ["INDEX_MIN", "TopicIndex", "equality_of", "value_keys"]

INDEX_MIN = 8
"""A topic gets an index once this many of its subscriptions have an indexable filter: below,
trying each filter costs about what decoding the body and looking the field up does (about
the cost of 5 to 8 simple filters in bench_scale's 10 a topic case)."""

Path = tuple[str, ...]
Key = tuple[str, Any]
Equality = tuple[Path, tuple[Key, ...]]
"""(field path, the keys of its constants, each once): what `equality_of` reads from a text.
Tuples, not sets, and one path object per distinct path: one is kept per distinct filter."""

_paths: dict[Path, Path] = {}


def _shared(path: Path) -> Path:
    if len(_paths) >= 4096:
        _paths.clear()
    return _paths.setdefault(path, path)


_decode = msgspec.json.Decoder().decode
_NUMERIC_CHARS = frozenset("0123456789+-.")


def _number(s: str) -> int | float | None:
    """The number a numeric string spells (the filter language's coercion), else None."""
    if not s or s[0] not in _NUMERIC_CHARS:
        return None
    return to_num(s)


def _scalar_keys(v: Any, out: list[Key]) -> None:
    c = v.__class__
    if c is str:
        out.append(("s", v))
        n = _number(v)
        if n is not None:
            out.append(("n", n))
    elif c is int or c is float:
        out.append(("n", v))
    elif c is bool:
        out.append(("b", v))


def value_keys(v: Any) -> list[Key]:
    """The keys under which a body value (or a filter constant) can be equal to another."""
    out: list[Key] = []
    if v.__class__ is list:
        for e in v:
            _scalar_keys(e, out)
    else:
        _scalar_keys(v, out)
    return out


def _constant(node: Node) -> tuple[bool, Any]:
    """(True, value) for a constant that is not NULL: `5`, `'x'`, `TRUE`, `-5`."""
    if isinstance(node, Const):
        return node.value is not None, node.value
    if isinstance(node, Unary) and isinstance(node.operand, Const):
        v = node.operand.value
        if v.__class__ in (int, float):
            return True, -v if node.op == "-" else v
    return False, None


def _path(node: Node) -> Path | None:
    if isinstance(node, Field) and all(s.__class__ is str for s in node.steps):
        return node.steps  # type: ignore[return-value]
    return None


def _equality(node: Node) -> Equality | None:
    if isinstance(node, Compare) and node.op == "=":
        for field, const in ((node.left, node.right), (node.right, node.left)):
            path = _path(field)
            ok, value = _constant(const)
            if path is not None and ok:
                found = value_keys(value)
                return (_shared(path), tuple(dict.fromkeys(found))) if found else None
        return None
    if isinstance(node, In) and not node.negated:
        path = _path(node.operand)
        if path is None:
            return None
        keys: list[Key] = []
        for item in node.items:
            ok, value = _constant(item)
            if ok:
                keys.extend(value_keys(value))
            elif not (isinstance(item, Const) and item.value is None):
                return None  # a field or an expression in the list: any value may match
        return (_shared(path), tuple(dict.fromkeys(keys))) if keys else None
    if isinstance(node, Junction) and node.kind == "and":
        best = None
        for item in node.items:
            eq = _equality(item)
            if eq is not None and (best is None or len(eq[1]) < len(best[1])):
                best = eq
        return best
    return None


@functools.lru_cache(maxsize=1 << 16)
def equality_of(text: str) -> Equality | None:
    """(field path, keys) of an equality that the filter `text` is ANDed with (the one with
    the fewest keys), or None when it has none (or does not parse)."""
    try:
        return _equality(parse(text))
    except (FilterError, RecursionError):
        return None


class TopicIndex:
    """The subscriptions one topic matches, indexed by their filters' equalities."""

    __slots__ = ("_paths", "_rest", "_subs")

    def __init__(self, subs: list[Any], eqs: list[Equality | None]) -> None:
        """`subs` in `Router.match` order; `eqs[i]` is `equality_of(subs[i].filter_text)`."""
        self._subs = subs
        self._rest: list[int] = []  # positions of subscriptions every message must try
        self._paths: dict[Path, dict[Key, list[int]]] = {}
        for i, eq in enumerate(eqs):
            if eq is None:
                self._rest.append(i)
                continue
            path, keys = eq
            table = self._paths.setdefault(path, {})
            for k in keys:
                table.setdefault(k, []).append(i)

    @classmethod
    def build(cls, subs: list[Any]) -> TopicIndex | None:
        """An index of `subs`, or None when too few filters are indexable to gain from one."""
        eqs = [equality_of(s.filter_text) if s.filter_text else None for s in subs]
        if sum(eq is not None for eq in eqs) < INDEX_MIN:
            return None
        return cls(subs, eqs)

    def select(self, body: bytes) -> tuple:
        """((outbox, (sub, ...)), ...): the candidates for `body`, as `Router.match` groups."""
        found = self._rest
        try:
            doc: Any = _decode(body)
        except msgspec.DecodeError:
            doc = None  # not JSON: matches no filter, so only the unindexed may want it
        if doc.__class__ is dict:
            hits: list[int] = []
            for path, table in self._paths.items():
                v: Any = doc
                for step in path:
                    v = v.get(step) if v.__class__ is dict else None
                if v is None:
                    continue
                for k in value_keys(v):
                    lst = table.get(k)
                    if lst is not None:
                        hits.extend(lst)
            if hits:
                if not found and len(hits) == 1:  # the common case: one equality holds
                    sub = self._subs[hits[0]]
                    return ((sub.out, (sub,)),)
                found = sorted(set(hits).union(found))
        if not found:
            return ()
        subs = self._subs
        groups: dict[Any, list[Any]] = {}
        for i in found:
            sub = subs[i]
            g = groups.get(sub.out)
            if g is None:
                groups[sub.out] = [sub]
            else:
                g.append(sub)
        return tuple((out, tuple(g)) for out, g in groups.items())
