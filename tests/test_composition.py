"""The journal, the client, the SOW manager, the queues and a session's command handlers are
façades over small objects handed their collaborators (docs/architecture.md), not classes put
together from mixins or from a base that unpacks their parts (issue 24).

A mixin shows as a base class other than `object`, or as a stub that raises NotImplementedError
for what another part supplies; both are refused here for the journal's, the client's, the SOW
manager's, the queue's and the session's parts. Across server/, journal/, client/ and config/,
a class inherits from a class of its own package only when that one is abstract (an ABC, a
Protocol, an exception family): no concrete base is excused (the fault-injecting file operations
wrap a FileIO, the logged and SOW bookmark stores hold the memory store's Subscriptions, the
config loader is functions over a Checker). protocol/'s filter syntax tree is a family of node
types under one `Node`, and bench/'s load generators are connection classes: not held here.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from client.client import Client
from client.client_commands import ClientCommands
from client.client_conn import ClientConnection
from client.client_publish import ClientPublishing
from client.client_sow import ClientSow
from client.client_subscribe import ClientSubscriptions
from client.ha import HAClient
from client.halife import Lifecycle
from journal.journal import Journal
from journal.reading import JournalReader
from journal.recovery import Recovery
from journal.state import Layout
from journal.writer import JournalWriter
from server.queue import Queue
from server.queue_state import QueueState
from server.session import Session
from server.session_caller import Caller
from server.session_delta import DeltaCommands
from server.session_publish import PublishCommands
from server.session_sow import SowCommands
from server.session_subscribe import SubscribeCommands
from server.sow.deltas import Deltas
from server.sow.held import HeldWrites
from server.sow.manager import SowManager

ROOT = pathlib.Path(__file__).resolve().parent.parent
PARTS = [
    Journal,
    Layout,
    JournalReader,
    JournalWriter,
    Recovery,
    Client,
    ClientConnection,
    ClientCommands,
    ClientPublishing,
    ClientSubscriptions,
    ClientSow,
    HAClient,
    Lifecycle,
    SowManager,
    Deltas,
    HeldWrites,
    Queue,
    QueueState,
    Session,
    Caller,
    PublishCommands,
    SubscribeCommands,
    SowCommands,
    DeltaCommands,
]
MODULES = [
    "journal/journal.py",
    "journal/state.py",
    "journal/reading.py",
    "journal/recovery.py",
    "journal/writer.py",
    "client/client.py",
    "client/client_conn.py",
    "client/client_commands.py",
    "client/client_publish.py",
    "client/client_subscribe.py",
    "client/client_sow.py",
    "client/ha.py",
    "client/halife.py",
    "server/sow/manager.py",
    "server/sow/deltas.py",
    "server/sow/held.py",
    "server/queue.py",
    "server/queue_state.py",
    "server/queue_repl.py",
    "server/session.py",
    "server/session_caller.py",
    "server/session_publish.py",
    "server/session_subscribe.py",
    "server/session_sow.py",
    "server/session_delta.py",
]


def _abstract(cls: ast.ClassDef) -> bool:
    names = {ast.unparse(b).split(".")[-1] for b in cls.bases}
    if cls.name.endswith(("Error", "Exception")) or {"ABC", "Protocol"} & names:
        return True
    decorated = (
        d for node in cls.body if isinstance(node, ast.FunctionDef) for d in node.decorator_list
    )
    return any("abstractmethod" in ast.unparse(d) for d in decorated)


def _classes(package: str) -> dict[str, ast.ClassDef]:
    return {
        node.name: node
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }


def _sibling_bases(classes: dict[str, ast.ClassDef]) -> list[tuple[str, str]]:
    return [
        (cls.name, base)
        for cls in classes.values()
        for base in (ast.unparse(b).split(".")[-1] for b in cls.bases)
        if base in classes
    ]


@pytest.mark.parametrize("package", ["server", "journal", "client", "config"])
def test_no_class_inherits_a_concrete_sibling(package):
    classes = _classes(package)
    wrong = [
        f"{name}({base})" for name, base in _sibling_bases(classes) if not _abstract(classes[base])
    ]
    assert wrong == [], f"{package}: classes share code by inheriting a concrete sibling: {wrong}"


@pytest.mark.parametrize("cls", PARTS, ids=lambda c: c.__name__)
def test_each_part_stands_alone(cls):
    """No part inherits from another: each gets its collaborators in its constructor."""
    assert cls.__bases__ == (object,), f"{cls.__name__} is put together from {cls.__bases__}"
    assert "__init__" in vars(cls), f"{cls.__name__} takes nothing in its constructor"


@pytest.mark.parametrize("path", MODULES)
def test_no_stub_waits_for_another_part(path):
    tree = ast.parse((ROOT / path).read_text())
    stubs = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        and node.exc is not None
        and "NotImplementedError" in ast.unparse(node.exc)
    ]
    assert stubs == [], f"{path}: NotImplementedError stubs at lines {stubs}"


def test_the_facades_keep_their_public_api(tmp_path):
    """What server/, bench/, the tests and the CLI call on a Journal and a Client is there."""
    journal_api = {
        "read", "read_raw", "read_block", "raw_batches", "records", "scan", "next_position",
        "after", "holds", "locate", "locate_time", "publishers", "publisher_owners",
        "disk_bytes", "collect_garbage", "submit", "commit_inline", "fence", "run_in_writer",
        "close", "sealed_segments", "commit_layout",
    }  # fmt: skip
    journal_props = {"segments", "manifest", "end_position", "start_position", "available"}
    client_api = {
        "connect", "logon", "close", "abort", "wait_closed", "send_heartbeat", "start_heartbeat",
        "execute", "flush", "sow_delete", "publish", "can_publish", "wait_publishable",
        "try_publish", "publish_nowait", "publish_flush", "unpersisted_count", "subscribe",
        "unsubscribe", "subscriptions", "sow", "sow_and_subscribe",
    }  # fmt: skip
    client_props = {"connected", "closed_reason", "persisted_seq", "last_seq", "failed_count",
                    "stray_messages", "server", "tls"}  # fmt: skip
    c = Client("api")
    for name in client_api:
        assert callable(getattr(c, name)), name
    for name in client_props:
        getattr(c, name)
    j = Journal(str(tmp_path / "j"))
    try:
        for name in journal_api:
            assert callable(getattr(j, name)), name
        for name in journal_props:
            getattr(j, name)
    finally:
        j.close()
