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

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_HOMES = ("_transport", "client", "errors", "security", "session", "table", "types", "watch")
"""The modules the names of `__all__` come from (as imported above for type checkers). They are
imported on first use (`__getattr__`): `import tablekeeper` alone, and the `tablekeeper server`
command, which needs none of them, do not load grpc and the protobuf modules."""

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


if not TYPE_CHECKING:  # type checkers see the imports above, and no other attribute

    def __getattr__(name: str) -> object:
        if name in __all__:
            for home in _HOMES:
                module = vars(importlib.import_module(f"tablekeeper.{home}"))
                if name in module:
                    globals()[name] = module[name]  # found without this call from now on
                    return module[name]
        raise AttributeError(f"module 'tablekeeper' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
