"""What a filter reads, and its simple forms as a program for the block scanner (server/_filterscan.c).

:func:`fields_read` names the top-level fields a filter looks at, so a body can be decoded into
just those (:func:`subset_decoder`). :func:`build_program` turns the common shapes into the
scanner's program (its layout is written at the top of server/_filterscan.c):

- a top-level field compared with a constant (either side), ``IN`` a list of constants,
  ``BETWEEN`` two constants, ``IS [NOT] NULL``, ``LIKE`` a literal or ``'^'`` + a literal;
- ``AND``, ``OR`` and ``NOT`` of those.

Anything else (nested paths, arithmetic, a field compared with a field, regular expressions)
gives None: such filters are evaluated by the Python closures only. A program is an
optimisation, never a meaning: the scanner answers "unsure" for every body it cannot decide
exactly as the closures would, and the caller asks the closures then.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable
from typing import Any, TypedDict

import msgspec

from .compiler import _value
from .kernels import FLIP
from .tree import Between, Compare, Field, In, IsNull, Junction, Like, Node, Not

__all__ = ["build_program", "equality", "fields_read", "subset_decoder"]

_MAX_FIELDS = 16
_MAX_OPS = 256
_MAX_STACK = 64
_OPS = {"=": 0, "!=": 1, "<": 2, "<=": 3, ">": 4, ">=": 5}
_LITERAL = re.compile(r"\^?[^\\.^$|?*+()\[\]{}]*")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def fields_read(node: Node) -> frozenset[str]:
    """The top-level field names the filter reads (the first step of every path)."""
    names: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Field):
            names.add(str(n.steps[0]))
            continue
        for slot in ("operand", "left", "right", "first", "low", "high"):
            child = getattr(n, slot, None)
            if isinstance(child, Node):
                stack.append(child)
        for slot in ("items", "rest"):
            for child in getattr(n, slot, None) or ():
                stack.append(child[1] if isinstance(child, tuple) else child)
    return frozenset(names)


@functools.lru_cache(maxsize=256)
def subset_decoder(fields: frozenset[str]) -> Callable[[bytes], Any]:
    """``decode(body) -> dict`` of only ``fields`` (absent ones left out): msgspec skips the
    other members without building them. It raises ``msgspec.ValidationError`` when the body
    is JSON but not an object, and does not check the text of members it skips beyond their
    syntax (callers give it ASCII bodies only: it does not check UTF-8 in skipped strings)."""
    shape = TypedDict("shape", {name: Any for name in fields}, total=False)  # type: ignore[misc]
    return msgspec.json.Decoder(shape).decode


def equality(node: Node) -> tuple[str, Any] | None:
    """``(field, value)`` when the filter is exactly ``/field = constant`` (a top-level field,
    a string, number or boolean): what an index of many subscriptions can look up."""
    if not isinstance(node, Compare) or node.op != "=":
        return None
    left, right = node.left, node.right
    if not isinstance(left, Field):
        left, right = right, left
    if not isinstance(left, Field) or len(left.steps) != 1 or right.dyn:
        return None
    value = _value(right)(None)
    if value is None or value.__class__ not in (str, int, float, bool):
        return None
    return str(left.steps[0]), value


class _Ineligible(Exception):
    """The filter has a shape the scanner does not take."""


def _const(v: Any) -> bytes:
    vc = v.__class__
    if vc is bool:
        return b"t" if v else b"f"
    if v is None:
        return b"z"
    if vc is int:
        if not -(1 << 63) <= v < (1 << 63):
            raise _Ineligible
        return b"i" + _I64.pack(v)
    if vc is float:
        return b"d" + _F64.pack(v)
    if vc is str:
        raw = v.encode("utf-8", "surrogatepass")
        return b"s" + struct.pack("<I", len(raw)) + raw
    raise _Ineligible


class _Builder:
    def __init__(self) -> None:
        self.fields: list[str] = []
        self.ops: list[bytes] = []
        self.depth = 0

    def field(self, node: Node) -> int:
        if not isinstance(node, Field) or len(node.steps) != 1:
            raise _Ineligible
        name = str(node.steps[0])
        if name not in self.fields:
            if len(self.fields) == _MAX_FIELDS:
                raise _Ineligible
            self.fields.append(name)
        return self.fields.index(name)

    def const(self, node: Node) -> bytes:
        if node.dyn:
            raise _Ineligible
        return _const(_value(node)(None))

    def emit(self, op: bytes, pushes: int) -> None:
        self.ops.append(op)
        self.depth += pushes
        if len(self.ops) > _MAX_OPS or self.depth > _MAX_STACK:
            raise _Ineligible

    def compare(self, field: int, op: str, const: bytes) -> None:
        self.emit(b"C" + bytes((field, _OPS[op])) + const, 1)

    def node(self, n: Node) -> None:
        if isinstance(n, Not):
            self.node(n.operand)
            self.emit(b"!", 0)
        elif isinstance(n, Junction):
            for item in n.items:
                self.node(item)
            if len(n.items) > 1:
                tag = b"&" if n.kind == "and" else b"|"
                self.emit(tag + struct.pack("<H", len(n.items)), 1 - len(n.items))
        elif isinstance(n, Compare):
            op, left, right = n.op, n.left, n.right
            if not isinstance(left, Field):
                op, left, right = FLIP[op], right, left
            self.compare(self.field(left), op, self.const(right))
        elif isinstance(n, In):
            f = self.field(n.operand)
            consts = b"".join(self.const(item) for item in n.items)
            self.emit(b"I" + bytes((f,)) + struct.pack("<H", len(n.items)) + consts, 1)
            if n.negated:
                self.emit(b"!", 0)
        elif isinstance(n, Between):
            f = self.field(n.operand)
            self.compare(f, ">=", self.const(n.low))
            self.compare(f, "<=", self.const(n.high))
            self.emit(b"&\x02\x00", -1)
            if n.negated:
                self.emit(b"!", 0)
        elif isinstance(n, IsNull):
            self.emit(b"N" + bytes((self.field(n.operand), int(n.negated))), 1)
        elif isinstance(n, Like):
            f = self.field(n.operand)
            pattern = getattr(getattr(n.search, "__self__", None), "pattern", None)
            if not isinstance(pattern, str) or not _LITERAL.fullmatch(pattern):
                raise _Ineligible
            mode = 0 if pattern.startswith("^") else 1
            lit = pattern[1 - mode :].encode()
            if len(lit) > 0xFFFF:
                raise _Ineligible
            self.emit(b"L" + bytes((f, mode)) + struct.pack("<H", len(lit)) + lit, 1)
            if n.negated:
                self.emit(b"!", 0)
        else:
            raise _Ineligible

    def program(self) -> bytes:
        head = [bytes((len(self.fields),))]
        for name in self.fields:
            raw = name.encode("utf-8", "surrogatepass")
            if len(raw) > 0xFFFF:
                raise _Ineligible
            head.append(struct.pack("<H", len(raw)) + raw)
        return b"".join(head + self.ops)


def build_program(node: Node) -> bytes | None:
    """The scanner's program for the filter, or None when its shape is not one the scanner
    takes (the module docstring lists them)."""
    if not node.dyn:
        return None
    b = _Builder()
    try:
        b.node(node)
        return b.program()
    except (_Ineligible, RecursionError):
        return None
