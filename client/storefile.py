"""What the file-backed stores share: one-owner file locking and the recovery report.

Each store module owns its own record format (documented at its top); this module slices no
record bytes. Durability of every file store: writes go to the kernel at once (an mmap'ed page
or one `write`), so they survive the client process being killed (`kill -9`) with no flush;
`sync()` / `close()` add an `fsync` for power loss.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import StoreLocked

__all__ = ["RecoveryReport", "open_locked", "recovered"]

log = logging.getLogger("tickertape.client.store")


@dataclass
class RecoveryReport:
    """What opening a store file found. `clean` when nothing was dropped.

    - `records`: valid records loaded (the ones that still matter: unpersisted publishes,
      bookmark log entries).
    - `dropped_records`: records that were present but unusable (bad checksum, cut short).
    - `dropped_bytes`: bytes cut off or skipped as damaged.
    - `missing`: for the publish store, sequence numbers between the persisted point and the
      newest valid record that no valid record holds (those messages are lost).
    - `problems`: one line per damaged place: offset and reason.
    """

    path: str
    records: int = 0
    dropped_records: int = 0
    dropped_bytes: int = 0
    missing: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.dropped_records or self.dropped_bytes or self.missing or self.problems)

    def damage(self, offset: int, reason: str, size: int = 0, records: int = 0) -> None:
        self.dropped_bytes += size
        self.dropped_records += records
        if len(self.problems) < 100:  # bounded: a wrecked file does not flood the log
            self.problems.append(f"offset {offset}: {reason}")

    def __str__(self) -> str:
        if self.clean:
            return f"{self.path}: {self.records} record(s) loaded, nothing dropped"
        text = (
            f"{self.path}: {self.records} record(s) loaded; dropped {self.dropped_records} "
            f"damaged record(s), {self.dropped_bytes} byte(s)"
        )
        if self.missing:
            shown = ", ".join(map(str, self.missing[:10]))
            more = f" and {len(self.missing) - 10} more" if len(self.missing) > 10 else ""
            text += f"; lost sequence number(s) {shown}{more}"
        if self.problems:
            text += " (" + "; ".join(self.problems[:5]) + ")"
        return text

    def log(self) -> None:
        if self.clean:
            log.debug("%s", self)
        else:
            log.warning("store recovery: %s", self)


def open_locked(path: str, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """Open (creating) `path` read-write and take an exclusive, non-blocking `flock` on it;
    returns the fd, or raises StoreLocked if someone holds the lock.

    flock locks belong to the open file description, so a second store object opened on the
    same path in the same process is refused too. A killed process's lock goes with it.
    """
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(path) from None
    return fd


def recovered(fd: int, load: Callable[[], RecoveryReport]) -> RecoveryReport:
    """What `load()` found in the store file just opened as `fd`, logged; `fd` is closed when
    the load fails (the store object is never made, so nothing else would close it)."""
    try:
        report = load()
    except BaseException:
        os.close(fd)
        raise
    report.log()
    return report
