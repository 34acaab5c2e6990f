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

import contextlib
import socket
import threading
from functools import partial

import benchlib
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
        with contextlib.suppress(OSError):
            while chunk := self.sock.recv(1 << 16):
                self.events += chunk.count(b"\nevent: ") + chunk.startswith(b"event: ")

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
    fan = v.opts["kind"] == "fan-out"
    n = args.fan_count if fan else args.count
    pages = [Page(admin_port) for _ in range(args.pages)] if v.opts["page"] else []
    try:
        out, problem = benchlib.publish_or_fanout(args, peer, TOPIC, n, fan, f"c{rep}")
    finally:
        for p in pages:
            p.close()
    out["events"] = sum(p.events for p in pages)
    if pages and out["events"] < len(pages):
        problem.append("a page read no event")
    return benchlib.judged(out, problem)


def main() -> None:
    p = benchlib.parser(__doc__)
    p.add_argument("--count", type=int, default=2_000_000, help="messages per publish repetition")
    p.add_argument("--fan-count", type=int, default=500_000, help="messages per fan-out repetition")
    p.add_argument("--subs", type=int, default=4, help="fan-out subscribers")
    p.add_argument("--pages", type=int, default=1, help="console pages open in the page rows")
    benchlib.common_args(p)
    args = p.parse_args()
    if args.quick:
        args.count, args.fan_count, args.reps = 300_000, 100_000, 1
    benchlib.tickertape_only()
    admin_port = peers.free_port()
    vs = variants(admin_port)
    print(
        f"console: publish {args.count} msgs, fan-out {args.fan_count} msgs x {args.subs} subs, "
        f"{args.pages} page(s) open, {args.reps} reps (interleaved)"
    )
    run = benchlib.run_rows(vs, args.reps, partial(one_rep, args, admin_port), METRICS)
    targets = benchlib.targets_table(
        [
            (
                f"{k}: page open ÷ no page ≥ 0.98",
                "×",
                run.ratio(f"{k}, page open", f"{k}, no page"),
                0.98,
                "min",
            )
            for k in ("publish", "fan-out")
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
    benchlib.report(
        "bench_console",
        "Console: the cost of an open page (bench_console)",
        run,
        METRICS,
        notes,
        args.no_results,
        targets,
        ratios=False,
    )


if __name__ == "__main__":
    main()
