"""A progress bar for the archive / compaction job (batch.py --progress), from Spark's status
tracker: groups done of all, input bytes, time. On a terminal it redraws one line; otherwise it
writes a line every 5 s and a last one at the end."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext


class Progress:
    """A progress bar on stderr from the status tracker: groups done / all, input bytes, time."""

    def __init__(
        self,
        sc: SparkContext,
        total_groups: int,
        total_bytes: int,
        label: str,
        stream: IO[str] | None = None,
    ):
        self.sc = sc
        self.total = total_groups
        self.bytes = total_bytes
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-progress", daemon=True)
        self.started = time.monotonic()
        self._last_line = 0.0

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self.draw(self.total if exc[0] is None else None, final=True)

    def _done_tasks(self) -> int:
        st = self.sc.statusTracker()
        infos = (st.getStageInfo(sid) for sid in st.getActiveStageIds())
        return sum(info.numCompletedTasks for info in infos if info is not None)

    def _run(self) -> None:
        seen = 0
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):  # the tracker can race the job's end
                seen = max(seen, self._done_tasks())
            self.draw(seen)

    def draw(self, done: int | None, final: bool = False) -> None:
        el = time.monotonic() - self.started
        if done is None:
            line = f"{self.label}: failed after {el:.1f}s"
        else:
            width = 30
            fill = int(width * done / self.total) if self.total else width
            mb = self.bytes / 1e6 * (done / self.total if self.total else 1)
            line = (
                f"{self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} groups "
                f"{mb:,.1f}/{self.bytes / 1e6:,.1f} MB {el:5.1f}s"
            )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
            self.stream.flush()
        elif final or el - self._last_line >= 5.0:
            self._last_line = el
            self.stream.write(line + "\n")
            self.stream.flush()
