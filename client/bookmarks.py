"""Bookmark stores: where a subscriber's HAClient resumes a bookmark subscription.

Special bookmarks: `EPOCH` ("0", replay everything), `NOW` ("0|1|", no replay), and
`MOST_RECENT` ("recent", resolved here: where this subscription left off, or EPOCH for a
subscription id the store has never seen). A bookmark is `<publisher_id>|<seq>|`
(docs/protocol.md §5); within one publisher, sequence numbers grow in journal order.

What a store tracks per subscription id (`_SubState`, shared by the memory and logged stores):

- `base`: the point the subscription started from (EPOCH for a new MOST_RECENT subscription).
- `recovery`: the newest bookmark with every entry up to it (in arrival order) discarded.
- the window: entries received after `recovery`, in arrival order, each discarded or not; its
  first entry is never discarded (discarding it moves `recovery` forward over every discarded
  entry that follows). An entry is a message or a mark (below).
- `highest`: per publisher, the newest sequence delivered to the application.
- `passed`: per publisher, the newest sequence that left the window (processed, or passed by a
  mark), so every earlier message of that publisher is processed too.
- `redeliver`: after a restart, the window's undiscarded messages: the application lost them
  with its process, so each is delivered once more when the replay brings it.

Events:

- `log(message) -> bool`: a message arrived. False means "drop it": its publisher's sequence is
  not above `highest` (a duplicate after a resubscribe or failover, or the out-of-order 999
  after 1000 and 1002), unless it is in `redeliver`. True appends it to the window.
- `discard(message)`: the application is done with it (any order).
- `persisted(sub_id, bookmark)`: a periodic `persisted` ack of the subscription, "the server
  has passed this durable bookmark": it is appended as a mark entry (a discarded position, not
  a message), so `recovery` can pass stretches a filter let nothing through. HASubscription
  feeds marks in stream order with the messages, so a mark never overtakes a message. A mark
  that comes while a replay is re-sending messages already delivered (the newest message was a
  duplicate) lies behind what was seen, and is ignored.
- `most_recent(sub_id, elsewhere=False)`: the bookmark (list) to resubscribe with, on this
  instance or on another one of a replicated set (bookmarks are the same on every instance;
  only the order across publishers differs, docs/protocol.md §5 "a list starts after its
  oldest"; the server leaves out, per publisher the list names, what it says the subscriber
  has):
    * nothing processed yet (no `recovery`): `base`; if `base` is NOW, the oldest undiscarded
      message's own bookmark (nothing earlier is known; that one message would only be lost if
      the process dies before the first discard or mark);
    * otherwise the list of `recovery` (the entry just before the oldest undiscarded message)
      and, per publisher, the newest bookmark of that publisher processed before its oldest
      undiscarded message (`passed`, or a discarded entry of the window). On any instance the
      server starts after the oldest of them, so each publisher resumes at or before its first
      unprocessed message, and `log` drops per publisher what was already delivered. A
      publisher with undiscarded messages and none processed adds `base` (unless NOW), the
      only point known to lie before its first message everywhere.
    * `elsewhere` (the subscription resumes on another instance than the one it last received
      from): `base` too (unless NOW), whatever was processed: a publisher this subscription
      has never seen may have its messages before the resume point on that instance (the
      order across publishers differs), and only `base` lies before them everywhere. The
      replay there starts at `base`, and the server leaves out each listed publisher's
      messages up to its point.
    Limits: at most MAX_LIST items (the oldest-seen publishers are left out first: the server
    then sends them again from the oldest point, and `log` drops them), and a subscription
    that started at NOW has no point before an unseen publisher's messages on another instance
    (its failover can pass over those).
Bounds: the window is bounded by the application's discards (HASubscription stops handing out
messages while a subscription's window holds `max_window` entries); `highest` and `passed` hold
at most `max_publishers` publishers each (the least recently seen is forgotten first).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Self

import msgspec

from protocol.bookmarks import format_bookmark, publisher_bookmark

from .errors import StoreClosed
from .message import Message

__all__ = [
    "EPOCH",
    "MOST_RECENT",
    "NOW",
    "BookmarkStore",
    "MemoryBookmarkStore",
]

EPOCH = "0"
NOW = "0|1|"
MOST_RECENT = "recent"
MAX_LIST = 9_999  # the server accepts lists of up to 10,000 items (protocol.bookmarks)


class _Entry(msgspec.Struct, eq=False, gc=False):
    pub: int
    seq: int
    bm: str  # the bookmark text as the server sent it (canonical)
    done: bool = False
    mark: bool = False


class _SubState:
    """One subscription's bookmark state; see the module docstring."""

    __slots__ = ("base", "behind", "highest", "index", "max_publishers", "passed", "recovery",
                 "redeliver", "window")  # fmt: skip

    def __init__(self, base: str, max_publishers: int):
        self.base = base
        self.recovery: str | None = None
        self.window: deque[_Entry] = deque()
        self.index: dict[str, _Entry] = {}  # the window's messages by bookmark
        self.highest: dict[int, int] = {}
        self.passed: dict[int, int] = {}
        self.redeliver: set[str] = set()
        self.max_publishers = max_publishers
        self.behind = False  # the newest message was a duplicate: a replay is catching up

    def log(self, pub: int, seq: int, bm: str) -> bool:
        redeliver = self.redeliver
        if redeliver and bm in redeliver:
            redeliver.discard(bm)
            return True
        highest = self.highest
        h = highest.get(pub)
        if h is not None:
            if seq <= h:
                self.behind = True
                return False
            del highest[pub]  # re-insert: the dict's order is least recently seen first
        elif len(highest) >= self.max_publishers:
            self._forget_publisher()
        highest[pub] = seq
        self.behind = False
        self.append(pub, seq, bm)
        return True

    def append(self, pub: int, seq: int, bm: str) -> None:
        """Add a received message to the window (load: no duplicate check)."""
        e = _Entry(pub, seq, bm)
        self.window.append(e)
        self.index[bm] = e
        h = self.highest.get(pub)
        if h is None or seq > h:
            self.highest[pub] = seq

    def discard(self, bm: str) -> _Entry | None:
        """Mark the message `bm` discarded; returns its entry (None if it was not pending)."""
        e = self.index.get(bm)
        if e is None or e.done:
            return None
        e.done = True
        if self.redeliver:
            self.redeliver.discard(bm)
        window = self.window
        if window[0] is e:
            index = self.index
            while window and window[0].done:
                f = window.popleft()
                if not f.mark:
                    del index[f.bm]
                self.recovery = f.bm
                self.pass_(f.pub, f.seq)
        return e

    def pass_(self, pub: int, seq: int) -> None:
        """Every message of `pub` up to `seq` is processed (or was never for this
        subscription): the publisher's point in a resume list."""
        passed = self.passed
        old = passed.pop(pub, None)  # re-insert: least recently passed first
        if old is not None and old > seq:
            seq = old
        elif old is None and len(passed) >= self.max_publishers:
            del passed[next(iter(passed))]
        passed[pub] = seq

    def mark(self, pub: int, seq: int) -> bool:
        if self.behind:
            return False
        text = format_bookmark(pub, seq)
        window = self.window
        if not window:
            if text == self.recovery:
                return False
            self.recovery = text
            self.pass_(pub, seq)
            return True
        last = window[-1]
        if last.mark:
            if last.bm == text:
                return False
            last.pub, last.seq, last.bm = pub, seq, text  # newer, nothing between: replace
        else:
            window.append(_Entry(pub, seq, text, True, True))
        return True

    def most_recent(self, elsewhere: bool = False) -> str:
        window = self.window
        if self.recovery is None:
            if window and self.base == NOW:
                return window[0].bm
            return self.base
        points = dict(self.passed)
        pending: set[int] = set()  # publishers with an undiscarded message
        for e in window:
            if e.mark or e.pub in pending:
                continue
            if e.done:
                points[e.pub] = e.seq
            else:
                pending.add(e.pub)
        items = [self.recovery]
        seen = {self.recovery}
        unseen = elsewhere or any(pub not in points for pub in pending)
        if unseen and self.base != NOW and self.base not in seen:
            items.append(self.base)  # a publisher with nothing processed: from the start
            seen.add(self.base)
        for pub in reversed(points):  # newest first: the oldest-seen are cut by MAX_LIST
            text = format_bookmark(pub, points[pub])
            if text not in seen:
                if len(items) >= MAX_LIST:
                    break
                seen.add(text)
                items.append(text)
        return ",".join(items)

    def _forget_publisher(self) -> None:
        held = {e.pub for e in self.window}
        pub = next((p for p in self.highest if p not in held), next(iter(self.highest)))
        del self.highest[pub]
        # a forgotten publisher's messages would pass `log` again: no resume point for it
        self.passed.pop(pub, None)

    def start_redelivery(self) -> None:
        """After a load: the undiscarded messages in the window come once more."""
        self.redeliver = {e.bm for e in self.window if not e.done and not e.mark}


def _canonical(bookmark: str) -> str:
    return bookmark if bookmark.endswith("|") else bookmark + "|"


def tracked(message: Message) -> tuple[str, int, int, str] | None:
    """The subscription id, publisher, sequence and bookmark of a message a store tracks: one
    of a bookmark subscription with a publisher bookmark (None: `log` passes it on as it is)."""
    sub_id, bm = message.sub_id, message.bookmark
    if sub_id is None or bm is None:
        return None
    point = publisher_bookmark(bm)
    return None if point is None else (sub_id, point[0], point[1], bm)


class Subscriptions:
    """The state of each subscription id (`_SubState`) and the events on it: all that the
    memory store keeps, and what the logged and SOW stores keep in memory and record (their
    file, their SOW topic). Each event returns what changed, for the store to record."""

    def __init__(self, max_publishers: int):
        self.max_publishers = max_publishers
        self.states: dict[str, _SubState] = {}

    def new(self, sub_id: str, base: str) -> None:
        self.states[sub_id] = _SubState(base, self.max_publishers)

    def start(self, sub_id: str, bookmark: str) -> tuple[str, bool]:
        """The bookmark to send (BookmarkStore.start), and whether the subscription starts
        afresh from it (False: it resumes its state)."""
        if bookmark == MOST_RECENT:
            state = self.states.get(sub_id)
            if state is not None:
                return state.most_recent(), False
            bookmark = EPOCH
        self.new(sub_id, bookmark)
        return bookmark, True

    def discard(self, sub_id: str, bookmark: str) -> _Entry | None:
        """The entry discarded (None: it was not pending)."""
        state = self.states.get(sub_id)
        return None if state is None else state.discard(_canonical(bookmark))

    def mark(self, sub_id: str, bookmark: str) -> tuple[int, int] | None:
        """A persisted ack: the point it marked (None: it changed nothing)."""
        state = self.states.get(sub_id)
        point = publisher_bookmark(bookmark)
        if state is None or point is None or not state.mark(*point):
            return None
        return point

    def most_recent(self, sub_id: str, elsewhere: bool) -> str:
        state = self.states.get(sub_id)
        return EPOCH if state is None else state.most_recent(elsewhere)

    def window_size(self, sub_id: str) -> int:
        state = self.states.get(sub_id)
        return 0 if state is None else len(state.window)

    def purge(self, sub_id: str | None) -> list[str]:
        """Forget `sub_id` (None: every subscription); the ids purged."""
        ids = list(self.states) if sub_id is None else [sub_id]
        for sid in ids:
            self.states.pop(sid, None)
        return ids


class BookmarkStore(ABC):
    """What an HAClient needs from a bookmark store. Every method is synchronous and fast:
    it runs on the event loop for every message. Thread-unsafe by design (one loop)."""

    path: str | None = None
    _closed = False

    def _check(self) -> None:
        if self._closed:
            raise StoreClosed(self.path)

    @abstractmethod
    def start(self, sub_id: str, bookmark: str) -> str:
        """A subscription is entered with `bookmark`; returns the bookmark to send.

        MOST_RECENT resolves through the store (EPOCH for an unknown `sub_id`) and keeps the
        subscription's state; any other bookmark starts the subscription afresh from there
        (its previous state for `sub_id` is dropped).
        """

    @abstractmethod
    def log(self, message: Message) -> bool:
        """A message of a bookmark subscription arrived; False: drop it (see module doc)."""

    @abstractmethod
    def discard_bookmark(self, sub_id: str, bookmark: str) -> bool:
        """The application is done with this message; False if it was not pending."""

    def discard(self, message: Message) -> bool:
        """The application is done with `message` (call it once processed, in any order)."""
        if message.bookmark is None or message.sub_id is None:
            return False
        return self.discard_bookmark(message.sub_id, message.bookmark)

    @abstractmethod
    def persisted(self, sub_id: str, bookmark: str) -> None:
        """A periodic persisted ack of the subscription (see module doc)."""

    @abstractmethod
    def most_recent(self, sub_id: str, elsewhere: bool = False) -> str:
        """Where to resume `sub_id` (EPOCH if unknown); `elsewhere`: on another instance than
        the one it last received from (module doc)."""

    @abstractmethod
    def window_size(self, sub_id: str) -> int:
        """Entries the store holds for `sub_id`'s recovery (0 if unknown)."""

    @abstractmethod
    def purge(self, sub_id: str | None = None) -> None:
        """Forget `sub_id` (None: every subscription)."""

    def prune(self) -> None:
        """Rewrite the store's file compactly (file stores); memory: nothing."""

    def close(self) -> None:
        """Flush and release the store; later calls raise StoreClosed. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryBookmarkStore(BookmarkStore):
    """Bookmark state in process memory: resumes after disconnects and failover (with
    duplicate and out-of-order filtering), not after the process ends."""

    def __init__(self, *, max_publishers: int = 100_000):
        self.subs = Subscriptions(max_publishers)

    def __repr__(self) -> str:
        return f"<MemoryBookmarkStore {len(self.subs.states)} subscription(s)>"

    def start(self, sub_id: str, bookmark: str) -> str:
        self._check()
        return self.subs.start(sub_id, bookmark)[0]

    def log(self, message: Message) -> bool:
        got = tracked(message)
        if got is None:
            return True
        sub_id, pub, seq, bm = got
        state = self.subs.states.get(sub_id)
        return state is None or state.log(pub, seq, bm)

    def discard_bookmark(self, sub_id: str, bookmark: str) -> bool:
        self._check()
        return self.subs.discard(sub_id, bookmark) is not None

    def persisted(self, sub_id: str, bookmark: str) -> None:
        self._check()
        self.subs.mark(sub_id, bookmark)

    def most_recent(self, sub_id: str, elsewhere: bool = False) -> str:
        self._check()
        return self.subs.most_recent(sub_id, elsewhere)

    def window_size(self, sub_id: str) -> int:
        return self.subs.window_size(sub_id)

    def purge(self, sub_id: str | None = None) -> None:
        self._check()
        self.subs.purge(sub_id)

    def close(self) -> None:
        self._closed = True
