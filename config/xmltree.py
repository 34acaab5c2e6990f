"""Safe XML reading for configuration files: bytes in, a small element tree with line numbers out.

The parser is the standard library's expat, used directly (no DOM, no ElementTree) because it
reports line numbers and lets us refuse what a configuration file never needs:

- any `<!DOCTYPE ...>`: so no DTD, no entity declarations (billion laughs, "quadratic blowup"),
  no external entities or external DTDs (file or network reads). Refusal happens at the start of
  the declaration, before anything in it is read or expanded;
- references to undefined entities (`&foo;`), which expat reports as an error; only the five
  predefined entities and character references (`&#233;`) are allowed;
- nesting deeper than `MAX_DEPTH` elements.

Comments and processing instructions are ignored; CDATA sections are ordinary text; namespaces
are not interpreted (a prefix is part of the tag name, which the loader will then not know).

Each element becomes a `Node` with its tag, attributes, text (all character data directly inside
it, not stripped), child nodes, the line of its start tag, and its path. Paths are XPath-like:
`/TickertapeConfig/SOW/Queue[2]/LeasePeriod`; a position `[n]` (from 1) is given only when the
parent has more than one child of that tag.

Malformed or refused input raises `XmlError(line, column, message, path)`: column is 1-based and
path is the element open where the error was found ("" before the root element).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn
from xml.parsers import expat

__all__ = ["MAX_DEPTH", "Node", "XmlError", "parse_xml"]

MAX_DEPTH = 64


class XmlError(Exception):
    """The input is not XML we accept. `line`/`column` are 1-based (0 when unknown)."""

    def __init__(self, line: int, column: int, message: str, path: str = "") -> None:
        self.line = line
        self.column = column
        self.message = message
        self.path = path
        super().__init__(f"line {line}, column {column}: {message}")


class Node:
    """One element of the configuration file."""

    __slots__ = ("_text", "attrs", "children", "line", "path", "tag")

    def __init__(self, tag: str, attrs: dict[str, str], line: int) -> None:
        self.tag = tag
        self.attrs = attrs
        self.line = line
        self.children: list[Node] = []
        self.path = ""
        self._text: list[str] = []

    @property
    def text(self) -> str:
        """All character data directly inside this element (not in its children), unstripped."""
        return "".join(self._text)

    def child(self, tag: str) -> Node:
        """The first child `tag`, else this element: where to report a problem about it."""
        return next((c for c in self.children if c.tag == tag), self)

    def __repr__(self) -> str:  # for test failures
        return f"<Node {self.path or self.tag} line {self.line}>"


class _Refused(Exception):
    def __init__(self, message: str) -> None:
        self.message = message


# Keyed by expat's message (pyexpat's `errors.XML_ERROR_*` constants are the message strings).
_ERROR_HINTS = {
    expat.errors.XML_ERROR_UNDEFINED_ENTITY: (
        "undefined entity reference; only &lt; &gt; &amp; &quot; &apos; and character "
        "references such as &#233; are allowed (write & as &amp;)"
    ),
    expat.errors.XML_ERROR_NO_ELEMENTS: "no element found; the file is empty or not finished",
    expat.errors.XML_ERROR_INVALID_TOKEN: (
        "not well-formed (invalid token); look for a bare & or < in a value (write &amp; "
        "and &lt;) or for -- inside a comment"
    ),
}


def parse_xml(data: bytes | str) -> Node:
    """Parse a whole document. Raises `XmlError`; never expands entities, never reads a DTD."""
    parser = expat.ParserCreate()
    # Belt and braces: no parameter entities, no external DTD, even if a DOCTYPE slipped through.
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.UseForeignDTD(False)
    parser.buffer_text = True
    stack: list[Node] = []
    root: list[Node] = []

    def refuse(what: str) -> Callable[..., NoReturn]:
        def handler(*_args: object) -> NoReturn:
            raise _Refused(what)

        return handler

    def start(tag: str, attrs: dict[str, str]) -> None:
        if len(stack) >= MAX_DEPTH:
            raise _Refused(f"elements are nested more than {MAX_DEPTH} deep")
        node = Node(tag, attrs, parser.CurrentLineNumber)
        if stack:
            stack[-1].children.append(node)
        else:
            root.append(node)
        stack.append(node)

    def end(_tag: str) -> None:
        stack.pop()

    def chars(data: str) -> None:
        if stack:
            stack[-1]._text.append(data)

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.StartDoctypeDeclHandler = refuse(
        "a <!DOCTYPE> declaration is not allowed in a configuration file (no DTDs, no entity "
        "declarations); remove it"
    )
    parser.EntityDeclHandler = refuse("entity declarations are not allowed; remove them")
    parser.UnparsedEntityDeclHandler = refuse("entity declarations are not allowed; remove them")
    parser.NotationDeclHandler = refuse("notation declarations are not allowed; remove them")
    parser.ExternalEntityRefHandler = refuse("external entities are not allowed; remove them")
    parser.SkippedEntityHandler = refuse(
        "entity references other than &lt; &gt; &amp; &quot; &apos; are not allowed"
    )

    try:
        parser.Parse(data, True)
    except _Refused as e:
        _number(root)
        raise XmlError(
            parser.CurrentLineNumber,
            parser.CurrentColumnNumber + 1,
            e.message,
            stack[-1].path if stack else "",
        ) from None
    except expat.ExpatError as e:
        _number(root)
        message = expat.errors.messages[e.code]
        message = _ERROR_HINTS.get(message, message)
        raise XmlError(
            e.lineno, e.offset + 1, f"malformed XML: {message}", stack[-1].path if stack else ""
        ) from None
    _number(root)
    return root[0]


def _number(root: list[Node]) -> None:
    """Fill in every node's path (iteratively: depth is bounded, but recursion is not needed)."""
    if not root:
        return
    top = root[0]
    top.path = "/" + top.tag
    todo = [top]
    while todo:
        node = todo.pop()
        counts: dict[str, int] = {}
        for child in node.children:
            counts[child.tag] = counts.get(child.tag, 0) + 1
        seen: dict[str, int] = {}
        for child in node.children:
            if counts[child.tag] > 1:
                seen[child.tag] = seen.get(child.tag, 0) + 1
                child.path = f"{node.path}/{child.tag}[{seen[child.tag]}]"
            else:
                child.path = f"{node.path}/{child.tag}"
            todo.append(child)
