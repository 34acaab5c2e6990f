"""Where an HAClient's subscriptions go on a connection (client/ha.py): `Placer` keeps the
client's HASubscriptions by sub_id, places one on a connection, and re-enters them all after a
logon (step 8 of the connect sequence).

A bookmark subscription with a bookmark store is placed with the bookmark the store gives: the
one asked for the first time (the store starts `sub_id` from it), MOST_RECENT on every later
connection, with `bookmark_not_found` added so that a server that does not know the bookmark
replays all it has (the store drops what was seen). A range and a live subscription are
re-entered as first placed.

A `sow_and_subscribe` is placed as one until its answer is all in (a lost connection before
that runs the query again). The answer's point (its `completed` bookmark) then starts `sub_id`
in the bookmark store (client/hasub.py), and every later connection resumes it as a bookmark
subscription from MOST_RECENT: each change after the point once, none lost, and no second
answer (docs/client.md says why it is not queried again). A re-entry the server refuses fails its HASubscription and drops
its spec from the subscription manager; the others go on.

Door: what the HAClient shows as a `PlacerHost` (its stores, options and current server) and
its error report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from .bookmarks import MOST_RECENT, BookmarkStore
from .client import DEFAULT_TIMEOUT, Client
from .errors import ClientError, CommandError, CommandTimeout, Disconnected
from .hasub import HASubscription
from .submanager import SubscriptionManager, SubscriptionSpec

__all__ = ["Placer", "PlacerHost"]

log = logging.getLogger("tickertape.client.ha")


class PlacerHost(Protocol):
    """What a Placer reads of its HAClient, at each placement."""

    @property
    def bookmark_store(self) -> BookmarkStore: ...

    @property
    def subscription_manager(self) -> SubscriptionManager: ...

    @property
    def bookmark_not_found(self) -> str | None: ...

    @property
    def current_uri(self) -> str | None: ...


def _is_range(bookmark: str) -> bool:
    return bookmark.lstrip()[:1] in ("[", "(")


def _subscribe_options(options: str | None) -> str | None:
    """A sow_and_subscribe's options as a subscribe takes them (no paging of the answer)."""
    if not options:
        return options
    kept = [o for o in options.split(",") if o.split("=")[0].strip() not in ("top_n", "skip_n")]
    return ",".join(kept) or None


class Placer:
    """An HAClient's subscriptions and their placement on its connections."""

    def __init__(self, host: PlacerHost, report: Callable[[ClientError], None]) -> None:
        self.host = host
        self.report = report  # a refused re-entry, which no call waits for
        self.subs: dict[str, HASubscription] = {}

    def tracking_store(self, spec: SubscriptionSpec) -> BookmarkStore | None:
        if not spec.sow and (spec.bookmark is None or _is_range(spec.bookmark)):
            return None  # a live subscription or a range: nothing to resume
        return self.host.bookmark_store

    async def place(self, hs: HASubscription, client: Client, *, first: bool,
                    timeout: float | None = DEFAULT_TIMEOUT) -> None:  # fmt: skip
        """Subscribe `hs` on `client`; a bookmark subscription through the bookmark store."""
        spec = hs.spec
        bookmark = spec.bookmark
        options = spec.options
        store = hs._store
        if spec.sow:
            if hs._sow_point is None:  # the answer has not been all in yet: (again) as one
                sub = await client.sow_and_subscribe(
                    spec.topic, filter=spec.filter, options=options, sub_id=spec.sub_id,
                    bookmark=bookmark, timeout=timeout, marks=True,
                )  # fmt: skip
                hs._placed_uri = self.host.current_uri
                hs._attach(sub)
                return
            first, bookmark = False, MOST_RECENT  # resumed from the answer's point on
            options = _subscribe_options(options)
        if store is not None:
            assert bookmark is not None, "a store tracks bookmark subscriptions only"
            recent = bookmark == MOST_RECENT or not first
            # resumed on another server than the one it last received from (or, first placed
            # from a stored state, on one not known): the list then says where unseen
            # publishers start (client/bookmarks.py `elsewhere`)
            elsewhere = recent and hs._placed_uri != self.host.current_uri
            if first:
                bookmark = store.start(spec.sub_id, bookmark)
                if recent and elsewhere:
                    bookmark = store.most_recent(spec.sub_id, elsewhere=True)
            else:
                bookmark = store.most_recent(spec.sub_id, elsewhere)
            if (
                recent
                and self.host.bookmark_not_found
                and "bookmark_not_found" not in (options or "")
            ):
                nf = f"bookmark_not_found={self.host.bookmark_not_found}"
                options = f"{options},{nf}" if options else nf
        elif bookmark == MOST_RECENT:
            bookmark = "0"
        sub = await client.subscribe(spec.topic, filter=spec.filter, bookmark=bookmark,
                                     options=options, sub_id=spec.sub_id, timeout=timeout,
                                     marks=store is not None)  # fmt: skip
        hs._placed_uri = self.host.current_uri
        hs._attach(sub)

    async def reenter(self, client: Client) -> None:
        """Step 8 on a logged-on connection: every subscription placed before, again."""
        for hs in list(self.subs.values()):
            if not hs.active or not hs._placed_once:
                continue  # a first placement in progress is subscribe()'s to retry
            try:
                await self.place(hs, client, first=False)
            except CommandError as exc:
                log.warning("re-entering subscription %s refused: %s", hs.sub_id, exc)
                hs._finish(exc)
                self.subs.pop(hs.sub_id, None)
                self.host.subscription_manager.remove(hs.sub_id)
                self.report(exc)
            except CommandTimeout as exc:
                client.abort("timeout", f"re-entering subscription {hs.sub_id}: {exc}")
                raise Disconnected("timeout", str(exc)) from None
