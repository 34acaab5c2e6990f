"""The Tickertape Python client (imports `protocol/` only; see shared/DESIGN.md §1).

`Client` (client/client.py) is one asyncio connection; `Subscription` an async iterator of
`Message`; errors are in client/errors.py; the `pub` / `sub` commands are in client/cli.py.
"""

from .client import Client
from .errors import (
    ClientError,
    CommandError,
    CommandTimeout,
    ConnectFailed,
    Disconnected,
    PublishFailed,
)
from .message import LogonResult, Message
from .subscription import Subscription

__all__ = [
    "Client",
    "ClientError",
    "CommandError",
    "CommandTimeout",
    "ConnectFailed",
    "Disconnected",
    "LogonResult",
    "Message",
    "PublishFailed",
    "Subscription",
]
