"""Before and after: the same benchmarks on another commit and on this working tree, in one run.

    ./run bench compare --before REF [--benches publish,replay,queue,fanout] [--reps 3]
                        [--peers tickertape] [--workdir DIR | --before-tree PATH] [--results] [--arg BENCH=ARGS]
                        [--pin CPUS]

REF is checked out in a throwaway `git worktree` (under a temp dir, or DIR/before-<sha> with
--workdir, kept and reused there) and gets its own `.venv` through its own `./run install`, so
each side runs its own benchmark scripts against its own server (--before-tree PATH: an
installed checkout instead). Each repetition runs every
named benchmark once on each side (`--reps 1 --no-results`, small counts: BENCH_ARGS, or
`--arg publish="--count 50000"`), before and after alternating, ABBA per repetition, so a noisy
spell on the machine hits both sides alike. The figures are read back from the table each
benchmark prints (`| peer | ...`), the median of the repetitions taken per figure, and a table
of after ÷ before printed; a figure that moved the wrong way by more than 5 % (per its Metric's
`better`) is marked. Its last column, `pairs ÷`, is the median of the repetitions' own
after ÷ before (pair_ratio): on a machine whose load drifts it is the steadier of the two. --results replaces the `bench_compare` section of bench/RESULTS.md with it,
the machine, the versions, the date and both commits.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

import benchlib
import peers

BENCH_ARGS = {  # small counts: the four take a few minutes per repetition pair
    "publish": ["--count", "20000"],
    "replay": ["--count", "200000", "--slow-seconds", "0"],
    "queue": ["--count", "20000"],
    "fanout": ["--count", "10000"],
}
TOLERANCE = 0.95  # after ÷ before below this (higher is better) is marked worse
RUN_TIMEOUT = 900.0  # seconds one benchmark run may take on one side

Key = tuple[str, str, str]  # (table caption, row label, column title)


class CompareError(Exception):
    """The comparison cannot run (bad ref, failed install); the message says what to fix."""


# ---- reading what a benchmark printed (pure) -----------------------------------------------


def number(cell: str) -> float | None:
    """The leading figure of a table cell: "12,345 (11,000–13,000)" -> 12345.0; "—" -> None."""
    m = re.match(r"\s*(-?[\d,]*\.?\d+)", cell)
    return float(m.group(1).replace(",", "")) if m else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def figures(text: str) -> dict[Key, float | None]:
    """Every figure of every `| peer | ...` table in a benchmark's output.

    A table is named by the heading above it within the section (`### backlog 10`, or a line
    ending in a colon, e.g. "Backlog 1:"; a benchmark with one table per case heads each), and
    numbered when two share a name."""
    out: dict[Key, float | None] = {}
    lines = text.splitlines()
    caption, seen = "", {}
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("## "):
            caption = ""
        elif line.startswith("#") or (line.endswith(":") and not line.startswith(("-", "|"))):
            caption = line.lstrip("#").strip()
        if line.startswith("| peer |") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            head = _cells(line)[1:]
            seen[caption] = seen.get(caption, 0) + 1
            name = caption if seen[caption] == 1 else f"{caption} #{seen[caption]}"
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                row = _cells(lines[i])
                for title, cell in zip(head, row[1:], strict=False):
                    out[(name, row[0], title)] = number(cell)
                i += 1
            continue
        i += 1
    return out


def better_by_title(bench: str) -> dict[str, str]:
    """Column title -> "higher" | "lower" from the benchmark module's Metric lists, for the
    figures it compares (ratio=True); the others (client CPU, frames per send) are shown, not
    judged."""
    try:
        mod = importlib.import_module(f"bench_{bench}")
    except ImportError:
        return {}
    out = {}
    for val in vars(mod).values():
        if isinstance(val, list) and val and all(isinstance(m, benchlib.Metric) for m in val):
            out.update({m.title: m.better for m in val if m.ratio})
    return out


def verdict(before: float | None, after: float | None, better: str | None) -> str:
    if not before or after is None:
        return ""
    r = after / before
    if (better == "higher" and r < TOLERANCE) or (better == "lower" and r > 1 / TOLERANCE):
        return "**worse**"
    return ""


def compare_table(
    runs: dict[str, dict[str, list[dict[Key, float | None]]]], better: dict[str, dict[str, str]]
) -> str:
    """runs: bench -> {"before": [figures per rep], "after": [...]} -> markdown table of the
    medians and after ÷ before, one row per figure both sides printed."""
    lines = [
        "| bench | table | row | figure | before | after | after ÷ before | | pairs ÷ |",
        "|---|---|---|---|---:|---:|---:|---|---:|",
    ]
    for bench, sides in runs.items():
        keys: list[Key] = []
        for reps in (sides["before"], sides["after"]):
            for figs in reps:
                keys += [k for k in figs if k not in keys]
        for key in keys:
            med = {}
            for side, reps in sides.items():
                vals = [v for figs in reps if (v := figs.get(key)) is not None]
                med[side] = statistics.median(vals) if vals else None
            b, a = med.get("before"), med.get("after")
            ratio = f"{a / b:.2f}×" if b and a is not None else "—"
            mark = verdict(b, a, better.get(bench, {}).get(key[2]))
            cap, row, title = key
            pr = pair_ratio(sides, key)
            pairs = f"{pr:.2f}×" if pr is not None else "—"
            lines.append(
                f"| {bench} | {cap} | {row} | {title} | {_fmt(b)} | {_fmt(a)} | {ratio} | {mark} "
                f"| {pairs} |"
            )
    return "\n".join(lines)


def pair_ratio(sides: dict[str, list[dict[Key, float | None]]], key: Key) -> float | None:
    """The median over the repetitions of after ÷ before of one figure: repetition i ran both
    sides back to back (ABBA), so a change in the machine's load between repetitions cancels
    within each pair, where it moves one side's median (a shared machine: the other column can
    swing by a third with nothing changed). None when no repetition has both figures."""
    ratios = [
        a / b
        for fb, fa in zip(sides.get("before", []), sides.get("after", []), strict=False)
        if (b := fb.get(key)) and (a := fa.get(key)) is not None
    ]
    return statistics.median(ratios) if ratios else None


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


# ---- running both sides --------------------------------------------------------------------


def _git(*args: str, cwd: str = peers.REPO) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if r.returncode:
        raise CompareError(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def before_path(ref: str, workdir: str) -> str:
    """Where the worktree of `ref` goes: workdir/before-<sha>."""
    sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    return os.path.join(workdir, f"before-{sha[:12]}")


def before_tree(path: str) -> str:
    """The worktree at path (made when missing) with its own installed .venv."""
    sha = os.path.basename(path).removeprefix("before-")
    if not os.path.isdir(path):
        _git("worktree", "add", "--detach", path, sha)
    print(f"compare: installing {sha} in {path} (./run install)", flush=True)
    r = subprocess.run([os.path.join(path, "run"), "install"], cwd=path, check=False)
    if r.returncode or not os.access(os.path.join(path, ".venv", "bin", "python"), os.X_OK):
        raise CompareError(f"./run install failed in {path}: see its output above")
    return path


def run_one(
    tree: str, bench: str, args: list[str], log, pin: str | None = None
) -> dict[Key, float | None]:
    py = os.path.join(tree, ".venv", "bin", "python")
    cmd = [py, os.path.join(tree, "bench", f"bench_{bench}.py"), *args]
    if pin:  # the benchmark, its client and every server it starts inherit the CPU set
        cmd = ["taskset", "-c", pin, *cmd]
    log.write(f"\n$ {shlex.join(cmd)}\n")
    log.flush()
    try:
        r = subprocess.run(
            cmd, cwd=tree, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
        )
        out, err = r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"(timed out after {RUN_TIMEOUT:.0f} s)"
    log.write(out + err)
    log.flush()
    return figures(out)


def run_compare(args, before: str, log) -> dict[str, dict[str, list[dict[Key, float | None]]]]:
    trees = {"before": before, "after": peers.REPO}
    runs = {b: {"before": [], "after": []} for b in args.benches}
    for rep in range(args.reps):
        order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
        for bench in args.benches:
            extra = ["--reps", "1", "--no-results", "--peers", args.peers, *args.bench_args[bench]]
            for side in order:
                figs = run_one(trees[side], bench, extra, log, args.pin)
                runs[bench][side].append(figs)
                print(
                    f"  rep {rep + 1}/{args.reps} {bench:8} {side:6}: {len(figs)} figures",
                    flush=True,
                )
    return runs


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--before", required=True, help="the commit to compare against (any git ref)")
    p.add_argument("--benches", default=",".join(BENCH_ARGS), help="comma list of benchmarks")
    p.add_argument("--reps", type=int, default=3, help="runs per side per benchmark (median)")
    p.add_argument("--peers", default="tickertape", help="--peers for every run")
    p.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="BENCH=ARGS",
        help="replace a benchmark's small-count arguments, e.g. publish='--count 50000'",
    )
    p.add_argument("--workdir", help="keep the before worktree here and reuse it next time")
    p.add_argument(
        "--before-tree",
        help="an installed checkout (with its .venv) to run as the before side instead of a "
        "worktree of --before (which then only names it)",
    )
    p.add_argument(
        "--pin",
        metavar="CPUS",
        help="run every benchmark on these CPUs (taskset -c), client and servers alike: a "
        "one-in-flight round trip then stays on one core instead of waiting on a wake-up of "
        "the other, whose cost on a virtual machine doubles the spread (see README)",
    )
    p.add_argument("--results", action="store_true", help="write the bench_compare section")
    args = p.parse_args()
    if args.pin and not shutil.which("taskset"):
        raise SystemExit("compare: --pin needs taskset (util-linux)")
    args.benches = [b.strip() for b in args.benches.split(",") if b.strip()]
    args.bench_args = {b: list(BENCH_ARGS.get(b, [])) for b in args.benches}
    for a in args.arg:
        bench, _, rest = a.partition("=")
        if bench not in args.bench_args:
            raise SystemExit(f"--arg {a!r}: {bench!r} is not in --benches")
        args.bench_args[bench] = shlex.split(rest)
    for b in args.benches:
        if not os.path.isfile(os.path.join(peers.HERE, f"bench_{b}.py")):
            raise SystemExit(f"no bench/bench_{b}.py: --benches names bench_NAME.py files")
    workdir = args.workdir or tempfile.mkdtemp(prefix="tt-compare-")
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, "compare.log")
    tree = None
    try:
        tree = None if args.before_tree else before_path(args.before, workdir)
        before = args.before_tree or before_tree(tree)
        with open(log_path, "a") as log:
            runs = run_compare(args, before, log)
        before_rev = peers.tickertape_rev(before)
    except CompareError as e:
        raise SystemExit(f"compare: {e}") from None
    finally:
        if not args.workdir:  # a throwaway: keep only the log, under bench/.data
            if tree and os.path.isdir(tree):
                _git("worktree", "remove", "--force", tree)
            if os.path.exists(log_path):
                os.makedirs(peers.DATA_ROOT, exist_ok=True)
                shutil.copy(log_path, os.path.join(peers.DATA_ROOT, "compare.log"))
            shutil.rmtree(workdir, ignore_errors=True)
    table = compare_table(runs, {b: better_by_title(b) for b in args.benches})
    notes = [
        f"before: {args.before} ({before_rev}); after: this working tree "
        f"({peers.tickertape_rev()})",
        f"{args.reps} runs per side per benchmark, alternating (ABBA), medians; peers "
        f"{args.peers}"
        + (f"; pinned to CPU {args.pin}" if args.pin else "")
        + "; arguments: "
        + "; ".join(f"{b} `{shlex.join(a)}`" for b, a in args.bench_args.items()),
        f"**worse**: the figure moved the wrong way by more than {1 - TOLERANCE:.0%}",
    ]
    text = benchlib.header_block(
        "Before and after (bench/compare.py)", ["compare", *sys.argv[1:]], notes
    )
    text += "\n\n" + table + "\n"
    benchlib.emit("bench_compare", text, no_results=not args.results)


if __name__ == "__main__":
    main()
