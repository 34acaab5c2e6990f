"""The entry points of the filter language: filter text to a cached, never-raising predicate.

:func:`compile_filter` checks the length of the text, parses it (:mod:`.parser`), compiles
the tree (:mod:`.compiler`) and wraps the result so evaluation never raises;
:func:`compile_body_filter` does the same for raw JSON bodies. Both cache by text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec

from .compiler import always_false, always_true, condition
from .errors import MAX_FILTER_TEXT, FilterError
from .parser import parse

__all__ = ["compile_body_filter", "compile_filter"]

_CACHED_TEXT = 4096
"""Texts up to this length are cached; longer ones are compiled each time so the cache stays
small (1024 entries of at most 4 KiB)."""


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
        test = condition(parse(text), True)
    except RecursionError:  # only if the caller's stack is already nearly full
        raise FilterError(text, 0, "filter nested too deeply to compile here") from None
    if test is always_true:
        return _match_all
    if test is always_false:
        return _match_none

    def predicate(body: Any) -> bool:
        try:
            return test(body)
        except Exception:
            return False

    return predicate


_compile_cached = functools.lru_cache(maxsize=1024)(_compile)


def compile_filter(text: str) -> Callable[[Any], bool]:
    """Compile filter text into ``predicate(body) -> bool``.

    ``body`` is the decoded JSON body (as ``msgspec.json.decode`` returns it). The predicate
    is True only when the filter is TRUE for the body; it never raises (NULL, type mismatches,
    division by zero, a non-object body all make the filter UNKNOWN or FALSE). Compiled
    filters are cached by text (1024 entries, texts up to 4 KiB), so many subscriptions with
    one filter share one predicate. Raises :class:`FilterError` on bad text.
    """
    if not isinstance(text, str):
        raise FilterError(
            repr(text)[:100], 0, f"filter must be a string, not {type(text).__name__}"
        )
    if len(text) <= _CACHED_TEXT:
        return _compile_cached(text)
    return _compile(text)


compile_filter.cache_info = _compile_cached.cache_info  # type: ignore[attr-defined]
compile_filter.cache_clear = _compile_cached.cache_clear  # type: ignore[attr-defined]

_decode = msgspec.json.decode


def _body_match_all(data: Any) -> bool:
    return True


def _body_match_none(data: Any) -> bool:
    return False


@functools.lru_cache(maxsize=1024)
def _compile_body(text: str) -> Callable[[bytes], bool]:
    predicate = compile_filter(text)
    if predicate is _match_all:  # 1=1 matches every message, JSON or not, without decoding
        return _body_match_all
    if predicate is _match_none:
        return _body_match_none

    def body_predicate(data: Any) -> bool:
        try:
            body = _decode(data)
        except Exception:
            return False
        return predicate(body)

    return body_predicate


def compile_body_filter(text: str) -> Callable[[bytes], bool]:
    """Like :func:`compile_filter`, for raw bodies: ``predicate(body_bytes) -> bool`` decodes
    with ``msgspec.json.decode`` (a body that is not JSON does not match) and applies the filter.
    A filter that is always TRUE (``1=1``) matches every body without decoding it."""
    if isinstance(text, str) and len(text) <= _CACHED_TEXT:
        return _compile_body(text)
    return _compile_body.__wrapped__(text)
