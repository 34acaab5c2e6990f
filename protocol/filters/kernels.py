"""The evaluation kernels of the filter language: three-valued, never raising.

Every kernel returns True, False or None (UNKNOWN) and takes values as
``msgspec.json.decode`` returns them (``dict``, ``list``, ``str``, ``int``, ``float``,
``bool``, ``None``; a value of any other type is NULL). The compiler calls them where its
specialised closures cannot decide alone. The semantics they implement (SQL three-valued
logic):

- A missing field, JSON ``null``, a path through a non-object / non-array or an index out of
  range is NULL. The empty string is *not* NULL.
- Any comparison, ``IN``, ``BETWEEN`` or ``LIKE`` with a NULL or object operand is UNKNOWN; so
  is an ordering of values that have no order (``'abc' < 5``, ``TRUE < FALSE``). Equality of
  values of different types is known: ``5 = 'abc'`` is FALSE and ``5 != 'abc'`` TRUE
  (``TRUE = 1`` is FALSE).
- ``NOT UNKNOWN`` is UNKNOWN; ``FALSE AND UNKNOWN`` is FALSE; ``TRUE OR UNKNOWN`` is TRUE.
  A message matches only if the whole filter is TRUE, so ``NOT (/missing = 1)`` matches nothing.
  ``x IN (...)`` is ``x = v1 OR x = v2 ...``; ``x NOT IN (1, NULL)`` is never TRUE.
- ``IS NULL`` / ``IS NOT NULL`` are always TRUE or FALSE.
- Coercion: a number against a string that parses as a number (``'12'``, ``'-1.5e3'``, no
  spaces) compares numerically; two strings compare as strings (by code point); booleans equal
  only booleans.
- Arrays: a comparison, ``IN``, ``BETWEEN`` or ``LIKE`` on an array holds if it holds for any
  element (elements that are arrays or objects are UNKNOWN); an empty array is NULL.
- Arithmetic takes numbers and numeric strings; anything else, division or modulo by zero, or a
  result beyond the float range gives NULL. ``int / int`` truncates toward zero and ``%`` takes
  the sign of the dividend (``7 / 2 = 3``, ``-7 % 2 = -1``), as in AMPS; integer results beyond
  2**64 become floats, so hostile arithmetic cannot grow numbers without bound.
- ``LIKE`` applies to strings only; on any other value it is UNKNOWN.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "ARITH",
    "FLIP",
    "KIND",
    "OPFN",
    "arith",
    "between",
    "cmp",
    "in_",
    "like",
    "to_num",
]

Value = Any
"""A decoded JSON value (or NULL as None); typed loosely because the kernels dispatch on
``__class__`` themselves."""

Tri = bool | None
"""A three-valued result: True, False or None (UNKNOWN)."""

Number = int | float
OpFn = Callable[[Any, Any], Any]
"""A comparison or arithmetic operator as a function (``operator.lt``, ``_div``, ...)."""

_INT_LIMIT = 1 << 64
"""Integer arithmetic results beyond +-this become floats (or NULL beyond the float range)."""

OPFN: dict[str, OpFn] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
FLIP: dict[str, str] = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_MISMATCH = {"=": False, "!=": True}  # values of different kinds; ordering is UNKNOWN
KIND: dict[type, str] = {
    str: "s",
    int: "n",
    float: "n",
    bool: "b",
}  # anything else (None, dict, list): NULL
_NUMERIC_STRING = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NUMERIC_CHARS = frozenset("0123456789+-")


def _parse_num(s: str) -> Number | None:
    """The number a string spells, or None."""
    if not s or (s[0] not in _NUMERIC_CHARS and s[0] != ".") or not _NUMERIC_STRING.fullmatch(s):
        return None
    if "." in s or "e" in s or "E" in s:
        return float(s)
    try:
        return int(s)
    except ValueError:  # more digits than int() converts; a float is close enough
        return float(s)


def to_num(x: Value) -> Number | None:
    """The number ``x`` is or spells (a numeric string), else None."""
    xc = x.__class__
    if xc is int or xc is float:
        return x
    if xc is str:
        return _parse_num(x)
    return None


def _scalar_cmp(op: str, fn: OpFn, left: Value, right: Value) -> Tri:
    """Compare two values, neither expanded as an array."""
    lc = left.__class__
    rc = right.__class__
    lk = KIND.get(lc)
    rk = KIND.get(rc)
    if lk is None or rk is None:
        return None
    if lk == rk:
        if lk == "b" and op != "=" and op != "!=":
            return None
        return fn(left, right)
    if lk == "b" or rk == "b":
        return _MISMATCH.get(op)
    if lk == "s":
        left = _parse_num(left)
        if left is None:
            return _MISMATCH.get(op)
    else:
        right = _parse_num(right)
        if right is None:
            return _MISMATCH.get(op)
    return fn(left, right)


def _cmp_right(op: str, fn: OpFn, left: Value, right: Value) -> Tri:
    if right.__class__ is list:
        if not right:
            return None
        result: Tri = False
        for e in right:
            r = _scalar_cmp(op, fn, left, e)
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return _scalar_cmp(op, fn, left, right)


def cmp(op: str, fn: OpFn, left: Value, right: Value) -> Tri:
    """Three-valued ``left op right`` (``fn`` is ``OPFN[op]``), an array on either side meaning
    "any element". ``left`` must not be None (callers test it first, once)."""
    if left.__class__ is list:
        if not left or right is None:
            return None
        result: Tri = False
        for e in left:
            r = _cmp_right(op, fn, e, right)
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return _cmp_right(op, fn, left, right)


_EQ = operator.eq
_GE = operator.ge
_LE = operator.le


def in_(value: Value, candidates: Iterable[Value]) -> Tri:
    """Three-valued ``value IN (candidates)``: ``value = c1 OR value = c2 ...``."""
    if value is None:
        return None
    result: Tri = False
    for c in candidates:
        r = cmp("=", _EQ, value, c)
        if r is True:
            return True
        if r is None:
            result = None
    return result


def _scalar_between(value: Value, lo: Value, hi: Value) -> Tri:
    a = _scalar_cmp(">=", _GE, value, lo)
    if a is False:
        return False
    b = _scalar_cmp("<=", _LE, value, hi)
    if b is False:
        return False
    return True if a is True and b is True else None


def between(value: Value, lo: Value, hi: Value) -> Tri:
    """Three-valued ``value BETWEEN lo AND hi`` (inclusive). ``value`` must not be None."""
    if value.__class__ is list:
        if not value:
            return None
        result: Tri = False
        for e in value:
            r = _scalar_between(e, lo, hi)
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return _scalar_between(value, lo, hi)


def like(value: Value, search: Callable[[str], object]) -> Tri:
    """Three-valued ``value LIKE pattern``, ``search`` being the compiled pattern's ``search``."""
    vc = value.__class__
    if vc is str:
        return search(value) is not None
    if vc is list and value:
        result: Tri = False
        for e in value:
            if e.__class__ is str:
                if search(e) is not None:
                    return True
            else:
                result = None
        return result
    return None


def _div(a: Number, b: Number) -> Number | None:
    if b == 0:
        return None
    if a.__class__ is int and b.__class__ is int:
        q = abs(a) // abs(b)  # truncate toward zero, as C and AMPS do
        return q if (a < 0) == (b < 0) else -q
    return a / b


def _mod(a: Number, b: Number) -> Number | None:
    if b == 0:
        return None
    if a.__class__ is int and b.__class__ is int:
        r = abs(a) % abs(b)  # sign of the dividend, as C and AMPS do
        return -r if a < 0 else r
    return math.fmod(a, b)


ARITH: dict[str, OpFn] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _div,
    "%": _mod,
}


def arith(fn: OpFn, a: Number, b: Number) -> Number | None:
    """``fn(a, b)`` (``fn`` from :data:`ARITH`), or None where the result is NULL."""
    try:
        r = fn(a, b)
    except (ArithmeticError, ValueError):  # int too large for a float, fmod(inf, x), ...
        return None
    if r.__class__ is int and (r > _INT_LIMIT or r < -_INT_LIMIT):
        try:
            return float(r)
        except OverflowError:
            return None
    return r
