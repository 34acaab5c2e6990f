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

__all__ = ["run_queue", "run_sub"]


def _sub_options(args: argparse.Namespace) -> str | None:
    opts = [o for o in (args.options,) if o]
    if args.rate:
        opts.append(f"rate={args.rate}")
    return ",".join(opts) or None


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


async def _idle_next(
    sub: HASubscription, args: argparse.Namespace, received: int, command: str, stderr: IO[str]
) -> Message | int | None:
    """The next message, or an exit status when the idle --timeout passed."""
    try:
        return await sub.next(timeout=args.timeout)
    except TimeoutError:
        if args.count is not None:
            print(
                f"tickertape {command}: received {received} of {args.count} message(s) "
                f"before the --timeout of {args.timeout:g}s",
                file=stderr,
            )
            return 1
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
    received = 0
    try:
        await connect(client, args)
        sub = await client.subscribe(
            args.topic,
            filter=args.filter,
            bookmark=bookmark,
            options=_sub_options(args),
            sub_id=args.sub_id,
        )
        while args.count is None or received < args.count:
            msg = await _idle_next(sub, args, received, "sub", stderr)
            if isinstance(msg, int):
                return msg
            if msg is None:  # a range completed
                return 0
            try:
                stdout.write(render(msg, args.headers))
                stdout.flush()
            except BrokenPipeError:
                return -1
            sub.discard(msg)
            received += 1
        return 0
    finally:
        await client.close()
        store.close()


async def _sub_sow(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    """`sub --sow`: sow_and_subscribe on one connection (no failover: a new connection would
    need a new answer)."""
    from .client import Client

    ha = ha_client("sub", args, stderr)
    received = 0
    try:
        await connect(ha, args)
        client = ha.client
        assert isinstance(client, Client)
        sub = await client.sow_and_subscribe(
            args.topic, filter=args.filter, options=args.options, sub_id=args.sub_id
        )
        while args.count is None or received < args.count:
            msg = await _idle_next(sub, args, received, "sub", stderr)  # type: ignore[arg-type]
            if isinstance(msg, int):
                return msg
            if msg is None:
                return 0
            try:
                stdout.write(render(msg, args.headers, key=True))
                stdout.flush()
            except BrokenPipeError:
                return -1
            received += 1
        return 0
    finally:
        await ha.close()


async def _queue(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    checked_servers(args)
    if args.backlog < 1:
        raise Usage("--backlog must be at least 1")
    if args.count is not None and args.count < 1:
        raise Usage("--count must be at least 1")
    client = ha_client("queue", args, stderr)
    received = 0
    unacked: list[str] = []
    batch = max(1, args.backlog // 2)

    async def ack() -> None:
        if unacked:
            bookmarks = ",".join(unacked)
            unacked.clear()
            await client.sow_delete(args.name, bookmarks)

    try:
        await connect(client, args)
        sub = await client.subscribe(args.name, filter=args.filter,
                                     options=f"max_backlog={args.backlog}")  # fmt: skip
        while args.count is None or received < args.count:
            if unacked and (len(unacked) >= batch or sub.buffered == 0):
                await ack()  # before waiting: the server sends no more than the backlog
            msg = await _idle_next(sub, args, received, "queue", stderr)
            if isinstance(msg, int):
                return msg
            if msg is None:
                return 0
            try:
                stdout.write(msg.body + b"\n")
                stdout.flush()
            except BrokenPipeError:
                return -1
            if msg.bookmark:
                unacked.append(msg.bookmark)
            received += 1
        return 0
    finally:
        try:
            if client.connected:
                await ack()
        finally:
            await client.close()


run_sub = Printing("sub", _sub)  # `tickertape sub` (see the module docstring)
run_queue = Printing("queue", _queue)  # `tickertape queue`
