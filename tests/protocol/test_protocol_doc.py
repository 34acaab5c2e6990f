"""docs/protocol.md keeps up with the code.

Every failure reason and disconnect reason the server can send, every dead-letter reason, every
option of protocol/options.py, every header field of protocol/headers.py and every command must
be listed in the reference, in its section; and the example frames of §12 must be real frames.

The reasons are collected from the source, not from a list kept here: a reason added to the
server without documentation fails this test. The scan reads every `server/**/*.py` (and the
error classes of protocol/ and journal/, whose `reason` goes on acks), finds the calls that
send a reason (`fail(`, `close(`, `send_ack(`, ...) wherever they live, and resolves reasons
given as UPPER_CASE constants. If server/ changes how it sends reasons, `test_scan_sees_the_server`
fails and says to teach REASON_ARGS the new call.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from protocol import options as options_module
from protocol.framing import FrameDecoder
from protocol.headers import LONG_NAMES, Header

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = ROOT / "docs" / "protocol.md"

# call name -> (category, index of the reason among the positional arguments)
REASON_ARGS: dict[str, tuple[str, int]] = {
    "fail": ("ack", 1),  # Connection.fail(header, reason, detail)
    "send_ack": ("ack", 3),  # send_ack(kind, cid, status, reason, **fields)
    "persist_failed": ("ack", 0),  # persist_failed(reason, detail)
    "flush_failed": ("ack", 2),  # flush_failed(cid, acks, reason)
    "FieldError": ("ack", 1),  # FieldError(header, reason, detail)
    "close": ("disconnect", 0),  # Connection.close(reason, abort=False)
    "_close": ("disconnect", 2),  # Intake._close(conn, counter, reason, why)
    "expire": ("dead letter", 1),  # QueueState.expire(position, reason, rec)
    "dead_letter": ("dead letter", 2),  # dead_letter(queue, position, reason, deliveries, rec)
}
# `send_ack(kind, cid, status, ...)`: the ack types and statuses the server emits
ACK_FIELDS = {"send_ack": (0, 2)}

# Reasons of the contract the server must always be able to send: if the scan misses one of
# these, the scan (not the server) is what broke.
ANCHORS = {
    "ack": {"logon required", "bad frame", "invalid topic", "journal unavailable", "not a queue"},
    "disconnect": {"logon required", "bad frame", "slow client", "shutdown", "connection closed"},
    "dead letter": {"expiration", "max deliveries"},
}


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def _constants(tree: ast.AST) -> dict[str, str]:
    """UPPER_CASE = "text" assignments, at module or class level."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                name = target.id if isinstance(target, ast.Name) else None
                if name and name.isupper() and isinstance(node.value.value, str):
                    out[name] = node.value.value
    return out


def _strings(node: ast.AST | None, consts: dict[str, str]) -> set[str]:
    """The literal texts an argument can be: constants, both arms of `a if c else b`, and
    UPPER_CASE names. f-strings are details, never reasons, and are skipped."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant):
        return {node.value} if isinstance(node.value, str) else set()
    if isinstance(node, ast.IfExp):
        return _strings(node.body, consts) | _strings(node.orelse, consts)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_strings(v, consts) for v in node.values))
    name = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else None
    )
    if name and name.isupper() and name in consts:
        return {consts[name]}
    return set()


def collect(sources: dict[str, str]) -> dict[str, set[str]]:
    """{category: reasons} from Python sources ({path under the root: text}). Categories: "ack"
    (failure and success reasons on acks), "disconnect", "dead letter", "ack type", "status"."""
    trees = {name: ast.parse(text, name) for name, text in sources.items()}
    consts: dict[str, str] = {}
    for tree in trees.values():
        consts.update(_constants(tree))
    found: dict[str, set[str]] = {
        k: set() for k in ("ack", "disconnect", "dead letter", "ack type", "status")
    }
    for source, tree in trees.items():
        # outside server/ only error classes and field checks (FieldError) reach the wire
        in_server = source.startswith("server/")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _call_name(node)
                if not in_server and name != "FieldError":
                    continue
                if name in REASON_ARGS:
                    category, index = REASON_ARGS[name]
                    if index < len(node.args):
                        found[category] |= _strings(node.args[index], consts)
                for kw in node.keywords:
                    if kw.arg == "reason":
                        category = REASON_ARGS.get(name or "", ("ack", 0))[0]
                        found[category] |= _strings(kw.value, consts)
                if name in ACK_FIELDS:
                    kind_at, status_at = ACK_FIELDS[name]
                    if kind_at < len(node.args):
                        found["ack type"] |= _strings(node.args[kind_at], consts)
                    if status_at < len(node.args):
                        found["status"] |= _strings(node.args[status_at], consts)
                # getattr(err, "reason", "journal unavailable"): the default reason
                if name == "getattr" and len(node.args) == 3:
                    if _strings(node.args[1], consts) == {"reason"}:
                        found["ack"] |= _strings(node.args[2], consts)
            elif isinstance(node, ast.Assign) and in_server:
                for target in node.targets:
                    attr = target.attr if isinstance(target, ast.Attribute) else None
                    if attr == "close_reason":  # a close the client made: reason set directly
                        found["disconnect"] |= _strings(node.value, consts)
            elif isinstance(node, ast.ClassDef):
                # error classes: `reason = "bad filter"` goes on the failure ack
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "reason" for t in stmt.targets
                    ):
                        found["ack"] |= _strings(stmt.value, consts)
    return found


def _sources() -> dict[str, str]:
    files = sorted((ROOT / "server").rglob("*.py"))
    files += sorted((ROOT / "protocol").glob("*.py")) + sorted((ROOT / "journal").glob("*.py"))
    return {path.relative_to(ROOT).as_posix(): path.read_text() for path in files}


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text()


@pytest.fixture(scope="module")
def found() -> dict[str, set[str]]:
    return collect(_sources())


def section(doc: str, heading: str) -> str:
    """The text under the first heading that starts with `heading`, up to the next heading of
    the same or a higher level."""
    level = heading.split(" ", 1)[0]
    m = re.search(rf"^{re.escape(heading)}.*$", doc, re.M)
    assert m, f"docs/protocol.md has no heading {heading!r}"
    rest = doc[m.end() :]
    stop = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return rest[: stop.start()] if stop else rest


def _missing(names, text: str, pattern: str = "`{}`") -> list[str]:
    return sorted(n for n in names if pattern.format(n) not in text)


# -- the scan itself -------------------------------------------------------------------------


def test_scan_sees_the_server(found):
    for category, anchors in ANCHORS.items():
        lost = anchors - found[category]
        assert not lost, (
            f"the scan of server/ no longer finds the {category} reasons {sorted(lost)}: if the "
            "server sends reasons through a new call, add it to REASON_ARGS in this test"
        )


def test_scan_finds_a_new_reason():
    """A reason added anywhere in server/, in any of the shapes the scan knows, is found."""
    src = """
NEW_REASON = "brand new reason"
class Refused(ValueError):
    reason = "class reason"
def handler(conn, h, err):
    conn.fail(h, "literal reason", f"detail {h}")
    conn.fail(h, NEW_REASON, "detail")
    conn.send_ack("processed", h.cid, "failure", "ack reason", detail="x")
    conn.send_ack("persisted", None, reason="dup" if h else None)
    conn.close("gone fishing")
    self._close(conn, "counter_name", "closed reason", "why")
    conn.persist_failed(getattr(err, "reason", "default reason"), "detail")
"""
    got = collect({"server/new_module.py": src})
    assert got["ack"] >= {
        "brand new reason",
        "class reason",
        "literal reason",
        "ack reason",
        "dup",
        "default reason",
    }
    assert got["disconnect"] == {"gone fishing", "closed reason"}
    assert "counter_name" not in got["ack"] | got["disconnect"]
    assert "detail" not in got["ack"]


# -- reasons ---------------------------------------------------------------------------------


def test_every_ack_reason_is_documented(doc, found):
    text = section(doc, "### Failure reasons")
    missing = _missing(found["ack"], text)
    assert not missing, f"reasons sent on acks but not in docs/protocol.md §9: {missing}"


def test_every_disconnect_reason_is_documented(doc, found):
    text = section(doc, "### Disconnect reasons")
    missing = _missing(found["disconnect"], text)
    assert not missing, f"disconnect reasons not in docs/protocol.md §9: {missing}"


def test_every_dead_letter_reason_is_documented(doc, found):
    text = section(doc, "## 8.")
    missing = _missing(found["dead letter"], text)
    assert not missing, f"dead-letter reasons not in docs/protocol.md §8: {missing}"


def test_ack_types_and_statuses_are_documented(doc, found):
    text = section(doc, "## 10.")
    assert found["ack type"] >= {"processed", "persisted", "completed"}
    assert not _missing(found["ack type"], text)
    assert found["status"] >= {"failure"}
    assert not _missing(found["status"] | {"success"}, section(doc, "## 2."))


# -- options, header fields, commands ---------------------------------------------------------


def _option_names() -> set[str]:
    names: set[str] = set()
    for struct in (
        options_module.SubscribeOptions,
        options_module.SowDeleteOptions,
        options_module.LogonOptions,
        options_module.HeartbeatOptions,
    ):
        names.update(struct.__struct_fields__)
    # the names each command accepts, wherever options.py keeps them
    tree = ast.parse(Path(options_module.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any("KNOWN" in t for t in targets):
                names.update(
                    e.value
                    for e in node.value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                )
    return names


def test_every_option_is_documented(doc):
    names = _option_names()
    assert {"live", "rate", "max_backlog", "cancel", "ack_conflation", "start"} <= names
    text = section(doc, "## 6.")
    missing = sorted(n for n in names if not re.search(rf"`{re.escape(n)}[`=,]", text))
    assert not missing, f"options not in docs/protocol.md §6: {missing}"


def test_every_header_field_is_documented(doc):
    names = set(Header.__struct_fields__) | set(LONG_NAMES)
    text = section(doc, "## 2.")
    missing = _missing(names, text)
    assert not missing, f"header fields (short or long names) not in docs/protocol.md §2: {missing}"


def _commands(sources: dict[str, str]) -> set[str]:
    """The keys of the dispatch table: a dict literal in server/ keyed by command names."""
    for name, text in sources.items():
        if not name.startswith("server/"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if {"logon", "publish", "subscribe"} <= keys:
                    return {k for k in keys if isinstance(k, str)}
    raise AssertionError("no command dispatch table found in server/")


def test_every_command_has_its_section(doc):
    commands = _commands(_sources())
    text = section(doc, "## 3.")
    missing = sorted(c for c in commands if not re.search(rf"^### {c}$", text, re.M))
    assert not missing, f"commands without a ### heading in docs/protocol.md §3: {missing}"


# -- structure and examples --------------------------------------------------------------------

CONTRACT_SECTIONS = [
    "## 1. Framing",
    "## 2. Header fields",
    "## 3. Commands",
    "## 4. Delivered messages",
    "## 5. Bookmarks",
    "## 6. Options",
    "## 7. Filters",
    "## 8. Queues",
    "## 9. Errors",
]


def test_contract_section_numbers_are_kept(doc):
    """Code comments say "§5": the numbers must mean the contract's sections."""
    for heading in CONTRACT_SECTIONS:
        assert re.search(rf"^{re.escape(heading)}", doc, re.M), heading


def test_no_machine_paths(doc):
    # the pattern is spelled in pieces so that this file does not itself name such a path
    outside = "|".join(("\\.\\./" + "shared", "/" + "work/", "/" + "home/", "/tmp/"))
    assert not re.search(outside, doc)


EXAMPLE = re.compile(r"^(->|<-) ((?:[0-9a-f]{2} ){4})(.*)$", re.M)


def test_examples_are_real_frames(doc, found):
    text = section(doc, "## 12.")
    lines = EXAMPLE.findall(text)
    assert len(lines) >= 20
    client_commands = _commands(_sources())
    reasons = found["ack"]
    for direction, prefix, payload in lines:
        frame = bytes.fromhex(prefix) + payload.encode()
        decoder = FrameDecoder()
        frames = decoder.feed(frame)
        assert len(frames) == 1 and decoder.buffered == 0, f"length prefix is wrong: {payload}"
        header, _body = frames[0]
        if direction == "->":
            assert header.c in client_commands, payload
        else:
            assert header.c in ("ack", "p", "heartbeat"), payload
            if header.c == "ack":
                assert header.status in ("success", "failure"), payload
                assert header.reason is None or header.reason in reasons, payload
