"""The compiler of the filter language: a syntax tree (:mod:`.tree`) to nested Python closures.

Each node gives up to three closures, memoised on the node: its value (``None`` = NULL), a
"definitely TRUE" condition and a "definitely FALSE" condition. ``NOT`` swaps the last two,
which is all three-valued logic needs, and every condition closure returns a plain ``bool``.
Evaluating a message is then a few closure calls, with no tree walking and no ``eval``.
Field paths are resolved with precomputed key tuples, the common shapes (``/a = 'x'``,
``/n > 5``, ``/a IN (...)``, ``BETWEEN`` with constant bounds) have specialised closures with
a type-checked fast path, and nodes that do not depend on the body are folded at compile
time. Where a fast path cannot decide, the closures call the three-valued kernels of
:mod:`protocol.filters.kernels`, which define the semantics.

A closure may raise on a body that is not what ``msgspec.json.decode`` returns; the caller
(:func:`protocol.filters.api.compile_filter`) turns that into False.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .kernels import ARITH, FLIP, KIND, OPFN, arith, between, cmp, in_, like, to_num
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

__all__ = ["Condition", "ValueFn", "always_false", "always_true", "condition", "path_getter"]

ValueFn = Callable[[Any], Any]
"""A closure from a decoded body to a value (None = NULL)."""

Condition = Callable[[Any], bool]
"""A closure from a decoded body to a plain bool."""


def always_true(body: Any) -> bool:
    return True


def always_false(body: Any) -> bool:
    return False


def path_getter(steps: tuple[str | int, ...]) -> ValueFn:
    """The value at a field path of a decoded body, None where there is none."""
    return _getter(steps)


def _getter(steps: tuple[str | int, ...]) -> ValueFn:
    if len(steps) == 1:
        (key,) = steps  # the first step is always a name

        def get1(body: Any) -> Any:
            return body.get(key) if body.__class__ is dict else None

        return get1
    if all(s.__class__ is str for s in steps):

        def get_keys(body: Any) -> Any:
            for key in steps:
                if body.__class__ is not dict:
                    return None
                body = body.get(key)
            return body

        return get_keys

    path: tuple[Any, ...] = steps  # keys and indexes, told apart by their class below

    def get_steps(body: Any) -> Any:
        for step in path:
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


def _constant(v: Any) -> ValueFn:
    return lambda body: v


def _value(node: Node) -> ValueFn:
    """A closure returning the node's value (None = NULL). Body-independent nodes are folded."""
    fn = node.memo.get("value")
    if fn is not None:
        return fn
    if isinstance(node, Const):
        fn = _constant(node.value)
    elif isinstance(node, Field):
        fn = _getter(node.steps)
    elif isinstance(node, Unary):
        f = _value(node.operand)
        if node.op == "-":

            def neg(body: Any) -> Any:
                x = to_num(f(body))
                return None if x is None else -x

            fn = neg
        else:

            def pos(body: Any) -> Any:
                return to_num(f(body))

            fn = pos
    elif isinstance(node, Arith):
        first = _value(node.first)
        steps = []
        for op, operand in node.rest:
            steps.append((ARITH[op], _value(operand)))
        rest = tuple(steps)

        def arithmetic(body: Any) -> Any:
            v = to_num(first(body))
            if v is None:
                return None
            for op_fn, g in rest:
                w = to_num(g(body))
                if w is None:
                    return None
                v = arith(op_fn, v, w)
                if v is None:
                    return None
            return v

        fn = arithmetic
    else:  # a condition used as a value: TRUE, FALSE or NULL
        fn = _tri(node)
    if not node.dyn and not isinstance(node, Const):
        fn = _constant(fn(None))
    node.memo["value"] = fn
    return fn


def _tri(node: Node) -> ValueFn:
    """A closure giving a condition's three-valued result: True, False or None (UNKNOWN).

    Used only where a condition is a value (``(/a = 1) = TRUE``, ``/b IN (/a > 1)``). It
    evaluates each subtree once: deriving it from the TRUE and FALSE closures would evaluate
    both, and nested conditions-as-values would then cost 2**depth per message."""
    if isinstance(node, Not):
        f = _value(node.operand)

        def not3(body: Any) -> Any:
            x = f(body)
            return not x if x.__class__ is bool else None

        return not3
    if isinstance(node, Junction):
        built: list[ValueFn] = []
        for item in node.items:
            built.append(_value(item))
        fns = tuple(built)
        stop = node.kind == "or"  # OR stops at the first TRUE, AND at the first FALSE

        def junction3(body: Any) -> Any:
            result: bool | None = not stop
            for f in fns:
                x = f(body)
                if x is stop:
                    return stop
                if x is not result:  # UNKNOWN, or a non-boolean value
                    result = None
            return result

        return junction3
    if isinstance(node, Compare):
        op = node.op
        op_fn = OPFN[op]
        lf = _value(node.left)
        rf = _value(node.right)

        def cmp3(body: Any) -> Any:
            a = lf(body)
            if a is None:
                return None
            b = rf(body)
            if b is None:
                return None
            return cmp(op, op_fn, a, b)

        return cmp3
    if not isinstance(node, (IsNull, In, Between, Like)):
        raise AssertionError(type(node).__name__)  # _value compiles every other node
    negated = node.negated
    get = _value(node.operand)
    if isinstance(node, IsNull):

        def isnull3(body: Any) -> Any:
            return (get(body) is None) is not negated

        return isnull3
    if isinstance(node, In):
        built = []
        for item in node.items:
            built.append(_value(item))
        item_fns = tuple(built)

        def in3(body: Any) -> Any:
            x = in_(get(body), [f(body) for f in item_fns])
            return x if x is None or not negated else not x

        return in3
    if isinstance(node, Between):
        lo_fn = _value(node.low)
        hi_fn = _value(node.high)

        def between3(body: Any) -> Any:
            v = get(body)
            if v is None:
                return None
            x = between(v, lo_fn(body), hi_fn(body))
            return x if x is None or not negated else not x

        return between3
    search = node.search

    def like3(body: Any) -> Any:
        x = like(get(body), search)
        return x if x is None or not negated else not x

    return like3


def _const_value(node: Node) -> tuple[bool, Any]:
    """(True, value) when the node does not depend on the body, else (False, None)."""
    if node.dyn:
        return False, None
    return True, _value(node)(None)


def condition(node: Node, want: bool) -> Condition:
    """A closure that is True exactly when the node is TRUE (``want``) or exactly when it is
    FALSE (``not want``); UNKNOWN gives False either way. NOT swaps the two."""
    fn = node.memo.get(want)
    if fn is not None:
        return fn
    if isinstance(node, Not):
        fn = condition(node.operand, not want)
    elif isinstance(node, Junction):
        fns = []
        for item in node.items:
            fns.append(condition(item, want))
        # TRUE of AND and FALSE of OR need every item; the other two need any item.
        fn = _junction(fns, every=(node.kind == "and") == want)
    elif isinstance(node, Compare):
        fn = _comparison(node, want)
    elif isinstance(node, IsNull):
        get = _value(node.operand)
        if node.negated == want:  # IS NOT NULL is TRUE / IS NULL is FALSE

            def not_null(body: Any) -> bool:
                return get(body) is not None

            fn = not_null
        else:

            def null(body: Any) -> bool:
                return get(body) is None

            fn = null
    elif isinstance(node, In):
        fn = _in_condition(node, want ^ node.negated)
    elif isinstance(node, Between):
        fn = _between_condition(node, want ^ node.negated)
    elif isinstance(node, Like):
        fn = _like_condition(node, want ^ node.negated)
    else:  # a plain value used as a condition: only a boolean is TRUE or FALSE
        get = _value(node)

        def is_bool(body: Any) -> bool:
            return get(body) is want

        fn = is_bool
    if not node.dyn and fn is not always_true and fn is not always_false:
        fn = always_true if fn(None) else always_false
    node.memo[want] = fn
    return fn


def _junction(fns: Sequence[Condition], every: bool) -> Condition:
    """Every (or any) of ``fns``, with constant members folded."""
    absorbing, neutral = (always_false, always_true) if every else (always_true, always_false)
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

        def every_of(body: Any) -> bool:
            for f in fns:
                if not f(body):
                    return False
            return True

        return every_of

    def any_of(body: Any) -> bool:
        for f in fns:
            if f(body):
                return True
        return False

    return any_of


def _comparison(node: Compare, want: bool) -> Condition:
    op, left, right = node.op, node.left, node.right
    if not isinstance(left, Field) and isinstance(right, Field) and not left.dyn:
        op, left, right = FLIP[op], right, left
    if isinstance(left, Field) and not right.dyn:
        return _compare_field_const(left.steps, op, _value(right)(None), want)
    fn = OPFN[op]
    lf = _value(left)
    rf = _value(right)

    def compare(body: Any) -> bool:
        a = lf(body)
        if a is None:
            return False
        b = rf(body)
        if b is None:
            return False
        return cmp(op, fn, a, b) is want

    return compare


class _NoValue:
    """A class no JSON value has: turns a type-checked fast path off."""


def _compare_field_const(steps: tuple[str | int, ...], op: str, lit: Any, want: bool) -> Condition:
    """``/field op literal``: the hot path of most subscriptions."""
    if lit is None:  # a comparison with NULL is never TRUE nor FALSE
        return always_false
    fn = OPFN[op]
    lc = lit.__class__
    c1: type
    c2: type
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

            def field_eq(body: Any) -> bool:
                if body.__class__ is dict:
                    v = body.get(key)
                    vc = v.__class__
                    if vc is c1 or vc is c2:
                        return v == lit
                    if v is not None:
                        return cmp(op, fn, v, lit) is True
                return False

            return field_eq
        if want:

            def field_cmp(body: Any) -> bool:
                if body.__class__ is dict:
                    v = body.get(key)
                    vc = v.__class__
                    if vc is c1 or vc is c2:
                        return fn(v, lit)
                    if v is not None:
                        return cmp(op, fn, v, lit) is True
                return False

            return field_cmp

        def field_not_cmp(body: Any) -> bool:
            if body.__class__ is dict:
                v = body.get(key)
                vc = v.__class__
                if vc is c1 or vc is c2:
                    return not fn(v, lit)
                if v is not None:
                    return cmp(op, fn, v, lit) is False
            return False

        return field_not_cmp

    get = _getter(steps)

    def path_cmp(body: Any) -> bool:
        v = get(body)
        vc = v.__class__
        if vc is c1 or vc is c2:
            return fn(v, lit) is want
        if v is None:
            return False
        return cmp(op, fn, v, lit) is want

    return path_cmp


def _in_condition(node: In, want: bool) -> Condition:
    """TRUE (``want``) or FALSE of ``a IN (items)``; NOT IN is handled by flipping ``want``."""
    get = _value(node.operand)
    built: list[ValueFn] = []
    for item in node.items:
        built.append(_value(item))
    if not any(item.dyn for item in node.items):
        candidates = tuple(f(None) for f in built)
        fast: frozenset[Any] | None = None
        c1: type
        c2: type
        if all(c.__class__ is str for c in candidates):
            fast, c1, c2 = frozenset(candidates), str, str
        elif all(c.__class__ is int or c.__class__ is float for c in candidates):
            fast, c1, c2 = frozenset(candidates), int, float
        if fast is not None:

            def in_set(body: Any) -> bool:
                v = get(body)
                vc = v.__class__
                if vc is c1 or vc is c2:
                    return (v in fast) is want
                if v is None:
                    return False
                return in_(v, candidates) is want

            return in_set

        def in_constants(body: Any) -> bool:
            return in_(get(body), candidates) is want

        return in_constants
    item_fns = tuple(built)

    def in_values(body: Any) -> bool:
        v = get(body)
        if v is None:
            return False
        return in_(v, [f(body) for f in item_fns]) is want

    return in_values


def _between_condition(node: Between, want: bool) -> Condition:
    get = _value(node.operand)
    lo_const, lo = _const_value(node.low)
    hi_const, hi = _const_value(node.high)
    if lo_const and hi_const:
        kinds = {KIND.get(lo.__class__), KIND.get(hi.__class__)}
        c1: type
        c2: type
        if kinds == {"n"}:
            c1, c2 = int, float
        elif kinds == {"s"}:
            c1 = c2 = str
        else:
            c1 = c2 = _NoValue

        def between_constants(body: Any) -> bool:
            v = get(body)
            vc = v.__class__
            if vc is c1 or vc is c2:
                return (lo <= v <= hi) is want
            if v is None:
                return False
            return between(v, lo, hi) is want

        return between_constants
    lo_fn = _value(node.low)
    hi_fn = _value(node.high)

    def between_values(body: Any) -> bool:
        v = get(body)
        if v is None:
            return False
        return between(v, lo_fn(body), hi_fn(body)) is want

    return between_values


def _like_condition(node: Like, want: bool) -> Condition:
    get = _value(node.operand)
    search = node.search

    def like_match(body: Any) -> bool:
        v = get(body)
        if v.__class__ is str:
            return (search(v) is not None) is want
        return like(v, search) is want

    return like_match
