"""Where server errors become wire statuses, by `errors.ERROR_TABLE` (and nothing else).

BookKeeper's convention, which its clients depend on:
- application errors travel in the response body (`code` / `header.code`) with gRPC status OK;
  TableKeeper adds the human-readable reason as the `tk-error` trailing metadata entry;
- "not served here / not ready / shutting down" is gRPC NOT_FOUND, which clients retry;
- a request over a configured limit is gRPC RESOURCE_EXHAUSTED (metrics code -429), never
  retried; a permission missing is PERMISSION_DENIED;
- an unexpected exception is INTERNAL_SERVER_ERROR (500) in the body, logged with its traceback.

Streams, the Admin service and the Batch RPC as a whole have no body status: they answer the
table's gRPC status, with the BookKeeper code as `tk-code` trailing metadata. The forwarder
reads the same table backwards (`error_for_unary_status`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_server.errors import (
    ERROR_TABLE,
    Code,
    CompactedError,
    TableKeeperError,
    wire_rule,
)
from tablekeeper_server.metrics import ServerMetrics

log = logging.getLogger(__name__)

ERROR_METADATA_KEY = "tk-error"
CODE_METADATA_KEY = "tk-code"
COMPACTED_METADATA_KEY = "tk-compacted-revision"
M = TypeVar("M")


# Why a command answered a non-zero status from the state machine (which has no messages: its
# responses must be identical on replay).
_COMMAND_STATUS_REASONS: dict[tuple[str, int], str] = {
    ("Put", Code.BAD_REQUEST): "the key holds a number (use Increment, or delete it first), "
    "or the put's expiry (ttl_ms) does not fit",
    ("Put", Code.BAD_VERSION): "expected_version does not match the key's version",
    ("Put", Code.KEY_EXISTS): "expected_version -1 (absent) but the key exists",
    ("Put", Code.KEY_NOT_FOUND): "expected_version given but the key does not exist",
    ("Put", Code.ILLEGAL_OP): "the put's session (lease) does not exist on this key's range "
    "(it expired or was closed, or was created for a pkey of another range)",
    ("Delete", Code.BAD_VERSION): "expected_version does not match the key's version",
    ("Delete", Code.KEY_NOT_FOUND): "expected_version given but the key does not exist",
    ("Increment", Code.BAD_REQUEST): "the key holds bytes, not a number",
    ("Txn", Code.KEY_NOT_FOUND): "a compare on version/create/mod names a key that does not exist",
    ("Txn", Code.BAD_REQUEST): "an op of the chosen branch cannot apply (e.g. a put onto a "
    "number, an increment of bytes): the txn applied nothing; the failing op is the last entry "
    "of `responses`",
    ("Txn", Code.BAD_VERSION): "an op of the chosen branch failed its expected_version: the txn "
    "applied nothing",
    ("Txn", Code.KEY_EXISTS): "an op of the chosen branch expected an absent key: the txn applied "
    "nothing",
}


def command_status_reason(method: str, code: int) -> str | None:
    return _COMMAND_STATUS_REASONS.get((method, code))


def _ascii(message: str) -> str:
    return message.encode("ascii", "backslashreplace").decode("ascii")[:1024]


async def serve(
    method: str,
    context: Any,  # grpc.aio.ServicerContext; grpc ships no type stubs
    metrics: ServerMetrics | None,
    handler: Callable[[], Awaitable[M]],
    error_response: Callable[[StatusCode.ValueType], M],
    code_of: Callable[[M], int],
) -> M:
    """Run `handler`, turning errors into BookKeeper statuses; record metrics."""
    started = time.perf_counter()
    try:
        response = await handler()
        code = code_of(response)
        if code and (reason := command_status_reason(method, code)):
            context.set_trailing_metadata(((ERROR_METADATA_KEY, reason),))
    except TableKeeperError as exc:
        rule = wire_rule(exc)
        if rule.unary_grpc is not None:
            _record(metrics, method, _ABORT_METRIC_CODES[rule.unary_grpc], started)
            await context.abort(grpc_status(rule.unary_grpc), _ascii(exc.message))
            raise  # unreachable: abort raises
        code = exc.code
        context.set_trailing_metadata(((ERROR_METADATA_KEY, _ascii(exc.message)),))
        response = error_response(exc.code)
    except Exception as exc:
        if isinstance(exc, grpc.aio.AbortError):
            raise
        log.exception("%s failed", method)
        code = Code.INTERNAL_SERVER_ERROR
        context.set_trailing_metadata(((ERROR_METADATA_KEY, _ascii(f"internal error: {exc}")),))
        response = error_response(Code.INTERNAL_SERVER_ERROR)
    _record(metrics, method, code, started)
    return response


async def serve_admin(method: str, context: Any, handler: Callable[[], Awaitable[M]]) -> M:
    """TableKeeper's own Admin service, and the Batch RPC as a whole, report errors as plain gRPC
    statuses (they have no body status field): the table's gRPC status with the code as
    `tk-code`; anything else → INTERNAL (logged)."""
    async with _AsGrpcStatus(method, context):
        return await handler()
    raise AssertionError("unreachable: context.abort raises")


def stream_errors(method: str, context: Any) -> _AsGrpcStatus:
    """Streaming RPCs (Watch, KeepAlive) report errors as the table's gRPC status, with the
    BookKeeper code in the `tk-code` trailing metadata entry: e.g. compacted → OUT_OF_RANGE
    (oldest available revision in `tk-compacted-revision`), a cancelled slow watcher or a
    request over a limit → RESOURCE_EXHAUSTED, not served here / shutting down → UNAVAILABLE
    (resume elsewhere), a bad request → INVALID_ARGUMENT, a session that is gone →
    FAILED_PRECONDITION; anything else → INTERNAL (logged)."""
    return _AsGrpcStatus(method, context)


class _AsGrpcStatus:
    """Aborts the call with the table's gRPC status for an error raised inside.

    A class, not a `contextlib.asynccontextmanager`: streams yield inside it, and when the loop
    finalizes an abandoned stream (its shutdown, or the stream's generator collected) it closes
    every async generator at once, in any order; a generator-based manager closed before the
    stream's own generator makes the stream's close fail with "generator didn't stop after
    athrow()"."""

    def __init__(self, method: str, context: Any) -> None:
        self.method = method
        self.context = context

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> bool:
        context = self.context
        if isinstance(exc, TableKeeperError):
            metadata: list[tuple[str, str]] = [(CODE_METADATA_KEY, str(exc.code))]
            if isinstance(exc, CompactedError):
                metadata.append((COMPACTED_METADATA_KEY, str(exc.oldest_revision)))
            context.set_trailing_metadata(tuple(metadata))
            await context.abort(grpc_status(wire_rule(exc).grpc), _ascii(exc.message))
        elif isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError):
            log.error("%s failed", self.method, exc_info=exc)
            await context.abort(grpc.StatusCode.INTERNAL, _ascii(f"{self.method} failed: {exc}"))
        return False


def grpc_status(name: str) -> grpc.StatusCode:
    """The `grpc.StatusCode` a table entry names."""
    return grpc.StatusCode[name]


# What the metrics record for a unary call answered with a gRPC status instead of a body code.
_ABORT_METRIC_CODES = {"NOT_FOUND": -404, "RESOURCE_EXHAUSTED": -429, "PERMISSION_DENIED": -403}


def _unary_refusals() -> dict[grpc.StatusCode, type[TableKeeperError]]:
    """gRPC status → the error class that unary calls answer with it: the first class of the
    table that does (`RouteNotFoundError` for NOT_FOUND). Each means nothing was applied."""
    found: dict[grpc.StatusCode, type[TableKeeperError]] = {}
    for cls, rule in ERROR_TABLE.items():
        if rule.unary_grpc is not None:
            found.setdefault(grpc_status(rule.unary_grpc), cls)
    return found


UNARY_REFUSALS = _unary_refusals()


def error_for_unary_status(code: grpc.StatusCode, message: str) -> TableKeeperError | None:
    """The domain error another server meant by answering a unary call with gRPC `code` (read
    back through the table), or None if the status is not one of the table's refusals."""
    cls = UNARY_REFUSALS.get(code)
    return cls(message) if cls is not None else None


def _record(metrics: ServerMetrics | None, method: str, code: int, started: float) -> None:
    if metrics is not None:
        metrics.observe_request(method, code, time.perf_counter() - started)
