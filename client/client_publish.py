"""Publishing on one connection, a collaborator of `Client`: publish, the in-flight window, flushes.

`ClientPublishing` is handed the connection (client_conn.py); it sends publishes and keeps
their sequence numbers in a `PublishTracker` (client/publish.py, its `tracker`), which
`Client._on_ack` feeds with the conflated persisted acks. Publishes carry `s` (numbered from the logon's `s` + 1 unless
given) and `a: "persisted"` (plus `processed` with `track_duplicates=True`); they carry no `cid`.
The common publish header is encoded once per topic and only `s` is appended per publish.

Back-pressure: `publish()` waits while `max_inflight` publishes are unacknowledged or the
socket's write buffer is above its high-water mark; `try_publish` / `publish_nowait` never wait.
"""

from __future__ import annotations

import msgspec

from protocol.framing import frame_bytes
from protocol.headers import Header, encode_header

from .client_conn import ClientConnection
from .publish import PublishTracker

__all__ = ["BodyLike", "ClientPublishing"]

_json_encode = msgspec.json.Encoder().encode

BodyLike = bytes | bytearray | memoryview | str | dict | list


def _body_bytes(body: object) -> bytes:
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, (dict, list)):
        return _json_encode(body)
    raise TypeError(f"body must be bytes, str or a JSON dict/list, not {type(body).__name__}")


class ClientPublishing:
    """Publishing on one connection (see the module docstring)."""

    def __init__(self, conn: ClientConnection, max_inflight: int, track_duplicates: bool) -> None:
        self._conn = conn
        self._publish_acks = "processed,persisted" if track_duplicates else "persisted"
        self.tracker = PublishTracker(max_inflight)
        self._prefixes: dict[str, bytes] = {}

    def unpersisted_count(self) -> int:
        """Publishes sent and not yet acknowledged as persisted (or failed)."""
        return len(self.tracker._inflight)

    async def publish(
        self,
        topic: str,
        body: BodyLike,
        *,
        seq: int | None = None,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> int:
        """Send one publish and return its sequence number; does not wait for the ack.

        Waits only when `max_inflight` publishes are unacknowledged or the socket's write
        buffer is full. `body`: bytes as-is, str as UTF-8, dict/list encoded as JSON.
        Raises Disconnected if the connection is gone, ClientError before logon.
        """
        tracker = self.tracker
        conn = self._conn
        # hot path: read the tracker's deque directly instead of through a method call
        if len(tracker._inflight) >= tracker.max_inflight:
            await tracker.wait_window()
        if conn.write_paused:
            await conn.wait_writable()
        if conn.state != "logged_on":
            raise conn.not_ready("publish")
        if type(body) is not bytes:
            body = _body_bytes(body)
        if seq is None:
            seq = tracker.last_seq + 1
        if expiration is None and correlation_id is None:
            prefix = self._prefixes.get(topic)
            if prefix is None:
                prefix = self._publish_prefix(topic)
            header = prefix + b"%d}" % seq
        else:
            header = self._full_header(topic, seq, expiration, correlation_id)
        conn.write(frame_bytes(header, body))
        tracker.sent(seq)
        return seq

    def can_publish(self) -> bool:
        """True when publish_nowait() may be called: logged on, the in-flight window has room
        and the socket's write buffer is below its high-water mark."""
        return (
            self._conn.state == "logged_on"
            and not self._conn.write_paused
            and len(self.tracker._inflight) < self.tracker.max_inflight
        )

    async def wait_publishable(self) -> None:
        """Wait until can_publish() (raises Disconnected if the connection ends first)."""
        conn = self._conn
        while True:
            if conn.state != "logged_on":
                raise conn.not_ready("publish")
            if len(self.tracker._inflight) >= self.tracker.max_inflight:
                await self.tracker.wait_window()
            elif conn.write_paused:
                await conn.wait_writable()
            else:
                return

    def try_publish(
        self,
        topic: str,
        body: bytes,
        seq: int,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> bool:
        """Send one publish with sequence `seq` if that needs no waiting (logged on, room in
        the window and the write buffer); returns False, sending nothing, otherwise."""
        tracker = self.tracker
        conn = self._conn
        if (
            conn.state != "logged_on"
            or conn.write_paused
            or len(tracker._inflight) >= tracker.max_inflight
        ):
            return False
        if expiration is None and correlation_id is None:
            prefix = self._prefixes.get(topic)
            if prefix is None:
                prefix = self._publish_prefix(topic)
            conn.write(frame_bytes(prefix + b"%d}" % seq, body))
        else:
            self.publish_nowait(topic, body, seq, expiration, correlation_id)
            return True
        tracker.sent(seq)
        return True

    def publish_nowait(
        self,
        topic: str,
        body: bytes,
        seq: int,
        expiration: float | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Send one publish with sequence `seq` now, without waiting (check can_publish()
        first: this ignores the window). For callers that number publishes themselves, such
        as the HAClient's publish store. Raises Disconnected / ClientError when not logged on.
        """
        conn = self._conn
        if conn.state != "logged_on":
            raise conn.not_ready("publish")
        if expiration is None and correlation_id is None:
            prefix = self._prefixes.get(topic)
            if prefix is None:
                prefix = self._publish_prefix(topic)
            header = prefix + b"%d}" % seq
        else:
            header = self._full_header(topic, seq, expiration, correlation_id)
        conn.write(frame_bytes(header, body))
        self.tracker.sent(seq)

    def _full_header(self, topic: str, seq: int, e: float | None, x: str | None) -> bytes:
        """A publish header with an expiration or a correlation id (no cached prefix)."""
        return encode_header(Header(c="publish", t=topic, a=self._publish_acks, s=seq, x=x, e=e))

    def _publish_prefix(self, topic: str) -> bytes:
        # The common publish header differs only in `s`: encode the rest once per topic and
        # append the number (halves the per-publish cost against a Header encode).
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        if len(self._prefixes) >= 1024:
            self._prefixes.clear()  # bounded: a publisher to many topics re-encodes now and then
        full = encode_header(Header(c="publish", t=topic, a=self._publish_acks))
        prefix = self._prefixes[topic] = full[:-1] + b',"s":'
        return prefix
