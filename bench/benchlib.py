"""The one runner every benchmark uses: options, repetitions and medians, one load run with the
server's CPU around it, the printed tables with ratios, and the section each benchmark keeps
up to date in bench/RESULTS.md (bench/README.md, "One runner", says which piece does what).

A benchmark is a list of variants (a label, the peer server to start, and options for the load)
and a function that runs one repetition of one variant against a freshly started peer and returns
a dict of metrics. Each repetition starts its own server (clean disk, clean peak RSS) and stops it;
a repetition that fails or times out is reported, never silently dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import math
import os
import platform
import re
import shlex
import statistics
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import loadgen
import peers

RESULTS = os.path.join(peers.HERE, "RESULTS.md")


@dataclass
class Variant:
    label: str  # row name in the table, e.g. "jetstream (push)"
    peer: str  # peers.make_peer name
    opts: dict = field(default_factory=dict)


@dataclass
class Metric:
    key: str
    title: str
    fmt: str = "{:,.0f}"
    better: str = "higher"  # "higher" | "lower": only for reading the ratio
    ratio: bool = True  # False: shown, but no tickertape ÷ peer ratio (e.g. client CPU)
    spread: bool = False  # also show the repetitions' range: "median (min–max)"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's option parser: the first paragraph of its docstring says what it runs."""
    return argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def common_args(p: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs peers side by side: run_args, --peers, --window."""
    p.add_argument(
        "--peers",
        default="all",
        help="comma list of peers: " + ",".join(peers.ALL_PEERS) + " (default: all "
        "that are installed; the ones that are not are listed as skipped)",
    )
    p.add_argument("--window", type=int, default=1000, help="most unacked messages in flight")
    run_args(p)


def run_args(p: argparse.ArgumentParser, quick: str = "small counts, 1 repetition") -> None:
    """The options every benchmark takes: --reps, --timeout, --size, --no-results, --quick."""
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds one repetition may take before it is cut off",
    )
    p.add_argument("--size", type=int, default=100, help="body bytes (JSON)")
    p.add_argument(
        "--no-results", action="store_true", help="print only; do not update bench/RESULTS.md"
    )
    p.add_argument("--quick", action="store_true", help=quick)


def nats_sub_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nats-sub",
        default="push,core",
        help="JetStream subscriber kinds: push (durable push consumer, delivers from "
        "the stream) and/or core (plain SUB on the stored subject, delivered at "
        "publish time); jetstream-sync always uses push",
    )


def peers_to_run(
    arg: str, drop: dict[str, str] | None = None, show: bool = True
) -> tuple[list[str], list[str]]:
    """(peers to run, lines saying which were skipped and why): the installed ones of the comma
    list arg ("all": every known peer), less those in drop (name -> why this benchmark skips
    it); every skipped peer printed unless not show."""
    wanted = peers.ALL_PEERS if arg == "all" else [x.strip() for x in arg.split(",") if x.strip()]
    names, skipped = [], []
    for n in wanted:
        ok, why = peers.available(n)
        if ok:
            names.append(n)
        else:
            skipped.append(f"{n}: {why}")
    for n, why in (drop or {}).items():
        if n in names:
            names.remove(n)
            skipped.append(f"{n}: {why}")
    for s in skipped if show else ():
        print(f"SKIPPED {s}")
    return names, skipped


def tickertape_only() -> None:
    """For the benchmarks of Tickertape alone: stop with the reason when it cannot run."""
    ok, why = peers.available("tickertape")
    if not ok:
        raise SystemExit(f"tickertape is not available: {why}")


def variants_for(names: list[str], nats_sub: str | None = None) -> list[Variant]:
    out = []
    kinds = [k.strip() for k in (nats_sub or "").split(",") if k.strip()]
    for n in names:
        if n == "jetstream" and kinds:
            for k in kinds:
                out.append(Variant(f"jetstream ({k})", n, {"nats_sub": k}))
        elif n == "jetstream-sync" and kinds:
            out.append(Variant("jetstream-sync (push)", n, {"nats_sub": "push"}))
        else:
            out.append(Variant(n, n, {}))
    return out


def subscriber_dests(peer, v: Variant, dest: str, n: int, name: str) -> list[str]:
    """Where n subscribers of dest subscribe: for a `jetstream (push)` variant each to a durable
    push consumer of its own (`{name}{i}`, delivering to `_bench.{name}.{i}`), else to dest."""
    if peer.kind != "nats" or v.opts.get("nats_sub") != "push":
        return [dest] * n
    for i in range(n):
        peer.create_push_consumer(f"{name}{i}", f"_bench.{name}.{i}", dest)
    return [f"_bench.{name}.{i}" for i in range(n)]


def repeat(
    label: str, reps: int, fn, first_rep: int = 0, of: int | None = None, show=None
) -> tuple[list[dict], list[str]]:
    """fn(rep) for rep in first_rep .. first_rep+reps-1, each printed (show(figures), default
    summary) and numbered of `of`: (the figures of the repetitions that count, problems). A
    repetition that raises, or returns a "problem", is reported, never silently dropped; one
    with valid=False is left out of the figures."""
    results, problems = [], []
    of = of or reps
    for r in range(first_rep, first_rep + reps):
        try:
            m = fn(r)
            if m.get("problem"):
                problems.append(f"rep {r + 1}: {m['problem']}")
            if m.get("valid", True):
                results.append(m)
            print(f"  {label:24} rep {r + 1}/{of}: " + (show or summary)(m), flush=True)
        except Exception as e:
            problems.append(f"rep {r + 1}: {type(e).__name__}: {e}".splitlines()[0][:300])
            print(f"  {label:24} rep {r + 1}/{of}: FAILED {type(e).__name__}: {e}", flush=True)
            if os.environ.get("BENCH_DEBUG"):
                traceback.print_exc()
    return results, problems


def run_variant(
    v: Variant, reps: int, one_rep, first_rep: int = 0, of: int | None = None
) -> tuple[list[dict], list[str]]:
    """Run one_rep(peer, variant, rep) `reps` times, each on a fresh server (repeat)."""

    def on_fresh_peer(r: int) -> dict:
        peer = peers.make_peer(v.peer)
        peer.extra.update(v.opts.get("peer_extra") or {})
        try:
            peer.start()
            return one_rep(peer, v, r)
        except Exception:
            tail = peer.log_tail(8) if peer.log_path else ""
            if tail:
                print("    server log tail:\n    " + tail.replace("\n", "\n    "), flush=True)
            raise
        finally:
            peer.cleanup()

    return repeat(v.label, reps, on_fresh_peer, first_rep, of)


@dataclass
class Table:
    """What a benchmark measured: rows of (label, medians) in variant order, problems by label,
    and the peers skipped (each a line saying why)."""

    rows: list[tuple[str, dict]]
    problems: dict[str, list[str]]
    skipped: list[str] = field(default_factory=list)

    def get(self, label: str, key: str):
        """One median figure of one row (None: not measured)."""
        return (dict(self.rows).get(label) or {}).get(key)

    def ratio(self, a: str, b: str, key: str = "rate") -> float | None:
        """Row a's figure ÷ row b's (None: either not measured)."""
        return ratio(self.get(a, key), self.get(b, key))


def run_rows(
    variants: list[Variant],
    reps: int,
    one_rep,
    metrics: list[Metric],
    interleave: bool = True,
    skipped: list[str] | None = None,
) -> Table:
    """Every variant `reps` times, one_rep(peer, variant, rep) on a fresh server each time
    (run_variant): interleaved, rep 1 of every variant, then rep 2 of every variant, ... (so that
    a noisy spell on the machine hits every peer alike), or variant-major."""
    runs: dict[str, tuple[list[dict], list[str]]] = {v.label: ([], []) for v in variants}
    if interleave:
        order = [(r, v) for r in range(reps) for v in variants]
    else:
        order = [(r, v) for v in variants for r in range(reps)]
    for r, v in order:
        res, probs = run_variant(v, 1, one_rep, first_rep=r, of=reps)
        runs[v.label][0].extend(res)
        runs[v.label][1].extend(probs)
    rows = [(v.label, medians(runs[v.label][0], metrics)) for v in variants]
    return Table(rows, {label: ps for label, (_, ps) in runs.items() if ps}, skipped or [])


def load_problems(r: dict, timeout: float, got: int, want: int) -> list[str]:
    """What went wrong in a loadgen run (r from loadgen.run): a time-out, errors, a count short
    (got of want: acked or delivered, as the benchmark counts)."""
    problem = []
    if r["timed_out"]:
        problem.append(f"timed out after {timeout}s: {got}/{want}, {r['acked']} acked")
    if r["errors"] or r["pub_errors"]:
        problem.append(f"errors: {r['errors'][:2]}, {r['pub_errors']} failed publishes")
    if got != want:
        problem.append(f"got {got} of {want}")
    return problem


def timed_load(peer, args, sender=None, **kw) -> tuple[dict, float]:
    """One load run against peer (loadgen.run_sync in its protocol, or sender(host, port, ...),
    e.g. pubsend.run) with args' body size, window and time bound unless kw names them:
    (its result, the server's CPU seconds from the first send to the end)."""
    st: dict = {}
    kw = {"body_size": args.size, "window": args.window, "timeout": args.timeout, **kw}
    kw["on_start"] = lambda: st.setdefault("cpu0", peer.cpu_seconds())
    if sender is None:
        r = loadgen.run_sync(peer.kind, peer.host, peer.port, **kw)
    else:
        r = sender(peer.host, peer.port, **kw)
    return r, peer.cpu_seconds() - st["cpu0"]


def publish_or_fanout(
    args, peer, topic: str, n: int, fan: bool, tag: str, ssl=None
) -> tuple[dict, list[str]]:
    """One Tickertape run of n persisted publishes on topic (to args.subs subscribers when fan)
    -> (figures, problems): rate = acked msgs/s, or deliveries/s when fan; server CPU µs per
    message (per delivery when fan); client CPU %."""
    subs = [topic] * args.subs if fan else []
    r, cpu = timed_load(peer, args, n=n, pub_dest=topic, sub_dests=subs, tag=tag, ssl=ssl)
    got = r["received"] if fan else r["acked"]
    seconds = r["seconds"] if fan else r["pub_seconds"]
    out = {
        "rate": got / seconds if seconds else None,
        "cpu_us": cpu / (got or 1) * 1e6,
        "client_pct": r["client_cpu"] / r["seconds"] * 100 if r["seconds"] else None,
    }
    return out, load_problems(r, args.timeout, got, n * args.subs if fan else n)


def judged(out: dict, problems: list[str], valid: bool | None = None) -> dict:
    """A repetition's figures with its problems: one with a problem is reported and, unless
    valid says otherwise, not counted in the medians."""
    if problems:
        out["problem"] = "; ".join(problems)
        out["valid"] = bool(valid)
    return out


def summary(m: dict) -> str:
    parts = []
    for k, v in m.items():
        if k in ("problem", "valid") or isinstance(v, (list, dict)):
            continue
        parts.append(f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def medians(results: list[dict], metrics: list[Metric] | None = None) -> dict:
    """Median of each metric over the repetitions (without metrics: of every numeric figure);
    with Metric.spread also its range, under key + "~"."""
    if metrics is None:
        keys = {
            k
            for r in results
            for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        metrics = [Metric(k, k) for k in sorted(keys)]
    out = {}
    for m in metrics:
        vals = [r[m.key] for r in results if r.get(m.key) is not None]
        out[m.key] = statistics.median(vals) if vals else None
        if m.spread and len(vals) > 1:
            out[m.key + "~"] = (min(vals), max(vals))
    return out


def pct(sorted_vals, q: float) -> float | None:
    """Nearest-rank percentile q of sorted values in ns, in µs (None: no values)."""
    if not sorted_vals:
        return None
    return sorted_vals[max(0, math.ceil(q * len(sorted_vals)) - 1)] / 1e3


def fmt(metric: Metric, v) -> str:
    return "—" if v is None else metric.fmt.format(v)


def table(rows: list[tuple[str, dict]], metrics: list[Metric]) -> tuple[str, str]:
    """(figures table, ratio table) as markdown. Ratio = Tickertape's figure / the peer's."""
    ours = "tickertape"
    head = "| peer | " + " | ".join(m.title for m in metrics) + " |"
    sep = "|---|" + "---:|" * len(metrics)
    lines = [head, sep]
    for label, med in rows:
        cells = []
        for m in metrics:
            cell = fmt(m, med.get(m.key))
            if med.get(m.key + "~"):
                lo, hi = med[m.key + "~"]
                cell += f" ({fmt(m, lo)}–{fmt(m, hi)})"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    figures = "\n".join(lines)
    our = dict(rows).get(ours)
    rms = [m for m in metrics if m.ratio]
    rl = [
        "| tickertape ÷ peer | "
        + " | ".join(f"{m.title} ({m.better} is better)" for m in rms)
        + " |",
        "|---|" + "---:|" * len(rms),
    ]
    for label, med in rows:
        if label == ours or label.startswith(ours + " "):
            continue  # our own variants (e.g. "tickertape (filtered)") are not peers
        cells = []
        for m in rms:
            a = our.get(m.key) if our else None
            b = med.get(m.key)
            cells.append("—" if a is None or not b else f"{a / b:.2f}×")
        rl.append(f"| {label} | " + " | ".join(cells) + " |")
    if our is None:
        rl.append("\n(no Tickertape figures in this run: ratios are left blank)")
    elif len(rl) == 2:  # only our own variants ran: no peer to divide by, no empty table
        return figures, ""
    return figures, "\n".join(rl)


# ---- environment ---------------------------------------------------------------------------


def machine() -> dict:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "unknown"
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        kb = int(f.readline().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "disk": _fs_of(peers.HERE),
    }


def _fs_of(path: str) -> str:
    best = ("", "?", "?")
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if path.startswith(mnt) and len(mnt) > len(best[0]):
                best = (mnt, dev, fstype)
    return f"{best[2]} on {best[1]}"


def shown_command(argv: list[str]) -> str:
    """The command line as RESULTS.md records it: quoted as a shell would take it, and a path
    of this machine (an absolute one, alone or after `--opt=`) shown as `DIR`, so the record
    names no place outside the repository."""
    shown = []
    for a in argv:
        opt, eq, value = a.partition("=")
        if a.startswith("/"):
            a = "DIR"
        elif eq and opt.startswith("-") and value.startswith("/"):
            a = f"{opt}=DIR"
        shown.append(a)
    return shlex.join(["./run", "bench", *shown])


def header_block(title: str, argv: list[str], notes: list[str]) -> str:
    m = machine()
    v = peers.versions()
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## {title}",
        "",
        f"- date: {now}; command: `{shown_command(argv)}`",
        (
            f"- machine: {m['nproc']} cores, {m['cpu']}, {m['memory']} RAM, kernel {m['kernel']}, "
            f"data dir {m['disk']}"
        ),
        "- versions: "
        + "; ".join(f"{k} {val}" for k, val in v.items())
        + f"; load generator on {loadgen.loop_name()}",
    ]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


def update_results(name: str, text: str) -> None:
    """Replace (or append) the section between this benchmark's markers in RESULTS.md."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    try:
        cur = Path(RESULTS).read_text()
    except FileNotFoundError:
        cur = (
            "# Benchmark results\n\nWritten by the scripts in bench/ (see bench/README.md); "
            "each section is replaced when its benchmark runs again. Machine is noisy: "
            "figures are medians of the repetitions.\n\n"
        )
    pat = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    new = pat.sub(lambda _m: block, cur) if pat.search(cur) else cur.rstrip() + "\n\n" + block
    tmp = RESULTS + ".tmp"
    Path(tmp).write_text(new)
    os.replace(tmp, RESULTS)


def report(
    name: str,
    title: str,
    t: Table,
    metrics: list[Metric],
    notes: list[str],
    no_results: bool,
    extra_text: str = "",
    ratios: bool = True,
) -> None:
    """extra_text: more markdown after the ratio table (e.g. targets_table()); ratios=False: no
    ratio table (rows that are all Tickertape, e.g. with and without a feature)."""
    figures, ratio_table = table(t.rows, metrics)
    if not ratios:
        ratio_table = ""
    body = figures + ("\n\n" + ratio_table if ratio_table else "")
    if extra_text:
        body += "\n\n" + extra_text.rstrip()
    extra = [f"skipped {s}" for s in t.skipped]
    extra += [f"{label} {p}" for label, ps in t.problems.items() for p in ps]
    write_section(name, title, notes, body, extra, no_results)


def write_section(
    name: str, title: str, notes: list[str], body: str, problems: list[str], no_results: bool
) -> None:
    """A benchmark's section: the header (machine, versions, date, command, notes), its
    markdown body and a list of what was skipped or went wrong; printed, and written unless
    no_results."""
    text = header_block(title, [name, *sys.argv[1:]], notes) + "\n\n" + body.rstrip() + "\n"
    if problems:
        text += "\n" + "\n".join(f"- {x}" for x in problems) + "\n"
    emit(name, text, no_results)


def emit(name: str, text: str, no_results: bool) -> None:
    """Print a benchmark's section and, unless no_results, write it into RESULTS.md."""
    print("\n" + text)
    if not no_results:
        update_results(name, text)
        print(f"(section `{name}` updated in {os.path.relpath(RESULTS)})")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or b is zero): a target not measured."""
    return a / b if a and b else None


def targets_table(items: list[tuple[str, str, object, object, str]]) -> str:
    """Markdown table of targets: items are (target, figure name, measured, wanted, "min"|"max").

    measured/wanted are numbers (measured may be None: not measured); "min" means
    measured >= wanted is met, "max" means measured < wanted is met."""
    lines = ["| target | measured | met |", "|---|---:|:---:|"]
    for what, unit, got, want, kind in items:
        if got is None:
            lines.append(f"| {what} | — | not measured |")
            continue
        ok = got >= want if kind == "min" else got < want
        shown = f"{got:,.0f}" if abs(got) >= 100 else f"{got:,.2f}"
        lines.append(f"| {what} | {shown} {unit} | {'yes' if ok else '**no**'} |")
    return "\n".join(lines)
