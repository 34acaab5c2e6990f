"""The Tickertape Python client (imports `protocol/` only; see docs/architecture.md).

`Client` (client/client.py) is one asyncio connection; `Subscription` an async iterator of
`Message`; errors are in client/errors.py; the `pub` / `sub` / `queue` commands are in
client/cli.py.

High availability (client/ha.py): `HAClient` reconnects and fails over (a `ServerChooser`, a
`ReconnectDelayStrategy`), republishes from a publish store (`MemoryPublishStore`,
`FilePublishStore`), and resumes subscriptions from a bookmark store (`MemoryBookmarkStore`,
`LoggedBookmarkStore`, `RingBookmarkStore`) through a `SubscriptionManager`.
"""

from .bookmarks import EPOCH, MOST_RECENT, NOW, BookmarkStore, MemoryBookmarkStore
from .bookmarks_logged import LoggedBookmarkStore
from .bookmarks_ring import RingBookmarkStore
from .bookmarks_sow import SowBookmarkStore
from .chooser import Authenticator, DefaultAuthenticator, DefaultServerChooser, ServerChooser
from .client import Client
from .delay import ExponentialDelayStrategy, FixedDelayStrategy, ReconnectDelayStrategy
from .errors import (
    ClientError,
    CommandError,
    CommandTimeout,
    ConnectFailed,
    CorruptStore,
    Disconnected,
    NoServerAvailable,
    PublishFailed,
    ReconnectGaveUp,
    StoreClosed,
    StoreError,
    StoreFull,
    StoreLocked,
)
from .ha import HAClient
from .hasub import HASubscription
from .message import LogonResult, Message, PersistedBookmark
from .pubstore import MemoryPublishStore, PublishStore, StoredPublish
from .pubstore_file import FilePublishStore
from .storefile import RecoveryReport
from .submanager import (
    FileSubscriptionManager,
    MemorySubscriptionManager,
    SubscriptionManager,
    SubscriptionSpec,
)
from .subscription import Subscription

__all__ = [
    "EPOCH",
    "MOST_RECENT",
    "NOW",
    "Authenticator",
    "BookmarkStore",
    "Client",
    "ClientError",
    "CommandError",
    "CommandTimeout",
    "ConnectFailed",
    "CorruptStore",
    "DefaultAuthenticator",
    "DefaultServerChooser",
    "Disconnected",
    "ExponentialDelayStrategy",
    "FilePublishStore",
    "FileSubscriptionManager",
    "FixedDelayStrategy",
    "HAClient",
    "HASubscription",
    "LoggedBookmarkStore",
    "LogonResult",
    "MemoryBookmarkStore",
    "MemoryPublishStore",
    "MemorySubscriptionManager",
    "Message",
    "NoServerAvailable",
    "PersistedBookmark",
    "PublishFailed",
    "PublishStore",
    "ReconnectDelayStrategy",
    "ReconnectGaveUp",
    "RecoveryReport",
    "RingBookmarkStore",
    "ServerChooser",
    "SowBookmarkStore",
    "StoreClosed",
    "StoreError",
    "StoreFull",
    "StoreLocked",
    "StoredPublish",
    "Subscription",
    "SubscriptionManager",
    "SubscriptionSpec",
]
