"""`tickertape passwd`: manage the password file named by `<Authentication><PasswordFile>`.

    tickertape passwd FILE USER            add USER, or change its password
    tickertape passwd FILE USER --delete   remove USER
    tickertape passwd FILE USER --token    issue a bearer token for the admin endpoint

The password is read from a prompt (twice, not echoed) when standard input is a terminal, and
otherwise as one line from standard input (`printf '%s\\n' "$PW" | tickertape passwd ...`). It is
never taken from the command line, where other users could read it in the process list. The
token is printed once on standard output; the file keeps only its hash, so a lost token is
replaced by issuing a new one (which also invalidates the old). The file is created if needed,
always written mode 0600 (passwords.py has the format). A running server picks up the change on
SIGHUP.

Exit status: 0 done; 1 the file or the input is refused (the message says why); 2 a bad command
line.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any, TextIO

from protocol.security.passwords import (
    MAX_PASSWORD_BYTES,
    PasswordFileError,
    delete_user,
    set_password,
    set_token,
)

__all__ = ["add_passwd_command", "read_password", "run"]


def add_passwd_command(sub: Any) -> None:
    """Register `passwd` on the `tickertape` command's subparsers."""
    p = sub.add_parser(
        "passwd",
        help="add, change or delete a user of a password file, or issue an admin token",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="the password file (created if absent)")
    p.add_argument("user", metavar="USER", help="the user name (the logon's user_id)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--delete", action="store_true", help="remove USER")
    what.add_argument(
        "--token",
        action="store_true",
        help="issue a new bearer token for USER (admin endpoint) and print it once",
    )
    p.set_defaults(run=run)


def read_password(stdin: TextIO, user: str) -> str:
    """The new password: prompted twice on a terminal, else one line of `stdin`."""
    if stdin.isatty():
        first = getpass.getpass(f"New password for {user}: ")
        if getpass.getpass("Again: ") != first:
            raise ValueError("the two passwords differ; nothing was changed")
        return first
    line = stdin.readline(MAX_PASSWORD_BYTES * 4 + 2)
    if not line:
        raise ValueError("no password on standard input (give it as one line)")
    return line.removesuffix("\n").removesuffix("\r")


def run(args: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    try:
        if args.delete:
            if not delete_user(args.file, args.user):
                print(f"tickertape passwd: no user {args.user!r} in {args.file}", file=err)
                return 1
            print(f"removed {args.user} from {args.file}", file=err)
        elif args.token:
            token = set_token(args.file, args.user)
            print(token, file=out)
            print(
                f"issued a bearer token for {args.user} in {args.file}; it is shown only this "
                "once (send it as 'Authorization: Bearer <token>')",
                file=err,
            )
        else:
            password = read_password(sys.stdin, args.user)
            added = set_password(args.file, args.user, password)
            done = "added" if added else "changed the password of"
            print(f"{done} {args.user} in {args.file}", file=err)
    except (PasswordFileError, ValueError) as e:
        print(f"tickertape passwd: {e}", file=err)
        return 1
    except OSError as e:
        print(f"tickertape passwd: {args.file}: {e.strerror or e}", file=err)
        return 1
    except KeyboardInterrupt:
        print("\ntickertape passwd: interrupted; nothing was changed", file=err)
        return 1
    return 0
