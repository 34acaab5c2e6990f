"""`tickertape sow`: query a SOW topic and print its records (docs/sow.md), one JSON line each:
the body as-is, or with --headers `{"k": ..., "bm": ..., "t": ..., "body": ...}`. Exit 0 once
the answer is printed; the statuses of client/cli.py otherwise.

`tickertape sub --sow` is `sow_and_subscribe`: the records of the answer, then the live
messages, with no gap and no duplicate between them (client/cli_sub.py, `_sub_sow`).
"""

from __future__ import annotations

import argparse
from typing import IO

from .cli_common import Printing, Usage, checked_servers, connect, ha_client, render

__all__ = ["run_sow"]


async def _sow(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    checked_servers(args)
    if args.top_n is not None and args.top_n < 0:
        raise Usage("--top-n must be 0 or more")
    ha = ha_client("sow", args, stderr)
    try:
        await connect(ha, args)
        client = ha.client
        assert client is not None, "connected: it has a client"
        records = await client.sow(
            args.topic, filter=args.filter, top_n=args.top_n, order_by=args.order_by
        )
        try:
            for msg in records:
                stdout.write(render(msg, args.headers, key=True))
            stdout.flush()
        except BrokenPipeError:
            return -1
        return 0
    finally:
        await ha.close()


run_sow = Printing("sow", _sow)  # `tickertape sow`
