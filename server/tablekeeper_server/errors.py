"""Server domain errors.

Every error the server raises on purpose derives from `TableKeeperError`. Each carries a
`StatusCode` value (BookKeeper's application status, which travels in response bodies) and a
human-readable message. The mapping to the wire lives in one place: `rpc/status.py`.
"""

from __future__ import annotations

import errno
import os


class Code:
    """BookKeeper `StatusCode` numbers (storage.proto), as plain ints: no protobuf needed here."""

    SUCCESS = 0
    FAILURE = 1
    BAD_REQUEST = 400
    ILLEGAL_OP = 403
    INTERNAL_SERVER_ERROR = 500
    NOT_IMPLEMENTED = 501
    UNEXPECTED = 600
    BAD_VERSION = 900
    BAD_REVISION = 901
    INVALID_NAMESPACE_NAME = 2000
    NAMESPACE_EXISTS = 2001
    NAMESPACE_NOT_FOUND = 2002
    INVALID_STREAM_NAME = 2100
    STREAM_EXISTS = 2101
    STREAM_NOT_FOUND = 2102
    INVALID_KEY = 6000
    KEY_EXISTS = 6001
    KEY_NOT_FOUND = 6002


class TableKeeperError(Exception):
    """Base of all deliberate server errors. `code` is a `Code` value."""

    code: int = Code.INTERNAL_SERVER_ERROR
    retryable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or type(self).__name__)
        self.message = message or type(self).__name__


class BadRequestError(TableKeeperError):
    code = Code.BAD_REQUEST


class ResourceLimitError(TableKeeperError):
    """The request is over a configured limit (ops per Batch, bytes per response, ...). Nothing was
    applied; the message names the limit and its flag. gRPC RESOURCE_EXHAUSTED on every RPC
    (unary BookKeeper calls included): retrying the same request cannot succeed."""

    code = Code.BAD_REQUEST


class PermissionDeniedError(TableKeeperError):
    """The caller's role may not do this (e.g. close a session another role created). gRPC
    PERMISSION_DENIED on every RPC; the message says what is missing."""

    code = Code.ILLEGAL_OP


class IllegalOpError(TableKeeperError):
    code = Code.ILLEGAL_OP


class InvalidKeyError(TableKeeperError):
    code = Code.INVALID_KEY


class KeyNotFoundError(TableKeeperError):
    code = Code.KEY_NOT_FOUND


class BadVersionError(TableKeeperError):
    code = Code.BAD_VERSION


class InvalidNamespaceNameError(TableKeeperError):
    code = Code.INVALID_NAMESPACE_NAME


class NamespaceExistsError(TableKeeperError):
    code = Code.NAMESPACE_EXISTS


class NamespaceNotFoundError(TableKeeperError):
    code = Code.NAMESPACE_NOT_FOUND


class InvalidStreamNameError(TableKeeperError):
    code = Code.INVALID_STREAM_NAME


class StreamExistsError(TableKeeperError):
    code = Code.STREAM_EXISTS


class StreamNotFoundError(TableKeeperError):
    code = Code.STREAM_NOT_FOUND


class RouteNotFoundError(TableKeeperError):
    """The target container or range is not served here (yet). Sent as gRPC NOT_FOUND, which
    BookKeeper clients retry."""

    code = Code.INTERNAL_SERVER_ERROR
    retryable = True


class NotServedHereError(RouteNotFoundError):
    """The request belongs to storage container `container_id`, which another server owns (or
    nobody owns right now). The RPC layer forwards the request to the owner when it knows one;
    otherwise the client hears NOT_FOUND and retries."""

    def __init__(self, container_id: int, message: str | None = None) -> None:
        super().__init__(message or f"storage container {container_id} is not served here")
        self.container_id = container_id


class UnavailableError(TableKeeperError):
    """The server cannot take the request right now (shutting down, log unavailable).
    Nothing was applied; the caller may retry."""

    code = Code.INTERNAL_SERVER_ERROR
    retryable = True


class StorageUnavailableError(UnavailableError):
    """The disk or the process ran out of a resource (space, quota, file descriptors, memory),
    a file lock is held, or permission is denied: nothing is damaged, and the request succeeds
    once the resource is back. Retryable (gRPC NOT_FOUND, like every `UnavailableError`); never
    a reason to set a store aside or restore a checkpoint. `maybe_persisted`: the failure hit a
    log append that may have reached the disk (its callers must hear "outcome unknown")."""

    RESOURCE_ERRNOS = frozenset(
        {
            errno.ENOSPC,
            errno.EDQUOT,
            errno.EMFILE,
            errno.ENFILE,
            errno.ENOLCK,
            errno.ENOMEM,
            errno.EACCES,
            errno.EPERM,
            errno.EROFS,
            errno.EAGAIN,
        }
    )
    RESOURCE_MESSAGES = tuple(os.strerror(code) for code in sorted(RESOURCE_ERRNOS)) + (
        "lock hold by current process",  # RocksDB: the LOCK is held by a handle of this process
    )

    def __init__(self, message: str = "", *, maybe_persisted: bool = False) -> None:
        super().__init__(message)
        self.maybe_persisted = maybe_persisted

    @classmethod
    def is_resource_error(cls, exc: BaseException) -> bool:
        """Whether `exc` (an `OSError`, or RocksDB's plain exception) reports exhaustion of a
        resource or a held lock rather than damaged data."""
        if isinstance(exc, OSError):
            return exc.errno in cls.RESOURCE_ERRNOS
        text = str(exc)
        return not text.startswith("Corruption") and any(m in text for m in cls.RESOURCE_MESSAGES)


class IndeterminateError(TableKeeperError):
    """The command may or may not have been applied (the log failed mid-append, or the owner a
    request was forwarded to stopped answering). Retrying a non-idempotent write could apply it
    twice, so callers must not retry blindly."""

    code = Code.UNEXPECTED  # BookKeeper clients do not retry it


class ForwardedError(TableKeeperError):
    """The owner a request was forwarded to answered this status; passed on unchanged."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message or f"status {code} from the owner")
        self.code = code


class LogFencedError(UnavailableError):
    """A newer writer owns the log. No append by this writer can succeed any more; the owner of
    the range must close it. `maybe_persisted`: the fence hit an append already sent, whose
    records the broker may have persisted before the fence."""

    def __init__(self, message: str = "", *, maybe_persisted: bool = False) -> None:
        super().__init__(message)
        self.maybe_persisted = maybe_persisted


class CorruptionError(TableKeeperError):
    """Stored data failed a checksum or structural check. Never retried, never skipped silently.

    UNEXPECTED (600) on the wire: BookKeeper clients and the SDK do not retry it (a retry cannot
    help and would only re-run recovery); the `tk-error` reason names the file or checkpoint."""

    code = Code.UNEXPECTED


class StoreCorruptionError(CorruptionError):
    """A range's local store (a RocksDB file) failed a checksum: the range stops serving and,
    when it reopens, sets the store aside and rebuilds it from its checkpoint and log, which
    hold everything the store did."""


class CompactedError(TableKeeperError):
    """A watch asked for changes older than the range's event history still holds."""

    code = Code.BAD_REVISION

    def __init__(self, message: str, oldest_revision: int) -> None:
        super().__init__(message)
        self.oldest_revision = oldest_revision


class WatcherTooSlowError(TableKeeperError):
    """A watcher fell too far behind the range's changes and was cancelled (it may resume from
    the revision the message names)."""

    code = Code.FAILURE
