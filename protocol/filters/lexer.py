"""The lexer of the filter language: filter text to a list of :class:`Token`.

Token kinds and their values:

=======  =====================================================================================
kind     value
=======  =====================================================================================
'num'    the number (``int``, or ``float`` when it has a ``.`` or an exponent)
'str'    the decoded string (a doubled quote is one quote; backslashes are literal)
'path'   the field's steps: ``str`` keys and ``int`` array indexes (``/a/b[0]``)
'op'     the operator symbol, normalised: ``==`` is ``=``, ``<>`` is ``!=``, ``MOD`` is ``%``
'kw'     the keyword in upper case (``AND``, ``OR``, ``NOT``, ``IN``, ``BETWEEN``, ``LIKE``,
         ``IS``, ``NULL``, ``TRUE``, ``FALSE``)
'eof'    None; always the last token, at ``len(text)``
=======  =====================================================================================

``/`` is the one ambiguous character: followed by a letter, ``_``, ``@`` or ``$`` it starts a
field; followed by a digit or ``.`` it starts a field only where an operand is expected (``/0``
is a field, ``10/2`` a division); anything else makes it division.
Every failure is a :class:`FilterError` at the position of the offending character.
"""

from __future__ import annotations

import re
from typing import cast

from .errors import FilterError

__all__ = ["Token", "TokenValue", "describe", "lex"]

TokenValue = int | float | str | tuple[str | int, ...] | None

_KEYWORDS = frozenset(
    {"AND", "OR", "NOT", "IN", "BETWEEN", "LIKE", "IS", "NULL", "TRUE", "FALSE", "MOD"}
)
_TWO_CHAR_OPS = frozenset({"<=", ">=", "<>", "!=", "=="})
_ONE_CHAR_OPS = frozenset("=<>+-*%(),")


def _digit(ch: str) -> bool:
    return ch.isascii() and ch.isdigit()


_NUMBER_TOKEN = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_WORD = re.compile(r"[A-Za-z_]\w*")


def _is_name_char(c: str) -> bool:
    return c != "" and (c.isalnum() or c in "_@$.")


def _is_name_start(c: str) -> bool:
    return c != "" and (c.isalpha() or c in "_@$")


class Token:
    """One token: ``kind`` and ``value`` as in the module's table, ``pos`` and ``end`` its
    character span in the text."""

    __slots__ = ("end", "kind", "pos", "value")

    def __init__(self, kind: str, value: TokenValue, pos: int, end: int) -> None:
        self.kind = kind
        self.value = value
        self.pos = pos
        self.end = end

    def is_op(self, sym: str) -> bool:
        return self.kind == "op" and self.value == sym

    def is_kw(self, word: str) -> bool:
        return self.kind == "kw" and self.value == word


def lex(text: str) -> list[Token]:
    """The tokens of ``text``, ending with one 'eof' token. Raises :class:`FilterError`."""
    toks: list[Token] = []
    n = len(text)
    i = 0
    # Whether the next token starts an operand; decides whether "/" is a field or division.
    operand = True
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            toks.append(Token("eof", None, n, n))
            return toks
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        start = i
        if c == "/" and (_is_name_start(nxt) or (operand and _is_name_char(nxt))):
            steps, i = _lex_path(text, i)
            toks.append(Token("path", steps, start, i))
            operand = False
        elif c == "/":
            if operand:
                raise FilterError(text, i + 1, "expected a field name after '/'")
            toks.append(Token("op", "/", i, i + 1))
            i += 1
            operand = True
        elif _digit(c) or (c == "." and _digit(nxt)):
            # ASCII digits only: "²".isdigit() is True, but no number starts with it
            m = cast("re.Match[str]", _NUMBER_TOKEN.match(text, i))
            i = m.end()
            raw = m.group()
            if i < n and _is_name_char(text[i]):
                j = i
                while j < n and _is_name_char(text[j]):
                    j += 1
                raise FilterError(
                    text, start, f"malformed number '{text[start:j]}' (put a space after a number)"
                )
            number: int | float
            if any(ch in raw for ch in ".eE"):
                number = float(raw)
            else:
                try:
                    number = int(raw)
                except ValueError:  # more digits than int() will convert
                    raise FilterError(text, start, "number has too many digits") from None
            toks.append(Token("num", number, start, i))
            operand = False
        elif c == "'" or c == '"':
            string, i = _lex_string(text, i)
            toks.append(Token("str", string, start, i))
            operand = False
        elif text[i : i + 2] in _TWO_CHAR_OPS:
            sym = text[i : i + 2]
            toks.append(Token("op", "=" if sym == "==" else "!=" if sym == "<>" else sym, i, i + 2))
            i += 2
            operand = True
        elif c in _ONE_CHAR_OPS:
            toks.append(Token("op", c, i, i + 1))
            i += 1
            operand = c != ")"
        elif c.isalpha() or c == "_":
            w = _WORD.match(text, i)
            word = w.group() if w else c
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
                toks.append(Token("op", "%", start, i))
                operand = True
            else:
                toks.append(Token("kw", upper, start, i))
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
            while j < n and _digit(text[j]):
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
    parts: list[str] = []
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


def describe(tok: Token, text: str) -> str:
    """The token as an error message names it: ``number '12'``, ``field '/a'``, ``string 'x'``,
    ``end of filter``; long tokens are cut."""
    if tok.kind == "eof":
        return "end of filter"
    raw = text[tok.pos : tok.end]
    if len(raw) > 40:
        raw = raw[:37] + "..."
    label = {"num": "number ", "str": "string ", "path": "field "}.get(tok.kind, "")
    return f"{label}'{raw}'" if tok.kind != "str" else f"string {raw}"
