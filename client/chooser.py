"""Server choosers: which server an HAClient connects to next, with which credentials.

A chooser only answers questions; it never calls the client. The HAClient asks
`current_uri()` and `current_authenticator()` before every connection attempt, then calls
`report_success(uri)` once logged on, or `report_failure(exc, uri)` when the connection or
the logon failed. When `current_uri()` returns None or "" the HAClient stops and raises
NoServerAvailable with the chooser's `error()`.

`DefaultServerChooser` rotates over a list of URIs: it stays on the current URI while it
works (a reconnect after a dropped connection tries the same server first) and moves to the
next one on each failure, wrapping around.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from .address import parse_server

__all__ = ["Authenticator", "DefaultAuthenticator", "DefaultServerChooser", "ServerChooser"]


class Authenticator(ABC):
    """Turns the configured credentials into the password sent at logon (a token, say)."""

    @abstractmethod
    def authenticate(self, user_id: str | None, password: str | None) -> str | None:
        """The password to send for `user_id`."""


class DefaultAuthenticator(Authenticator):
    """Sends the configured password as it is."""

    def authenticate(self, user_id: str | None, password: str | None) -> str | None:
        return password


class ServerChooser(ABC):
    """See the module docstring for the contract."""

    @abstractmethod
    def current_uri(self) -> str | None:
        """The server to connect to next (`host:port`, `tcp://host:port/`, or
        `tcps://host:port/` for TLS); None: none."""

    def current_authenticator(self) -> Authenticator:
        """The authenticator for `current_uri()`."""
        return DefaultAuthenticator()

    @abstractmethod
    def report_success(self, uri: str) -> None:
        """Connected and logged on to `uri`."""

    @abstractmethod
    def report_failure(self, exc: BaseException, uri: str) -> None:
        """Connecting or logging on to `uri` failed with `exc`."""

    @abstractmethod
    def error(self) -> str:
        """Why no server is available (used when current_uri() returns None)."""


class DefaultServerChooser(ServerChooser):
    """Rotates over `uris` in order (module docstring). Each URI is checked when added."""

    def __init__(self, uris: Iterable[str] = (), authenticator: Authenticator | None = None):
        self._uris: list[str] = []
        self._index = 0
        self._authenticator = authenticator or DefaultAuthenticator()
        self._failures: dict[str, str] = {}
        for uri in uris:
            self.add(uri)

    def __repr__(self) -> str:
        return f"<DefaultServerChooser {self._uris} current={self.current_uri()!r}>"

    def add(self, uri: str) -> None:
        parse_server(uri)  # raises ValueError naming the accepted forms
        self._uris.append(uri)

    @property
    def uris(self) -> list[str]:
        return list(self._uris)

    def current_uri(self) -> str | None:
        if not self._uris:
            return None
        return self._uris[self._index % len(self._uris)]

    def current_authenticator(self) -> Authenticator:
        return self._authenticator

    def report_success(self, uri: str) -> None:
        self._failures.pop(uri, None)

    def report_failure(self, exc: BaseException, uri: str) -> None:
        self._failures[uri] = str(exc)
        if self._uris and self.current_uri() == uri:
            self._index = (self._index + 1) % len(self._uris)

    def error(self) -> str:
        if not self._uris:
            return "no server URIs were given to the DefaultServerChooser"
        return "; ".join(f"{u}: {e}" for u, e in self._failures.items()) or "no failures"
