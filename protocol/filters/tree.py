"""The syntax tree of the filter language: what the parser builds and the compiler reads.

Nodes, their fields, and filter text that makes them:

- ``Const``: ``value``, a number, a string, True, False or None (NULL). ``5``, ``'x'``, ``NULL``
- ``Field``: ``steps``, ``str`` keys and ``int`` array indexes. ``/a/b[0]``
- ``Unary``: ``op`` (``-`` or ``+``), ``operand``. ``-/a``
- ``Arith``: ``first``, then ``rest`` ``[(op, node), ...]`` applied left to right; ``level`` is
  the binding power (``+ -`` or ``* / %``): a chain only extends at its own level. ``/a + 1 - 2``
- ``Compare``: ``op`` (``= != < <= > >=``, normalised), ``left``, ``right``. ``/a = 1``
- ``In``: ``operand``, ``items``, ``negated``. ``/a NOT IN (1, 2)``
- ``Between``: ``operand``, ``low``, ``high`` (inclusive), ``negated``. ``/a BETWEEN 1 AND 2``
- ``Like``: ``operand``, ``search`` (the compiled pattern's ``search``), ``negated``.
  ``/a LIKE '^x'``
- ``IsNull``: ``operand``, ``negated`` (IS NOT NULL). ``/a IS NOT NULL``
- ``Junction``: ``kind`` (``'and'`` or ``'or'``), ``items``. ``/a = 1 AND /b = 2``
- ``Not``: ``operand``. ``NOT /a = 1``

Every node has ``dyn``, whether it depends on the body (a node that does not is folded to a
constant at compile time), and ``memo``, the compiler's closures for it by mode (``"value"``,
True, False): a condition used as a value compiles in up to three modes, each once. Chains of
AND, OR, ``+`` and ``*`` are n-ary nodes, which the parser extends in place (``items`` /
``rest`` and ``dyn``), so a long flat filter is a shallow tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "Arith",
    "Between",
    "Compare",
    "Const",
    "Field",
    "In",
    "IsNull",
    "Junction",
    "Like",
    "Node",
    "Not",
    "Unary",
]


class Node:
    """A node of the syntax tree; see the module docstring for the kinds."""

    __slots__ = ("dyn", "memo")

    def __init__(self, dyn: bool) -> None:
        self.dyn = dyn
        self.memo: dict[object, Any] = {}


class Const(Node):
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        super().__init__(False)
        self.value = value


class Field(Node):
    __slots__ = ("steps",)

    def __init__(self, steps: tuple[str | int, ...]) -> None:
        super().__init__(True)
        self.steps = steps


class Unary(Node):
    __slots__ = ("op", "operand")

    def __init__(self, op: str, operand: Node) -> None:
        super().__init__(operand.dyn)
        self.op = op
        self.operand = operand


class Arith(Node):
    __slots__ = ("first", "level", "rest")

    def __init__(self, first: Node, rest: list[tuple[str, Node]], level: int) -> None:
        super().__init__(first.dyn or any(node.dyn for _, node in rest))
        self.first = first
        self.rest = rest
        self.level = level


class Compare(Node):
    __slots__ = ("left", "op", "right")

    def __init__(self, op: str, left: Node, right: Node) -> None:
        super().__init__(left.dyn or right.dyn)
        self.op = op
        self.left = left
        self.right = right


class In(Node):
    __slots__ = ("items", "negated", "operand")

    def __init__(self, operand: Node, items: list[Node], negated: bool) -> None:
        super().__init__(operand.dyn or any(item.dyn for item in items))
        self.operand = operand
        self.items = items
        self.negated = negated


class Between(Node):
    __slots__ = ("high", "low", "negated", "operand")

    def __init__(self, operand: Node, low: Node, high: Node, negated: bool) -> None:
        super().__init__(operand.dyn or low.dyn or high.dyn)
        self.operand = operand
        self.low = low
        self.high = high
        self.negated = negated


class Like(Node):
    __slots__ = ("negated", "operand", "search")

    def __init__(self, operand: Node, search: Callable[[str], object], negated: bool) -> None:
        super().__init__(operand.dyn)
        self.operand = operand
        self.search = search
        self.negated = negated


class IsNull(Node):
    __slots__ = ("negated", "operand")

    def __init__(self, operand: Node, negated: bool) -> None:
        super().__init__(operand.dyn)
        self.operand = operand
        self.negated = negated


class Junction(Node):
    __slots__ = ("items", "kind")

    def __init__(self, kind: str, items: list[Node]) -> None:
        super().__init__(any(item.dyn for item in items))
        self.kind = kind
        self.items = items


class Not(Node):
    __slots__ = ("operand",)

    def __init__(self, operand: Node) -> None:
        super().__init__(operand.dyn)
        self.operand = operand
