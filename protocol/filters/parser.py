"""The parser of the filter language: tokens to a syntax tree (:mod:`.tree`).

Grammar (EBNF). Keywords are case-insensitive; whitespace separates tokens::

    filter    = expr EOF ;
    expr      = and { "OR" and } ;
    and       = not { "AND" not } ;
    not       = "NOT" not | predicate ;
    predicate = sum [ cmp_op sum                              (* not chainable: a = b = c fails *)
                    | [ "NOT" ] "IN" "(" sum { "," sum } ")"
                    | [ "NOT" ] "BETWEEN" sum "AND" sum        (* inclusive *)
                    | [ "NOT" ] "LIKE" string                  (* RE2 syntax, search semantics *)
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

Nesting (parentheses, ``NOT``, unary signs, ``IN`` lists) deeper than
:data:`~protocol.filters.errors.MAX_FILTER_DEPTH` fails. Every failure is a :class:`FilterError`
with the position of the offending token and a detail that names it. ``LIKE`` patterns are
compiled here (through ``protocol.patterns``), so a bad pattern fails at parse time.
"""

from __future__ import annotations

from typing import Any, cast

from protocol.patterns import PatternError, compile_pattern

from .errors import MAX_FILTER_DEPTH, FilterError
from .lexer import Token, describe, lex
from .tree import (
    Arith,
    Between,
    Compare,
    Const,
    Field,
    In,
    IsNull,
    Junction,
    Like,
    Node,
    Not,
    Unary,
)

__all__ = ["parse"]


# Binding powers (higher binds tighter).
_BP_OR, _BP_AND, _BP_NOT, _BP_PRED, _BP_SUM, _BP_PRODUCT, _BP_UNARY = 10, 20, 30, 40, 50, 60, 70
_CMP_OPS = frozenset({"=", "!=", "<", "<=", ">", ">="})
_PRED_KWS = frozenset({"IN", "BETWEEN", "LIKE", "IS", "NOT"})


class _Parser:
    """Precedence climbing over the token list. Recursion happens only through nesting
    (parentheses, NOT, unary signs, IN lists), which ``depth`` bounds; chains of AND, OR, + and
    * become n-ary nodes, so a long flat filter builds a shallow tree."""

    def __init__(self, text: str, toks: list[Token]) -> None:
        self.text = text
        self.toks = toks
        self.i = 0
        self.depth = 0

    def error(self, pos: int, detail: str) -> FilterError:
        return FilterError(self.text, pos, detail)

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        tok = self.toks[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def enter(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_FILTER_DEPTH:
            raise self.error(tok.pos, f"nesting deeper than {MAX_FILTER_DEPTH} levels")

    def parse(self) -> Node:
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
                f"unexpected {describe(tok, self.text)} after a complete expression "
                f"(expected AND, OR or end of filter{hint})",
            )
        return node

    def infix_bp(self, tok: Token) -> int | None:
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

    def expr(self, min_bp: int) -> Node:
        left = self.prefix()
        chain: Junction | Arith | None = None  # the n-ary node this loop built last, to extend
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
                if left is chain and isinstance(chain, Junction) and chain.kind == kind:
                    chain.items.append(right)
                    chain.dyn = chain.dyn or right.dyn
                else:
                    left = chain = Junction(kind, [left, right])
            elif bp == _BP_SUM or bp == _BP_PRODUCT:
                right = self.expr(bp)
                op = cast(str, tok.value)
                if left is chain and isinstance(chain, Arith) and chain.level == bp:
                    chain.rest.append((op, right))
                    chain.dyn = chain.dyn or right.dyn
                else:
                    left = chain = Arith(left, [(op, right)], bp)
            else:
                if predicate_done:
                    raise self.error(
                        tok.pos, "comparisons cannot be chained; use AND or parentheses"
                    )
                left = self.predicate(left, tok)
                predicate_done = True

    def predicate(self, left: Node, tok: Token) -> Node:
        if tok.kind == "op":  # comparison
            return Compare(cast(str, tok.value), left, self.expr(_BP_PRED))
        word = tok.value
        negated = False
        if word == "NOT":
            nxt = self.peek()
            if not (nxt.kind == "kw" and nxt.value in ("IN", "BETWEEN", "LIKE")):
                raise self.error(
                    nxt.pos,
                    f"expected IN, BETWEEN or LIKE after NOT, found {describe(nxt, self.text)}",
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
                    nxt.pos, f"expected {expected} after IS, found {describe(nxt, self.text)}"
                )
            return IsNull(left, negated)
        if word == "IN":
            return self.in_list(left, negated)
        if word == "BETWEEN":
            lo = self.expr(_BP_PRED)
            and_tok = self.take()
            if not and_tok.is_kw("AND"):
                raise self.error(
                    and_tok.pos,
                    f"expected AND in BETWEEN, found {describe(and_tok, self.text)}",
                )
            hi = self.expr(_BP_PRED)
            return Between(left, lo, hi, negated)
        if word == "LIKE":
            pat = self.take()
            if pat.kind != "str":
                raise self.error(
                    pat.pos,
                    f"LIKE needs a quoted regular expression, found {describe(pat, self.text)}",
                )
            try:
                # Any: protocol.patterns spells its Pattern type so that mypy cannot read it
                regex: Any = compile_pattern(cast(str, pat.value))
            except PatternError as e:
                raise self.error(
                    pat.pos,
                    f"bad regular expression in LIKE: {e.why} (RE2 syntax: no backreferences or lookaround)",
                ) from None
            return Like(left, regex.search, negated)
        raise AssertionError(word)  # infix_bp admits no other keyword

    def in_list(self, left: Node, negated: bool) -> Node:
        opener = self.take()
        if not opener.is_op("("):
            raise self.error(
                opener.pos, f"expected '(' after IN, found {describe(opener, self.text)}"
            )
        self.enter(opener)
        if self.peek().is_op(")"):
            raise self.error(self.peek().pos, "IN needs at least one value")
        items: list[Node] = []
        while True:
            items.append(self.expr(_BP_PRED))
            sep = self.take()
            if sep.is_op(")"):
                break
            if not sep.is_op(","):
                raise self.error(
                    sep.pos,
                    f"expected ',' or ')' in the IN list opened at position {opener.pos}, "
                    f"found {describe(sep, self.text)}",
                )
        self.depth -= 1
        return In(left, items, negated)

    def prefix(self) -> Node:
        index = self.i
        tok = self.take()
        kind = tok.kind
        if kind == "num" or kind == "str":
            return Const(tok.value)
        if kind == "path":
            return Field(cast("tuple[str | int, ...]", tok.value))
        if kind == "kw":
            v = tok.value
            if v == "TRUE" or v == "FALSE" or v == "NULL":
                return Const({"TRUE": True, "FALSE": False, "NULL": None}[v])
            if v == "NOT":
                self.enter(tok)
                node: Node = Not(self.expr(_BP_NOT))
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
                        f"found {describe(close, self.text)}",
                    )
                self.depth -= 1
                return node
            if v == "-" or v == "+":
                self.enter(tok)
                node = Unary(v, self.expr(_BP_UNARY))
                self.depth -= 1
                return node
        # Not a value. Name what came before, so "/a = " says "after '='".
        prev = self.toks[index - 1] if index > 0 else None
        where = f" after '{self.text[prev.pos : prev.end]}'" if prev is not None else ""
        raise self.error(tok.pos, f"expected a value{where}, found {describe(tok, self.text)}")


def parse(text: str) -> Node:
    """The syntax tree of ``text``. Raises :class:`FilterError`; the caller checks the length
    of the text first (the lexer and the parser do not)."""
    return _Parser(text, lex(text)).parse()
