"""The cost of the web console (docs/console.md): publish and fan-out with a console page open
against none, in the same run (Tickertape only).

    ./run bench bench_console [--count 2000000] [--fan-count 500000] [--subs 4] [--pages 1]
                              [--reps 3]

Rows (each repetition on a freshly started server with an admin endpoint; repetitions
interleaved, so that a noisy spell on the shared machine hits every row alike):
  publish, no page     one publisher, persisted acks (as bench_publish)
  publish, page open   the same while `--pages` readers of `/events` take every event, as an
                       open console does (the hour ring first, then a sample and the details
                       each second)
  fan-out, no page / page open   one publisher and `--subs` subscribers receiving every message
Figures: msgs/s (fan-out rows: deliveries/s), server CPU µs per message (per delivery), events
the pages read (a sample a second: the counts make each repetition last several seconds).
Target (issue 16): the console costs less than 2 % of the publish throughput while a page is
open (page open ÷ no page ≥ 0.98).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading

import benchlib
import loadgen
import peers
from benchlib import Metric, Variant

TOPIC = "bench.console"

METRICS = [
    Metric("rate", "msgs/s (fan-out: deliveries/s)", spread=True),
    Metric("cpu_us", "srv CPU µs/msg", "{:.2f}", "lower", ratio=False),
    Metric("events", "events read", "{:.0f}", "higher", ratio=False),
]


class Page:
    """What an open console does to the server: read `/events` until closed."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
        self.events = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(1 << 16):
                self.events += chunk.count(b"\nevent: ") + chunk.startswith(b"event: ")
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


def variants(admin_port: int) -> list[Variant]:
    admin = {"config_xml": f"<Admin><InetAddr>127.0.0.1:{admin_port}</InetAddr></Admin>"}
    return [
        Variant(
            f"{kind}, {page}",
            "tickertape",
            {"kind": kind.split()[0], "page": page == "page open", "peer_extra": admin},
        )
        for kind in ("publish", "fan-out")
        for page in ("no page", "page open")
    ]


def one_rep(args, admin_port: int, peer, v, rep) -> dict:
    st = {}
    fan = v.opts["kind"] == "fan-out"
    n = args.fan_count if fan else args.count
    pages = [Page(admin_port) for _ in range(args.pages)] if v.opts["page"] else []

    def on_start():
        st["cpu0"] = peer.cpu_seconds()

    try:
        r = loadgen.run_sync(
            "tickertape",
            peer.host,
            peer.port,
            n=n,
            pub_dest=TOPIC,
            sub_dests=[TOPIC] * args.subs if fan else [],
            body_size=args.size,
            window=args.window,
            timeout=args.timeout,
            tag=f"c{rep}",
            on_start=on_start,
        )
        cpu = peer.cpu_seconds() - st["cpu0"]
    finally:
        for p in pages:
            p.close()
    got = r["received"] if fan else r["acked"]
    seconds = r["seconds"] if fan else r["pub_seconds"]
    out = {
        "rate": got / seconds if seconds else None,
        "cpu_us": cpu / (got or 1) * 1e6,
        "events": sum(p.events for p in pages),
    }
    want = n * args.subs if fan else n
    problem = []
    if r["timed_out"]:
        problem.append(f"timed out after {args.timeout}s: {got}/{want}")
    if r["errors"] or r["pub_errors"]:
        problem.append(f"errors: {r['errors'][:2]} pub errors {r['pub_errors']}")
    if got != want:
        problem.append(f"got {got} of {want}")
    if pages and out["events"] < len(pages):
        problem.append("a page read no event")
    if problem:
        out["problem"] = "; ".join(problem)
        out["valid"] = False
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--count", type=int, default=2_000_000, help="messages per publish repetition")
    p.add_argument("--fan-count", type=int, default=500_000, help="messages per fan-out repetition")
    p.add_argument("--subs", type=int, default=4, help="fan-out subscribers")
    p.add_argument("--pages", type=int, default=1, help="console pages open in the page rows")
    benchlib.common_args(p)
    args = p.parse_args()
    if args.quick:
        args.count, args.fan_count, args.reps = 300_000, 100_000, 1
    ok, why = peers.available("tickertape")
    if not ok:
        raise SystemExit(f"tickertape is not available: {why}")
    admin_port = peers.free_port()
    vs = variants(admin_port)
    print(
        f"console: publish {args.count} msgs, fan-out {args.fan_count} msgs x {args.subs} subs, "
        f"{args.pages} page(s) open, {args.reps} reps (interleaved)"
    )
    by_label = benchlib.run_interleaved(
        vs, args.reps, lambda peer, v, rep: one_rep(args, admin_port, peer, v, rep)
    )
    rows = [(v.label, benchlib.medians(by_label[v.label][0], METRICS)) for v in vs]
    problems = {label: probs for label, (_r, probs) in by_label.items() if probs}
    rate = {label: med.get("rate") for label, med in rows}

    def ratio(a: str, b: str) -> float | None:
        return rate[a] / rate[b] if rate.get(a) and rate.get(b) else None

    targets = benchlib.targets_table(
        [
            (
                "publish: page open ÷ no page ≥ 0.98",
                "×",
                ratio("publish, page open", "publish, no page"),
                0.98,
                "min",
            ),
            (
                "fan-out: page open ÷ no page ≥ 0.98",
                "×",
                ratio("fan-out, page open", "fan-out, no page"),
                0.98,
                "min",
            ),
        ]
    )
    notes = [
        (
            f"publish rows: 1 publisher, {args.count} messages of {args.size} B, persisted acks, "
            f"window {args.window}; fan-out rows: {args.fan_count} messages to {args.subs} "
            f"subscribers; median of {args.reps} repetitions, interleaved, fresh server each"
        ),
        (
            f"page open: {args.pages} reader(s) of /events taking every event (the ring, then "
            "one sample with the clients, subscriptions, queues and segments a second), opened "
            "before the load starts; a browser would also draw, on its own CPU"
        ),
    ]
    extra = [f"{label} {p}" for label, ps in problems.items() for p in ps]
    text = (
        benchlib.header_block(
            "Console: the cost of an open page (bench_console)",
            ["bench_console", *sys.argv[1:]],
            notes,
        )
        + "\n\n"
        + benchlib.table(rows, METRICS)[0]
        + "\n\n"
        + targets
        + "\n"
        + ("\n" + "\n".join(f"- {x}" for x in extra) + "\n" if extra else "")
    )
    print("\n" + text)
    if not args.no_results:
        benchlib.update_results("bench_console", text)
        print(f"(section `bench_console` updated in {os.path.relpath(benchlib.RESULTS)})")


if __name__ == "__main__":
    main()
