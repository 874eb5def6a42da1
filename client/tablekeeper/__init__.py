"""TableKeeper Python SDK.

    from tablekeeper import Client
    with Client("bk://127.0.0.1:4181") as client:
        client.create_namespace("app")
        client.create_table("app", "users", ranges=4)
        users = client.table("app", "users")
        users.put("user-1", "name", "Ada")
        print(users.get("user-1", "name").value)

`AsyncClient` / `AsyncTable` are the asyncio versions (many requests in flight on one channel).
Every exception is in `tablekeeper.errors` (each says whether it is `retryable` and whether a
write's outcome is unknown; `NotFoundError`, `ConflictError` and `UnavailableError` group them);
the value types are in `tablekeeper.types`. Table calls take `timeout=` (seconds, retries
included). Recipes (metadata store, locks, elections, ...) are in `tablekeeper.recipes`.
"""

from tablekeeper._transport import RetryPolicy
from tablekeeper.client import DEFAULT_SERVICE, AsyncClient, Client, Table, Txn
from tablekeeper.errors import (
    BadRequestError,
    BadRevisionError,
    BadVersionError,
    CompactedError,
    ConflictError,
    DeadlineExceededError,
    IllegalOpError,
    InternalServerError,
    InvalidKeyError,
    InvalidNamespaceNameError,
    InvalidTableNameError,
    KeyExistsError,
    KeyNotFoundError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    NotFoundError,
    NotImplementedOnServerError,
    OutcomeUnknownError,
    PermissionDeniedError,
    ResourceLimitError,
    SessionExpiredError,
    TableExistsError,
    TableKeeperError,
    TableNotFoundError,
    UnauthenticatedError,
    UnavailableError,
    UnexpectedError,
    WatchCancelledError,
    WriteTimeoutError,
)
from tablekeeper.security import TlsConfig
from tablekeeper.session import AsyncSession, Session
from tablekeeper.table import AsyncTable, AsyncTxn
from tablekeeper.types import KeyValue, ReadInfo, TableInfo, TxnResult, WatchEvent
from tablekeeper.watch import AsyncWatch, Watch

__all__ = [
    "DEFAULT_SERVICE",
    "AsyncClient",
    "AsyncSession",
    "AsyncTable",
    "AsyncTxn",
    "AsyncWatch",
    "BadRequestError",
    "BadRevisionError",
    "BadVersionError",
    "Client",
    "CompactedError",
    "ConflictError",
    "DeadlineExceededError",
    "IllegalOpError",
    "InternalServerError",
    "InvalidKeyError",
    "InvalidNamespaceNameError",
    "InvalidTableNameError",
    "KeyExistsError",
    "KeyNotFoundError",
    "KeyValue",
    "NamespaceExistsError",
    "NamespaceNotFoundError",
    "NotFoundError",
    "NotImplementedOnServerError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ReadInfo",
    "ResourceLimitError",
    "RetryPolicy",
    "Session",
    "SessionExpiredError",
    "Table",
    "TableExistsError",
    "TableInfo",
    "TableKeeperError",
    "TableNotFoundError",
    "TlsConfig",
    "Txn",
    "TxnResult",
    "UnauthenticatedError",
    "UnavailableError",
    "UnexpectedError",
    "Watch",
    "WatchCancelledError",
    "WatchEvent",
    "WriteTimeoutError",
]
