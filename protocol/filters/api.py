"""The entry points of the filter language: filter text to a cached, never-raising predicate.

:func:`compile_filter` checks the length of the text, parses it (:mod:`.parser`), compiles
the tree (:mod:`.compiler`) and wraps the result so evaluation never raises;
:func:`compile_body_filter` does the same for raw JSON bodies. Both cache by text;
:func:`cached_filter` answers only when that costs next to nothing, so the server can compile
large filters off its event loop.

Every predicate :func:`compile_filter` returns carries a :class:`CompiledFilter`
(:func:`compiled`): the text, the top-level fields it reads, ``match_raw`` (the raw-body
evaluator every path uses: it decodes only those fields), the block scanner's program
(server/filter_scan.py) and, for ``/field = constant``, the pair an index can look up.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from .compiler import always_false, always_true, condition, path_getter
from .errors import MAX_FILTER_TEXT, FilterError
from .lexer import lex
from .parser import parse
from .program import build_program, equality, fields_read, subset_decoder

__all__ = [
    "CHEAP_TEXT",
    "NOT_JSON",
    "CompiledFilter",
    "cached_filter",
    "compile_body_filter",
    "compile_filter",
    "compile_path",
    "compiled",
]

_decode_full = msgspec.json.Decoder().decode
_ValidationError = msgspec.ValidationError
_NotJSON = (ValueError, RecursionError)
"""What decoding a body that is not JSON raises: msgspec.DecodeError (a ValueError), and
UnicodeDecodeError for bad UTF-8 in a string, RecursionError for very deep nesting."""


NOT_JSON: Any = object()
"""What ``CompiledFilter.decode`` returns for a body that is not JSON."""


class CompiledFilter:
    """What is known of a compiled filter besides its predicate (the API for the paths that
    evaluate filters: live delivery, replay, queues, and indexes of many subscriptions).

    - ``text``: the filter text; ``fields``: the top-level field names it reads.
    - ``match_raw(body: bytes) -> bool``: whether the filter is TRUE for a raw body; a body that
      is not JSON matches nothing. It decodes only ``fields`` (the same answer as the predicate
      on the fully decoded body, except that a member the filter does not read is checked for
      JSON syntax only). Never raises.
    - ``decode(body: bytes)``: the body as ``match_raw`` decodes it (only ``fields``), or
      :data:`NOT_JSON`; filters with the same ``fields`` can share it, and the predicate
      evaluates it. Never raises.
    - ``program``: the block scanner's program (protocol/filters/program.py), None when the
      filter has a shape the scanner does not take.
    - ``equals``: ``(field, value)`` when the filter is exactly ``/field = constant``.

    The predicate :func:`compile_filter` returns is this object's bound ``evaluate``: one small
    object a filter, since every subscription with its own filter holds one (a closure with a
    function attribute and a second closure for ``match_raw`` cost twice as much).
    """

    __slots__ = ("_subset", "decode", "equals", "fields", "program", "test", "text")

    def __init__(
        self,
        text: str,
        fields: frozenset[str],
        test: Callable[[Any], bool],
        program: bytes | None,
        equals: tuple[str, Any] | None,
    ) -> None:
        self.text = text
        self.fields = fields
        self.test = test
        self.program = program
        self.equals = equals
        self.decode: Callable[[bytes], Any] = _decoder(fields)
        self._subset = subset_decoder(fields)

    def evaluate(self, body: Any) -> bool:
        """The filter on a decoded body; never raises."""
        try:
            return self.test(body)
        except Exception:
            return False

    def match_raw(self, data: bytes) -> bool:
        # the decode, inlined for the common case: an ASCII body that is an object
        try:
            doc = self._subset(data) if data.isascii() else _decode_full(data)
        except _ValidationError:  # JSON, not an object
            doc = self.decode(data)
        except _NotJSON:
            return False
        except AttributeError:  # a memoryview
            doc = self.decode(data)
        if doc is NOT_JSON:
            return False
        try:
            return self.test(doc)
        except Exception:
            return False


def compiled(predicate: Callable[[Any], bool] | None) -> CompiledFilter | None:
    """The :class:`CompiledFilter` of a predicate from :func:`compile_filter`; None for any
    other callable (a combination of filters made elsewhere, say)."""
    info = getattr(predicate, "__self__", None)
    return info if info.__class__ is CompiledFilter else None


@functools.lru_cache(maxsize=256)
def _decoder(fields: frozenset[str]) -> Callable[[bytes], Any]:
    decode_subset = subset_decoder(fields)

    def decode(data: bytes) -> Any:
        try:
            ascii = data.isascii()  # the subset decoder does not check UTF-8 in what it skips
        except AttributeError:  # a memoryview
            ascii = False
        try:
            if ascii:
                try:
                    return decode_subset(data)
                except _ValidationError:  # JSON, not an object: no field is there
                    return _decode_full(data)
            return _decode_full(data)
        except _NotJSON:
            return NOT_JSON
        except TypeError:  # not bytes at all
            return NOT_JSON

    return decode


_FIELDS: dict[frozenset[str], frozenset[str]] = {}
_FIELDS_LIMIT = 4096

CACHE_ENTRIES = 1024
CACHE_TEXT = 2 * 1024 * 1024
"""The compile cache holds at most this many filters and this many characters of their texts
(a compiled filter costs some 10-20 times its text), least recently used out first: a hundred
subscriptions with one large filter compile it once."""

CHEAP_TEXT = 1024
"""Compiling text up to this length costs well under a millisecond; longer text not in the
cache is worth compiling off the event loop (the server does: server/session_subscribe.py)."""


def _match_all(body: Any) -> bool:
    return True


def _match_none(body: Any) -> bool:
    return False


def _compile(text: str) -> Callable[[Any], bool]:
    if len(text) > MAX_FILTER_TEXT:
        raise FilterError(
            text,
            MAX_FILTER_TEXT,
            f"filter is {len(text)} characters long; the limit is {MAX_FILTER_TEXT}",
        )
    try:
        tree = parse(text)
        test = condition(tree, True)
    except RecursionError:  # only if the caller's stack is already nearly full
        raise FilterError(text, 0, "filter nested too deeply to compile here") from None
    if test is always_true:
        return _match_all
    if test is always_false:
        return _match_none

    fields = fields_read(tree)
    if len(_FIELDS) >= _FIELDS_LIMIT:
        _FIELDS.clear()
    fields = _FIELDS.setdefault(fields, fields)  # one set a field set, not one a filter
    return CompiledFilter(text, fields, test, build_program(tree), equality(tree)).evaluate


class _Cache:
    """Compiled filters by text, bounded in entries and characters (LRU). Safe to use from the
    loop and from the thread the server compiles large filters on."""

    def __init__(self, entries: int, chars: int) -> None:
        self.entries = entries
        self.chars = chars
        self._map: OrderedDict[str, Callable[[Any], bool]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, text: str) -> Callable[[Any], bool] | None:
        with self._lock:
            predicate = self._map.get(text)
            if predicate is not None:
                self._map.move_to_end(text)
                self.hits += 1
            return predicate

    def put(self, text: str, predicate: Callable[[Any], bool]) -> Callable[[Any], bool]:
        """Keep `predicate` for `text`; the one kept already wins (so equal texts share one)."""
        if len(text) > self.chars:
            return predicate
        with self._lock:
            self.misses += 1
            kept = self._map.setdefault(text, predicate)
            if kept is predicate:
                self._size += len(text)
                while len(self._map) > self.entries or self._size > self.chars:
                    old, _ = self._map.popitem(last=False)
                    self._size -= len(old)
            return kept

    def info(self) -> _CacheInfo:
        with self._lock:
            return _CacheInfo(self.hits, self.misses, len(self._map), self._size)

    def clear(self) -> None:
        with self._lock:
            self._map.clear()
            self._size = self.hits = self.misses = 0


class _CacheInfo(NamedTuple):
    hits: int
    misses: int
    entries: int
    chars: int


_CACHE = _Cache(CACHE_ENTRIES, CACHE_TEXT)


def _checked(text: object) -> str:
    if not isinstance(text, str):
        raise FilterError(
            repr(text)[:100], 0, f"filter must be a string, not {type(text).__name__}"
        )
    return text


def compile_filter(text: str) -> Callable[[Any], bool]:
    """Compile filter text into ``predicate(body) -> bool``.

    ``body`` is the decoded JSON body (as ``msgspec.json.decode`` returns it). The predicate
    is True only when the filter is TRUE for the body; it never raises (NULL, type mismatches,
    division by zero, a non-object body all make the filter UNKNOWN or FALSE). Compiled
    filters are cached by text (:data:`CACHE_ENTRIES` entries, :data:`CACHE_TEXT`
    characters), so many subscriptions with one filter share one predicate. Raises
    :class:`FilterError` on bad text.
    """
    predicate = _CACHE.get(_checked(text))
    if predicate is None:
        predicate = _CACHE.put(text, _compile(text))
    return predicate


def cached_filter(text: str) -> Callable[[Any], bool] | None:
    """The predicate :func:`compile_filter` would return when getting it costs next to nothing
    (cached, or text of at most :data:`CHEAP_TEXT` characters); None when compiling it may take
    long enough to be done off the event loop. Raises :class:`FilterError` on bad short text."""
    predicate = _CACHE.get(_checked(text))
    if predicate is None and len(text) <= CHEAP_TEXT:
        predicate = _CACHE.put(text, _compile(text))
    return predicate


compile_filter.cache_info = _CACHE.info  # type: ignore[attr-defined]
compile_filter.cache_clear = _CACHE.clear  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=1024)
def _compile_body(text: str) -> Callable[[bytes], bool]:
    predicate = compile_filter(text)
    if predicate is _match_all or predicate is _match_none:
        return predicate  # each ignores the body: 1=1 matches every message, JSON or not

    info = compiled(predicate)
    assert info is not None  # every predicate but the two constant ones has one
    return info.match_raw


def compile_body_filter(text: str) -> Callable[[bytes], bool]:
    """Like :func:`compile_filter`, for raw bodies: ``predicate(body_bytes) -> bool`` decodes
    with ``msgspec.json.decode`` (a body that is not JSON does not match) and applies the filter.
    A filter that is always TRUE (``1=1``) matches every body without decoding it."""
    if isinstance(text, str) and len(text) <= 4096:
        return _compile_body(text)
    return _compile_body.__wrapped__(text)


@functools.lru_cache(maxsize=256)
def compile_path(text: str) -> Callable[[Any], Any]:
    """A lone field path (`/a`, `/a/b`, `/arr[0]`, as in a filter) to a getter over a decoded
    body: the value there, or None where the body has none. Raises :class:`FilterError` for
    text that is not exactly one path (SOW `<Key>` paths use this: the same rules as filters)."""
    toks = lex(text)
    if len(toks) != 2 or toks[0].kind != "path":
        raise FilterError(
            text,
            toks[0].end if toks[0].kind == "path" else 0,
            "expected one field path such as /sym",
        )
    return path_getter(toks[0].value)  # type: ignore[arg-type]
