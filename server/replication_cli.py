"""`tickertape replication downgrade|upgrade NAME`: change a sync destination's mode on a running
server, through its admin endpoint (`POST /replication/<NAME>/downgrade|upgrade`, server/admin.py).

    tickertape replication downgrade NAME [--admin URL] [--user USER [--password-file FILE]]
                                          [--token-file FILE] [--ca-file FILE]
    tickertape replication upgrade NAME ...

`--admin` defaults to the default `<Admin>` address (http://127.0.0.1:8085). With
`<Authentication>` the endpoint wants a user with admin rights: `--user` (password from the
first line of `--password-file`, else $TICKERTAPE_PASSWORD) as HTTP Basic, or a bearer token
from `tickertape passwd FILE USER --token` (first line of `--token-file`, else
$TICKERTAPE_TOKEN). The request carries the console's `X-Requested-By` header, which the
endpoint asks of every action.

Exit status: 0 done; 1 the server refused (no such destination, nothing to change, no rights)
or could not be reached; 2 a bad command line.
"""

from __future__ import annotations

import argparse
import base64
import os
import ssl
import sys
import urllib.error
import urllib.request
from typing import IO
from urllib.parse import quote

DEFAULT_ADMIN = "http://127.0.0.1:8085"
ACTION_HEADER = "tickertape-console"  # server/admin.py ACTION_HEADER
TIMEOUT = 10.0


def add_replication_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replication",
        help="downgrade a sync replication destination to async, or upgrade it back",
    )
    p.add_argument("action", choices=("downgrade", "upgrade"))
    p.add_argument("name", metavar="NAME", help="the destination's <Name>")
    p.add_argument(
        "--admin",
        metavar="URL",
        default=DEFAULT_ADMIN,
        help=f"the server's admin endpoint (default {DEFAULT_ADMIN})",
    )
    p.add_argument("--user", metavar="USER", help="a user with admin rights (HTTP Basic)")
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help="the password for --user: the first line of FILE (else $TICKERTAPE_PASSWORD)",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="a bearer token (tickertape passwd --token): the first line of FILE "
        "(else $TICKERTAPE_TOKEN)",
    )
    p.add_argument("--ca-file", metavar="FILE", help="CA certificates for an https:// endpoint")
    p.set_defaults(run=run)


def run(
    args: argparse.Namespace, stdout: IO[str] | None = None, stderr: IO[str] | None = None
) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    command = f"tickertape replication {args.action}"
    try:
        auth = _authorization(args)
        ctx = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
    except (OSError, ValueError) as exc:
        print(f"{command}: {exc}", file=stderr)
        return 2
    url = f"{args.admin.rstrip('/')}/replication/{quote(args.name, safe='')}/{args.action}"
    req = urllib.request.Request(url, data=b"", method="POST")
    req.add_header("X-Requested-By", ACTION_HEADER)
    if auth is not None:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT, context=ctx) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace").strip()
        print(f"{command}: {exc.code}: {text}", file=stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"{command}: cannot reach the admin endpoint {args.admin}: {reason}", file=stderr)
        return 1
    mode = "async (downgraded)" if args.action == "downgrade" else "sync"
    print(f"destination {args.name} is {mode} now", file=stdout)
    return 0


def _authorization(args: argparse.Namespace) -> str | None:
    """The Authorization header from the options, or None. Raises OSError/ValueError."""
    if args.token_file or (os.environ.get("TICKERTAPE_TOKEN") and not args.user):
        token = _first_line(args.token_file) if args.token_file else os.environ["TICKERTAPE_TOKEN"]
        return f"Bearer {token}"
    if args.password_file and not args.user:
        raise ValueError("--password-file needs --user")
    if not args.user:
        return None
    if args.password_file:
        password = _first_line(args.password_file)
    else:
        password = os.environ.get("TICKERTAPE_PASSWORD", "")
    pair = f"{args.user}:{password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def _first_line(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\r\n")
