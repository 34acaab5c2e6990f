"""`tickertape pub`, `tickertape sub` and `tickertape queue`: the command-line client.

The project's entry point (server/cli.py) owns the `tickertape` parser; it calls
`add_client_commands(subparsers)` and then `args.run(args)` (run_pub / run_sub / run_queue).
Each is a plain synchronous function that runs its own event loop (`asyncio.run`, the default
loop: uvloop belongs to the server's entry point) and returns the exit status:

```
0    done (pub: everything persisted; sub/queue: --count reached, a range completed, or idle
     --timeout without --count)
1    the server refused something, pub rejected input lines or timed out waiting for persisted
     acks, or sub/queue's --timeout passed before --count messages
2    usage: cannot connect at start (names the address, suggests `tickertape serve`), bad
     --server, --bookmark or store option, or a store file in use by another process
130  interrupted (Ctrl-C)
```

All three use the HAClient (client/ha.py): `--server` may be given several times (failover
order; default 127.0.0.1:9007); `tcps://host:port` is TLS, checked against `--ca-file` (the
system's trust store without it), with `--cert`/`--key` for a server that asks for a client
certificate. `--user` logs on as that user, with the password from the environment variable
TICKERTAPE_PASSWORD or the first line of `--password-file` (never from the command line,
which other users can read in the process list). At start every server is tried once (`--connect-timeout`
to keep trying longer); once connected, a lost connection is retried and failed over without
end, and a one-line note goes to stderr. Errors are one line on stderr, never a traceback.
`python -m client.cli pub|sub|queue ...` runs the same commands without the server package.

This module is the command line: its parser and exit statuses. Each command lives in its own
module (client/cli_pub.py: pub; client/cli_sub.py: sub and queue), on what they share
(client/cli_common.py: options, the HAClient and its connection, the run wrapper).
"""

from __future__ import annotations

import argparse
import sys

from .address import DEFAULT_ADDRESS
from .cli_pub import run_pub
from .cli_sow import run_sow
from .cli_sub import run_queue, run_sub

__all__ = ["add_client_commands", "main", "run_pub", "run_queue", "run_sow", "run_sub"]


def add_client_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `pub`, `sub` and `queue` on the `tickertape` parser's subparsers.

    Each sets `run` and `func` (both run_pub / run_sub / run_queue; `run` is what server/cli.py
    dispatches on, `func` the argparse idiom): dispatch with `sys.exit(args.run(args))`.
    """
    pub = subparsers.add_parser(
        "pub",
        help="publish JSON lines from stdin to a topic",
        description="Publish one message per non-empty JSON line of stdin, then wait until "
        "the server has persisted all of them.",
    )
    pub.add_argument("topic", help="topic to publish to")
    _common(pub)
    pub.add_argument(
        "--client-name",
        help="publisher name (default: tickertape-pub-<host>-<pid>); reuse a name to continue "
        "its sequence numbers (always with --publish-store)",
    )
    pub.add_argument(
        "--publish-store",
        metavar="FILE",
        help="keep every message in FILE until persisted: survives server restarts and this "
        "command being killed (run it again with the same FILE and --client-name)",
    )
    pub.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait for the persisted acks at the end (default 60)",
    )
    pub.set_defaults(func=run_pub, run=run_pub)

    sub = subparsers.add_parser(
        "sub",
        help="print a topic's messages as JSON lines",
        description="Subscribe to a topic (or a topic regex) and print one line per message.",
    )
    sub.add_argument("topic", help="topic name or regular expression")
    _common(sub)
    sub.add_argument("--client-name", help="default: tickertape-sub-<host>-<pid>")
    sub.add_argument("--filter", help="content filter, e.g. \"/qty > 10 AND /sym = 'X'\"")
    sub.add_argument(
        "--bookmark",
        help="replay from a bookmark: recent (where --sub-id left off, with --bookmark-store), "
        "epoch or 0 (everything), now or 0|1| (no replay), <id>|<seq>|, a timestamp YYYYmmddTHHMMSS, a comma list, "
        "or a range [begin:end]",
    )
    sub.add_argument(
        "--bookmark-store",
        metavar="FILE",
        help="remember in FILE what was printed, per --sub-id, to resume where the last run "
        "stopped (--bookmark defaults to recent)",
    )
    sub.add_argument(
        "--bookmark-store-kind",
        choices=("logged", "ring"),
        default="logged",
        help="logged (default: exact even with out-of-order discards) or ring (smaller, faster)",
    )
    sub.add_argument("--sub-id", help="subscription id (needed to resume with a bookmark store)")
    sub.add_argument("--rate", help="replay rate limit: 1000 (msgs/s), 500KB (bytes/s), 2X")
    sub.add_argument("--options", help="raw subscribe options (the `o` header)")
    sub.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    sub.add_argument(
        "--headers",
        action="store_true",
        help='print {"bm": ..., "t": ..., "body": ...} instead of the bare body',
    )
    sub.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop when no message arrives for SECONDS (exit 1 if --count was not reached)",
    )
    sub.add_argument(
        "--sow",
        action="store_true",
        help="on a SOW topic: print its current records first, then every later change "
        "(sow_and_subscribe; no gap, no duplicate between the two)",
    )
    sub.set_defaults(func=run_sub, run=run_sub)

    sow = subparsers.add_parser(
        "sow",
        help="print a SOW topic's current records as JSON lines",
        description="Query a State of the World topic (or a regex over SOW topics) and print "
        "one line per record.",
    )
    sow.add_argument("topic", help="SOW topic name or regular expression")
    _common(sow)
    sow.add_argument("--client-name", help="default: tickertape-sow-<host>-<pid>")
    sow.add_argument("--filter", help='content filter, e.g. "/px > 10"')
    sow.add_argument("--top-n", type=int, metavar="N", help="at most N records")
    sow.add_argument("--order-by", metavar="ORDER", help='e.g. "/px DESC, /sym"')
    sow.add_argument(
        "--headers",
        action="store_true",
        help='print {"k": ..., "bm": ..., "t": ..., "body": ...} instead of the bare body',
    )
    sow.set_defaults(func=run_sow, run=run_sow)

    queue = subparsers.add_parser(
        "queue",
        help="consume a queue, printing and acknowledging each message",
        description="Subscribe to a queue and print one JSON line per message (the body), "
        "acknowledging each after it is printed.",
    )
    queue.add_argument("name", help="queue name (its <SOW><Queue><Name>)")
    _common(queue)
    queue.add_argument("--client-name", help="default: tickertape-queue-<host>-<pid>")
    queue.add_argument(
        "--backlog",
        type=int,
        default=10,
        metavar="N",
        help="most unacknowledged messages leased to this consumer (max_backlog, default 10)",
    )
    queue.add_argument("--filter", help="content filter on the queue's messages")
    queue.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    queue.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop when no message arrives for SECONDS (exit 1 if --count was not reached)",
    )
    queue.set_defaults(func=run_queue, run=run_queue)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        action="append",
        metavar="HOST:PORT",
        help=f"server address (default {DEFAULT_ADDRESS}); give it several times for failover, "
        "in order",
    )
    p.add_argument("--user", metavar="USER", help="log on as USER (user_id)")
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help="the password for --user: the first line of FILE (else $TICKERTAPE_PASSWORD)",
    )
    p.add_argument("--ca-file", metavar="FILE", help="CA certificates for tcps:// servers (PEM)")
    p.add_argument("--cert", metavar="FILE", help="client certificate for tcps:// (PEM)")
    p.add_argument("--key", metavar="FILE", help="private key of --cert (PEM)")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep trying to connect at start for SECONDS (default: try each server once)",
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m client.cli pub|sub|queue ...` (the same commands as `tickertape ...`)."""
    parser = argparse.ArgumentParser(prog="tickertape", description="Tickertape client")
    commands = parser.add_subparsers(dest="command", required=True)
    add_client_commands(commands)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
