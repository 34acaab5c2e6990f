"""Python bytecodes a program executes, per function, in every thread (bench_costs' third tool).

    python bytecount.py OUT.json ROOT SCRIPT [ARGS...]

runs SCRIPT (the server's `tickertape` entry point) as __main__ under a trace function that
counts each opcode executed, and on exit writes OUT.json: {"ROOT-relative file:line:name":
[opcodes, calls]}. Callgrind counts the interpreter's instructions, which move with how often
3.11 specialises an attribute read and how many objects a call leaves behind; this counts what
the Python code itself asks for, which only the code moves. Tracing runs the server some 20×
slower, so timers fire more often per message than at full speed: `split` separates the work
every message does from the rest (the group commit's, whose number per message follows the
clock), so that two builds can be compared on each.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
from collections import Counter
from types import CodeType, FrameType
from typing import Any

Rows = dict[str, list[int]]  # function -> [opcodes, calls]
COMMIT = "journal/writer.py", "_commit"  # the group commit, in every build since the first


def split(lo: Rows, hi: Rows, units: int) -> dict[str, float]:
    """Per unit between two runs `units` apart: all opcodes, those of functions called about
    once a unit or more (`per_unit_fns`), the rest per group commit (`per_commit`), and the
    commits a unit (`commits`)."""
    every = per_unit_fns = rest = commits = 0.0
    for key in set(lo) | set(hi):
        o0, c0 = lo.get(key, [0, 0])
        o1, c1 = hi.get(key, [0, 0])
        ops, calls = (o1 - o0) / units, (c1 - c0) / units
        every += ops
        if calls >= 0.95:
            per_unit_fns += ops
        else:
            rest += ops
        file, _line, name = key.rsplit(":", 2)
        if (file, name) == COMMIT:
            commits += calls
    return {
        "all": every,
        "per_unit_fns": per_unit_fns,
        "per_commit": rest / commits if commits else 0.0,
        "commits": commits,
    }


def main(argv: list[str]) -> None:
    out, root, script, *rest = argv
    root = os.path.abspath(root) + os.sep
    tallies: list[tuple[Counter[CodeType], Counter[CodeType]]] = []
    local = threading.local()

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        # per thread: a shared Counter's += can lose counts when the GIL changes hands in it
        try:
            ops, calls = local.t
        except AttributeError:
            local.t = ops, calls = Counter(), Counter()
            tallies.append(local.t)
        if event == "opcode":
            ops[frame.f_code] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
            calls[frame.f_code] += 1
        return tracer

    def dump() -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        rows: Rows = {}
        for ops, calls in list(tallies):
            for code in set(ops) | set(calls):
                path = code.co_filename
                path = path[len(root) :] if path.startswith(root) else os.path.basename(path)
                row = rows.setdefault(f"{path}:{code.co_firstlineno}:{code.co_name}", [0, 0])
                row[0] += ops[code]
                row[1] += calls[code]
        with open(out, "w") as f:
            json.dump(rows, f)

    atexit.register(dump)
    sys.argv = [script, *rest]
    threading.settrace(tracer)
    sys.settrace(tracer)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
