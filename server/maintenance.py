"""Journal maintenance inside the server: the <Actions> schedule, the Spark job in a child
process, orders from `tickertape archive|compact`, and applying results.

The server is the journal's owner, so it is the one that changes the manifest and the index
(journal/maintenance.py): it writes requests, applies results, and removes segments. The Spark
job itself (journal/spark/batch.py) always runs in another process: a child started here for a
scheduled action, or the CLI. Nothing here runs on the event loop but bookkeeping: file work
runs in the default executor, the job in a child process, and the layout swap on the journal's
writer thread between two group commits.

Action steps (docs/configuration.md <Actions>), run in order; a step that fails skips the rest:
- archive-journal (Age): archive sealed segments older than Age (needs JournalArchiveDirectory)
- compress-journal (Age): compact segments older than Age, dropping nothing
- compact-journal (Retention): compact sealed segments, dropping what is older than Retention,
  needed by no queue and no publisher's dedup state, and (when the journal is archived: an
  archive-journal step or an archive directory is configured) held by the archive
- remove-journal (Age): delete the oldest archived segments older than Age that no queue and no
  replay still needs

A step that ran but could not do all it should (compaction kept records the archive does not
hold; removal stopped at a segment old enough for it) is *held*: its reason is logged as a
warning, kept with the action's last run (`status`: /stats "maintenance", the console), and the
later steps still run.

Every POLL_S the server also takes orders (CLI requests), applies results that arrived, answers
requests whose job was lost, and unlinks retired segment files after their grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.model import Action, ActionStep, ActionTrigger, Config
from journal import maintenance as jm
from journal import maintenance_apply as jma
from journal.journal import Journal
from journal.manifest import request_path, result_path
from protocol.patterns import is_pattern

log = logging.getLogger("tickertape.maintenance")

POLL_S = 1.0
CHILD_STOP_S = 5.0


def next_run(trigger: ActionTrigger, after: float) -> float | None:
    """Wall-clock time of the next run of a schedule trigger strictly after `after`."""
    if trigger.kind != "schedule":
        return None
    if trigger.every:
        return after + trigger.every
    if trigger.at is None:
        return None
    tz = dt.UTC if trigger.utc else None
    now = dt.datetime.fromtimestamp(after, tz)
    hour, minute = trigger.at
    cand = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    for _ in range(8):
        ok = cand.timestamp() > after and (
            trigger.weekday is None or cand.weekday() == trigger.weekday
        )
        if ok:
            return cand.timestamp()
        cand = cand + dt.timedelta(days=1)
    return None


@dataclass(eq=False, repr=False)
class Maintenance:
    """Narrow doors: the configuration (actions, archive directory, queues), the journal, the
    loop, and `replay_floor` (the lowest position a running replay reads, never removed)."""

    config: Config
    journal: Journal
    loop: asyncio.AbstractEventLoop
    replay_floor: Callable[[], int | None]

    def __post_init__(self) -> None:
        config = self.config
        tl = self.config.transaction_log
        self.archive_root = tl.archive_directory if tl is not None else None
        self.queues = [
            (q.name, q.underlying_topic, is_pattern(q.underlying_topic)) for q in self.config.queues
        ]
        self.destinations = [d.name for d in self.config.replication.destinations]
        self.actions = list(self.config.actions)
        self.archive_scheduled = archive_scheduled(config)
        self._next: list[float | None] = [None] * len(self.actions)
        # per action: its last run (wall-clock start and end, whether every step succeeded, and
        # what the last step that ran said), for the console
        self._last: list[dict[str, Any] | None] = [None] * len(self.actions)
        self._running: dict[int, asyncio.Task] = {}
        self._poll: asyncio.Future | None = None
        self._last_poll = 0.0
        self._apply_lock = threading.Lock()
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self.history: list[dict] = []
        self.stopping = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        now = time.time()
        for i, a in enumerate(self.actions):
            if a.on.kind == "startup":
                self._launch(i)
            else:
                self._next[i] = next_run(a.on, now)

    async def stop(self) -> None:
        self.stopping = True
        for proc in list(self.children.values()):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + CHILD_STOP_S
        for proc in list(self.children.values()):
            try:
                await asyncio.wait_for(proc.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                _signal_group(proc, signal.SIGKILL)
                await proc.wait()
        for t in list(self._running.values()):
            t.cancel()
        if self._poll is not None:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._poll), 10.0)

    def tick(self, now_mono: float) -> None:
        """From the server's periodic tick: start due actions, and poll the maintenance folder."""
        if self.stopping or self.journal is None:
            return
        wall = time.time()
        for i, a in enumerate(self.actions):
            due = self._next[i]
            if due is not None and wall >= due:
                self._next[i] = next_run(a.on, wall)
                if i in self._running:
                    log.warning("action %s: still running; this run is skipped", _label(a))
                else:
                    self._launch(i)
        if (self._poll is None or self._poll.done()) and now_mono - self._last_poll >= POLL_S:
            self._last_poll = now_mono
            self._poll = self.loop.run_in_executor(None, self._poll_sync)

    # -- the folder: orders, results, stale requests, retired files ---------------------------

    def _poll_sync(self) -> None:
        j = self.journal
        if j is None:
            return
        try:
            jm.take_orders(
                j,
                archive_root=self.archive_root,
                queues=self.queues,
                destinations=self.destinations,
                archive_scheduled=self.archive_scheduled,
            )
            for rid in jma.pending_results(j.directory):
                self.apply(rid)
            jma.clean_stale(j.directory)
            j.collect_garbage()
        except Exception:
            log.exception("journal maintenance: polling %s failed", j.directory)

    def apply(self, rid: str) -> dict:
        with self._apply_lock:
            ans = jma.apply_result(self.journal, rid)
        self.history.append(ans)
        del self.history[:-50]
        return ans

    # -- actions ---------------------------------------------------------------------------------

    def run_now(self, name: str) -> str | None:
        """Start the action named `name` (its `<Name>`, or its steps joined by commas when it has
        none) now, outside its schedule, which stays as it was. Returns "started", "running" (it
        is running already: not started twice), or None when no action has that name."""
        for i, a in enumerate(self.actions):
            if _label(a) == name:
                if i in self._running:
                    return "running"
                if self.stopping or self.journal is None:
                    return None
                self._launch(i)
                return "started"
        return None

    def status(self) -> list[dict[str, Any]]:
        """Each action as the console shows it: name, trigger, steps, running, last run, next run
        (wall-clock seconds; None when unknown or not scheduled)."""
        return [
            {
                "name": _label(a),
                "trigger": a.on.kind,
                "steps": [s.name for s in a.do],
                "running": i in self._running,
                "last": self._last[i],
                "next_run": self._next[i],
            }
            for i, a in enumerate(self.actions)
        ]

    def _launch(self, i: int) -> None:
        task = self.loop.create_task(self._run_action(i))
        self._running[i] = task
        task.add_done_callback(lambda _t: self._running.pop(i, None))

    async def _run_action(self, i: int) -> None:
        action = self.actions[i]
        label = _label(action)
        started = time.monotonic()
        last: dict[str, Any] = {
            "started": time.time(),
            "ended": None,
            "ok": None,
            "result": "",
            "held": [],  # "<step>: <why>" for each step that could not do all it should
            "steps": [],  # {"step", "ok", "result", "held"} for each step that ran
        }
        self._last[i] = last
        for step in action.do:
            held = ""
            try:
                ok, what, held = await self._step(step)
            except Exception as exc:  # not CancelledError: a BaseException
                log.exception("action %s: %s failed", label, step.name)
                ok, what = False, str(exc)
            log.log(
                logging.INFO if ok and not held else logging.WARNING,
                "action %s: %s: %s",
                label,
                step.name,
                what,
            )
            if held:
                log.warning("action %s: %s held: %s", label, step.name, held)
                last["held"].append(f"{step.name}: {held}")
            last["steps"].append({"step": step.name, "ok": ok, "result": what, "held": held})
            last["ok"], last["result"] = ok, f"{step.name}: {what}"
            last["ended"] = time.time()
            if not ok:
                log.warning("action %s: later steps skipped", label)
                break
        log.info("action %s: done in %.1fs", label, time.monotonic() - started)

    async def _step(self, step: ActionStep) -> tuple[bool, str, str]:
        """(succeeded, what it did, why it is held: "" when it did all it should)."""
        loop = self.loop
        j = self.journal
        if step.name == "remove-journal":
            floor = self.replay_floor()
            res = await loop.run_in_executor(
                None,
                lambda: jm.remove_journal(
                    j,
                    older_than_s=step.age,
                    archive_root=self.archive_root,
                    queues=self.queues,
                    replay_floor=floor,
                    destinations=self.destinations,
                ),
            )
            held = res["reason"] if res.get("held") else ""
            if res["removed"]:
                return (
                    True,
                    f"removed {res['removed']} segments ({res['bytes']:,} bytes); journal starts at {res['start']}",
                    held,
                )
            return True, f"nothing removed ({res['reason'] or 'no sealed segment'})", held
        kind = "archive" if step.name == "archive-journal" else "compact"
        older = step.age if step.name in ("archive-journal", "compress-journal") else None
        retention = step.retention if step.name == "compact-journal" else None

        def make() -> dict[str, Any] | None:
            req = jm.make_request(
                j,
                kind,
                older_than_s=older,
                retention_s=retention,
                archive_root=self.archive_root,
                queues=self.queues,
                destinations=self.destinations,
                archive_scheduled=self.archive_scheduled,
            )
            if req is not None:
                jm.write_request(j.directory, req)
            return req

        req = await loop.run_in_executor(None, make)
        if req is None:
            return True, "nothing to do", ""
        rc, summary = await self._run_child(request_path(j.directory, req["id"]))
        if not os.path.exists(result_path(j.directory, req["id"])):
            return (
                False,
                f"the job exited with status {rc} and no result ({summary or 'see the log'})",
                "",
            )
        ans = await loop.run_in_executor(None, self.apply, req["id"])
        ok = ans.get("status") in ("applied", "noop")
        held = (ans.get("held") or {}).get("reason", "")
        return (
            ok,
            f"{ans.get('status')}: {ans.get('reason')}" + (f" [{summary}]" if summary else ""),
            held,
        )

    async def _run_child(self, req_path: str) -> tuple[int, str]:
        """`python -m journal.spark.batch --request ...` in its own process group; its output is logged."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(jm.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "journal.spark.batch",
            "--request",
            req_path,
            "--driver-memory",
            "1g",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=root,
            env=env,
            start_new_session=True,
        )
        self.children[proc.pid] = proc
        last = ""
        try:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                if not line or ("WARN" in line and "NativeCodeLoader" in line):
                    continue
                log.info("journal job %d: %s", proc.pid, line)
                last = line
            rc = await proc.wait()
        finally:
            self.children.pop(proc.pid, None)
        return rc, last


def archive_scheduled(config: Config) -> bool:
    """Whether an <Actions> step archives the journal (compaction then drops only what the
    archive holds; the CLI and the server decide it the same way)."""
    return any(s.name == "archive-journal" for a in config.actions for s in a.do)


def _label(action: Action) -> str:
    return action.on.name or ",".join(s.name for s in action.do)


def _signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
