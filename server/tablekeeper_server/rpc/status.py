"""The one place where server errors become wire statuses.

BookKeeper's convention, which its clients depend on:
- application errors travel in the response body (`code` / `header.code`) with gRPC status OK;
  TableKeeper adds the human-readable reason as the `tk-error` trailing metadata entry;
- "not served here / not ready / shutting down" is gRPC NOT_FOUND, which clients retry;
- a request over a configured limit is gRPC RESOURCE_EXHAUSTED (metrics code -429), never retried;
- an unexpected exception is INTERNAL_SERVER_ERROR (500) in the body, logged with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tablekeeper_server.errors import (
    BadRequestError,
    Code,
    CompactedError,
    CorruptionError,
    PermissionDeniedError,
    ResourceLimitError,
    RouteNotFoundError,
    TableKeeperError,
    UnavailableError,
    WatcherTooSlowError,
)
from tablekeeper_server.metrics import ServerMetrics

log = logging.getLogger(__name__)

ERROR_METADATA_KEY = "tk-error"
CODE_METADATA_KEY = "tk-code"
COMPACTED_METADATA_KEY = "tk-compacted-revision"
M = TypeVar("M")


# Why a command answered a non-zero status from the state machine (which has no messages: its
# responses must be identical on replay).
_COMMAND_STATUS_REASONS = {
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
    error_response: Callable[[int], M],
    code_of: Callable[[M], int],
) -> M:
    """Run `handler`, turning errors into BookKeeper statuses; record metrics."""
    started = time.perf_counter()
    try:
        response = await handler()
        code = code_of(response)
        if code and (reason := command_status_reason(method, code)):
            context.set_trailing_metadata(((ERROR_METADATA_KEY, reason),))
    except (RouteNotFoundError, UnavailableError) as exc:
        _record(metrics, method, -404, started)
        await context.abort(grpc.StatusCode.NOT_FOUND, _ascii(exc.message))
        raise  # unreachable: abort raises
    except ResourceLimitError as exc:
        _record(metrics, method, -429, started)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _ascii(exc.message))
        raise  # unreachable: abort raises
    except PermissionDeniedError as exc:
        _record(metrics, method, -403, started)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, _ascii(exc.message))
        raise  # unreachable: abort raises
    except TableKeeperError as exc:
        code = exc.code
        context.set_trailing_metadata(((ERROR_METADATA_KEY, _ascii(exc.message)),))
        response = error_response(code)
    except Exception as exc:
        if isinstance(exc, grpc.aio.AbortError):
            raise
        log.exception("%s failed", method)
        code = Code.INTERNAL_SERVER_ERROR
        context.set_trailing_metadata(((ERROR_METADATA_KEY, _ascii(f"internal error: {exc}")),))
        response = error_response(code)
    _record(metrics, method, code, started)
    return response


async def serve_admin(method: str, context: Any, handler: Callable[[], Awaitable[M]]) -> M:
    """TableKeeper's own Admin service reports errors as plain gRPC statuses (it has no body
    status field): unavailable → UNAVAILABLE, corruption → DATA_LOSS, other domain errors →
    FAILED_PRECONDITION, anything else → INTERNAL (logged)."""
    try:
        return await handler()
    except (RouteNotFoundError, UnavailableError) as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, _ascii(exc.message))
    except CorruptionError as exc:
        await context.abort(grpc.StatusCode.DATA_LOSS, _ascii(exc.message))
    except ResourceLimitError as exc:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _ascii(exc.message))
    except PermissionDeniedError as exc:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, _ascii(exc.message))
    except TableKeeperError as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, _ascii(exc.message))
    except Exception as exc:
        if isinstance(exc, grpc.aio.AbortError):
            raise
        log.exception("%s failed", method)
        await context.abort(grpc.StatusCode.INTERNAL, _ascii(f"{method} failed: {exc}"))
    raise AssertionError("unreachable: context.abort raises")


@contextlib.asynccontextmanager
async def stream_errors(method: str, context: Any) -> AsyncIterator[None]:
    """Streaming RPCs (Watch) report errors as gRPC statuses, with the BookKeeper code in the
    `tk-code` trailing metadata entry: compacted → OUT_OF_RANGE (oldest available revision in
    `tk-compacted-revision`), a cancelled slow watcher or a request over a limit →
    RESOURCE_EXHAUSTED, not served here /
    shutting down → UNAVAILABLE (resume elsewhere), a bad request → INVALID_ARGUMENT, other
    domain errors → FAILED_PRECONDITION, anything else → INTERNAL (logged)."""
    try:
        yield
    except TableKeeperError as exc:
        metadata: list[tuple[str, str]] = [(CODE_METADATA_KEY, str(exc.code))]
        if isinstance(exc, CompactedError):
            metadata.append((COMPACTED_METADATA_KEY, str(exc.oldest_revision)))
            status = grpc.StatusCode.OUT_OF_RANGE
        elif isinstance(exc, (WatcherTooSlowError, ResourceLimitError)):
            status = grpc.StatusCode.RESOURCE_EXHAUSTED
        elif isinstance(exc, PermissionDeniedError):
            status = grpc.StatusCode.PERMISSION_DENIED
        elif isinstance(exc, (RouteNotFoundError, UnavailableError)):
            status = grpc.StatusCode.UNAVAILABLE
        elif isinstance(exc, BadRequestError):
            status = grpc.StatusCode.INVALID_ARGUMENT
        else:
            status = grpc.StatusCode.FAILED_PRECONDITION
        context.set_trailing_metadata(tuple(metadata))
        await context.abort(status, _ascii(exc.message))
    except Exception as exc:
        if isinstance(exc, grpc.aio.AbortError):
            raise
        log.exception("%s failed", method)
        await context.abort(grpc.StatusCode.INTERNAL, _ascii(f"{method} failed: {exc}"))


def _record(metrics: ServerMetrics | None, method: str, code: int, started: float) -> None:
    if metrics is not None:
        metrics.observe_request(method, code, time.perf_counter() - started)
