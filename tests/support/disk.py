"""A small real filesystem (tmpfs) to run a server out of space, and filling it; a directory in
memory for input data whose durability a test does not test."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def mount_tmpfs(path, size: str = "24m") -> None:
    """Mount a tmpfs of `size` at path (root only). Without root the test fails under CI and is
    skipped elsewhere, saying why."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        why = f"cannot mount a tmpfs (needs root): {r.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def unmount(path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path) -> None:
    """Write to a new file at path until the device is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (256 * 1024, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "mnt"
    mount_tmpfs(mnt)
    yield mnt
    unmount(mnt)


@pytest.fixture
def memory_dir(tmp_path):
    """A fresh directory in memory (/dev/shm, a tmpfs: its fsync costs nothing), removed after
    the test, for data a test builds as its input and whose durability it does not test. A
    journal built by 2,000 commits fsyncs each one: 19 s on the shared test machine's disk,
    0.9 s here (measured). Where /dev/shm is missing or not writable: tmp_path."""
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = tempfile.mkdtemp(prefix="tt-test-", dir=shm)
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
