"""The delta commands of a session (docs/sow.md "delta_publish", "Delta subscriptions"):
`delta_subscribe`, `sow_and_delta_subscribe` and `delta_publish`.

A delta subscription is the plain command's subscription (`cmd_subscribe`,
`cmd_sow_and_subscribe`) with a delta feed (server/sow/delta.py) put on it after the command
made it; `delta_publish` merges its body into the record (`SowManager.merge_delta`) and then
publishes the merged message. `DeltaCommands` is built by the session at logon beside its
`SowCommands` (server/session_sow.py), whose query commands it ends in.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.headers import Header
from protocol.options import InvalidOptions, subscribe_options
from protocol.patterns import is_pattern

from .reasons import Failure
from .services import SessionServices
from .session_caller import Caller
from .session_sow import SowCommands
from .sow import BadSowKey, SowManager

__all__ = ["DeltaCommands"]


class DeltaCommands:
    """One logged-on session's delta commands; `sowing`: its SOW commands, which check the
    topic and run the plain command a delta one ends as."""

    __slots__ = ("caller", "fail", "sowing", "svc", "table")

    def __init__(self, caller: Caller, svc: SessionServices, sowing: SowCommands) -> None:
        self.caller = caller
        self.svc = svc
        self.fail, self.table = caller.fail, caller.table
        self.sowing = sowing

    # -- delta_subscribe, sow_and_delta_subscribe ------------------------------------------------

    def cmd_delta_subscribe(self, h: Header, body: bytes) -> None:
        """A subscribe to a SOW topic whose live changes to records it was sent arrive as only
        the fields that changed (server/sow/delta.py)."""
        self._delta(h, body, self.sowing.cmd_subscribe)

    def cmd_sow_and_delta_subscribe(self, h: Header, body: bytes) -> None:
        """sow_and_subscribe whose live changes arrive as deltas (server/sow/delta.py)."""
        self._delta(h, body, self.sowing.cmd_sow_and_subscribe)

    def _delta(self, h: Header, body: bytes, command: Callable[[Header, bytes], None]) -> None:
        """`command` (the plain one), then the subscription it made (not one it refused to
        replace) gets its feed of deltas."""
        sow = self._delta_checks(h)
        if sow is None:
            return
        before = self.table.get(h.sub_id or "")
        command(h, body)
        sub = self.table.get(h.sub_id or "")
        if sub is not None and sub is not before and sub.conflation is None:
            sub.conflation = sow.delta_feed(sub)

    def _delta_checks(self, h: Header) -> SowManager | None:
        """What a delta subscription needs beyond its plain command's checks: a SOW topic, no
        bookmark replay (delta_subscribe), no option that holds or reorders messages. Gives
        the command a sub_id (to find its subscription after)."""
        sow = self.sowing.sow_manager(h)
        if sow is None:
            return None
        topic = h.t or ""
        if not is_pattern(topic) and not sow.is_sow(topic):
            self.fail(
                h,
                Failure.INVALID_TOPIC,
                f"{h.c} needs a SOW topic (<SOW><Topic>, recorded); {topic!r} is not one",
            )
            return None
        if h.bm and h.c == "delta_subscribe":
            self.fail(
                h,
                Failure.INVALID_BOOKMARK,
                "delta_subscribe takes no bm (a replay sends whole messages); use "
                "sow_and_delta_subscribe with bm for the state at a point, then changes",
            )
            return None
        try:
            opts = subscribe_options(h.o, h.c or "delta_subscribe")
        except InvalidOptions as exc:
            self.fail(h, Failure.INVALID_OPTIONS, str(exc))
            return None
        refused = [n for n in ("live", "conflation") if getattr(opts, n)]
        if refused:
            self.fail(
                h,
                Failure.INVALID_OPTIONS,
                f"options {', '.join(refused)} are not served on {h.c}",
            )
            return None
        if h.sub_id is None:
            h.sub_id = self.caller.new_sub_id()
        return sow

    # -- delta_publish ------------------------------------------------------------------------------

    def cmd_delta_publish(self, h: Header, body: bytes) -> None:
        """A publish whose body is merged into the record with its key (§14); on a topic that
        is not a SOW topic, a plain publish."""
        sow = self.svc.sow
        topic = self.svc.topics.publish_topic(h.t) if h.t else None
        if sow is not None and topic and sow.is_sow(topic):
            if self.sowing.store_failed(h, sow):
                return
            try:
                body = sow.merge_delta(topic, body, h.k)
            except BadSowKey as exc:
                self.fail(h, Failure.BAD_SOW_KEY, str(exc))
                return
            except ValueError as exc:
                self.fail(h, Failure.BAD_FRAME, str(exc))
                return
        self.sowing.cmd_publish(h, body)
