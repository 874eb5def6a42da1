"""Every exception of the SDK, and the SDK's side of the error table.

The server answers an error in one of two ways (its table is `tablekeeper_server.errors`; the
two sides share only the protocol's facts: BookKeeper's `StatusCode`, generated from
storage.proto, and gRPC's status codes):

- a BookKeeper status code in the response body (unary calls, and each result of a Batch),
  with the reason in the `tk-error` trailing metadata: `ERROR_TABLE` names the exception of
  each code (`error_for_code`);
- a gRPC status (streams, the Admin service, a Batch as a whole, and "not served here",
  "over a limit" or "permission denied" on any call), with the status code as `tk-code`
  trailing metadata where there is one; or the call fails in transport. `STATUS_TABLE` says
  what each gRPC status means (`error_for_rpc_error`).

Every error carries two flags, set by the tables (per class, or per call for a failure in
transport), and the SDK's retry loops read nothing else (`should_resend`):

- `retryable`: the same request may succeed when sent again (elsewhere, or later);
- `outcome_unknown`: a write may or may not have been applied, so sending it again could
  apply it twice. An `UnexpectedError` (600) is always so: the server answers 600 when its log
  failed mid-append, and for damaged data, and the SDK cannot tell which; a write whose call
  was cut off after it left (CANCELLED, DEADLINE_EXCEEDED, a dropped connection, its `timeout=`
  passing) raises `OutcomeUnknownError`, which is so too. Test the flag to cover every case.

The classes form a few groups to catch at once:

- `NotFoundError`: `NamespaceNotFoundError`, `TableNotFoundError`, `KeyNotFoundError`;
- `ConflictError`: `NamespaceExistsError`, `TableExistsError`, `KeyExistsError`,
  `BadVersionError` (a conditional write lost against the current state);
- `UnavailableError`: the service did not answer in time, or not at all. Its subclasses say
  more: `OutcomeUnknownError` (a write may have been applied: never retried by the SDK, and
  not `retryable`), `DeadlineExceededError` (a call's `timeout=` passed; also a built-in
  `TimeoutError`), and `WriteTimeoutError`, both of these at once for a write.

`except UnavailableError` still catches all of them; the flags, not the class, are what the
SDK's retry loops read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode

ERROR_METADATA_KEY = "tk-error"
"""Trailing metadata: the server's reason for an error."""
CODE_METADATA_KEY = "tk-code"
"""Trailing metadata: the BookKeeper status code behind a gRPC status."""
COMPACTED_METADATA_KEY = "tk-compacted-revision"
"""Trailing metadata: the oldest revision a range still holds (with OUT_OF_RANGE)."""
CONNECT_FAILURE_HINTS = (
    "failed to connect",
    "connection refused",
    "connections to all backends",
)
"""Words of an UNAVAILABLE whose call never reached a server (so nothing was applied)."""


class TableKeeperError(Exception):
    """Base of every SDK error. `code` is the BookKeeper status code (0 if none).

    `retryable` and `outcome_unknown`: see the module docstring. Each class has the values of
    its row in `ERROR_TABLE`; an error built from a failed call may differ (`STATUS_TABLE`)."""

    code: int = 0
    retryable: bool = False
    outcome_unknown: bool = False

    def __init__(
        self,
        message: str = "",
        *,
        code: int | None = None,
        retryable: bool | None = None,
        outcome_unknown: bool | None = None,
    ) -> None:
        super().__init__(message or type(self).__name__)
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable
        if outcome_unknown is not None:
            self.outcome_unknown = outcome_unknown


# ------------------------------------------------------------------ errors with a status code


class BadRequestError(TableKeeperError):
    """The request is malformed, or asks for something the server does not support."""


class IllegalOpError(TableKeeperError):
    """Not allowed in this state (e.g. a put with a session that is gone)."""


class InternalServerError(TableKeeperError):
    """The server failed unexpectedly. Reads are sent again; a write's outcome is unknown."""


class NotImplementedOnServerError(TableKeeperError):
    """The server does not implement this."""


class UnexpectedError(TableKeeperError):
    """A condition retrying cannot fix; the message says which: the server could not tell whether
    a write was applied (its log failed mid-append), or the range's stored data is damaged and it
    refuses to serve it rather than serve incomplete data. `outcome_unknown` is set, since the
    SDK cannot tell the two apart."""


class NotFoundError(TableKeeperError):
    """Base of the "no such thing" errors: a namespace, table or key that does not exist."""


class ConflictError(TableKeeperError):
    """Base of the errors of a write that conflicts with the current state: the thing exists
    already, or its version is not the one expected."""


class BadVersionError(ConflictError):
    """A compare-and-set on the key's version failed."""


class BadRevisionError(TableKeeperError):
    """A revision the server cannot serve."""


class CompactedError(BadRevisionError):
    """The start revision is older than the range's event history holds."""

    def __init__(self, message: str, oldest_revision: int) -> None:
        super().__init__(message)
        self.oldest_revision = oldest_revision


class InvalidNamespaceNameError(TableKeeperError):
    """A namespace name that is empty, too long or contains '/'."""


class NamespaceExistsError(ConflictError):
    """The namespace already exists."""


class NamespaceNotFoundError(NotFoundError):
    """No such namespace."""


class InvalidTableNameError(TableKeeperError):
    """A table name that is empty, too long or contains '/'."""


class TableExistsError(ConflictError):
    """The table already exists."""


class TableNotFoundError(NotFoundError):
    """No such table."""


class InvalidKeyError(TableKeeperError):
    """Empty or oversized key."""


class KeyExistsError(ConflictError):
    """The key exists (a put that expected it absent)."""


class KeyNotFoundError(NotFoundError):
    """The key does not exist (a put or delete that expected a version)."""


# ------------------------------------------------------------------ errors from a gRPC status


class UnavailableError(TableKeeperError):
    """The service could not be reached or kept answering "not served here" until the deadline.
    A write cut off mid-call raises the subclass `OutcomeUnknownError` instead."""


class OutcomeUnknownError(UnavailableError):
    """A write's call ended without an answer after it left (CANCELLED, DEADLINE_EXCEEDED, a
    dropped connection, INTERNAL): the server may or may not have applied it. Never sent again by
    the SDK, and not `retryable`: read the key to find out, or make the write conditional
    (`expected_version`, a txn) so that sending it again is safe."""


class DeadlineExceededError(UnavailableError, TimeoutError):
    """The `timeout=` of a call passed (its retries included) before it succeeded. For a read or
    an admin call nothing changed, and it may be sent again with more time; a write raises
    `WriteTimeoutError`."""


class WriteTimeoutError(OutcomeUnknownError, DeadlineExceededError):
    """A write's `timeout=` passed before it succeeded: it may or may not have been applied
    (`OutcomeUnknownError`), and it is a `DeadlineExceededError` (and `TimeoutError`)."""


class UnauthenticatedError(TableKeeperError):
    """The server wants credentials this client did not send, or refused them (expired,
    tampered, signed by another key). The message says which; never retried."""


class PermissionDeniedError(TableKeeperError):
    """The caller's role lacks a permission; the message names it and the namespace."""


class ResourceLimitError(TableKeeperError):
    """The request is over one of the server's limits (ops per Batch, bytes of one response,
    ...; gRPC RESOURCE_EXHAUSTED). Nothing was applied; the message carries the server's reason,
    which names the limit and its flag. Sending the same request again cannot succeed: send
    less per request."""


class SessionExpiredError(IllegalOpError):
    """The session behind an ephemeral key or a lock expired (or was closed): its ephemeral keys
    are gone, and a lock held through it may be held by someone else now. Start a new session
    (a `MetadataStore` does so on its next ephemeral put) and acquire again. An `IllegalOpError`
    (what the server answers for a put with a session that is gone) found by the SDK itself."""


class WatchCancelledError(TableKeeperError):
    """The server cancelled the watch (the watcher fell too far behind); watch again from the
    last revision seen."""


# ------------------------------------------------------------------ errors of the SDK itself


class BatchOpError(TableKeeperError):
    """An op of a batch failed on its own (e.g. a put on a number key): `pkey`, `lkey` say which."""

    def __init__(self, error: TableKeeperError, pkey: bytes, lkey: bytes, reason: str) -> None:
        super().__init__(
            f"{type(error).__name__} on pkey={pkey!r} lkey={lkey!r}: {reason or error}",
            code=error.code,
        )
        self.pkey = pkey
        self.lkey = lkey


# ---------------------------------------------------------------------------- the tables


@dataclass(frozen=True, slots=True)
class ErrorRule:
    """One class's row: the status code that means it, and its flags."""

    code: int = 0
    """The BookKeeper status (in a body, or as `tk-code`) that means this error; 0: none."""
    retryable: bool = False
    outcome_unknown: bool = False


ERROR_TABLE: dict[type[TableKeeperError], ErrorRule] = {
    TableKeeperError: ErrorRule(),
    BadRequestError: ErrorRule(StatusCode.BAD_REQUEST),
    IllegalOpError: ErrorRule(StatusCode.ILLEGAL_OP),
    InternalServerError: ErrorRule(
        StatusCode.INTERNAL_SERVER_ERROR, retryable=True, outcome_unknown=True
    ),
    NotImplementedOnServerError: ErrorRule(StatusCode.NOT_IMPLEMENTED),
    UnexpectedError: ErrorRule(StatusCode.UNEXPECTED, outcome_unknown=True),
    BadVersionError: ErrorRule(StatusCode.BAD_VERSION),
    BadRevisionError: ErrorRule(StatusCode.BAD_REVISION),
    InvalidNamespaceNameError: ErrorRule(StatusCode.INVALID_NAMESPACE_NAME),
    NamespaceExistsError: ErrorRule(StatusCode.NAMESPACE_EXISTS),
    NamespaceNotFoundError: ErrorRule(StatusCode.NAMESPACE_NOT_FOUND),
    InvalidTableNameError: ErrorRule(StatusCode.INVALID_STREAM_NAME),
    TableExistsError: ErrorRule(StatusCode.STREAM_EXISTS),
    TableNotFoundError: ErrorRule(StatusCode.STREAM_NOT_FOUND),
    InvalidKeyError: ErrorRule(StatusCode.INVALID_KEY),
    KeyExistsError: ErrorRule(StatusCode.KEY_EXISTS),
    KeyNotFoundError: ErrorRule(StatusCode.KEY_NOT_FOUND),
    # Statuses without a body code: see STATUS_TABLE.
    NotFoundError: ErrorRule(),
    ConflictError: ErrorRule(),
    UnavailableError: ErrorRule(retryable=True),
    OutcomeUnknownError: ErrorRule(outcome_unknown=True),
    DeadlineExceededError: ErrorRule(retryable=True),
    WriteTimeoutError: ErrorRule(outcome_unknown=True),
    UnauthenticatedError: ErrorRule(),
    PermissionDeniedError: ErrorRule(),
    ResourceLimitError: ErrorRule(),
    SessionExpiredError: ErrorRule(),
    WatchCancelledError: ErrorRule(),
}
"""Every class's row (subclasses without one, `CompactedError` and `BatchOpError`, take their
base's). The first class with a code is the one that code means."""

_BY_CODE: dict[int, type[TableKeeperError]] = {}
for _cls, _rule in ERROR_TABLE.items():
    _cls.code, _cls.retryable, _cls.outcome_unknown = (
        _rule.code,
        _rule.retryable,
        _rule.outcome_unknown,
    )
    if _rule.code:
        _BY_CODE.setdefault(_rule.code, _cls)
del _cls, _rule


Applied = Literal["no", "unknown", "unless-never-sent"]


@dataclass(frozen=True, slots=True)
class StatusRule:
    """What a call that ended with a gRPC status means."""

    error: type[TableKeeperError]
    """The exception (when `tk-code` names none, or `by_code` is off)."""
    by_code: bool = False
    """The `tk-code` trailer, when there is one, names the exception (the server's exact
    error, e.g. `InvalidKeyError` for an INVALID_ARGUMENT)."""
    applied: Applied = "no"
    """Whether a write may have been applied: "no" (refused before anything was done),
    "unknown", or "unless-never-sent" (unknown unless the call never reached a server)."""
    retryable: bool = False
    """Whether sending the call again may succeed (the SDK does so for reads, and for writes
    that were not applied)."""


STATUS_TABLE: dict[grpc.StatusCode, StatusRule] = {
    # "Not served here / not ready / shutting down": sent before anything is appended.
    grpc.StatusCode.NOT_FOUND: StatusRule(UnavailableError, applied="no", retryable=True),
    grpc.StatusCode.UNAVAILABLE: StatusRule(
        UnavailableError, applied="unless-never-sent", retryable=True
    ),
    grpc.StatusCode.DEADLINE_EXCEEDED: StatusRule(
        UnavailableError, applied="unknown", retryable=True
    ),
    grpc.StatusCode.INTERNAL: StatusRule(UnavailableError, applied="unknown", retryable=True),
    grpc.StatusCode.UNAUTHENTICATED: StatusRule(UnauthenticatedError),
    grpc.StatusCode.PERMISSION_DENIED: StatusRule(PermissionDeniedError),
    grpc.StatusCode.RESOURCE_EXHAUSTED: StatusRule(ResourceLimitError),
    grpc.StatusCode.INVALID_ARGUMENT: StatusRule(BadRequestError, by_code=True),
    grpc.StatusCode.DATA_LOSS: StatusRule(UnexpectedError, by_code=True),
    grpc.StatusCode.OUT_OF_RANGE: StatusRule(CompactedError),
    grpc.StatusCode.FAILED_PRECONDITION: StatusRule(TableKeeperError, by_code=True),
}
"""gRPC statuses the server answers on purpose, and the transport's own. Any other (CANCELLED:
the call was cancelled, e.g. by the client closing; UNKNOWN; ...) is `OTHER_STATUS`."""
OTHER_STATUS = StatusRule(UnavailableError, applied="unknown")


def error_for_code(code: int, message: str = "") -> TableKeeperError:
    """The exception for a non-zero BookKeeper status code."""
    cls = _BY_CODE.get(code, TableKeeperError)
    return cls(message or f"status {code}", code=code)


def error_for_result(code: int, reason: str, retryable: bool) -> TableKeeperError:
    """The exception for a Batch result with status `code`; a result the server marked
    `retryable` was not applied (its range is not served there)."""
    if retryable:
        return UnavailableError(f"NOT_FOUND: {reason}".strip())
    return error_for_code(code, reason)


def never_sent(code: grpc.StatusCode, details: str | None) -> bool:
    """Whether a call that failed with `code` certainly never reached a server."""
    text = (details or "").lower()
    return code == grpc.StatusCode.UNAVAILABLE and any(h in text for h in CONNECT_FAILURE_HINTS)


def error_for_status(
    code: grpc.StatusCode,
    details: str | None,
    trailers: Iterable[tuple[str, Any]] = (),
    *,
    idempotent: bool = True,
) -> TableKeeperError:
    """The exception for a call that ended with gRPC `code` (see `STATUS_TABLE`). `idempotent`:
    the call was a read (or may be applied twice), so its outcome does not matter."""
    metadata = {key: str(value) for key, value in trailers}
    rule = STATUS_TABLE.get(code, OTHER_STATUS)
    message = f"{code.name}: {details or ''}".strip()
    tk_code = int(metadata.get(CODE_METADATA_KEY, "0") or 0)
    error: TableKeeperError
    if rule.error is CompactedError:
        oldest = int(metadata.get(COMPACTED_METADATA_KEY, "0") or 0)
        error = CompactedError(details or "compacted", oldest)
    elif rule.by_code and tk_code in _BY_CODE:
        error = error_for_code(tk_code, message)
    else:
        error = rule.error(message, code=tk_code or None)
    applied = rule.applied
    if applied == "unless-never-sent":
        applied = "no" if never_sent(code, details) else "unknown"
    outcome_unknown = applied == "unknown" and not idempotent
    if outcome_unknown and type(error) is UnavailableError:
        # A write cut off after it left: its own class, never retryable.
        error = OutcomeUnknownError(message, code=tk_code or None)
    error.retryable = error.retryable and rule.retryable
    error.outcome_unknown = outcome_unknown
    return error


def error_for_rpc_error(error: grpc.aio.AioRpcError, *, idempotent: bool) -> TableKeeperError:
    """`error_for_status` of a failed grpc.aio call."""
    return error_for_status(
        error.code(), error.details(), error.trailing_metadata() or (), idempotent=idempotent
    )


def should_resend(error: TableKeeperError, idempotent: bool) -> bool:
    """The SDK's one retry rule: send a request again when it may succeed (`retryable`), and, for
    a write, only when it certainly was not applied."""
    return error.retryable and (idempotent or not error.outcome_unknown)


__all__ = [
    "ERROR_TABLE",
    "STATUS_TABLE",
    "BadRequestError",
    "BadRevisionError",
    "BadVersionError",
    "BatchOpError",
    "CompactedError",
    "ConflictError",
    "DeadlineExceededError",
    "ErrorRule",
    "IllegalOpError",
    "InternalServerError",
    "InvalidKeyError",
    "InvalidNamespaceNameError",
    "InvalidTableNameError",
    "KeyExistsError",
    "KeyNotFoundError",
    "NamespaceExistsError",
    "NamespaceNotFoundError",
    "NotFoundError",
    "NotImplementedOnServerError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ResourceLimitError",
    "SessionExpiredError",
    "StatusRule",
    "TableExistsError",
    "TableKeeperError",
    "TableNotFoundError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnexpectedError",
    "WatchCancelledError",
    "WriteTimeoutError",
    "error_for_code",
    "error_for_result",
    "error_for_rpc_error",
    "error_for_status",
    "never_sent",
    "should_resend",
]
