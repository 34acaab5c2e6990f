"""The server's door to server/security: TLS contexts, the logon check, what a user may read.

Built once per server from its configuration (`build_guard`) and handed to the parts that use it:
the TLS acceptor (server/tls_accept.py) takes the transports' contexts, sessions (through
`SessionServices`) check logons and commands, the admin endpoint checks its requests.

    Guard.tls[name]      the ssl.SSLContext of each `tcps` transport
    Guard.admin_tls      the admin endpoint's, or None (plain HTTP)
    Guard.checker        the LogonChecker; None without <Authentication>: every logon is
                         accepted under the user_id it claims, as without security
    Guard.entitlements   the Entitlements; None without <Authentication> (nothing is checked)
    Guard.logon(...)     a logon checked off the event loop, the outcome called back on it
    Guard.grant(...)     whether a user may read a topic or pattern, and what it then reads:
                         the subscriber's filter AND the content entitlements, and for a
                         regex that is allowed only topic by topic, the gate on its topics
    Guard.reload(cfg)    SIGHUP: the password file, the roles, the certificates

The rules themselves are server/security's (docs/security.md); this module only applies them to
the server's objects. Each part of a reload that fails keeps its old state and is reported.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from config.model import Config
from protocol.filters import FilterError, cached_filter, compiled
from protocol.security.tls import ServerTls, TlsError, reload_server_context, server_context

from .matching import Predicate, TopicFilter
from .security.authenticator import AuthFailure, Identity, LogonChecker, build_authenticator
from .security.entitlements import Access, Entitlements, ReadFilter
from .subscriptions import Subscription

__all__ = ["Grant", "Guard", "TopicGate", "build_guard"]

log = logging.getLogger("tickertape.server")

LogonOutcome = Identity | AuthFailure


class TopicGate:
    """A regex subscription's pattern when its user may read only some of the topics it
    matches (`Access.PER_TOPIC`): it matches a topic when the pattern does and the user may
    read it. Stands in for the compiled pattern (`fullmatch`, str or bytes); each topic is
    decided once (bounded cache), so a delivery costs a dict lookup."""

    __slots__ = ("_seen", "allowed", "pattern")

    LIMIT = 4096

    def __init__(self, pattern: Any, allowed: Callable[[str], bool]) -> None:
        self.pattern = pattern
        self.allowed = allowed
        self._seen: dict[str | bytes, bool] = {}

    def fullmatch(self, topic: str | bytes) -> bool | None:
        hit = self._seen.get(topic)
        if hit is None:
            name = topic if isinstance(topic, str) else topic.decode("utf-8", "replace")
            hit = self.pattern.fullmatch(topic) is not None and self.allowed(name)
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            self._seen[topic] = hit
        return True if hit else None  # callers test `is not None` or truth, as of a match


@dataclass(frozen=True, slots=True)
class Grant:
    """What a subscription may read: `filter` replaces the subscriber's own (it is that AND
    the content entitlements; a `TopicFilter` for a regex whose entitlements vary by topic);
    `topics`, for a regex allowed only topic by topic, says which topics; `entitled` is the
    content entitlement alone (None: none), which tells an out-of-focus `entitlement` from a
    `match` (server/sow/oof.py)."""

    filter: Predicate | None
    topics: Callable[[str], bool] | None = None
    entitled: Predicate | None = None

    def apply(self, sub: Subscription) -> None:
        """Put the grant on `sub`, a new subscription or one re-checked by a reload (then the
        caller has taken it out of the router, whose matches are cached by topic)."""
        sub.filter = self.filter
        sub.entitled = self.entitled
        regex, regex_b = sub.regex, sub.regex_b
        if isinstance(regex, TopicGate):
            regex = regex.pattern
        if isinstance(regex_b, TopicGate):
            regex_b = regex_b.pattern
        if self.topics is not None and regex is not None:
            regex = TopicGate(regex, self.topics)
            regex_b = TopicGate(regex_b, self.topics) if regex_b is not None else None
        sub.regex, sub.regex_b = regex, regex_b


def _and(own: Predicate | None, entitled: ReadFilter | None) -> Predicate | None:
    if entitled is None:
        return own
    role = entitled.match_value
    if own is None:
        return role
    own_filter = compiled(own)
    if own_filter is not None:
        # one compiled filter, so the fields-only decode and the replay's block scanner apply
        # to an entitled subscriber's filter too (a lambda over two predicates gets neither);
        # only when that costs next to nothing: a large own filter was compiled off the event
        # loop (server/session_subscribe.py), and compiling it again here would stall it
        try:
            both = cached_filter(entitled.and_with(own_filter.text))
        except FilterError:  # together past the length limit: evaluate them one by one
            both = None
        if both is not None:
            return both
    return lambda doc: role(doc) and own(doc)


@dataclass
class Guard:
    tls: dict[str, ssl.SSLContext] = field(default_factory=dict)
    admin_tls: ssl.SSLContext | None = None
    checker: LogonChecker | None = None
    entitlements: Entitlements | None = None
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    # -- logon -----------------------------------------------------------------------------

    def logon(
        self,
        peer: str,
        user: str | None,
        password: str | None,
        peer_cert: Any,
        transport: str | None,
        done: Callable[[LogonOutcome], None],
    ) -> None:
        """Check a logon (back-off, scrypt on a worker thread, the audit line) and call
        `done(identity or failure)` on the event loop; not called if the server stops first."""
        checker = self.checker
        assert checker is not None, "logon() needs <Authentication>; without it logons are open"
        task = asyncio.get_running_loop().create_task(
            checker.check(peer, user, password, peer_cert, transport)
        )
        self._tasks.add(task)

        def finished(t: asyncio.Task[LogonOutcome]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                log.error("logon check of %s failed: %r", peer, exc, exc_info=exc)
                done(AuthFailure(user, f"the check failed: {exc!r}"))
            else:
                done(t.result())

        task.add_done_callback(finished)

    # -- entitlements ----------------------------------------------------------------------

    def grant(
        self,
        peer: str,
        user: str | None,
        right: str,
        topic: str,
        pattern: bool,
        own: Predicate | None,
        command: str,
        also: tuple[str, ...] = (),
    ) -> Grant | None:
        """What `user` may read with `right` on `topic` (a regex over topic names when
        `pattern`), given the subscriber's own filter; None when refused (audited). `also`:
        more topics whose content entitlements apply (a queue's underlying topic)."""
        ent = self.entitlements
        if ent is None or user is None:
            return Grant(own)
        access = ent.subscription(user, right, topic, pattern)
        if access is Access.DENY:
            ent.check(peer, user, right, topic, command)  # refused: writes the audit line
            return None
        if not pattern:
            rf = ent.read_filter(user, topic, *also)
            return Grant(_and(own, rf), entitled=rf.match_value if rf is not None else None)
        topics = None if access is Access.ALLOW else partial(ent.allows, user, right)
        if not ent.has_filters(user):
            return Grant(own, topics)
        return Grant(
            TopicFilter(lambda t: _and(own, ent.read_filter(user, t))),
            topics,
            TopicFilter(lambda t: _and(None, ent.read_filter(user, t))),
        )

    def may_admin(self, peer: str, user: str) -> bool:
        """Whether `user` may use the admin endpoint (a refusal is audited)."""
        ent = self.entitlements
        return ent is not None and ent.check(peer, user, "admin", "", "admin")

    # -- lifecycle -------------------------------------------------------------------------

    def reload(self, config: Config) -> list[str]:
        """Re-read the password file, take `config`'s roles and re-read the certificates of
        the transports and admin endpoint this guard serves (SIGHUP). Returns a problem per
        part that failed (that part keeps its old state). The caller then re-checks the
        subscriptions that are open (`grant` again)."""
        problems = []
        if self.checker is not None:
            try:
                self.checker.reload()
            except Exception as exc:  # PasswordFileError, OSError: the old users stay
                problems.append(f"password file not reloaded, the old users stay: {exc}")
        if self.entitlements is not None:
            self.entitlements.reload(config.entitlement)
        for t in config.transports:
            ctx = self.tls.get(t.name)
            if ctx is not None and t.type == "tcps":
                problems += _reload_tls(ctx, t, f"transport {t.name!r}")
        if self.admin_tls is not None and config.admin is not None:
            if config.admin.certificate is not None:
                problems += _reload_tls(self.admin_tls, config.admin, "the admin endpoint")
        return problems

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.checker is not None:
            self.checker.close()


def _reload_tls(ctx: ssl.SSLContext, section: Any, what: str) -> list[str]:
    try:
        reload_server_context(ctx, ServerTls.of(section))
    except TlsError as exc:
        return [f"certificates of {what} not reloaded, the old ones stay: {exc}"]
    return []


def build_guard(config: Config) -> Guard:
    """The guard for `config`. Raises `TlsError` or `PasswordFileError` for a file that does
    not load (the configuration loader has checked them; this is a file changed since)."""
    tls = {t.name: server_context(ServerTls.of(t)) for t in config.transports if t.type == "tcps"}
    admin = config.admin
    admin_tls = (
        server_context(ServerTls.of(admin))
        if admin is not None and admin.certificate is not None
        else None
    )
    auth = config.authentication
    if auth is None:
        return Guard(tls, admin_tls)
    return Guard(
        tls,
        admin_tls,
        LogonChecker(build_authenticator(auth)),
        Entitlements(config.entitlement),
    )
