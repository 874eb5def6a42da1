"""Server domain errors, and the one table of how each travels on the wire.

Every error the server raises on purpose derives from `TableKeeperError` and carries a
human-readable message. `ERROR_TABLE` (at the end of this module) gives each class its
BookKeeper status code (the generated `StatusCode` enum of storage.proto, which travels in
response bodies), the gRPC status that streams and the Admin service answer with, whether the
request may be sent again, and whether a write's outcome is unknown. The classes' `code`,
`retryable` and `outcome_unknown` attributes are set from it, and the RPC layer
(`rpc/status.py`, the Batch path, the forwarder) reads nothing else. Each other protocol's
front-end has a column of its own in the same table (`WireRule.etcd`, `WireRule.oxia`: the gRPC
status and message its clients recognise; `WireRule.zookeeper`: the `KeeperException` code, or
closing the connection), so no front-end decides again what an error means.
The SDK keeps its side of the same table in `tablekeeper.errors`, keyed by the same status
codes.

gRPC statuses are named here by their `grpc.StatusCode` names (the domain layers do not import
gRPC); `rpc/status.py` resolves them.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field, replace
from typing import Literal

from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode

Code = StatusCode
"""BookKeeper's application status codes (storage.proto's `StatusCode`, generated)."""

GrpcStatusName = Literal[
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "NOT_FOUND",
    "UNAVAILABLE",
    "RESOURCE_EXHAUSTED",
    "PERMISSION_DENIED",
    "OUT_OF_RANGE",
    "DATA_LOSS",
    "UNKNOWN",
    "INTERNAL",
    "ABORTED",
]


class TableKeeperError(Exception):
    """Base of all deliberate server errors. `code` is a `StatusCode` value; `code`,
    `retryable` and `outcome_unknown` come from `ERROR_TABLE`."""

    code: StatusCode.ValueType
    retryable: bool
    """Nothing was applied and the same request may succeed later (elsewhere, or once a
    resource is back)."""
    outcome_unknown: bool
    """A write may or may not have been applied: resending a non-idempotent one could apply
    it twice."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or type(self).__name__)
        self.message = message or type(self).__name__


class BadRequestError(TableKeeperError):
    """The request is malformed or asks for something unsupported; nothing was applied."""


class ResourceLimitError(TableKeeperError):
    """The request is over a configured limit (ops per Batch, bytes per response, ...). Nothing was
    applied; the message names the limit and its flag. gRPC RESOURCE_EXHAUSTED on every RPC
    (unary BookKeeper calls included): retrying the same request cannot succeed."""


class PermissionDeniedError(TableKeeperError):
    """The caller's role may not do this (e.g. close a session another role created). gRPC
    PERMISSION_DENIED on every RPC; the message says what is missing."""


class IllegalOpError(TableKeeperError):
    """The operation is not allowed in this state (e.g. a put with a session that is gone)."""


class InvalidKeyError(TableKeeperError):
    """An empty key, or one over the key size limit."""


class KeyNotFoundError(TableKeeperError):
    """The key (or session) does not exist."""


class BadVersionError(TableKeeperError):
    """A compare-and-set on the key's version failed."""


class InvalidNamespaceNameError(TableKeeperError):
    """A namespace name that is empty, too long or contains '/'."""


class NamespaceExistsError(TableKeeperError):
    """The namespace already exists."""


class NamespaceNotFoundError(TableKeeperError):
    """No such namespace."""


class InvalidStreamNameError(TableKeeperError):
    """A table (stream) name that is empty, too long or contains '/'."""


class StreamExistsError(TableKeeperError):
    """The table (stream) already exists."""


class StreamNotFoundError(TableKeeperError):
    """No such table (stream)."""


class RouteNotFoundError(TableKeeperError):
    """The target container or range is not served here (yet). Sent as gRPC NOT_FOUND, which
    BookKeeper clients retry."""


class RangeMovedError(RouteNotFoundError):
    """The range was sealed by a split: its keys now live in its children. Nothing was applied;
    the request succeeds once routed again (the server re-routes by itself once the split has
    switched the table's ranges; until then the caller retries, as for NOT_FOUND)."""

    def __init__(self, message: str, children: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.children = children


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
        if maybe_persisted:  # answered as an `IndeterminateError` (see `wire_rule`)
            rule = ERROR_TABLE[IndeterminateError]
            self.code, self.retryable, self.outcome_unknown = rule.status, False, True

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


class ForwardedError(TableKeeperError):
    """The owner a request was forwarded to answered this status; passed on unchanged. Its
    UNEXPECTED (600) is as uncertain as the owner's, so it keeps "outcome unknown"."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message or f"status {code} from the owner")
        self.code = StatusCode.ValueType(code)
        self.outcome_unknown = code == StatusCode.UNEXPECTED


class LogFencedError(UnavailableError):
    """A newer writer owns the log. No append by this writer can succeed any more; the owner of
    the range must close it. `maybe_persisted`: the fence hit an append already sent, whose
    records the broker may have persisted before the fence."""

    def __init__(self, message: str = "", *, maybe_persisted: bool = False) -> None:
        super().__init__(message)
        self.maybe_persisted = maybe_persisted
        if maybe_persisted:  # answered as an `IndeterminateError` (see `wire_rule`)
            rule = ERROR_TABLE[IndeterminateError]
            self.code, self.retryable, self.outcome_unknown = rule.status, False, True


class CorruptionError(TableKeeperError):
    """Stored data failed a checksum or structural check. Never retried, never skipped silently.

    UNEXPECTED (600) on the wire (gRPC DATA_LOSS on streams and Admin): BookKeeper clients and
    the SDK do not retry it (a retry cannot help and would only re-run recovery); the `tk-error`
    reason names the file or checkpoint."""


class StoreCorruptionError(CorruptionError):
    """A range's local store (a RocksDB file) failed a checksum: the range stops serving and,
    when it reopens, sets the store aside and rebuilds it from its checkpoint and log, which
    hold everything the store did."""


class CompactedError(TableKeeperError):
    """A watch asked for changes older than the range's event history still holds."""

    def __init__(self, message: str, oldest_revision: int) -> None:
        super().__init__(message)
        self.oldest_revision = oldest_revision


class WatcherTooSlowError(TableKeeperError):
    """A watcher fell too far behind the range's changes and was cancelled (it may resume from
    the revision the message names)."""


# ---------------------------------------------------------------------------- the error table


@dataclass(frozen=True, slots=True)
class ProtocolAnswer:
    """How one front-end answers a class of error: the gRPC status and message its clients
    recognise. `message` is a template: `{message}` is the error's own message."""

    grpc: GrpcStatusName
    message: str = "{message}"
    name: str = ""
    """The front-end's own name for the answer, where it has names (etcd's error names)."""

    def text(self, error: TableKeeperError) -> str:
        return self.message.format(message=error.message)


_ETCD_INTERNAL = ProtocolAnswer("INTERNAL", name="internal")
_ETCD_UNAVAILABLE = ProtocolAnswer("UNAVAILABLE", "etcdserver: {message}", "unavailable")
"""In etcd's style ("etcdserver: ..."): the pass-through of cluster mode tells the answers of an
etcd port from failures of the connection to it by that prefix. Clients retry UNAVAILABLE, as
they do with an etcd member that is not ready."""
_OXIA_UNKNOWN = ProtocolAnswer("UNKNOWN", "oxia: {message}")
_OXIA_INTERNAL = ProtocolAnswer("INTERNAL", "oxia: {message}")
# ZooKeeper's codes (`KeeperException.Code`) the ZooKeeper column names.
_ZK_SYSTEM_ERROR = -1
_ZK_BAD_ARGUMENTS = -8
_ZK_NO_NODE = -101
_ZK_NO_AUTH = -102
_ZK_BAD_VERSION = -103


@dataclass(frozen=True, slots=True)
class WireRule:
    """How one class of error travels. See `ERROR_TABLE`."""

    status: StatusCode.ValueType
    """The BookKeeper status in the response body (unary BookKeeper and TableKeeper calls, and
    each result of a Batch). Sent with gRPC OK, except when `unary_grpc` is set."""
    grpc: GrpcStatusName
    """The gRPC status of streams (Watch, KeepAlive) and of the Admin service and the Batch RPC
    as a whole, which have no body status; `status` goes with it as `tk-code` metadata."""
    unary_grpc: GrpcStatusName | None = None
    """Unary calls answer this gRPC status instead of a body status (what BookKeeper clients
    expect: NOT_FOUND means "retry, not served here")."""
    retryable: bool = False
    """Nothing was applied; the same request may succeed when sent again."""
    outcome_unknown: bool = False
    """A write may or may not have been applied."""
    # The other protocols' columns. Two rows are equal when they travel alike on TableKeeper's
    # own wire (what the forwarder reads back from an owner): these columns are left out.
    etcd: ProtocolAnswer = field(default=_ETCD_INTERNAL, compare=False)
    """The etcd front-end's answer (`etcd.errors.from_tablekeeper`)."""
    oxia: ProtocolAnswer = field(default=_OXIA_UNKNOWN, compare=False)
    """The Oxia front-end's answer (`oxia.errors.from_tablekeeper`)."""
    zookeeper: int | None = field(default=_ZK_SYSTEM_ERROR, compare=False)
    """The ZooKeeper port's answer: a `KeeperException.Code`, or None: it closes the connection,
    which ZooKeeper's clients see as CONNECTIONLOSS and retry on another connection (for a
    write: outcome unknown, ZooKeeper's own meaning of it)."""


_NOT_HERE = WireRule(
    Code.INTERNAL_SERVER_ERROR,
    "UNAVAILABLE",
    "NOT_FOUND",
    retryable=True,
    etcd=_ETCD_UNAVAILABLE,
    zookeeper=None,
)
_OXIA_INVALID = ProtocolAnswer("INVALID_ARGUMENT", "oxia: {message}")

ERROR_TABLE: dict[type[TableKeeperError], WireRule] = {
    # Anything without a row of its own (and `ForwardedError`, whose instance carries the
    # owner's status) is answered as its nearest base class is.
    TableKeeperError: WireRule(Code.INTERNAL_SERVER_ERROR, "FAILED_PRECONDITION"),
    BadRequestError: WireRule(
        Code.BAD_REQUEST,
        "INVALID_ARGUMENT",
        etcd=ProtocolAnswer("INVALID_ARGUMENT", name="bad_request"),
        oxia=_OXIA_INVALID,
        zookeeper=_ZK_BAD_ARGUMENTS,
    ),
    ResourceLimitError: WireRule(
        Code.BAD_REQUEST,
        "RESOURCE_EXHAUSTED",
        "RESOURCE_EXHAUSTED",
        etcd=ProtocolAnswer(
            "INVALID_ARGUMENT", "etcdserver: request is too large", "request_too_large"
        ),
        oxia=ProtocolAnswer("RESOURCE_EXHAUSTED", "oxia: {message}"),
        zookeeper=None,  # ZooKeeper closes a connection whose packet is over jute.maxbuffer
    ),
    PermissionDeniedError: WireRule(
        Code.ILLEGAL_OP, "PERMISSION_DENIED", "PERMISSION_DENIED", zookeeper=_ZK_NO_AUTH
    ),
    IllegalOpError: WireRule(Code.ILLEGAL_OP, "FAILED_PRECONDITION", zookeeper=_ZK_BAD_ARGUMENTS),
    InvalidKeyError: WireRule(
        Code.INVALID_KEY, "INVALID_ARGUMENT", oxia=_OXIA_INVALID, zookeeper=_ZK_BAD_ARGUMENTS
    ),
    # FAILED_PRECONDITION on a session's keep-alive stream means "this session is gone".
    KeyNotFoundError: WireRule(Code.KEY_NOT_FOUND, "FAILED_PRECONDITION", zookeeper=_ZK_NO_NODE),
    BadVersionError: WireRule(Code.BAD_VERSION, "FAILED_PRECONDITION", zookeeper=_ZK_BAD_VERSION),
    InvalidNamespaceNameError: WireRule(Code.INVALID_NAMESPACE_NAME, "INVALID_ARGUMENT"),
    NamespaceExistsError: WireRule(Code.NAMESPACE_EXISTS, "FAILED_PRECONDITION"),
    NamespaceNotFoundError: WireRule(Code.NAMESPACE_NOT_FOUND, "FAILED_PRECONDITION"),
    InvalidStreamNameError: WireRule(Code.INVALID_STREAM_NAME, "INVALID_ARGUMENT"),
    StreamExistsError: WireRule(Code.STREAM_EXISTS, "FAILED_PRECONDITION"),
    StreamNotFoundError: WireRule(Code.STREAM_NOT_FOUND, "FAILED_PRECONDITION"),
    # Not served here, not ready, shutting down, out of a resource, fenced: sent before anything
    # was appended. Streams resume elsewhere (UNAVAILABLE); a Batch result says `retryable`.
    RouteNotFoundError: _NOT_HERE,
    # Oxia's clients look for a new leader on this answer.
    NotServedHereError: replace(
        _NOT_HERE, oxia=ProtocolAnswer("ABORTED", "oxia: node is not leader")
    ),
    UnavailableError: replace(
        _NOT_HERE, oxia=ProtocolAnswer("UNAVAILABLE", "oxia: resource unavailable: {message}")
    ),
    IndeterminateError: WireRule(
        Code.UNEXPECTED, "UNKNOWN", outcome_unknown=True, oxia=_OXIA_INTERNAL, zookeeper=None
    ),
    ForwardedError: WireRule(Code.INTERNAL_SERVER_ERROR, "FAILED_PRECONDITION"),
    CorruptionError: WireRule(Code.UNEXPECTED, "DATA_LOSS", oxia=_OXIA_INTERNAL, zookeeper=None),
    CompactedError: WireRule(
        Code.BAD_REVISION, "OUT_OF_RANGE", oxia=ProtocolAnswer("OUT_OF_RANGE", "oxia: {message}")
    ),
    WatcherTooSlowError: WireRule(Code.FAILURE, "RESOURCE_EXHAUSTED", zookeeper=None),
}
"""Every error class's row; subclasses without a row of their own (`RangeMovedError`,
`StorageUnavailableError`, `LogFencedError`, `StoreCorruptionError`, ...) take their base's."""


def class_rule(error: type[TableKeeperError]) -> WireRule:
    """The row of the class `error`: its own, or its nearest base's."""
    for cls in error.__mro__:
        rule = ERROR_TABLE.get(cls)
        if rule is not None:
            return rule
    raise AssertionError(f"{error.__name__} is not a TableKeeperError")  # pragma: no cover


def wire_rule(error: type[TableKeeperError] | TableKeeperError) -> WireRule:
    """The row of `error` (a class or an instance): its own, or its nearest base's. An instance
    that may have persisted (`maybe_persisted`) is answered as `IndeterminateError`."""
    if isinstance(error, TableKeeperError):
        if getattr(error, "maybe_persisted", False):
            return ERROR_TABLE[IndeterminateError]
        error = type(error)
    for cls in error.__mro__:
        rule = ERROR_TABLE.get(cls)
        if rule is not None:
            return rule
    raise AssertionError(f"{error.__name__} is not a TableKeeperError")  # pragma: no cover


for _cls, _rule in ERROR_TABLE.items():
    _cls.code = _rule.status
    _cls.retryable = _rule.retryable
    _cls.outcome_unknown = _rule.outcome_unknown
del _cls, _rule
