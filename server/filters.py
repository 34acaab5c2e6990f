"""Content filters (PROTOCOL.md §7): filter text compiled into a predicate over a JSON body.

:func:`compile_filter` parses the text once and builds nested Python closures; evaluating a
message is a few closure calls, with no tree walking and no ``eval``. Field paths are resolved
with precomputed key tuples, and the common shapes (``/a = 'x'``, ``/n > 5``, ``/a IN (...)``)
have specialised closures with a type-checked fast path.

Grammar (EBNF). Keywords are case-insensitive; whitespace separates tokens::

    filter    = expr EOF ;
    expr      = and { "OR" and } ;
    and       = not { "AND" not } ;
    not       = "NOT" not | predicate ;
    predicate = sum [ cmp_op sum                              (* not chainable: a = b = c fails *)
                    | [ "NOT" ] "IN" "(" sum { "," sum } ")"
                    | [ "NOT" ] "BETWEEN" sum "AND" sum        (* inclusive *)
                    | [ "NOT" ] "LIKE" string                  (* Python re, search semantics *)
                    | "IS" [ "NOT" ] "NULL" ] ;
    sum       = product { ( "+" | "-" ) product } ;
    product   = unary { ( "*" | "/" | "%" | "MOD" ) unary } ;
    unary     = ( "-" | "+" ) unary | primary ;
    primary   = number | string | "TRUE" | "FALSE" | "NULL" | field | "(" expr ")" ;
    cmp_op    = "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">=" ;
    field     = "/" name { "/" name | "[" digit { digit } "]" } ;   (* no spaces inside *)
    name      = namechar { namechar } ;     (* letters, digits, "_", "@", "$", "." *)
    number    = digits [ "." [ digits ] ] [ exp ] | "." digits [ exp ] ;
    exp       = ( "e" | "E" ) [ "+" | "-" ] digits ;
    string    = "'" { char | "''" } "'" | '"' { char | '""' } '"' ;  (* no backslash escapes *)

``/`` directly followed by a name starts a field; ``/a/b`` is ``body["a"]["b"]`` and ``/arr[0]``
is ``body["arr"][0]``. Put spaces around ``/`` when it means division (``/a / 2``); ``10/2`` also
works. Backslashes in strings are literal, so ``LIKE '^\\d+$'`` is written as in Python ``re``.
A bare value is also a condition: ``/active`` and ``TRUE`` hold when the value is JSON ``true``;
and a condition is also a value (TRUE, FALSE or NULL): ``(/a > 1) = /flag``. ``NOT`` binds
looser than comparisons (``NOT /a = 1`` is ``NOT (/a = 1)``) and tighter than ``AND``.

NULL semantics (SQL three-valued logic):

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

Evaluation never raises: the body is whatever ``msgspec.json.decode`` returns (exact ``dict``,
``list``, ``str``, ``int``, ``float``, ``bool``, ``None``; values of other types are NULL).

Limits: text over :data:`MAX_FILTER_TEXT` characters or nesting (parentheses, ``NOT``, unary
signs, ``IN`` lists) deeper than :data:`MAX_FILTER_DEPTH` fails. Every failure raises
:class:`FilterError` (``reason = "bad filter"``, the stable failure reason of PROTOCOL.md §3)
with the 0-based character position of the problem. ``LIKE`` patterns are compiled at compile
time; a pattern that backtracks catastrophically is not detected (Python ``re`` has no timeout).
Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable

import msgspec

from protocol.patterns import PatternError, compile_pattern

__all__ = [
    "MAX_FILTER_DEPTH",
    "MAX_FILTER_TEXT",
    "FilterError",
    "compile_body_filter",
    "compile_filter",
]

MAX_FILTER_TEXT = 65536
"""Longest filter text accepted, in characters."""

MAX_FILTER_DEPTH = 200
"""Deepest nesting of parentheses, ``NOT``, unary signs and ``IN`` lists accepted."""

_CACHED_TEXT = 4096
"""Texts up to this length are cached; longer ones are compiled each time so the cache stays
small (1024 entries of at most 4 KiB)."""

_INT_LIMIT = 1 << 64
"""Integer arithmetic results beyond +-this become floats (or NULL beyond the float range)."""


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

    def __reduce__(self):  # ValueError pickles by args; ours takes three
        return (type(self), (self.text, self.position, self.detail))


def _excerpt(text: str, position: int) -> str:
    """The text for an error message: control characters blanked, long texts cut around
    ``position`` (so a 64 KiB filter does not make a 64 KiB log line)."""
    if len(text) > 160:
        start = max(0, position - 60)
        end = min(len(text), position + 60)
        text = ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")
    return "".join(c if c.isprintable() else " " for c in text)


# ---------------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------------

_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "IS", "NULL", "TRUE", "FALSE", "MOD"}
)
_TWO_CHAR_OPS = frozenset({"<=", ">=", "<>", "!=", "=="})
_ONE_CHAR_OPS = frozenset("=<>+-*%(),")
_NUMBER_TOKEN = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_WORD = re.compile(r"[A-Za-z_]\w*")


def _is_name_char(c: str) -> bool:
    return c != "" and (c.isalnum() or c in "_@$.")


def _is_name_start(c: str) -> bool:
    return c != "" and (c.isalpha() or c in "_@$")


class _Tok:
    """kind: 'num' | 'str' | 'path' | 'op' | 'kw' | 'eof'. value: the number, the decoded
    string, the path steps, the operator symbol or the upper-case keyword."""

    __slots__ = ("end", "kind", "pos", "value")

    def __init__(self, kind: str, value, pos: int, end: int) -> None:
        self.kind = kind
        self.value = value
        self.pos = pos
        self.end = end

    def is_op(self, sym: str) -> bool:
        return self.kind == "op" and self.value == sym

    def is_kw(self, word: str) -> bool:
        return self.kind == "kw" and self.value == word


def _lex(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    n = len(text)
    i = 0
    # Whether the next token starts an operand; decides whether "/" is a field or division.
    operand = True
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            toks.append(_Tok("eof", None, n, n))
            return toks
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        start = i
        if c == "/" and (_is_name_start(nxt) or (operand and _is_name_char(nxt))):
            steps, i = _lex_path(text, i)
            toks.append(_Tok("path", steps, start, i))
            operand = False
        elif c == "/":
            if operand:
                raise FilterError(text, i + 1, "expected a field name after '/'")
            toks.append(_Tok("op", "/", i, i + 1))
            i += 1
            operand = True
        elif c.isdigit() or (c == "." and nxt.isdigit()):
            m = _NUMBER_TOKEN.match(text, i)
            i = m.end()
            raw = m.group()
            if i < n and _is_name_char(text[i]):
                j = i
                while j < n and _is_name_char(text[j]):
                    j += 1
                raise FilterError(
                    text, start, f"malformed number '{text[start:j]}' (put a space after a number)"
                )
            if any(ch in raw for ch in ".eE"):
                value = float(raw)
            else:
                try:
                    value = int(raw)
                except ValueError:  # more digits than int() will convert
                    raise FilterError(text, start, "number has too many digits") from None
            toks.append(_Tok("num", value, start, i))
            operand = False
        elif c == "'" or c == '"':
            value, i = _lex_string(text, i)
            toks.append(_Tok("str", value, start, i))
            operand = False
        elif text[i : i + 2] in _TWO_CHAR_OPS:
            sym = text[i : i + 2]
            toks.append(_Tok("op", "=" if sym == "==" else "!=" if sym == "<>" else sym, i, i + 2))
            i += 2
            operand = True
        elif c in _ONE_CHAR_OPS:
            toks.append(_Tok("op", c, i, i + 1))
            i += 1
            operand = c != ")"
        elif c.isalpha() or c == "_":
            m = _WORD.match(text, i)
            word = m.group() if m else c
            i = start + len(word)
            upper = word.upper()
            if upper not in _KEYWORDS:
                j = i
                while j < n and text[j].isspace():
                    j += 1
                if j < n and text[j] == "(":
                    raise FilterError(text, start, f"unsupported function '{word}'")
                raise FilterError(
                    text,
                    start,
                    f"unknown word '{word}' (field names start with '/', strings are quoted)",
                )
            if upper == "MOD":
                toks.append(_Tok("op", "%", start, i))
                operand = True
            else:
                toks.append(_Tok("kw", upper, start, i))
                operand = upper not in ("TRUE", "FALSE", "NULL")
        else:
            raise FilterError(text, i, f"unexpected character {c!r}")


def _lex_path(text: str, i: int) -> tuple[tuple[str | int, ...], int]:
    """``/name{/name|[digits]}`` starting at ``text[i] == '/'``: (steps, end)."""
    n = len(text)
    steps: list[str | int] = []
    while i < n and text[i] == "/" and i + 1 < n and _is_name_char(text[i + 1]):
        j = i + 1
        while j < n and _is_name_char(text[j]):
            j += 1
        steps.append(text[i + 1 : j])
        i = j
        while i < n and text[i] == "[":
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            if j == i + 1:
                raise FilterError(text, j, "expected an array index (digits) after '['")
            if j - i - 1 > 9:
                raise FilterError(text, i + 1, "array index too large")
            if j >= n or text[j] != "]":
                raise FilterError(text, j, "expected ']' to close the array index")
            steps.append(int(text[i + 1 : j]))
            i = j + 1
    return tuple(steps), i


def _lex_string(text: str, i: int) -> tuple[str, int]:
    """A quoted string starting at ``text[i]`` (its quote); a doubled quote is one quote."""
    quote = text[i]
    parts = []
    j = i + 1
    while True:
        k = text.find(quote, j)
        if k < 0:
            raise FilterError(text, i, "unterminated string")
        parts.append(text[j:k])
        if text.startswith(quote, k + 1):
            parts.append(quote)
            j = k + 2
        else:
            return "".join(parts), k + 1


def _describe(tok: _Tok, text: str) -> str:
    if tok.kind == "eof":
        return "end of filter"
    raw = text[tok.pos : tok.end]
    if len(raw) > 40:
        raw = raw[:37] + "..."
    label = {"num": "number ", "str": "string ", "path": "field "}.get(tok.kind, "")
    return f"{label}'{raw}'" if tok.kind != "str" else f"string {raw}"


# ---------------------------------------------------------------------------------------------
# Syntax tree (compile time only)
# ---------------------------------------------------------------------------------------------


class _Node:
    """One node of the syntax tree. ``kind`` and the fields it uses:

    ====================  ===================================================================
    'const'               value
    'path'                value (the steps: str keys and int indexes)
    'unary'               op ('-' or '+'), a
    'arith'               a, items [(op, node), ...] applied left to right, value (its level)
    'cmp'                 op, a, b
    'in'                  a, items [node, ...], negated
    'between'             a, b (low), c (high), negated
    'like'                a, value (the compiled regex), negated
    'isnull'              a, negated (IS NOT NULL)
    'and', 'or'           items [node, ...]
    'not'                 a
    ====================  ===================================================================

    ``dyn`` says whether the node depends on the body (if not, it is folded at compile time);
    ``memo`` holds its compiled closures by mode ("value", True, False).
    """

    __slots__ = ("a", "b", "c", "dyn", "items", "kind", "memo", "negated", "op", "value")

    def __init__(
        self,
        kind,
        *,
        a=None,
        b=None,
        c=None,
        items=None,
        op=None,
        value=None,
        negated=False,
        dyn=None,
    ):
        self.kind = kind
        self.a = a
        self.b = b
        self.c = c
        self.items = items
        self.op = op
        self.value = value
        self.negated = negated
        if dyn is None:
            parts = [x for x in (a, b, c) if x is not None]
            for item in items or ():
                parts.append(item[1] if isinstance(item, tuple) else item)
            dyn = any(p.dyn for p in parts)
        self.dyn = dyn
        self.memo: dict = {}  # a condition used as a value compiles in up to three modes


# Binding powers (higher binds tighter).
_BP_OR, _BP_AND, _BP_NOT, _BP_PRED, _BP_SUM, _BP_PRODUCT, _BP_UNARY = 10, 20, 30, 40, 50, 60, 70
_CMP_OPS = frozenset({"=", "!=", "<", "<=", ">", ">="})
_PRED_KWS = frozenset({"IN", "BETWEEN", "LIKE", "IS", "NOT"})


class _Parser:
    """Precedence climbing over the token list. Recursion happens only through nesting
    (parentheses, NOT, unary signs, IN lists), which ``depth`` bounds; chains of AND, OR, + and
    * become n-ary nodes, so a long flat filter builds a shallow tree."""

    def __init__(self, text: str, toks: list[_Tok]) -> None:
        self.text = text
        self.toks = toks
        self.i = 0
        self.depth = 0

    def error(self, pos: int, detail: str) -> FilterError:
        return FilterError(self.text, pos, detail)

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def enter(self, tok: _Tok) -> None:
        self.depth += 1
        if self.depth > MAX_FILTER_DEPTH:
            raise self.error(tok.pos, f"nesting deeper than {MAX_FILTER_DEPTH} levels")

    def parse(self) -> _Node:
        if self.peek().kind == "eof":
            raise self.error(0, "empty filter")
        node = self.expr(0)
        tok = self.peek()
        if tok.kind != "eof":
            if tok.is_op(")"):
                raise self.error(tok.pos, "unmatched ')'")
            hint = ""
            if tok.kind == "path" and tok.pos > 0 and self.toks[self.i - 1].end == tok.pos:
                hint = "; put spaces around '/' for division"
            raise self.error(
                tok.pos,
                f"unexpected {_describe(tok, self.text)} after a complete expression "
                f"(expected AND, OR or end of filter{hint})",
            )
        return node

    def infix_bp(self, tok: _Tok) -> int | None:
        if tok.kind == "op":
            v = tok.value
            if v in _CMP_OPS:
                return _BP_PRED
            if v == "+" or v == "-":
                return _BP_SUM
            if v == "*" or v == "/" or v == "%":
                return _BP_PRODUCT
        elif tok.kind == "kw":
            v = tok.value
            if v == "OR":
                return _BP_OR
            if v == "AND":
                return _BP_AND
            if v in _PRED_KWS:
                return _BP_PRED
        return None

    def expr(self, min_bp: int) -> _Node:
        left = self.prefix()
        chain: _Node | None = None  # the n-ary node this loop built last, to extend
        predicate_done = False
        while True:
            tok = self.peek()
            bp = self.infix_bp(tok)
            if bp is None or bp <= min_bp:
                return left
            self.take()
            if bp == _BP_OR or bp == _BP_AND:
                kind = "or" if bp == _BP_OR else "and"
                right = self.expr(bp)
                if left is chain and chain.kind == kind:
                    chain.items.append(right)
                    chain.dyn = chain.dyn or right.dyn
                else:
                    left = chain = _Node(kind, items=[left, right])
            elif bp == _BP_SUM or bp == _BP_PRODUCT:
                right = self.expr(bp)
                if left is chain and chain.kind == "arith" and chain.value == bp:
                    chain.items.append((tok.value, right))
                    chain.dyn = chain.dyn or right.dyn
                else:
                    left = chain = _Node("arith", a=left, items=[(tok.value, right)], value=bp)
            else:
                if predicate_done:
                    raise self.error(
                        tok.pos, "comparisons cannot be chained; use AND or parentheses"
                    )
                left = self.predicate(left, tok)
                predicate_done = True

    def predicate(self, left: _Node, tok: _Tok) -> _Node:
        if tok.kind == "op":  # comparison
            return _Node("cmp", op=tok.value, a=left, b=self.expr(_BP_PRED))
        word = tok.value
        negated = False
        if word == "NOT":
            nxt = self.peek()
            if not (nxt.kind == "kw" and nxt.value in ("IN", "BETWEEN", "LIKE")):
                raise self.error(
                    nxt.pos,
                    f"expected IN, BETWEEN or LIKE after NOT, found {_describe(nxt, self.text)}",
                )
            tok = self.take()
            word = tok.value
            negated = True
        if word == "IS":
            negated = False
            nxt = self.take()
            if nxt.is_kw("NOT"):
                negated = True
                nxt = self.take()
            if not nxt.is_kw("NULL"):
                expected = "NULL" if negated else "NULL or NOT NULL"
                raise self.error(
                    nxt.pos, f"expected {expected} after IS, found {_describe(nxt, self.text)}"
                )
            return _Node("isnull", a=left, negated=negated)
        if word == "IN":
            return self.in_list(left, negated)
        if word == "BETWEEN":
            lo = self.expr(_BP_PRED)
            and_tok = self.take()
            if not and_tok.is_kw("AND"):
                raise self.error(
                    and_tok.pos,
                    f"expected AND in BETWEEN, found {_describe(and_tok, self.text)}",
                )
            hi = self.expr(_BP_PRED)
            return _Node("between", a=left, b=lo, c=hi, negated=negated)
        if word == "LIKE":
            pat = self.take()
            if pat.kind != "str":
                raise self.error(
                    pat.pos,
                    f"LIKE needs a quoted regular expression, found {_describe(pat, self.text)}",
                )
            try:
                regex = compile_pattern(pat.value)
            except PatternError as e:
                raise self.error(
                    pat.pos,
                    f"bad regular expression in LIKE: {e.why} (RE2 syntax: no backreferences or lookaround)",
                ) from None
            return _Node("like", a=left, value=regex, negated=negated)
        raise AssertionError(word)  # infix_bp admits no other keyword

    def in_list(self, left: _Node, negated: bool) -> _Node:
        opener = self.take()
        if not opener.is_op("("):
            raise self.error(
                opener.pos, f"expected '(' after IN, found {_describe(opener, self.text)}"
            )
        self.enter(opener)
        if self.peek().is_op(")"):
            raise self.error(self.peek().pos, "IN needs at least one value")
        items = []
        while True:
            items.append(self.expr(_BP_PRED))
            sep = self.take()
            if sep.is_op(")"):
                break
            if not sep.is_op(","):
                raise self.error(
                    sep.pos,
                    f"expected ',' or ')' in the IN list opened at position {opener.pos}, "
                    f"found {_describe(sep, self.text)}",
                )
        self.depth -= 1
        return _Node("in", a=left, items=items, negated=negated)

    def prefix(self) -> _Node:
        index = self.i
        tok = self.take()
        kind = tok.kind
        if kind == "num" or kind == "str":
            return _Node("const", value=tok.value, dyn=False)
        if kind == "path":
            return _Node("path", value=tok.value, dyn=True)
        if kind == "kw":
            v = tok.value
            if v == "TRUE" or v == "FALSE" or v == "NULL":
                return _Node(
                    "const", value={"TRUE": True, "FALSE": False, "NULL": None}[v], dyn=False
                )
            if v == "NOT":
                self.enter(tok)
                node = _Node("not", a=self.expr(_BP_NOT))
                self.depth -= 1
                return node
        elif kind == "op":
            v = tok.value
            if v == "(":
                self.enter(tok)
                if self.peek().is_op(")"):
                    raise self.error(self.peek().pos, "empty parentheses")
                node = self.expr(0)
                close = self.take()
                if not close.is_op(")"):
                    raise self.error(
                        close.pos,
                        f"expected ')' to close '(' at position {tok.pos}, "
                        f"found {_describe(close, self.text)}",
                    )
                self.depth -= 1
                return node
            if v == "-" or v == "+":
                self.enter(tok)
                node = _Node("unary", op=v, a=self.expr(_BP_UNARY))
                self.depth -= 1
                return node
        # Not a value. Name what came before, so "/a = " says "after '='".
        prev = self.toks[index - 1] if index > 0 else None
        where = f" after '{self.text[prev.pos : prev.end]}'" if prev is not None else ""
        raise self.error(tok.pos, f"expected a value{where}, found {_describe(tok, self.text)}")


# ---------------------------------------------------------------------------------------------
# Evaluation kernels: three-valued (True / False / None = UNKNOWN), never raising
# ---------------------------------------------------------------------------------------------

_OPFN = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_MISMATCH = {"=": False, "!=": True}  # values of different kinds; ordering is UNKNOWN
_KIND = {str: "s", int: "n", float: "n", bool: "b"}  # anything else (None, dict, list): NULL
_NUMERIC_STRING = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NUMERIC_CHARS = frozenset("0123456789+-")


def _parse_num(s: str):
    """The number a string spells, or None."""
    if not s or (s[0] not in _NUMERIC_CHARS and s[0] != ".") or not _NUMERIC_STRING.fullmatch(s):
        return None
    if "." in s or "e" in s or "E" in s:
        return float(s)
    try:
        return int(s)
    except ValueError:  # more digits than int() converts; a float is close enough
        return float(s)


def _to_num(x):
    xc = x.__class__
    if xc is int or xc is float:
        return x
    if xc is str:
        return _parse_num(x)
    return None


def _scalar_cmp(op: str, fn, left, right):
    """Compare two values, neither expanded as an array."""
    lc = left.__class__
    rc = right.__class__
    lk = _KIND.get(lc)
    rk = _KIND.get(rc)
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


def _cmp_right(op: str, fn, left, right):
    if right.__class__ is list:
        if not right:
            return None
        result = False
        for e in right:
            r = _scalar_cmp(op, fn, left, e)
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return _scalar_cmp(op, fn, left, right)


def _cmp(op: str, fn, left, right):
    """Three-valued ``left op right``, an array on either side meaning "any element"."""
    if left.__class__ is list:
        if not left or right is None:
            return None
        result = False
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


def _in(value, candidates):
    if value is None:
        return None
    result = False
    for c in candidates:
        r = _cmp("=", _EQ, value, c)
        if r is True:
            return True
        if r is None:
            result = None
    return result


def _scalar_between(value, lo, hi):
    a = _scalar_cmp(">=", _GE, value, lo)
    if a is False:
        return False
    b = _scalar_cmp("<=", _LE, value, hi)
    if b is False:
        return False
    return True if a is True and b is True else None


def _between(value, lo, hi):
    if value.__class__ is list:
        if not value:
            return None
        result = False
        for e in value:
            r = _scalar_between(e, lo, hi)
            if r is True:
                return True
            if r is None:
                result = None
        return result
    return _scalar_between(value, lo, hi)


def _like(value, search):
    vc = value.__class__
    if vc is str:
        return search(value) is not None
    if vc is list and value:
        result = False
        for e in value:
            if e.__class__ is str:
                if search(e) is not None:
                    return True
            else:
                result = None
        return result
    return None


def _div(a, b):
    if b == 0:
        return None
    if a.__class__ is int and b.__class__ is int:
        q = abs(a) // abs(b)  # truncate toward zero, as C and AMPS do
        return q if (a < 0) == (b < 0) else -q
    return a / b


def _mod(a, b):
    if b == 0:
        return None
    if a.__class__ is int and b.__class__ is int:
        r = abs(a) % abs(b)  # sign of the dividend, as C and AMPS do
        return -r if a < 0 else r
    return math.fmod(a, b)


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _div, "%": _mod}


def _arith(fn, a, b):
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


# ---------------------------------------------------------------------------------------------
# Code generation: each node gives a value closure, a "definitely TRUE" closure and a
# "definitely FALSE" closure. NOT swaps the last two, which is all three-valued logic needs;
# every condition closure returns a plain bool.
# ---------------------------------------------------------------------------------------------


def _always_true(body) -> bool:
    return True


def _always_false(body) -> bool:
    return False


def _getter(steps: tuple) -> Callable[[object], object]:
    if len(steps) == 1:
        (key,) = steps  # the first step is always a name

        def get1(body):
            return body.get(key) if body.__class__ is dict else None

        return get1
    if all(s.__class__ is str for s in steps):

        def get_keys(body):
            for key in steps:
                if body.__class__ is not dict:
                    return None
                body = body.get(key)
            return body

        return get_keys

    def get_steps(body):
        for step in steps:
            if step.__class__ is str:
                if body.__class__ is not dict:
                    return None
                body = body.get(step)
            else:
                if body.__class__ is not list or step >= len(body):
                    return None
                body = body[step]
        return body

    return get_steps


# Recursion here follows the nesting of the filter, so each level costs as few stack frames as
# possible (no helper layers, no comprehensions): MAX_FILTER_DEPTH levels must compile well
# inside the default recursion limit, whatever the caller's own stack depth.


def _constant(v) -> Callable[[object], object]:
    return lambda body: v


def _value(node: _Node) -> Callable[[object], object]:
    """A closure returning the node's value (None = NULL). Body-independent nodes are folded."""
    fn = node.memo.get("value")
    if fn is not None:
        return fn
    kind = node.kind
    if kind == "const":
        fn = _constant(node.value)
    elif kind == "path":
        fn = _getter(node.value)
    elif kind == "unary":
        f = _value(node.a)
        if node.op == "-":

            def neg(body):
                x = _to_num(f(body))
                return None if x is None else -x

            fn = neg
        else:

            def pos(body):
                return _to_num(f(body))

            fn = pos
    elif kind == "arith":
        first = _value(node.a)
        steps = []
        for op, operand in node.items:
            steps.append((_ARITH[op], _value(operand)))
        rest = tuple(steps)

        def arith(body):
            v = _to_num(first(body))
            if v is None:
                return None
            for op_fn, g in rest:
                w = _to_num(g(body))
                if w is None:
                    return None
                v = _arith(op_fn, v, w)
                if v is None:
                    return None
            return v

        fn = arith
    else:  # a condition used as a value: TRUE, FALSE or NULL
        fn = _tri(node)
    if not node.dyn and kind != "const":
        fn = _constant(fn(None))
    node.memo["value"] = fn
    return fn


def _tri(node: _Node) -> Callable[[object], object]:
    """A closure giving a condition's three-valued result: True, False or None (UNKNOWN).

    Used only where a condition is a value (``(/a = 1) = TRUE``, ``/b IN (/a > 1)``). It
    evaluates each subtree once: deriving it from the TRUE and FALSE closures would evaluate
    both, and nested conditions-as-values would then cost 2**depth per message."""
    kind = node.kind
    if kind == "not":
        f = _value(node.a)

        def not3(body):
            x = f(body)
            return not x if x.__class__ is bool else None

        return not3
    if kind == "and" or kind == "or":
        fns = []
        for item in node.items:
            fns.append(_value(item))
        fns = tuple(fns)
        stop = kind == "or"  # OR stops at the first TRUE, AND at the first FALSE

        def junction3(body):
            result = not stop
            for f in fns:
                x = f(body)
                if x is stop:
                    return stop
                if x is not result:  # UNKNOWN, or a non-boolean value
                    result = None
            return result

        return junction3
    if kind == "cmp":
        op = node.op
        op_fn = _OPFN[op]
        lf = _value(node.a)
        rf = _value(node.b)

        def cmp3(body):
            a = lf(body)
            if a is None:
                return None
            b = rf(body)
            if b is None:
                return None
            return _cmp(op, op_fn, a, b)

        return cmp3
    negated = node.negated
    get = _value(node.a)
    if kind == "isnull":

        def isnull3(body):
            return (get(body) is None) is not negated

        return isnull3
    if kind == "in":
        item_fns = []
        for item in node.items:
            item_fns.append(_value(item))
        item_fns = tuple(item_fns)

        def in3(body):
            x = _in(get(body), [f(body) for f in item_fns])
            return x if x is None or not negated else not x

        return in3
    if kind == "between":
        lo_fn = _value(node.b)
        hi_fn = _value(node.c)

        def between3(body):
            v = get(body)
            if v is None:
                return None
            x = _between(v, lo_fn(body), hi_fn(body))
            return x if x is None or not negated else not x

        return between3
    if kind == "like":
        search = node.value.search

        def like3(body):
            x = _like(get(body), search)
            return x if x is None or not negated else not x

        return like3
    raise AssertionError(kind)


def _const_value(node: _Node):
    """(True, value) when the node does not depend on the body, else (False, None)."""
    if node.dyn:
        return False, None
    return True, _value(node)(None)


def _condition(node: _Node, want: bool) -> Callable[[object], bool]:
    """A closure that is True exactly when the node is TRUE (``want``) or exactly when it is
    FALSE (``not want``); UNKNOWN gives False either way. NOT swaps the two."""
    fn = node.memo.get(want)
    if fn is not None:
        return fn
    kind = node.kind
    if kind == "not":
        fn = _condition(node.a, not want)
    elif kind == "and" or kind == "or":
        fns = []
        for item in node.items:
            fns.append(_condition(item, want))
        # TRUE of AND and FALSE of OR need every item; the other two need any item.
        fn = _junction(fns, every=(kind == "and") == want)
    elif kind == "cmp":
        fn = _comparison(node, want)
    elif kind == "isnull":
        get = _value(node.a)
        if node.negated == want:  # IS NOT NULL is TRUE / IS NULL is FALSE

            def not_null(body):
                return get(body) is not None

            fn = not_null
        else:

            def null(body):
                return get(body) is None

            fn = null
    elif kind == "in":
        fn = _in_condition(node, want ^ node.negated)
    elif kind == "between":
        fn = _between_condition(node, want ^ node.negated)
    elif kind == "like":
        fn = _like_condition(node, want ^ node.negated)
    else:  # a plain value used as a condition: only a boolean is TRUE or FALSE
        get = _value(node)

        def is_bool(body):
            return get(body) is want

        fn = is_bool
    if not node.dyn and fn is not _always_true and fn is not _always_false:
        fn = _always_true if fn(None) else _always_false
    node.memo[want] = fn
    return fn


def _junction(fns: list, every: bool) -> Callable[[object], bool]:
    """Every (or any) of ``fns``, with constant members folded."""
    absorbing, neutral = (_always_false, _always_true) if every else (_always_true, _always_false)
    if absorbing in fns:
        return absorbing
    fns = [f for f in fns if f is not neutral]
    if not fns:
        return neutral
    if len(fns) == 1:
        return fns[0]
    if len(fns) == 2:
        f1, f2 = fns
        if every:
            return lambda body: f1(body) and f2(body)
        return lambda body: f1(body) or f2(body)
    fns = tuple(fns)
    if every:

        def every_of(body):
            for f in fns:
                if not f(body):
                    return False
            return True

        return every_of

    def any_of(body):
        for f in fns:
            if f(body):
                return True
        return False

    return any_of


def _comparison(node: _Node, want: bool) -> Callable[[object], bool]:
    op, left, right = node.op, node.a, node.b
    if left.kind != "path" and right.kind == "path" and not left.dyn:
        op, left, right = _FLIP[op], right, left
    if left.kind == "path" and not right.dyn:
        return _compare_field_const(left.value, op, _value(right)(None), want)
    fn = _OPFN[op]
    lf = _value(left)
    rf = _value(right)

    def compare(body):
        a = lf(body)
        if a is None:
            return False
        b = rf(body)
        if b is None:
            return False
        return _cmp(op, fn, a, b) is want

    return compare


class _NoValue:
    """A class no JSON value has: turns a type-checked fast path off."""


def _compare_field_const(steps: tuple, op: str, lit, want: bool) -> Callable[[object], bool]:
    """``/field op literal``: the hot path of most subscriptions."""
    if lit is None:  # a comparison with NULL is never TRUE nor FALSE
        return _always_false
    fn = _OPFN[op]
    lc = lit.__class__
    if lc is str:
        c1 = c2 = str
    elif lc is int or lc is float:
        c1, c2 = int, float
    elif lc is bool and (op == "=" or op == "!="):
        c1 = c2 = bool
    else:
        c1 = c2 = _NoValue
    # Values of the literal's kind compare with plain Python operators; anything else
    # (numeric strings, arrays, mixed kinds) goes through the three-valued kernel.
    if len(steps) == 1:
        key = steps[0]
        if want and op == "=":

            def field_eq(body):
                if body.__class__ is dict:
                    v = body.get(key)
                    vc = v.__class__
                    if vc is c1 or vc is c2:
                        return v == lit
                    if v is not None:
                        return _cmp(op, fn, v, lit) is True
                return False

            return field_eq
        if want:

            def field_cmp(body):
                if body.__class__ is dict:
                    v = body.get(key)
                    vc = v.__class__
                    if vc is c1 or vc is c2:
                        return fn(v, lit)
                    if v is not None:
                        return _cmp(op, fn, v, lit) is True
                return False

            return field_cmp

        def field_not_cmp(body):
            if body.__class__ is dict:
                v = body.get(key)
                vc = v.__class__
                if vc is c1 or vc is c2:
                    return not fn(v, lit)
                if v is not None:
                    return _cmp(op, fn, v, lit) is False
            return False

        return field_not_cmp

    get = _getter(steps)

    def path_cmp(body):
        v = get(body)
        vc = v.__class__
        if vc is c1 or vc is c2:
            return fn(v, lit) is want
        if v is None:
            return False
        return _cmp(op, fn, v, lit) is want

    return path_cmp


def _in_condition(node: _Node, want: bool) -> Callable[[object], bool]:
    """TRUE (``want``) or FALSE of ``a IN (items)``; NOT IN is handled by flipping ``want``."""
    get = _value(node.a)
    item_fns = []
    for item in node.items:
        item_fns.append(_value(item))
    if not any(item.dyn for item in node.items):
        candidates = tuple(f(None) for f in item_fns)
        fast = None
        if all(c.__class__ is str for c in candidates):
            fast, c1, c2 = frozenset(candidates), str, str
        elif all(c.__class__ is int or c.__class__ is float for c in candidates):
            fast, c1, c2 = frozenset(candidates), int, float
        if fast is not None:

            def in_set(body):
                v = get(body)
                vc = v.__class__
                if vc is c1 or vc is c2:
                    return (v in fast) is want
                if v is None:
                    return False
                return _in(v, candidates) is want

            return in_set

        def in_constants(body):
            return _in(get(body), candidates) is want

        return in_constants
    item_fns = tuple(item_fns)

    def in_values(body):
        v = get(body)
        if v is None:
            return False
        return _in(v, [f(body) for f in item_fns]) is want

    return in_values


def _between_condition(node: _Node, want: bool) -> Callable[[object], bool]:
    get = _value(node.a)
    lo_const, lo = _const_value(node.b)
    hi_const, hi = _const_value(node.c)
    if lo_const and hi_const:
        kinds = {_KIND.get(lo.__class__), _KIND.get(hi.__class__)}
        if kinds == {"n"}:
            c1, c2 = int, float
        elif kinds == {"s"}:
            c1 = c2 = str
        else:
            c1 = c2 = _NoValue

        def between_constants(body):
            v = get(body)
            vc = v.__class__
            if vc is c1 or vc is c2:
                return (lo <= v <= hi) is want
            if v is None:
                return False
            return _between(v, lo, hi) is want

        return between_constants
    lo_fn = _value(node.b)
    hi_fn = _value(node.c)

    def between_values(body):
        v = get(body)
        if v is None:
            return False
        return _between(v, lo_fn(body), hi_fn(body)) is want

    return between_values


def _like_condition(node: _Node, want: bool) -> Callable[[object], bool]:
    get = _value(node.a)
    search = node.value.search

    def like(body):
        v = get(body)
        if v.__class__ is str:
            return (search(v) is not None) is want
        return _like(v, search) is want

    return like


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _match_all(body) -> bool:
    return True


def _match_none(body) -> bool:
    return False


def _compile(text: str) -> Callable[[object], bool]:
    if len(text) > MAX_FILTER_TEXT:
        raise FilterError(
            text,
            MAX_FILTER_TEXT,
            f"filter is {len(text)} characters long; the limit is {MAX_FILTER_TEXT}",
        )
    try:
        node = _Parser(text, _lex(text)).parse()
        test = _condition(node, True)
    except RecursionError:  # only if the caller's stack is already nearly full
        raise FilterError(text, 0, "filter nested too deeply to compile here") from None
    if test is _always_true:
        return _match_all
    if test is _always_false:
        return _match_none

    def predicate(body) -> bool:
        try:
            return test(body)
        except Exception:
            return False

    return predicate


_compile_cached = functools.lru_cache(maxsize=1024)(_compile)


def compile_filter(text: str) -> Callable[[object], bool]:
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


def _body_match_all(data) -> bool:
    return True


def _body_match_none(data) -> bool:
    return False


@functools.lru_cache(maxsize=1024)
def _compile_body(text: str) -> Callable[[bytes], bool]:
    predicate = compile_filter(text)
    if predicate is _match_all:  # 1=1 matches every message, JSON or not, without decoding
        return _body_match_all
    if predicate is _match_none:
        return _body_match_none

    def body_predicate(data) -> bool:
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
