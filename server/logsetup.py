"""Logging to the configured targets (`<Logging><Target>`), and reopening files on SIGHUP.

Every line: `2026-11-21T21:05:09.123Z LEVEL logger: message`, UTC. File targets are opened
in append mode; `reopen()` closes and reopens them, so log rotation (move the file, send SIGHUP)
loses no line.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable

from config.model import LogTarget


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + ".%03dZ" % record.msecs
        )


_handlers: list[logging.Handler] = []


def setup_logging(targets: Iterable[LogTarget], foreground: bool = True) -> None:
    """Install one handler per target on the `tickertape` logger, replacing earlier ones."""
    root = logging.getLogger("tickertape")
    for old in _handlers:
        root.removeHandler(old)
        old.close()
    _handlers.clear()
    fmt = _Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    lowest = logging.ERROR
    h: logging.Handler
    for t in targets:
        if t.protocol in ("stdout", "stderr"):
            if not foreground:
                continue  # a daemon has no terminal
            h = logging.StreamHandler(sys.stdout if t.protocol == "stdout" else sys.stderr)
        else:
            path = t.file_name
            assert path is not None  # the loader requires FileName for a file target
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            h = logging.FileHandler(path, mode="a", encoding="utf-8", delay=False)
        level = logging.getLevelNamesMapping()[t.level.upper()]  # the config's four names
        h.setLevel(level)
        h.setFormatter(fmt)
        if t.logger:  # <Logger>: e.g. the audit trail in a file of its own
            h.addFilter(logging.Filter(t.logger))
        root.addHandler(h)
        _handlers.append(h)
        lowest = min(lowest, level)
    root.setLevel(lowest)
    root.propagate = False


def reopen() -> None:
    """Reopen every file target (SIGHUP), for log rotation."""
    for h in _handlers:
        if isinstance(h, logging.FileHandler):
            h.acquire()
            try:
                if h.stream:
                    h.stream.close()
                h.stream = h._open()
            finally:
                h.release()
    logging.getLogger("tickertape").info("log files reopened")
