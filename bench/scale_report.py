"""bench_scale's report: the markdown of its three sections with the targets of issue 15, and
bench/scale.png (matplotlib, imported only when drawing)."""

from __future__ import annotations

import os
import sys

import benchlib
import peers


def _fmt(v, f: str = "{:,.0f}") -> str:
    return "—" if v is None else f.format(v)


def report(args, sub_conns: int, curve, pubs, mem, problems, skipped, elapsed) -> str:
    notes = [
        f"curve: {args.count} messages of {args.size} B per point, persisted publish window "
        f"{args.window}; subscription i has filter `/id = i`, each message matches exactly one; "
        f"Tickertape subscriptions on {sub_conns} connections; median of {args.reps} "
        "repetitions, fresh server each",
        "NATS has no content filter: subject bench.scale.<id> stands for the filter; JetStream "
        f"consumers (durable push, ack none) up to {args.js_max}; core SUBs deliver beside the store",
        f"the machine is shared with other jobs (2 cores): compare ratios within this run; "
        f"whole run {elapsed:.0f} s",
    ]
    lines = [
        benchlib.header_block(
            "Scale: subscriptions, topics, connections (bench_scale)",
            ["bench_scale"] + sys.argv[1:],
            notes,
        ),
        "",
    ]
    lines += [
        "### Publish with S filtered subscriptions",
        "",
        "| series | S | msgs/s | srv CPU µs/msg | ÷ S=1 |",
        "|---|---:|---:|---:|---:|",
    ]
    base = {}
    for series, s, med in curve:
        if s == 1:
            base[series] = med.get("msgs_s")
    for series, s, med in curve:
        b = base.get(series) or base.get(series.replace("T=1000", "T=1"))
        r = med.get("msgs_s") / b if b and med.get("msgs_s") else None
        lines.append(
            f"| {series} | {s:,} | {_fmt(med.get('msgs_s'))} | {_fmt(med.get('cpu_us'), '{:.1f}')} | {_fmt(r, '{:.2f}')} |"
        )
    lines += [
        "",
        f"### {args.conns} publishing connections at once ({args.per_conn} messages each)",
        "",
        "| peer | msgs/s | srv CPU µs/msg |",
        "|---|---:|---:|",
    ]
    for name, med in pubs:
        lines.append(
            f"| {name} | {_fmt(med.get('msgs_s'))} | {_fmt(med.get('cpu_us'), '{:.1f}')} |"
        )
    lines += [
        "",
        "### Memory (server RSS growth)",
        "",
        "| peer | per idle connection KiB | per idle subscription B | per JetStream consumer B |",
        "|---|---:|---:|---:|",
    ]
    for name, med in mem:
        lines.append(
            f"| {name} | {_fmt(med.get('conn_kib'), '{:.1f}')} | {_fmt(med.get('sub_b'))} | {_fmt(med.get('consumer_b'))} |"
        )
    tt = {s: med for series, s, med in curve if series == "tickertape T=1"}
    ttm = dict(mem).get("tickertape", {})
    r10k = benchlib.ratio(tt.get(10000, {}).get("msgs_s"), tt.get(1, {}).get("msgs_s"))
    lines += [
        "",
        benchlib.targets_table(
            [
                (
                    "10,000 filtered subscriptions on one topic: throughput ÷ 1 subscription",
                    "×",
                    r10k,
                    0.5,
                    "min",
                ),
                ("memory per idle subscription", "B", ttm.get("sub_b"), 2048, "max"),
                ("memory per idle connection", "KiB", ttm.get("conn_kib"), 20, "max"),
            ]
        ),
    ]
    lines += ["", "![scale curves](scale.png)"]
    extra = [f"skipped {s}" for s in skipped] + problems
    if extra:
        lines += [""] + [f"- {x}" for x in extra]
    return "\n".join(lines)


def plot(curve, pubs, mem, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8.5))
    series = sorted({c[0] for c in curve})
    for sname in series:
        pts = [(s, m) for n, s, m in curve if n == sname and m.get("msgs_s")]
        if not pts:
            continue
        xs = [s for s, _ in pts]
        ax[0][0].plot(xs, [m["msgs_s"] for _, m in pts], marker="o", label=sname)
        ax[0][1].plot(xs, [m["cpu_us"] for _, m in pts], marker="o", label=sname)
    for a, title, unit in (
        (ax[0][0], "publish throughput with S filtered subscriptions", "msgs/s"),
        (ax[0][1], "server CPU per message", "µs/msg"),
    ):
        a.set_xscale("log")
        a.set_xlabel("subscriptions S (each with its own filter / subject)")
        a.set_ylabel(unit)
        a.set_title(title)
        a.grid(True, alpha=0.3)
        a.legend(fontsize=8)
    ax[0][1].set_yscale("log")
    names = [n for n, _ in pubs]
    ax[1][0].bar(names, [m.get("msgs_s") or 0 for _, m in pubs], color="tab:blue")
    ax[1][0].set_title(f"{args.conns} publishing connections at once")
    ax[1][0].set_ylabel("msgs/s")
    mnames = [n for n, _ in mem]
    x = range(len(mnames))
    ax[1][1].bar(
        [i - 0.2 for i in x],
        [m.get("conn_kib") or 0 for _, m in mem],
        0.4,
        label="per idle connection (KiB)",
    )
    ax[1][1].bar(
        [i + 0.2 for i in x],
        [(m.get("sub_b") or 0) / 1024 for _, m in mem],
        0.4,
        label="per idle subscription (KiB)",
    )
    ax[1][1].set_xticks(list(x), mnames)
    ax[1][1].set_title("server memory (RSS growth)")
    ax[1][1].set_ylabel("KiB")
    ax[1][1].legend(fontsize=8)
    fig.suptitle("Tickertape scale curves (bench_scale; medians, shared 2-core machine)")
    fig.tight_layout()
    out = os.path.join(peers.HERE, "scale.png")
    fig.savefig(out, dpi=90)
    print(f"plot: {os.path.relpath(out)}")
