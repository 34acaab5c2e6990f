"""The file operations the journal writer makes, behind one object so tests can make them fail.

`FileIO` is the real thing (os calls). `FaultyIO` stands in for it: it makes each operation with
a `FileIO` of its own, and first fails chosen operations with a chosen errno:
the tests drive every error path of the writer with it, and a server started with the
environment variable TICKERTAPE_FAULTS uses it (the fault campaign in bench/ does), e.g.

    TICKERTAPE_FAULTS="seed=7;p=0.02;ops=write+fsync+open+rename+close;errno=ENOSPC+EIO;after=100;count=5"

Keys (all optional): `seed` (random seed, default 0), `p` (probability that an eligible operation
fails once past `after`, default 1.0), `ops` (eligible operations joined by `+`, from
open, write, fsync, rename, close, truncate; default all), `errno` (errno names joined by `+`,
default ENOSPC), `after` (eligible operations that succeed first, default 0), `count` (most
failures in all, 0 = unlimited, default 1). `fsync` covers fdatasync and the directory fsync.
`pwrite_dsync` (a write that is durable when it returns) is eligible as `write` and as `fsync`,
checked in that order, so a spec meets it exactly where it met the write + fdatasync it replaces.
`extend` (zero-filling the active segment's runway, writer.py) is eligible only when named in
`ops`: it is not in the default, so a spec written before the runway fails the same operations.

`delay` (seconds, default 0: fail) makes a chosen operation wait that long and then succeed
instead of failing: a commit held on purpose, for the tests of what must wait until something
is durable (an at-most-once queue delivery waits for its event, tests/e2e/test_queues.py), e.g.
`ops=write;delay=1.5;count=0` holds every journal write 1.5 s before it is made.
"""

from __future__ import annotations

import errno as errno_mod
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

from .errors import JournalError

OPS = ("open", "write", "fsync", "rename", "close", "truncate")
EXTRA_OPS = ("extend",)  # accepted in `ops`, never eligible by default
ZERO_CHUNK = bytes(1024 * 1024)
_NUMBERS: dict[str, tuple[type, float, float, str]] = {  # key: (type, range, what it is)
    "seed": (int, -math.inf, math.inf, ""),
    "delay": (float, 0.0, 600.0, "delay is seconds, between 0 and 600"),
    "p": (float, 0.0, 1.0, "p is a probability between 0 and 1"),
    "after": (int, 0, math.inf, "after is a count, 0 or more"),
    "count": (int, 0, math.inf, "count is a count, 0 or more"),
}


class FaultSpecError(JournalError, ValueError):
    def __init__(self, spec: str, why: str):
        super().__init__(
            f"TICKERTAPE_FAULTS={spec!r} is not a fault spec: {why}. Use e.g. "
            "'seed=7;p=0.02;ops=write+fsync;errno=ENOSPC+EIO;after=100;count=5', or unset it"
        )


class FileIO:
    """The writer's file operations, as the os module does them."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pwrite_dsync(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        """pwrite that returns once the bytes written are durable (RWF_DSYNC): one system call
        in place of a write and an fdatasync. Short writes are possible, as with pwrite."""
        return os.pwritev(fd, [data], offset, os.RWF_DSYNC)

    def extend(self, fd: int, offset: int, length: int) -> None:
        """Write `length` zero bytes at `offset` and fdatasync them (the runway, writer.py)."""
        end = offset + length
        while offset < end:
            offset += os.pwrite(fd, memoryview(ZERO_CHUNK)[: end - offset], offset)
        os.fdatasync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def close(self, fd: int) -> None:
        os.close(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fsync_dir(self, directory: str) -> None:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            self.fsync(dfd)
        finally:
            os.close(dfd)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _faulty(
    op: Callable[Concatenate[FileIO, _P], _R], *faults: str
) -> Callable[Concatenate[FaultyIO, _P], _R]:
    """FaultyIO's form of the FileIO operation `op`: first each of `faults` may fail (in
    order), then FaultyIO's own FileIO does it."""

    def method(self: FaultyIO, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        for fault in faults:
            self._maybe_fail(fault)
        return op(self.real, *args, **kwargs)

    method.__name__ = op.__name__
    return method


class FaultyIO:
    """FileIO's operations, each failing when eligible (see the module doc). Thread-safe;
    `failures` counts the errors raised (with `delay`, the operations held), `armed` turns
    injection off and on (tests)."""

    def __init__(
        self,
        ops: Iterable[str] = OPS,
        errnos: Iterable[int] = (errno_mod.ENOSPC,),
        p: float = 1.0,
        after: int = 0,
        count: int = 1,
        seed: int = 0,
        delay: float = 0.0,
    ):
        self.ops = frozenset(ops)
        self.delay = delay  # > 0: a chosen operation waits this long, then runs (no error)
        self.errnos = tuple(errnos)
        self.p = p
        self.after = after
        self.count = count
        self.rng = random.Random(seed)
        self.seen = 0
        self.failures = 0
        self.armed = True
        self._lock = threading.Lock()
        self.real = FileIO()

    @classmethod
    def from_spec(cls, spec: str) -> FaultyIO:
        kw: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            key, sep, val = part.partition("=")
            if not sep:
                raise FaultSpecError(spec, f"{part!r} is not key=value")
            try:
                if key in _NUMBERS:
                    kind, lowest, highest, why = _NUMBERS[key]
                    kw[key] = kind(val)
                    if not lowest <= kw[key] <= highest:
                        raise FaultSpecError(spec, why)
                elif key == "ops":
                    ops = val.split("+")
                    bad = [o for o in ops if o not in OPS + EXTRA_OPS]
                    if bad:
                        raise FaultSpecError(
                            spec,
                            f"unknown operation {bad[0]!r} (one of {', '.join(OPS + EXTRA_OPS)})",
                        )
                    kw["ops"] = ops
                elif key == "errno":
                    names = val.split("+")
                    bad = [n for n in names if not isinstance(getattr(errno_mod, n, None), int)]
                    if bad:
                        raise FaultSpecError(
                            spec, f"unknown errno {bad[0]!r} (e.g. ENOSPC, EIO, EBADF)"
                        )
                    kw["errnos"] = [getattr(errno_mod, n) for n in names]
                else:
                    raise FaultSpecError(
                        spec, f"unknown key {key!r} (seed, p, ops, errno, after, count, delay)"
                    )
            except ValueError as exc:
                if isinstance(exc, FaultSpecError):
                    raise
                raise FaultSpecError(spec, f"{key}={val!r} is not a number") from None
        return cls(**kw)

    def _maybe_fail(self, op: str) -> None:
        if op not in self.ops or not self.armed:
            return
        with self._lock:
            self.seen += 1
            if self.seen <= self.after or (self.count and self.failures >= self.count):
                return
            if self.p < 1.0 and self.rng.random() >= self.p:
                return
            self.failures += 1
            code = self.rng.choice(self.errnos)
        if self.delay:
            time.sleep(self.delay)  # held, not failed (outside the lock: others go on)
            return
        raise OSError(code, f"{os.strerror(code)} (injected into {op})")

    def close(self, fd: int) -> None:
        # Like Linux: the descriptor is released even when close reports an error.
        try:
            self._maybe_fail("close")
        finally:
            self.real.close(fd)

    # each of FileIO's operations, after the chance to fail as the fault ops named here
    open = _faulty(FileIO.open, "open")
    pwrite = _faulty(FileIO.pwrite, "write")
    pwrite_dsync = _faulty(FileIO.pwrite_dsync, "write", "fsync")
    extend = _faulty(FileIO.extend, "extend")
    fdatasync = _faulty(FileIO.fdatasync, "fsync")
    fsync = _faulty(FileIO.fsync, "fsync")
    rename = _faulty(FileIO.rename, "rename")
    ftruncate = _faulty(FileIO.ftruncate, "truncate")
    fsync_dir = _faulty(FileIO.fsync_dir, "fsync")


FileOps = FileIO | FaultyIO  # what the writer is handed


def io_from_env(environ: Mapping[str, str] = os.environ) -> FaultyIO | None:
    """FaultyIO per TICKERTAPE_FAULTS, or None when it is unset (FaultSpecError when malformed)."""
    spec = environ.get("TICKERTAPE_FAULTS", "").strip()
    return FaultyIO.from_spec(spec) if spec else None
