"""The general rules every section follows, and the value checks the sections share.

docs/configuration.md ("General rules") states them for users; in code:

- `Checker` collects `Problem`s (it never raises) and reads value elements: no attributes
  anywhere, no elements inside a value, no text inside a section, values stripped, `${VAR}`
  substituted from the environment value by value, an empty value is a problem.
- `Section` checks a section's children against its `config.schema.Spec` (unknown, unsupported,
  repeated) and hands out their parsed values, falling back to the default after a problem so
  that loading goes on and every problem in the file is found in one pass.
- Value checks (`enum`, `literal_topic`, ...) turn text into a value or raise `ValueError` with a
  message that says what to write; `Section.value` adds the element's path and line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import Problem
from .schema import Spec, unknown_element
from .values import parse_interval, parse_size, substitute_env
from .xmltree import Node

__all__ = [
    "Checker",
    "Section",
    "at_least",
    "boolean",
    "enum",
    "human",
    "instance_name",
    "literal_topic",
    "message_type",
    "positive_interval",
    "size_between",
]

T = TypeVar("T")

_NAME_FORBIDDEN = re.compile(r"[\s/\\$~]")
_TOPIC_FORBIDDEN = re.compile(r"[\s*+?\[\](){}|^$\\]")


# ----------------------------------------------------------------------------------------------
# Value checks: text -> value, or ValueError with a message that says what to write


def enum(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """A parser for one of `choices` (or an alias of one), case-insensitive, returned lowercase."""
    table = {c: c for c in choices} | dict(aliases or {})

    def parse(text: str) -> str:
        value = table.get(text.lower())
        if value is None:
            raise ValueError(f"invalid value {text!r}; use one of: {', '.join(choices)}")
        return value

    return parse


def boolean(text: str) -> bool:
    """`true` or `false`, case-insensitive."""
    value = text.lower()
    if value not in ("true", "false"):
        raise ValueError(f"invalid value {text!r}; write true or false")
    return value == "true"


def at_least(parse: Callable[[str], T], low: Any, describe: str) -> Callable[[str], T]:
    """`parse`, refusing values below `low` (`describe` names the minimum in the message)."""

    def checked(text: str) -> T:
        value = parse(text)
        if value < low:  # type: ignore[operator]
            raise ValueError(f"{text!r} is below the minimum {describe}; write {low} or more")
        return value

    return checked


def positive_interval(text: str) -> float:
    """An interval (`config.values.parse_interval`) greater than zero, in seconds."""
    value = parse_interval(text)
    if value <= 0:
        raise ValueError(f"interval {text!r} must be greater than zero")
    return value


def instance_name(text: str) -> str:
    """An instance `<Name>`: it becomes part of file names and publisher ids."""
    if _NAME_FORBIDDEN.search(text):
        raise ValueError(
            f"invalid instance name {text!r}; use no whitespace and none of / \\ $ ~ "
            "(it is part of file names and publisher ids)"
        )
    return text


def literal_topic(text: str) -> str:
    """A topic name that is not a pattern and not reserved (`/AMPS...`)."""
    if _TOPIC_FORBIDDEN.search(text):
        raise ValueError(
            f"{text!r} is not a literal topic name; use no whitespace and none of "
            "* + ? [ ] ( ) { } | ^ $ \\ (regular expressions are not allowed here)"
        )
    if text.startswith("/AMPS"):
        raise ValueError(f"topic names starting with /AMPS are reserved: {text!r}")
    return text


def message_type(text: str) -> str:
    """A `<MessageType>`: json is the only one."""
    return enum("json")(text)


def size_between(low: int, high: int | None, name: str) -> Callable[[str], int]:
    """A parser for a size in bytes from `low` to `high` (None: no maximum) for element `name`."""

    def parse(text: str) -> int:
        value = parse_size(text)
        if value < low:
            hint = " (a plain number is bytes: add a unit such as MB)" if text.isdigit() else ""
            raise ValueError(f"{name} {text!r} is below the minimum {human(low)}{hint}")
        if high is not None and value > high:
            raise ValueError(f"{name} {text!r} is above the maximum {high} bytes{_why(name)}")
        return value

    return parse


def _why(name: str) -> str:
    if name == "MaxMessageSize":
        return ", the largest frame a 4-byte length can describe"
    return ""


def human(n: int) -> str:
    """A size as written in a configuration file: `64MB` when whole, else `n bytes`."""
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


# ----------------------------------------------------------------------------------------------
# Reading elements


class Checker:
    """Collects the problems of one document and reads its value elements.

    `env` is where `${NAME}` is looked up. Nothing here raises for a problem in the file: each
    is appended to `problems`, and the caller raises `ConfigError` once the document is done.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[Problem] = []

    def report(self, node: Node, message: str) -> None:
        self.problems.append(Problem(node.path, node.line, message))

    def unique_name(self, seen: dict[str, Node], kind: str, name: str, node: Node) -> None:
        """Note `node` as the first `kind` (transport, role, queue) named `name`, or report it."""
        if name in seen:
            taken = f"{kind} name {name!r} is already used at line {seen[name].line}"
            self.report(node, f"{taken}; give each {kind} its own <Name>")
        seen.setdefault(name, node)

    def check_section(self, node: Node) -> None:
        """A section element: no attributes, no text of its own."""
        self.check_attrs(node)
        stray = node.text.strip()
        if stray:
            shown = stray if len(stray) <= 40 else stray[:37] + "..."
            self.report(
                node, f"text {shown!r} is not allowed in <{node.tag}>, which holds elements only"
            )

    def check_attrs(self, node: Node) -> None:
        if node.attrs:
            names = ", ".join(sorted(node.attrs))
            self.report(
                node,
                f"attributes are not used in this format ({names}); write values as child elements",
            )

    def leaf(self, node: Node) -> str | None:
        """The value of a value element: stripped, ${VAR} substituted; None after a problem."""
        self.check_attrs(node)
        if node.children:
            self.report(
                node,
                f"<{node.tag}> takes a value, not elements (found <{node.children[0].tag}>)",
            )
            return None
        return self.substitute(node, node.text.strip())

    def substitute(self, node: Node, text: str) -> str | None:
        """`text` of `node` with ${VAR} substituted and stripped; None after a problem."""
        value, errors = substitute_env(text, self.env)
        for error in errors:
            self.report(node, error)
        if errors:
            return None
        value = value.strip()
        if not value:
            self.report(node, f"<{node.tag}> is empty; give a value or remove the element")
            return None
        return value


class Section:
    """A section element whose children have been checked against its `Spec`.

    Children are found under our name (a synonym counts as the element it stands for); a child
    the Spec does not allow, or a second one of a child that may not repeat, is reported here
    and then ignored.
    """

    def __init__(self, checker: Checker, node: Node, spec: Spec) -> None:
        self.checker = checker
        self.node = node
        self.found: dict[str, list[Node]] = {}
        checker.check_section(node)
        for child in node.children:
            name = spec.synonyms.get(child.tag, child.tag)
            if name not in spec.children:
                checker.report(child, unknown_element(child.tag, node.tag, spec))
                continue
            seen = self.found.setdefault(name, [])
            if seen and not spec.children[name]:
                also = f" (also written <{seen[0].tag}>)" if seen[0].tag != child.tag else ""
                checker.report(
                    child,
                    f"<{name}> is given more than once in <{node.tag}>{also}, first at line "
                    f"{seen[0].line}; keep one",
                )
                continue
            seen.append(child)

    def has(self, name: str) -> bool:
        return name in self.found

    def one(self, name: str) -> Node | None:
        nodes = self.found.get(name)
        return nodes[0] if nodes else None

    def at(self, name: str) -> Node:
        """Where to report a problem about child `name`: the child, or this section if absent."""
        return self.one(name) or self.node

    def many(self, name: str) -> list[Node]:
        return self.found.get(name, [])

    def missing(self, name: str, hint: str = "") -> None:
        self.checker.report(
            self.node, f"missing <{name}> in <{self.node.tag}>; add <{name}>...</{name}>{hint}"
        )

    def value(
        self,
        name: str,
        parse: Callable[[str], T],
        default: T,
        *,
        required: bool = False,
        hint: str = "",
    ) -> T:
        """The parsed value of child `name`; `default` when it is absent or has a problem."""
        node = self.one(name)
        if node is None:
            if required:
                self.missing(name, hint)
            return default
        text = self.checker.leaf(node)
        if text is None:
            return default
        try:
            return parse(text)
        except ValueError as e:
            self.checker.report(node, str(e))
            return default

    def text(self, name: str, *, required: bool = False, hint: str = "") -> str | None:
        """The value of child `name` as text; None when it is absent or has a problem."""
        return self.value(name, str, None, required=required, hint=hint)
