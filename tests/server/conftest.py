"""Fixtures of the in-process core tests (tests/server/core_harness.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from journal.journal import Journal
from tests.server.core_harness import Core


@pytest.fixture
def journal(tmp_path):
    """A Journal of its own in tmp_path (no fsync: these tests are about the server)."""
    j = Journal(str(tmp_path / "journal"), durability="write")
    yield j
    j.close()


@pytest.fixture
async def core(tmp_path):
    c = Core(tmp_path, asyncio.get_running_loop())
    yield c
    await c.aclose()


@pytest.fixture
async def make_core(tmp_path):
    """Core with extra configuration (queues); closed at the end of the test."""
    made: list[Core] = []

    def make(
        extra: str = "", sub: str = "a", topics: tuple[str, ...] = (".*",), io: Any = None
    ) -> Core:
        c = Core(tmp_path / sub, asyncio.get_running_loop(), extra, topics, io)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.aclose()
