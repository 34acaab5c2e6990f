"""Work per message, counted: this tree's server against another build's, with one client.

    ./run bench bench_costs --before-tree PATH [--benches publish,publish1,queue1,queue100,replay,replayf,fanout]
                      [--scale 1.0] [--no-results]

Throughput on a shared 2-core machine moves by ±15 % between runs of one build, so a change of
5 % cannot be told from noise in msgs/s (bench/compare.py). What the server does per message
does not move. For each benchmark and each side the server runs twice, at two counts, under

    valgrind --tool=callgrind   instructions executed in user space, every thread (Ir)
    strace -f -c                system calls made, every thread
    bytecodes                   Python opcodes executed, every thread (bench/bytecount.py)

and the work per message is the difference between the two runs over the difference in count:
start-up, the journal's creation and shutdown cancel out. Both sides are driven by this tree's
benchmark code (each benchmark's `one_rep`, peer `tickertape-base` with TICKERTAPE_BASE_BIN
pointed at a wrapper that starts `serve` under the tool), so only the server differs. PATH is an
installed checkout with its own .venv (bench/compare.py keeps one with --workdir).

What it does not see: the kernel's work inside a call (an fdatasync is one call however long
it takes) and time spent waiting. Under valgrind the server runs some 50× slower, so its reads
find more bytes waiting and its commits carry more messages than at full speed: both sides are
slowed alike, and the figure is for comparing two builds, not a profile of one. LMDB's 64 GiB
map reservations do not fit valgrind's address space: a sitecustomize on the server's path
clamps every map to 1 GiB (the runs here stay far below it).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import bench_fanout
import bench_publish
import bench_queue
import bench_replay
import benchlib
import bytecount
import journaldata
import peers
from benchlib import Variant

START_TIMEOUT = 900.0  # seconds: imports alone take a minute or two under valgrind
# A server under valgrind on a loaded machine can take longer than the default 10 s from a
# connect to reading its logon; both builds read the root <LogonTimeout>. <IdlePoll> 0: the
# idle poll spins for a time, not for an amount of work, so under valgrind its instructions
# follow the clock and the machine's load (the backlog-1 queue's count moved by 7 % with it).
SLOW_XML = "  <LogonTimeout>600s</LogonTimeout>\n  <IdlePoll>0</IdlePoll>\n"
SITE = """\
import lmdb
_open = lmdb.open


def _clamped(*a, **k):
    k["map_size"] = min(k.get("map_size", 10 << 20), 1 << 30)
    return _open(*a, **k)


lmdb.open = _clamped
"""
# The server is `serve --config FILE`; every other call (the peer's --help probe) runs plainly.
WRAPPER = """#!/bin/bash
if [ "$1" != serve ] || [ "$2" != --config ]; then exec {py} {bin} "$@"; fi
{run}
"""
RUN = {
    # callgrind writes its counts when the process exits (SIGTERM from peer.stop included)
    "callgrind": "PYTHONPATH={site} exec valgrind --tool=callgrind -q "
    '--callgrind-out-file={out}/cg.%p {py} {bin} "$@"',
    # the peer signals the wrapper, which passes SIGTERM to the server (strace's child) so that
    # strace itself lives to write its table
    "strace": 'strace -f -c -o {out}/st.txt {py} {bin} "$@" &\nSP=$!\n'
    "trap 'pkill -TERM -P $SP' TERM\nwait $SP; wait $SP",
    # the tracer is this tree's, run by the other tree's interpreter (it needs the stdlib only)
    "bytecodes": 'PYTHONPATH={site} exec {py} {here}/bytecount.py {out}/bc.json {tree} {bin} "$@"',
}
# what each tool needs installed
PROGRAMS = {"callgrind": "valgrind", "strace": "strace", "bytecodes": None}
HERE = os.path.dirname(os.path.abspath(__file__))


class CostsError(Exception):
    """A run could not be counted (tool missing, server failed); the message says what to do."""


@dataclass
class Spec:
    """One benchmark: its one_rep, the variant options, the two counts, what a unit is."""

    module: object
    opts: dict
    counts: tuple[int, int]
    unit: str = "msg"
    config_xml: str = ""  # more of the server's config (the queue's)
    per_count: int = 1  # units per counted message (deliveries per publish in fan-out)


def specs(args) -> dict[str, Spec]:
    queue = bench_queue.QUEUE_XML
    return {
        "publish": Spec(bench_publish, {"per_send": 0}, (20_000, 120_000)),
        "publish1": Spec(bench_publish, {"per_send": 1}, (10_000, 40_000)),
        "queue1": Spec(bench_queue, {"backlog": 1}, (300, 1_300), config_xml=queue),
        "queue100": Spec(bench_queue, {"backlog": 100}, (5_000, 25_000), config_xml=queue),
        "replay": Spec(bench_replay, {}, (50_000, 250_000)),
        "replayf": Spec(bench_replay, {"filter": bench_replay.FILTER}, (50_000, 250_000)),
        "fanout": Spec(bench_fanout, {}, (5_000, 25_000), "delivery", per_count=args.subs),
    }


def tool_total(tool: str, out: str) -> int:
    """Ir summed over the callgrind files, or the calls in strace -c's total row."""
    if tool == "callgrind":
        total = 0
        for path in glob.glob(os.path.join(out, "cg.*")):
            with open(path) as f:
                m = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
            total += int(m.group(1)) if m else 0
        if not total:
            raise CostsError(f"no callgrind counts in {out}: did the server exit cleanly?")
        return total
    if tool == "bytecodes":
        return sum(ops for ops, _calls in bytecode_rows(out).values())
    with open(os.path.join(out, "st.txt")) as f:
        # "% time  seconds  usecs/call  calls  [errors]  syscall": the row whose name is total
        rows = [line.split() for line in f if line.rstrip().endswith(" total")]
    if not rows:
        raise CostsError(f"no strace total in {out}/st.txt: did the server exit cleanly?")
    return int(rows[-1][3])


def bytecode_rows(out: str) -> bytecount.Rows:
    try:
        with open(os.path.join(out, "bc.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise CostsError(
            f"no bytecode counts in {out}: did the server exit cleanly? ({exc})"
        ) from exc


def run_once(args, spec: Spec, n: int, tree: str, tool: str, work: str) -> str:
    """One server run of spec at count n, the server from tree: the directory of its counts."""
    out = tempfile.mkdtemp(dir=work)
    site = os.path.join(work, "site")
    wrapper = os.path.join(out, "tickertape")
    py, binary = (os.path.join(tree, ".venv", "bin", x) for x in ("python", "tickertape"))
    run = RUN[tool].format(site=site, out=out, py=py, bin=binary, here=HERE, tree=tree)
    with open(wrapper, "w") as f:
        f.write(WRAPPER.format(py=py, bin=binary, run=run))
    os.chmod(wrapper, 0o755)
    peers.TICKERTAPE_BASE_BIN = wrapper
    args.count = n
    peer = peers.make_peer("tickertape-base")
    peer.extra["config_xml"] = SLOW_XML + spec.config_xml
    if spec.module is bench_replay:
        jdir, _meta = journaldata.cached_journal(n, bench_replay.TOPIC, args.size)
        peer.extra["journal_copy_from"] = jdir
    try:
        peer.start(timeout=START_TIMEOUT)
        res = spec.module.one_rep(args, peer, Variant("costs", "tickertape-base", spec.opts), 0)
    finally:
        peer.cleanup()
    if res.get("problem"):
        raise CostsError(f"{tree}: {res['problem']}")
    tool_total(tool, out)  # counts there, or the error that says why not
    return out


def counts(args, spec: Spec, tool: str) -> tuple[int, int]:
    """strace's counts are 10× callgrind's: it runs at near full speed, and how many reads and
    polls a message takes depends on timing, which a longer run averages out."""
    k = args.scale * (10 if tool == "strace" else 1)
    lo, hi = spec.counts
    return round(lo * k), round(hi * k)


def counted(args, spec: Spec, n: int, tree: str, tool: str, work: str) -> str:
    """run_once, again once if it failed: on a loaded machine a server under valgrind can miss a
    deadline of the client's (a connect, a first reply) without anything being wrong with it."""
    try:
        return run_once(args, spec, n, tree, tool, work)
    except Exception as exc:  # any failure of the run; a second one is raised
        print(f"  (run at {n} failed: {exc!r}; once more)", flush=True)
        return run_once(args, spec, n, tree, tool, work)


def per_unit(args, spec: Spec, tree: str, tool: str, work: str) -> tuple[float, dict]:
    """The tool's count per unit, and (bytecodes) bytecount.split's parts of it."""
    lo, hi = counts(args, spec, tool)
    a = counted(args, spec, lo, tree, tool, work)
    b = counted(args, spec, hi, tree, tool, work)
    units = (hi - lo) * spec.per_count
    parts = {}
    if tool == "bytecodes":
        parts = bytecount.split(bytecode_rows(a), bytecode_rows(b), units)
    return (tool_total(tool, b) - tool_total(tool, a)) / units, parts


def split_line(name: str, side: str, unit: str, parts: dict) -> str:
    """bytecount.split's parts as a line of the notes."""
    return (
        f"bytecodes, {name} {side}: {parts['per_unit_fns']:,.0f} a {unit} in the functions "
        f"every {unit} runs, the rest {parts['per_commit']:,.0f} a group commit "
        f"({parts['commits']:.3f} commits a {unit})"
    )


def fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.4f}"


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--before-tree", required=True, help="an installed checkout (with .venv)")
    p.add_argument(
        "--after-tree",
        default=peers.REPO,
        help="the other side (default: this tree); the same as --before-tree measures the "
        "method's own spread",
    )
    p.add_argument("--benches", default="publish,publish1,queue1,queue100,replay,replayf,fanout")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every count by this")
    p.add_argument("--tools", default="callgrind,strace", help="callgrind, strace, bytecodes")
    p.add_argument("--subs", type=int, default=10, help="fan-out subscribers")
    p.add_argument("--window", type=int, default=1000, help="most unacked messages in flight")
    benchlib.run_args(p)
    args = p.parse_args()
    args.consume, args.load_window, args.no_verify, args.sender = 0, 5000, True, "c"
    args.redis_count, args.timeout = 1000, max(args.timeout, 900.0)
    tools = [t for t in args.tools.split(",") if t]
    for t in tools:
        if t not in RUN:
            raise SystemExit(f"costs: unknown tool {t!r}; choose from {sorted(RUN)}")
        if PROGRAMS[t] and not shutil.which(PROGRAMS[t]):
            raise SystemExit(f"costs: {PROGRAMS[t]} is not installed: install it for --tools {t}")
    before, after = (os.path.abspath(t) for t in (args.before_tree, args.after_tree))
    for tree in (before, after):
        if not os.path.exists(os.path.join(tree, ".venv", "bin", "tickertape")):
            raise SystemExit(f"costs: {tree} has no .venv/bin/tickertape: run ./run install there")
    table = specs(args)
    names = [b for b in args.benches.split(",") if b]
    if unknown := [b for b in names if b not in table]:
        raise SystemExit(f"costs: unknown benchmark(s) {unknown}; choose from {sorted(table)}")
    rows = []
    splits: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tt-costs-") as work:
        os.makedirs(os.path.join(work, "site"))
        with open(os.path.join(work, "site", "sitecustomize.py"), "w") as f:
            f.write(SITE)
        for name in names:
            spec = table[name]
            figs = {}
            for tool in tools:
                for side, tree in (("before", before), ("after", after)):
                    figs[tool, side], parts = per_unit(args, spec, tree, tool, work)
                    print(
                        f"  {name:9} {tool:9} {side:6}: {fmt(figs[tool, side])}/{spec.unit}",
                        flush=True,
                    )
                    if parts.get("commits"):  # a split needs group commits to split off
                        splits.append(split_line(name, side, spec.unit, parts))
                        print("   ", splits[-1], flush=True)
            rows.append((name, spec.unit, figs))
    head = "| bench | per | " + " | ".join(
        f"{t} before | {t} after | after ÷ before" for t in tools
    )
    lines = [head + " |", "|---|---|" + "---:|---:|---:|" * len(tools)]
    for name, unit, figs in rows:
        cells = []
        for t in tools:
            b, a = figs[t, "before"], figs[t, "after"]
            cells += [fmt(b), fmt(a), f"{a / b:.3f}×" if b else "—"]
        lines.append(f"| {name} | {unit} | " + " | ".join(cells) + " |")
    peers.TICKERTAPE_BASE_BIN = os.path.join(before, ".venv", "bin", "tickertape")
    rev_before, rev_after = (
        subprocess.run(
            ["git", "-C", t, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        for t in (before, after)
    )
    notes = [
        f"before: the server at git {rev_before}; after: the server at git {rev_after}"
        + (" (this tree)" if after == os.path.abspath(peers.REPO) else "")
        + "; the client for both: this tree's benchmark code",
        "callgrind = user-space instructions per unit, every thread; strace = system calls per "
        "unit; bytecodes = Python opcodes per unit, every thread; each the difference of two "
        "runs over the difference in units (callgrind's and bytecodes' counts: "
        + ", ".join(f"{n} {counts(args, table[n], 'callgrind')}" for n in names)
        + "; strace's 10× those)",
        *splits,
    ]
    benchlib.write_section(
        "bench_costs",
        "Work per message, counted (bench_costs)",
        notes,
        "\n".join(lines),
        [],
        args.no_results,
    )


if __name__ == "__main__":
    main()
