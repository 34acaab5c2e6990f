"""The `<Actions>` section: scheduled journal management.

An `<Action>` has one `<On>` (when) and one or more `<Do>` (what, in order). Each names a module
(`amps-action-on-schedule`, `amps-action-do-archive-journal`, ...; `tickertape-action-` is the same
prefix) from the tables in `config.schema`, and takes that module's `<Options>`.
docs/configuration.md ("`<Actions>`") describes every module and option.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import cast

from .model import Action, ActionStep, ActionTrigger, StepName, TransactionLog
from .rules import Checker, Section, positive_interval
from .schema import ACTION, ACTIONS, DO, MODULE_PREFIXES, ON, OPTION_SPECS, STEPS, TRIGGERS
from .values import parse_interval
from .xmltree import Node

__all__ = ["every", "read_actions"]

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAILY = re.compile(
    r"(?:(?P<day>[A-Za-z]+)\s+at\s+)?(?P<h>[0-9]{1,2}):(?P<m>[0-9]{2})(?P<z>[Zz])?", re.IGNORECASE
)

# module short name -> (options allowed, options required)
_ModuleTable = Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]


def read_actions(checker: Checker, node: Node | None, tlog: TransactionLog | None) -> list[Action]:
    """The actions of `<Actions>` (none without it). An action with any problem is left out.

    `tlog` is the transaction log (None without one): journal steps need it.
    """
    if node is None:
        return []
    sec = Section(checker, node, ACTIONS)
    actions = []
    for anode in sec.many("Action"):
        a = Section(checker, anode, ACTION)
        on_node = a.one("On")
        if on_node is None:
            a.missing("On", " (when the action runs)")
        if not a.many("Do"):
            a.missing("Do", " (what the action does)")
        trigger = _trigger(checker, on_node) if on_node is not None else None
        steps = [_step(checker, d, tlog) for d in a.many("Do")]
        done = [s for s in steps if s is not None]
        if trigger is not None and steps and len(done) == len(steps):
            actions.append(Action(on=trigger, do=tuple(done)))
    return actions


def _module(
    checker: Checker, node: Node, kind: str, table: _ModuleTable
) -> tuple[str | None, dict[str, tuple[str, Node]]]:
    """The short module name of an <On>/<Do>, and its options {name: (text, node)}."""
    sec = Section(checker, node, ON if kind == "on" else DO)
    example = f" (for example amps-action-{kind}-{next(iter(table))})"
    module_text = sec.text("Module", required=True, hint=example)
    short = None
    if module_text is not None:
        for prefix in MODULE_PREFIXES:
            if module_text.startswith(f"{prefix}{kind}-"):
                short = module_text[len(prefix) + len(kind) + 1 :]
        if short not in table:
            supported = ", ".join(f"amps-action-{kind}-{m}" for m in table)
            checker.report(
                sec.at("Module"),
                f"unsupported <{node.tag}> module {module_text!r}; supported: {supported}",
            )
            short = None
    options: dict[str, tuple[str, Node]] = {}
    if short is None:
        return None, options
    allowed, required = table[short]
    opts_node = sec.one("Options")
    if opts_node is not None:
        opts = Section(checker, opts_node, OPTION_SPECS[(kind, short)])
        for option in allowed:
            onode = opts.one(option)
            if onode is not None:
                text = checker.leaf(onode)
                if text is not None:
                    options[option] = (text, onode)
    present = {c.tag for c in opts_node.children} if opts_node is not None else set()
    for option in required:
        if option not in present:  # present but invalid has been reported already
            checker.report(
                opts_node or node,
                f"{module_text} needs <Options><{option}>...</{option}></Options>",
            )
    return short, options


def _trigger(checker: Checker, node: Node) -> ActionTrigger | None:
    short, options = _module(checker, node, "on", TRIGGERS)
    if short is None:
        return None
    if short == "startup":
        return ActionTrigger(kind="startup")
    if "Every" not in options:
        return None
    text, every_node = options["Every"]
    try:
        interval, at, weekday, utc = every(text)
    except ValueError as e:
        checker.report(every_node, str(e))
        return None
    name = options["Name"][0] if "Name" in options else None
    return ActionTrigger(
        kind="schedule", every=interval, at=at, weekday=weekday, utc=utc, name=name
    )


def _step(checker: Checker, node: Node, tlog: TransactionLog | None) -> ActionStep | None:
    short, options = _module(checker, node, "do", STEPS)
    if short is None:
        return None
    if tlog is None:
        checker.report(node, f"{short} needs a <TransactionLog>; add one or remove this <Do>")
    elif short == "archive-journal" and tlog.archive_directory is None:
        checker.report(
            node,
            "archive-journal needs <JournalArchiveDirectory> in <TransactionLog>; add it",
        )
    typed: dict[str, float] = {}
    ok = True
    for option in ("Age", "Retention"):
        if option in options:
            text, onode = options[option]
            try:
                typed[option] = parse_interval(text)
            except ValueError as e:
                checker.report(onode, str(e))
                ok = False
    if not ok or any(o not in options for o in STEPS[short][1]):
        return None
    return ActionStep(
        name=cast(StepName, short),
        options=tuple((k, v[0]) for k, v in options.items()),
        age=typed.get("Age"),
        retention=typed.get("Retention"),
    )


def every(text: str) -> tuple[float | None, tuple[int, int] | None, int | None, bool]:
    """`<Every>`: (interval, at, weekday, utc). Timer, daily time or weekly time."""
    with contextlib.suppress(ValueError):
        return positive_interval(text), None, None, False
    m = _DAILY.fullmatch(text)
    if m:
        hour, minute = int(m.group("h")), int(m.group("m"))
        weekday = None
        if m.group("day"):
            day = m.group("day").lower()
            matches = [i for i, d in enumerate(_WEEKDAYS) if d == day or d[:3] == day]
            if not matches:
                raise ValueError(f"unknown weekday {m.group('day')!r} in {text!r}")
            weekday = matches[0]
        if hour > 23 or minute > 59:
            raise ValueError(f"invalid time of day in {text!r}; use 00:00 to 23:59")
        return None, (hour, minute), weekday, bool(m.group("z"))
    raise ValueError(
        f"invalid schedule {text!r}; write an interval (30m, 1h, 1d), a daily time (17:45, or "
        "17:45Z for UTC) or a weekly time (Saturday at 00:30)"
    )
