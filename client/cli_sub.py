"""`tickertape sub` and `tickertape queue`: the commands that print what they receive (options
and exit statuses: client/cli.py).

sub: one line per message on stdout, flushed per line: the body as-is, or with --headers
`{"bm": ..., "t": ..., "body": <body as JSON, or as a string if it is not JSON>}`. With
`--bookmark recent --bookmark-store FILE --sub-id ID` it resumes exactly where the previous
run with that FILE and ID stopped: each message is discarded in the store right after it is
printed (a kill between the two prints that one message again on the next run).
--timeout is an idle limit: stop when no message arrived for that many seconds.

queue: consume a queue (docs/protocol.md §8): one line per message (the body), each acknowledged
(`sow_delete`, in batches of up to half the backlog) after it is printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from functools import partial
from typing import IO

from protocol.bookmarks import InvalidBookmark, parse_bookmark

from .bookmarks import MOST_RECENT, BookmarkStore, MemoryBookmarkStore
from .bookmarks_logged import LoggedBookmarkStore
from .bookmarks_ring import RingBookmarkStore
from .cli_common import (
    Printing,
    Usage,
    checked_servers,
    connect,
    ha_client,
    render,
    report_recovery,
)
from .hasub import HASubscription
from .message import Message
from .subscription import Subscription

__all__ = ["run_queue", "run_sub"]


def _sub_options(args: argparse.Namespace) -> str | None:
    rate = f"rate={args.rate}" if args.rate else None
    return ",".join(o for o in (args.options, rate) if o) or None


_BOOKMARK_WORDS = {"epoch": "0", "now": "0|1|"}


def _check_bookmark(text: str | None) -> None:
    if text is None or text == MOST_RECENT:
        return
    try:
        parse_bookmark(text)
    except InvalidBookmark as exc:
        raise Usage(f"--bookmark: {exc}") from None


def _open_bookmark_store(args: argparse.Namespace) -> BookmarkStore:
    if not args.bookmark_store:
        return MemoryBookmarkStore()
    if not args.sub_id:
        raise Usage("--bookmark-store needs --sub-id (the store keeps state per subscription)")
    if args.bookmark_store_kind == "ring":
        return RingBookmarkStore(args.bookmark_store)
    return LoggedBookmarkStore(args.bookmark_store)


async def _print_each(
    command: str,
    sub: HASubscription | Subscription,
    args: argparse.Namespace,
    streams: tuple[IO[bytes], IO[str]],
    line: Callable[[Message], bytes],
    printed: Callable[[Message], object] | None = None,
    before: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Print `line(msg)` for each message until --count, a completed range (0), the idle
    --timeout (1 if --count was not reached, else 0) or a closed stdout (-1); `printed(msg)`
    after each line, `await before()` before each wait."""
    stdout, stderr = streams
    received = 0
    while args.count is None or received < args.count:
        if before is not None:
            await before()
        try:
            msg = await sub.next(timeout=args.timeout)
        except TimeoutError:
            if args.count is None:
                return 0
            print(
                f"tickertape {command}: received {received} of {args.count} message(s) "
                f"before the --timeout of {args.timeout:g}s",
                file=stderr,
            )
            return 1
        if msg is None:  # a range completed
            return 0
        try:
            stdout.write(line(msg))
            stdout.flush()
        except BrokenPipeError:
            return -1
        if printed is not None:
            printed(msg)
        received += 1
    return 0


async def _sub(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    checked_servers(args)
    args.bookmark = _BOOKMARK_WORDS.get((args.bookmark or "").lower(), args.bookmark)
    _check_bookmark(args.bookmark)
    if args.count is not None and args.count < 1:
        raise Usage("--count must be at least 1")
    store = _open_bookmark_store(args)
    report_recovery("sub", store, stderr)
    bookmark = args.bookmark
    if bookmark is None and args.bookmark_store:
        bookmark = MOST_RECENT  # a store is there to resume from
    if getattr(args, "sow", False):
        if bookmark is not None or args.bookmark_store:
            raise Usage("--sow starts from the current state: give no --bookmark or store")
        return await _sub_sow(args, stdout, stderr)
    client = ha_client("sub", args, stderr, bookmark_store=store)
    try:
        await connect(client, args)
        sub = await client.subscribe(
            args.topic,
            filter=args.filter,
            bookmark=bookmark,
            options=_sub_options(args),
            sub_id=args.sub_id,
        )
        line = partial(render, headers=args.headers)
        return await _print_each("sub", sub, args, (stdout, stderr), line, sub.discard)
    finally:
        await client.close()
        store.close()


async def _sub_sow(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    """`sub --sow`: sow_and_subscribe on one connection (no failover: a new connection would
    need a new answer)."""
    ha = ha_client("sub", args, stderr)
    try:
        await connect(ha, args)
        client = ha.client
        assert client is not None, "connected: it has a client"
        sub = await client.sow_and_subscribe(
            args.topic, filter=args.filter, options=args.options, sub_id=args.sub_id
        )
        line = partial(render, headers=args.headers, key=True)
        return await _print_each("sub", sub, args, (stdout, stderr), line)
    finally:
        await ha.close()


async def _queue(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    checked_servers(args)
    if args.backlog < 1:
        raise Usage("--backlog must be at least 1")
    if args.count is not None and args.count < 1:
        raise Usage("--count must be at least 1")
    client = ha_client("queue", args, stderr)
    unacked: list[str] = []
    batch = max(1, args.backlog // 2)

    async def ack() -> None:
        if unacked:
            bookmarks = ",".join(unacked)
            unacked.clear()
            await client.sow_delete(args.name, bookmarks)

    async def ack_due() -> None:  # before waiting: the server sends no more than the backlog
        if unacked and (len(unacked) >= batch or sub.buffered == 0):
            await ack()

    def printed(msg: Message) -> None:
        if msg.bookmark:
            unacked.append(msg.bookmark)

    try:
        await connect(client, args)
        sub = await client.subscribe(args.name, filter=args.filter,
                                     options=f"max_backlog={args.backlog}")  # fmt: skip
        return await _print_each(
            "queue", sub, args, (stdout, stderr), lambda m: m.body + b"\n", printed, ack_due
        )
    finally:
        try:
            if client.connected:
                await ack()
        finally:
            await client.close()


run_sub = Printing("sub", _sub)  # `tickertape sub` (see the module docstring)
run_queue = Printing("queue", _queue)  # `tickertape queue`
