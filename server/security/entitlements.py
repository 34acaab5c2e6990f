"""What a user may do: roles from `<Entitlement>`, decided once per (user, right, topic), cached.

    e = Entitlements(cfg.entitlement)
    e.allows(user, "publish", topic) -> bool                 a literal topic
    e.subscription(user, "subscribe", topic, pattern=True) -> Access   a subscription's topic
    e.allows_admin(user) -> bool
    e.read_filter(user, topic, ...) -> ReadFilter | None     content entitlement to AND in
    e.has_filters(user) -> bool                              any content entitlement at all
    e.check(peer, user, right, topic, command) -> bool       allows() + the audit line
    e.reload(new_entitlement, in_use=...) -> ReloadResult    what changed, to end what lost it

Rules (docs/security.md, "Roles"):

- Rights are `publish`, `subscribe` (live), `replay` (a subscription with a bookmark),
  `consume` (a queue subscription, and `sow_delete` acknowledging its messages; the topic is the
  queue's name) and `admin` (the admin endpoint). Each topic right is granted by topic regexes
  (RE2, matched against the whole topic name).
- A user's roles are those that list the user in `<Users>`, and those with `*`, which means
  every authenticated user: not "anonymous", which a role names explicitly when it means it.
- A right on a topic is refused if any of the user's roles denies it (`<Deny>`), else granted if
  any role grants it, else refused. Deny wins over allow.
- Without an `<Entitlement>` section every user may do everything but admin.

Regex subscriptions. Whether a regex's language lies inside the union of the allow regexes
minus the deny regexes is decidable but costly, and tests on the *text* of the regex are not
sound (an allow `orders\\..*` matches the string `orders..*`, whose language includes
`ordersX`). So a subscription whose topic is a pattern gets one of three answers (`Access`):

- `ALLOW`: every topic it can match is allowed, for sure: its text is exactly one of the user's
  allow regexes for that right, or an allow regex is `.*`, and the user has no deny regex for
  that right. Deliver as usual.
- `DENY`: no topic it can match is allowed, for sure: the user has no allow regex for the right,
  or a deny regex is exactly its text or `.*`. Refuse with `not entitled`.
- `PER_TOPIC`: accept the subscription, and deliver a message only when `allows(user, right,
  message_topic)`; that decision is cached per topic, so this costs a dict lookup per message.
  Messages on topics the user may not see are silently left out: the subscriber learns nothing
  about them.

Content entitlements: `read_filter(user, topic)` is the AND of the `<Filter><Expression>`s of
the user's roles whose `<Filter><Topic>` matches the topic (None when none does). Engines AND it
to the subscriber's own filter for every read: live delivery, replay, queue delivery. For a
regex subscription the topic is each message's; for a queue, pass the queue's name and its
underlying topic (`read_filter(user, queue, underlying)`), so filters written for either apply.

Caching: decisions and filters are computed once per key and kept in bounded maps (the oldest
entry goes first when full), so a publish or a delivery never evaluates a regex twice for the
same (user, topic). `reload` rebuilds the rules and returns every cached or in-use decision and
filter that changed, so the server can end subscriptions that lost their right.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from config.model import Entitlement, Role
from protocol.patterns import compile_pattern
from protocol.security.passwords import ANONYMOUS

from . import audit

__all__ = [
    "RIGHTS",
    "Access",
    "Change",
    "Entitlements",
    "ReadFilter",
    "ReloadResult",
    "Right",
]

Right = Literal["publish", "subscribe", "replay", "consume", "admin"]
RIGHTS: tuple[str, ...] = ("publish", "subscribe", "replay", "consume")
_ANY = ".*"
DEFAULT_CACHE = 1 << 16


class Access(enum.Enum):
    ALLOW = "allow"
    PER_TOPIC = "per-topic"
    DENY = "deny"


Key = tuple[str, str, str, bool]
"""(user, right, topic or pattern, is a pattern); admin decisions use ("user", "admin", "", False)."""


@dataclass(frozen=True)
class ReadFilter:
    """A content entitlement: `text` in the filter language, and its compiled predicates."""

    text: str

    @property
    def match(self) -> Callable[[bytes], bool]:
        """predicate(raw JSON body) -> bool (protocol.filters.compile_body_filter, cached there)."""
        from protocol.filters import compile_body_filter

        return compile_body_filter(self.text)

    @property
    def match_value(self) -> Callable[[object], bool]:
        """predicate(decoded JSON body) -> bool."""
        from protocol.filters import compile_filter

        return compile_filter(self.text)

    def and_with(self, own: str | None) -> str:
        """The filter text an engine applies: this AND the subscriber's own filter."""
        return self.text if not own else f"({self.text}) AND ({own})"


@dataclass(frozen=True)
class Change:
    """A decision that a reload changed."""

    user: str
    right: str
    topic: str
    pattern: bool
    before: Access
    after: Access


@dataclass(frozen=True)
class ReloadResult:
    changed: tuple[Change, ...]
    """Every decision cached or in use whose answer changed."""
    filters_changed: tuple[tuple[str, str], ...]
    """(user, topic) whose read filter changed: their subscriptions need the new one."""

    @property
    def revoked(self) -> tuple[Change, ...]:
        """Decisions that no longer allow everything they did (end or narrow the subscription)."""
        rank = {Access.ALLOW: 2, Access.PER_TOPIC: 1, Access.DENY: 0}
        return tuple(c for c in self.changed if rank[c.after] < rank[c.before])


@dataclass(frozen=True)
class _Rules:
    """One user's roles folded together."""

    allow: dict[str, tuple[str, ...]]
    deny: dict[str, tuple[str, ...]]
    allow_re: dict[str, Any]
    deny_re: dict[str, Any]
    admin: bool
    filters: tuple[tuple[Any, str], ...]


def _alternation(patterns: tuple[str, ...]) -> Any:
    if not patterns:
        return None
    return compile_pattern("|".join(f"(?:{p})" for p in patterns))


class _Bounded(dict[Any, Any]):
    """A dict that forgets its oldest entry when it holds `limit` entries."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: Any, value: Any) -> Any:
        if len(self) >= self.limit:
            del self[next(iter(self))]
        self[key] = value
        return value


class Entitlements:
    """The decisions for one `<Entitlement>` (None: none configured). Not thread-safe: use it
    from the event loop."""

    def __init__(self, entitlement: Entitlement | None, cache_size: int = DEFAULT_CACHE) -> None:
        self.entitlement = entitlement
        self.cache_size = cache_size
        self._rules: _Bounded = _Bounded(cache_size)
        self._decisions: _Bounded = _Bounded(cache_size)
        self._filters: _Bounded = _Bounded(cache_size)

    # -- decisions -------------------------------------------------------------------------

    def allows(self, user: str, right: str, topic: str) -> bool:
        """Whether `user` has `right` on the literal `topic`."""
        return self.subscription(user, right, topic, pattern=False) is Access.ALLOW

    def subscription(self, user: str, right: str, topic: str, pattern: bool) -> Access:
        """The decision for a command on `topic`; `pattern`: the topic is a regex over topic
        names (a regex subscription). ALLOW or DENY for a literal topic."""
        key = (user, right, topic, pattern)
        found = self._decisions.get(key)
        if found is None:
            found = self._decisions.put(key, self._decide(user, right, topic, pattern))
        return found  # type: ignore[no-any-return]

    def allows_admin(self, user: str) -> bool:
        return self.subscription(user, "admin", "", False) is Access.ALLOW

    def check(
        self, peer: str, user: str, right: str, topic: str, command: str | None = None
    ) -> bool:
        """`allows`, writing the audit line for a refusal."""
        ok = self.allows_admin(user) if right == "admin" else self.allows(user, right, topic)
        if not ok:
            audit.refused(peer, user, right, topic, command)
        return ok

    def has_filters(self, user: str) -> bool:
        """Whether any of `user`'s roles has a content filter, on any topic (a regex
        subscription then needs its filter decided topic by topic)."""
        return self.entitlement is not None and bool(self._user_rules(user).filters)

    def read_filter(self, user: str, *topics: str) -> ReadFilter | None:
        """The content entitlement for reading `topics` (one, or a queue and its underlying
        topic): the AND of every applicable role filter, or None."""
        key = (user, topics)
        if key in self._filters:
            return self._filters[key]  # type: ignore[no-any-return]
        return self._filters.put(key, self._filter(user, topics))  # type: ignore[no-any-return]

    # -- reload ----------------------------------------------------------------------------

    def reload(
        self,
        entitlement: Entitlement | None,
        in_use: Iterable[Key] = (),
        reads_in_use: Iterable[tuple[str, tuple[str, ...]]] = (),
    ) -> ReloadResult:
        """Switch to `entitlement` and say what changed: every decision in the cache or in
        `in_use` (the server's live subscriptions: the cache is bounded, so it may have dropped
        some), and every read filter in the cache or `reads_in_use`."""
        keys = dict.fromkeys([*self._decisions, *in_use])
        reads = dict.fromkeys([*self._filters, *reads_in_use])
        before = {k: self.subscription(*k) for k in keys}
        filters_before = {k: self.read_filter(k[0], *k[1]) for k in reads}
        self.entitlement = entitlement
        self._rules = _Bounded(self.cache_size)
        self._decisions = _Bounded(self.cache_size)
        self._filters = _Bounded(self.cache_size)
        changed = []
        for (user, right, topic, pattern), old in before.items():
            new = self.subscription(user, right, topic, pattern)
            if new is not old:
                changed.append(Change(user, right, topic, pattern, before=old, after=new))
        filters_changed: list[tuple[str, str]] = []
        for (user, topics), old_filter in filters_before.items():
            if self.read_filter(user, *topics) != old_filter:
                filters_changed.extend((user, t) for t in topics)
        return ReloadResult(tuple(changed), tuple(dict.fromkeys(filters_changed)))

    # -- computing -------------------------------------------------------------------------

    def _roles(self, user: str) -> list[Role]:
        assert self.entitlement is not None
        return [
            r
            for r in self.entitlement.roles
            if user in r.users or ("*" in r.users and user != ANONYMOUS)
        ]

    def _user_rules(self, user: str) -> _Rules:
        found = self._rules.get(user)
        if found is not None:
            return found  # type: ignore[no-any-return]
        roles = self._roles(user)
        allow = {r: tuple(p for role in roles for p in role.allow.patterns(r)) for r in RIGHTS}
        deny = {r: tuple(p for role in roles for p in role.deny.patterns(r)) for r in RIGHTS}
        rules = _Rules(
            allow=allow,
            deny=deny,
            allow_re={r: _alternation(allow[r]) for r in RIGHTS},
            deny_re={r: _alternation(deny[r]) for r in RIGHTS},
            admin=any(r.allow.admin for r in roles) and not any(r.deny.admin for r in roles),
            filters=tuple(
                (compile_pattern(f.topic), f.expression) for role in roles for f in role.filters
            ),
        )
        return self._rules.put(user, rules)  # type: ignore[no-any-return]

    def _decide(self, user: str, right: str, topic: str, pattern: bool) -> Access:
        if self.entitlement is None:
            return Access.DENY if right == "admin" else Access.ALLOW
        rules = self._user_rules(user)
        if right == "admin":
            return Access.ALLOW if rules.admin else Access.DENY
        if right not in RIGHTS:
            raise ValueError(f"unknown right {right!r}; one of {', '.join(RIGHTS)}, admin")
        if not pattern:
            deny, allow = rules.deny_re[right], rules.allow_re[right]
            if deny is not None and deny.fullmatch(topic):
                return Access.DENY
            return Access.ALLOW if allow is not None and allow.fullmatch(topic) else Access.DENY
        allows, denies = rules.allow[right], rules.deny[right]
        if not allows or topic in denies or _ANY in denies:
            return Access.DENY
        if not denies and (topic in allows or _ANY in allows):
            return Access.ALLOW
        return Access.PER_TOPIC

    def _filter(self, user: str, topics: tuple[str, ...]) -> ReadFilter | None:
        if self.entitlement is None:
            return None
        expressions = list(
            dict.fromkeys(
                expression
                for regex, expression in self._user_rules(user).filters
                if any(regex.fullmatch(t) for t in topics)
            )
        )
        if not expressions:
            return None
        if len(expressions) == 1:
            return ReadFilter(expressions[0])
        return ReadFilter(" AND ".join(f"({e})" for e in expressions))
