"""The runner the fault campaigns share: rounds, seeds, totals, the exit code, --json and --keep.

    ./run bench fault_campaign [--seams] --rounds N --seed S [--first-round R] [--faults a,b]
                               [--json out.json] [--keep DIR] [--time-limit S]

A campaign is a `Mode`: the fault classes it knows, the totals it counts, and `play`, which runs
one round in a fresh directory and returns (stats, violations). Round r draws every random
choice from `random.Random(seed * 100003 + r)`, first the round's faults (`Mode.pick`), so
`--first-round R --rounds 1` with the same seed and --faults replays round R exactly as far as
the processes' timing allows. Each violation is printed with its round, faults and seed, and the
command line that replays it.

Exit code: 0 no violation, 1 violations, 2 setup error, 3 time limit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass


class SetupError(Exception):
    """The campaign cannot run here (no tmpfs without root, no server installed): exit 2."""


@dataclass
class Mode:
    name: str  # "single-node" or "seams": in the totals
    faults: tuple[str, ...]
    stat_keys: tuple[str, ...]
    # (rng, enabled faults) -> the round's faults, "+"-joined
    pick: Callable[[random.Random, list[str]], str]
    # (round, rng, faults, directory) -> (stats, violations)
    play: Callable[[int, random.Random, str, str], tuple[dict, list[str]]]
    replay_flags: str = ""  # put in the replay command line ("--seams")


def mount_tmpfs(path: str, size: str) -> None:
    """A small filesystem of its own at `path`, so that its disk can fill (root only)."""
    import subprocess

    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise SetupError(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")


def unmount_under(path: str) -> None:
    """Unmount every filesystem mounted at or below `path` (a round's tmpfs), deepest first."""
    import subprocess

    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for p in sorted((p for p in points if p == path or p.startswith(path + "/")), reverse=True):
        subprocess.run(["umount", "-l", p], check=False)


def round_seed(seed: int, r: int) -> int:
    return seed * 100003 + r


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first-round", type=int, default=0)
    ap.add_argument("--json", help="write the totals and violations here")
    ap.add_argument("--keep", help="keep each failing round's directory under here")
    ap.add_argument(
        "--time-limit", type=float, default=0, help="stop after this many seconds (exit 3)"
    )
    ap.add_argument("--faults", help="comma list of fault classes (default: all of the mode's)")


def run(args: argparse.Namespace, mode: Mode) -> int:
    faults = [f for f in (args.faults or ",".join(mode.faults)).split(",") if f]
    unknown = [f for f in faults if f not in mode.faults]
    if unknown or not faults:
        print(
            f"fault_campaign: unknown fault(s) {unknown or args.faults!r}; "
            f"use {', '.join(mode.faults)}",
            file=sys.stderr,
        )
        return 2
    # SIGTERM unwinds like Ctrl-C, so a round's `finally` stops its servers and the tmpfs
    # mounts under `root` are undone
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = tempfile.mkdtemp(prefix="tt-faults-")
    totals: dict = {"mode": mode.name, "rounds": 0, **{k: 0 for k in mode.stat_keys}}
    totals["by_fault"] = {f: 0 for f in faults}
    all_violations = []
    started = time.monotonic()
    rc = 0
    try:
        for r in range(args.first_round, args.first_round + args.rounds):
            if args.time_limit and time.monotonic() - started > args.time_limit:
                rc = 3
                break
            rng = random.Random(round_seed(args.seed, r))
            label = mode.pick(rng, faults)
            data = os.path.join(root, f"round-{r}")
            os.makedirs(data)
            try:
                stats, violations = mode.play(r, rng, label, data)
            except SetupError as exc:
                print(f"fault_campaign: {exc}", file=sys.stderr)
                return 2
            totals["rounds"] += 1
            for f in label.split("+"):
                totals["by_fault"][f] = totals["by_fault"].get(f, 0) + 1
            for k in mode.stat_keys:
                totals[k] += stats.get(k, 0)
            line = f"round {r:4d} {label:18s} " + " ".join(
                f"{k} {stats.get(k, 0)}" for k in mode.stat_keys
            )
            print(line, flush=True)
            if violations:
                again = (
                    f"./run bench fault_campaign {mode.replay_flags} --seed {args.seed} "
                    f"--first-round {r} --rounds 1 --faults {','.join(faults)}"
                ).replace("  ", " ")
                for v in violations:
                    print(f"  VIOLATION round {r} faults {label} seed {args.seed}: {v}", flush=True)
                print(f"  replay: {again}", flush=True)
                all_violations.append(
                    {
                        "round": r,
                        "fault": label,
                        "seed": args.seed,
                        "violations": violations,
                        "replay": again,
                    }
                )
                if args.keep:
                    shutil.copytree(
                        data, os.path.join(args.keep, f"round-{r}"), dirs_exist_ok=True,
                        ignore_dangling_symlinks=True,
                    )  # fmt: skip
            unmount_under(data)
            shutil.rmtree(data, ignore_errors=True)
    finally:
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
    totals["seconds"] = round(time.monotonic() - started, 1)
    totals["violations"] = all_violations
    print(json.dumps({k: v for k, v in totals.items() if k != "violations"}))
    print(
        f"fault campaign ({mode.name}): {totals['rounds']} rounds, "
        + ", ".join(f"{k} {totals[k]}" for k in mode.stat_keys)
        + f", {len(all_violations)} round(s) with violations"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(totals, f, indent=1)
    if rc:
        return rc
    return 1 if all_violations else 0
