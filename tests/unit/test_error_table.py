"""The error table, row by row: every server error's BookKeeper code, its gRPC status on streams
and Admin, on unary calls, its flags; what each path (unary, Batch op, stream, Admin, forwarder)
answers for it; and what the SDK makes of each answer. A new error class fails
`test_every_server_error_has_a_row_here` until it is given one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from tablekeeper import errors as sdk
from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import tablekeeper_pb2
from tablekeeper_server import errors as server
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.rpc.servicers import TableKeeperServicer
from tablekeeper_server.rpc.status import (
    error_for_unary_status,
    grpc_status,
    serve,
    serve_admin,
    stream_errors,
)

pytestmark = pytest.mark.unit

C = StatusCode
S = grpc.StatusCode


@dataclass(frozen=True)
class Row:
    """One server error: how it travels, and what the SDK raises for it."""

    make: Callable[[], server.TableKeeperError]
    status: int
    grpc: grpc.StatusCode
    unary: grpc.StatusCode | None  # None: a status in the body
    retryable: bool
    outcome_unknown: bool
    sdk_body: type[sdk.TableKeeperError]  # from the body code (unary call, Batch result)
    sdk_stream: type[sdk.TableKeeperError]  # from the stream / Admin status and `tk-code`


def _row(
    make: Callable[[], server.TableKeeperError],
    status: int,
    grpc_code: grpc.StatusCode,
    sdk_body: type[sdk.TableKeeperError],
    sdk_stream: type[sdk.TableKeeperError] | None = None,
    *,
    unary: grpc.StatusCode | None = None,
    retryable: bool = False,
    outcome_unknown: bool = False,
) -> Row:
    return Row(
        make,
        status,
        grpc_code,
        unary,
        retryable,
        outcome_unknown,
        sdk_body,
        sdk_stream or sdk_body,
    )


ROWS: dict[type[server.TableKeeperError], Row] = {
    server.TableKeeperError: _row(
        lambda: server.TableKeeperError("x"),
        C.INTERNAL_SERVER_ERROR,
        S.FAILED_PRECONDITION,
        sdk.InternalServerError,
    ),
    server.BadRequestError: _row(
        lambda: server.BadRequestError("x"), C.BAD_REQUEST, S.INVALID_ARGUMENT, sdk.BadRequestError
    ),
    server.ResourceLimitError: _row(
        lambda: server.ResourceLimitError("x"),
        C.BAD_REQUEST,
        S.RESOURCE_EXHAUSTED,
        sdk.BadRequestError,
        sdk.ResourceLimitError,
        unary=S.RESOURCE_EXHAUSTED,
    ),
    server.PermissionDeniedError: _row(
        lambda: server.PermissionDeniedError("x"),
        C.ILLEGAL_OP,
        S.PERMISSION_DENIED,
        sdk.IllegalOpError,
        sdk.PermissionDeniedError,
        unary=S.PERMISSION_DENIED,
    ),
    server.IllegalOpError: _row(
        lambda: server.IllegalOpError("x"), C.ILLEGAL_OP, S.FAILED_PRECONDITION, sdk.IllegalOpError
    ),
    server.InvalidKeyError: _row(
        lambda: server.InvalidKeyError("x"), C.INVALID_KEY, S.INVALID_ARGUMENT, sdk.InvalidKeyError
    ),
    server.KeyNotFoundError: _row(
        lambda: server.KeyNotFoundError("x"),
        C.KEY_NOT_FOUND,
        S.FAILED_PRECONDITION,
        sdk.KeyNotFoundError,
    ),
    server.BadVersionError: _row(
        lambda: server.BadVersionError("x"),
        C.BAD_VERSION,
        S.FAILED_PRECONDITION,
        sdk.BadVersionError,
    ),
    server.InvalidNamespaceNameError: _row(
        lambda: server.InvalidNamespaceNameError("x"),
        C.INVALID_NAMESPACE_NAME,
        S.INVALID_ARGUMENT,
        sdk.InvalidNamespaceNameError,
    ),
    server.NamespaceExistsError: _row(
        lambda: server.NamespaceExistsError("x"),
        C.NAMESPACE_EXISTS,
        S.FAILED_PRECONDITION,
        sdk.NamespaceExistsError,
    ),
    server.NamespaceNotFoundError: _row(
        lambda: server.NamespaceNotFoundError("x"),
        C.NAMESPACE_NOT_FOUND,
        S.FAILED_PRECONDITION,
        sdk.NamespaceNotFoundError,
    ),
    server.InvalidStreamNameError: _row(
        lambda: server.InvalidStreamNameError("x"),
        C.INVALID_STREAM_NAME,
        S.INVALID_ARGUMENT,
        sdk.InvalidTableNameError,
    ),
    server.StreamExistsError: _row(
        lambda: server.StreamExistsError("x"),
        C.STREAM_EXISTS,
        S.FAILED_PRECONDITION,
        sdk.TableExistsError,
    ),
    server.StreamNotFoundError: _row(
        lambda: server.StreamNotFoundError("x"),
        C.STREAM_NOT_FOUND,
        S.FAILED_PRECONDITION,
        sdk.TableNotFoundError,
    ),
    server.RouteNotFoundError: _row(
        lambda: server.RouteNotFoundError("x"),
        C.INTERNAL_SERVER_ERROR,
        S.UNAVAILABLE,
        sdk.InternalServerError,
        sdk.UnavailableError,
        unary=S.NOT_FOUND,
        retryable=True,
    ),
    server.RangeMovedError: _row(
        lambda: server.RangeMovedError("x", (1, 2)),
        C.INTERNAL_SERVER_ERROR,
        S.UNAVAILABLE,
        sdk.InternalServerError,
        sdk.UnavailableError,
        unary=S.NOT_FOUND,
        retryable=True,
    ),
    server.NotServedHereError: _row(
        lambda: server.NotServedHereError(3, "x"),
        C.INTERNAL_SERVER_ERROR,
        S.UNAVAILABLE,
        sdk.InternalServerError,
        sdk.UnavailableError,
        unary=S.NOT_FOUND,
        retryable=True,
    ),
    server.UnavailableError: _row(
        lambda: server.UnavailableError("x"),
        C.INTERNAL_SERVER_ERROR,
        S.UNAVAILABLE,
        sdk.InternalServerError,
        sdk.UnavailableError,
        unary=S.NOT_FOUND,
        retryable=True,
    ),
    server.StorageUnavailableError: _row(
        lambda: server.StorageUnavailableError("x"),
        C.INTERNAL_SERVER_ERROR,
        S.UNAVAILABLE,
        sdk.InternalServerError,
        sdk.UnavailableError,
        unary=S.NOT_FOUND,
        retryable=True,
    ),
    server.LogFencedError: _row(
        lambda: server.LogFencedError("x"),
        C.INTERNAL_SERVER_ERROR,
        S.UNAVAILABLE,
        sdk.InternalServerError,
        sdk.UnavailableError,
        unary=S.NOT_FOUND,
        retryable=True,
    ),
    server.IndeterminateError: _row(
        lambda: server.IndeterminateError("x"),
        C.UNEXPECTED,
        S.UNKNOWN,
        sdk.UnexpectedError,
        sdk.UnavailableError,
        outcome_unknown=True,
    ),
    server.ForwardedError: _row(
        lambda: server.ForwardedError(C.KEY_EXISTS, "x"),
        C.KEY_EXISTS,
        S.FAILED_PRECONDITION,
        sdk.KeyExistsError,
    ),
    server.CorruptionError: _row(
        lambda: server.CorruptionError("x"), C.UNEXPECTED, S.DATA_LOSS, sdk.UnexpectedError
    ),
    server.StoreCorruptionError: _row(
        lambda: server.StoreCorruptionError("x"), C.UNEXPECTED, S.DATA_LOSS, sdk.UnexpectedError
    ),
    server.CompactedError: _row(
        lambda: server.CompactedError("x", 7),
        C.BAD_REVISION,
        S.OUT_OF_RANGE,
        sdk.BadRevisionError,
        sdk.CompactedError,
    ),
    server.WatcherTooSlowError: _row(
        lambda: server.WatcherTooSlowError("x"),
        C.FAILURE,
        S.RESOURCE_EXHAUSTED,
        sdk.TableKeeperError,
        sdk.ResourceLimitError,
    ),
}
"""Rows that differ from a plain reading of the table: a server error the SDK sees as a more
general class (`InternalServerError` for "not served here" in a Batch result is resent by the
Batch path itself, which reads the result's `retryable` flag; `IndeterminateError` never ends a
stream or an Admin call, and its UNKNOWN would be an `UnavailableError` whose outcome is
unknown)."""


def _all_subclasses(cls: type[server.TableKeeperError]) -> set[type[server.TableKeeperError]]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _all_subclasses(sub)
    return found


def test_every_server_error_has_a_row_here() -> None:
    classes = {
        cls for cls in _all_subclasses(server.TableKeeperError) if cls.__module__ == server.__name__
    }
    assert classes == set(ROWS), classes ^ set(ROWS)


@pytest.mark.parametrize("cls", list(ROWS), ids=lambda cls: cls.__name__)
def test_the_row_of_each_server_error(cls: type[server.TableKeeperError]) -> None:
    row = ROWS[cls]
    error = row.make()
    assert type(error) is cls
    rule = server.wire_rule(error)
    assert (error.code, rule.grpc, rule.unary_grpc) == (
        row.status,
        row.grpc.name,
        row.unary.name if row.unary else None,
    )
    assert (error.retryable, error.outcome_unknown) == (row.retryable, row.outcome_unknown)
    assert row.status in StatusCode.values()  # the generated enum, not a copy
    assert grpc_status(rule.grpc) == row.grpc


def test_an_append_that_may_have_persisted_is_outcome_unknown() -> None:
    for cls in (server.StorageUnavailableError, server.LogFencedError):
        error = cls("disk", maybe_persisted=True)
        assert (error.code, error.retryable, error.outcome_unknown) == (C.UNEXPECTED, False, True)
        assert server.wire_rule(error) == server.ERROR_TABLE[server.IndeterminateError]
    assert server.ForwardedError(C.UNEXPECTED, "owner's 600").outcome_unknown


# ------------------------------------------------------------------------ the server's paths


class FakeContext:
    """A grpc.aio servicer context that records what the servicer answered."""

    def __init__(self) -> None:
        self.trailers: dict[str, str] = {}
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailers.update(metadata)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return ()

    def time_remaining(self) -> float | None:
        return None


def _failing(error: server.TableKeeperError) -> Callable[[], Any]:
    async def handler() -> Any:
        raise error

    return handler


@pytest.mark.parametrize("cls", list(ROWS), ids=lambda cls: cls.__name__)
def test_unary_calls_answer_the_body_code_or_the_unary_status(
    cls: type[server.TableKeeperError],
) -> None:
    row = ROWS[cls]
    context = FakeContext()

    async def run() -> kv_rpc_pb2.PutResponse | None:
        try:
            response: kv_rpc_pb2.PutResponse = await serve(
                "Put",
                context,
                None,
                _failing(row.make()),
                lambda code: kv_rpc_pb2.PutResponse(header=kv_rpc_pb2.ResponseHeader(code=code)),
                lambda response: int(response.header.code),
            )
            return response
        except grpc.aio.AbortError:
            return None

    response = asyncio.run(run())
    if row.unary is not None:
        assert response is None and context.aborted is not None
        assert context.aborted[0] == row.unary
    else:
        assert response is not None and context.aborted is None
        assert response.header.code == row.status
        assert context.trailers["tk-error"] == "x"
        assert sdk.error_for_code(response.header.code).__class__ is row.sdk_body


@pytest.mark.parametrize("cls", list(ROWS), ids=lambda cls: cls.__name__)
def test_streams_and_admin_answer_the_grpc_status_with_tk_code(
    cls: type[server.TableKeeperError],
) -> None:
    row = ROWS[cls]
    for path in ("stream", "admin"):
        context = FakeContext()

        async def run(which: str = path, ctx: FakeContext = context) -> None:
            if which == "stream":
                async with stream_errors("Watch", ctx):
                    raise row.make()
            else:
                await serve_admin("Checkpoint", ctx, _failing(row.make()))

        with pytest.raises(grpc.aio.AbortError):
            asyncio.run(run())
        assert context.aborted is not None and context.aborted[0] == row.grpc, path
        assert context.trailers["tk-code"] == str(row.status)
        # What the SDK makes of it (a watch's RESOURCE_EXHAUSTED is its own: a cancelled watch).
        seen = sdk.error_for_status(
            row.grpc, context.aborted[1], context.trailers.items(), idempotent=False
        )
        expected = row.sdk_stream
        if expected is sdk.UnavailableError and seen.outcome_unknown:
            expected = sdk.OutcomeUnknownError  # a write cut off after it left
        assert type(seen) is expected, path
        if isinstance(seen, sdk.CompactedError):
            assert seen.oldest_revision == 7


class _FailingForwarder:
    def __init__(self, error: server.TableKeeperError) -> None:
        self.error = error

    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


class _Elsewhere:
    """A registry whose every range is in container 7, hosted by another server."""

    containers: dict[int, Any] = {}

    async def container_of(self, stream_id: int, pkey: bytes) -> int:
        return 7


class _Ops:
    """`TableOps` whose every op fails with one error."""

    def __init__(self, error: server.TableKeeperError, *, path: str) -> None:
        self.limits = Limits()
        self.error = error
        self.path = path
        # "forwarded": the ops' ranges are on another server, which cannot be reached.
        self.forwarder = _FailingForwarder(error) if path == "forwarded" else None
        self.registry = _Elsewhere()

    def open_range_for_write(self, kind: str, stream_id: int, request: Any) -> Any:
        """A write the Batch queues at once on its range fails the same as one it awaits,
        whether the range refuses it before queueing (`refused`), the queued entry fails
        (`queued`: the log) or the write's own outcome is the error (`rejected`: the apply)."""
        return None if self.path in ("awaited", "forwarded") else self

    def submit_many(self, commands: list[Any]) -> Any:
        if self.path == "refused":
            raise self.error
        future = asyncio.get_running_loop().create_future()
        if self.path == "queued":
            future.set_exception(self.error)
        else:
            future.set_result([self.error for _ in commands])
        return future

    async def put(self, stream_id: int, request: Any, context: Any = None) -> Any:
        raise self.error

    range = increment = delete = txn = put


@pytest.mark.parametrize("path", ["awaited", "refused", "queued", "rejected", "forwarded"])
@pytest.mark.parametrize("cls", list(ROWS), ids=lambda cls: cls.__name__)
def test_a_batch_op_answers_the_body_code_and_retryable(
    cls: type[server.TableKeeperError], path: str
) -> None:
    row = ROWS[cls]
    ops = _Ops(row.make(), path=path)
    servicer = TableKeeperServicer(ops, None, None)  # type: ignore[arg-type]
    header = kv_rpc_pb2.RoutingHeader(stream_id=1024, r_key=b"p")
    request = tablekeeper_pb2.BatchRequest(
        ops=[
            tablekeeper_pb2.BatchOp(put=kv_rpc_pb2.PutRequest(header=header, key=b"k")),
            tablekeeper_pb2.BatchOp(range=kv_rpc_pb2.RangeRequest(header=header, key=b"k")),
        ]
    )
    response = asyncio.run(servicer.Batch(request, FakeContext()))
    put, read = response.results
    assert (put.put.header.code, put.error, put.retryable) == (row.status, "x", row.retryable)
    # A read over the Batch's response bound: retryable, to be sent alone.
    over_bound = cls is server.ResourceLimitError
    assert read.retryable == (row.retryable or over_bound)
    seen = sdk.error_for_result(put.put.header.code, put.error, put.retryable)
    assert type(seen) is (sdk.UnavailableError if row.retryable else row.sdk_body)


# ------------------------------------------------------------------------ the forwarder


@pytest.mark.parametrize("cls", [c for c, row in ROWS.items() if row.unary is not None])
def test_the_forwarder_reads_an_owners_refusal_back(cls: type[server.TableKeeperError]) -> None:
    """An owner's unary refusal (nothing applied) is the same error on the forwarding server,
    not an unknown outcome: before the table, RESOURCE_EXHAUSTED and PERMISSION_DENIED from an
    owner became `IndeterminateError` for writes (and a retried NOT_FOUND for reads)."""
    row = ROWS[cls]
    assert row.unary is not None
    error = error_for_unary_status(row.unary, "from the owner")
    assert error is not None and server.wire_rule(error) == server.wire_rule(row.make())
    assert error.message == "from the owner"
    assert error_for_unary_status(S.DEADLINE_EXCEEDED, "late") is None


# ------------------------------------------------------------------------ the SDK's side


def test_every_sdk_error_has_a_row_and_each_code_one_class() -> None:
    classes = {
        value
        for value in vars(sdk).values()
        if isinstance(value, type) and issubclass(value, sdk.TableKeeperError)
    }
    without_row = {c for c in classes if c not in sdk.ERROR_TABLE}
    assert without_row == {sdk.CompactedError, sdk.BatchOpError}  # they take their base's
    codes = [rule.code for rule in sdk.ERROR_TABLE.values() if rule.code]
    assert len(codes) == len(set(codes))
    assert all(code in StatusCode.values() for code in codes)
    for cls, rule in sdk.ERROR_TABLE.items():
        assert (cls.code, cls.retryable, cls.outcome_unknown) == (
            rule.code,
            rule.retryable,
            rule.outcome_unknown,
        )


def test_the_sdk_never_resends_a_write_the_server_may_have_applied() -> None:
    for cls, row in ROWS.items():
        seen = sdk.error_for_code(row.status, "x")
        if row.outcome_unknown:
            assert not sdk.should_resend(seen, idempotent=False), cls
        if row.unary is not None:  # refused before anything was applied
            refused = sdk.error_for_status(row.unary, "x", idempotent=False)
            assert sdk.should_resend(refused, idempotent=False) == row.retryable, cls


@pytest.mark.parametrize(
    ("status", "details", "idempotent", "cls", "resend", "outcome_unknown"),
    [
        (S.NOT_FOUND, "not served here", False, sdk.UnavailableError, True, False),
        (
            S.UNAVAILABLE,
            "failed to connect to all addresses",
            False,
            sdk.UnavailableError,
            True,
            False,
        ),
        (S.UNAVAILABLE, "Socket closed", False, sdk.OutcomeUnknownError, False, True),
        (S.UNAVAILABLE, "Socket closed", True, sdk.UnavailableError, True, False),
        (S.DEADLINE_EXCEEDED, "", False, sdk.OutcomeUnknownError, False, True),
        (S.DEADLINE_EXCEEDED, "", True, sdk.UnavailableError, True, False),
        (S.INTERNAL, "", True, sdk.UnavailableError, True, False),
        (S.CANCELLED, "", True, sdk.UnavailableError, False, False),
        (S.CANCELLED, "", False, sdk.OutcomeUnknownError, False, True),
        (S.UNKNOWN, "", True, sdk.UnavailableError, False, False),
        (S.INTERNAL, "", False, sdk.OutcomeUnknownError, False, True),
        (S.UNAUTHENTICATED, "", True, sdk.UnauthenticatedError, False, False),
        (S.PERMISSION_DENIED, "", True, sdk.PermissionDeniedError, False, False),
        (S.RESOURCE_EXHAUSTED, "", True, sdk.ResourceLimitError, False, False),
        # Fixed with the table: these were `UnavailableError` (retryable) before.
        (S.INVALID_ARGUMENT, "malformed", True, sdk.BadRequestError, False, False),
        (S.DATA_LOSS, "checksum", True, sdk.UnexpectedError, False, False),
        (S.FAILED_PRECONDITION, "", True, sdk.TableKeeperError, False, False),
    ],
)
def test_what_the_sdk_makes_of_each_grpc_status(
    status: grpc.StatusCode,
    details: str,
    idempotent: bool,
    cls: type[sdk.TableKeeperError],
    resend: bool,
    outcome_unknown: bool,
) -> None:
    """The retry rule the SDK had before the table, kept: NOT_FOUND and a call that never left
    are resent, reads after a transient failure, nothing else."""
    error = sdk.error_for_status(status, details, idempotent=idempotent)
    assert type(error) is cls
    assert sdk.should_resend(error, idempotent) == resend
    assert error.outcome_unknown == outcome_unknown


def test_body_codes_and_batch_results() -> None:
    assert type(sdk.error_for_code(C.UNEXPECTED)) is sdk.UnexpectedError
    assert sdk.error_for_code(C.UNEXPECTED).outcome_unknown
    internal = sdk.error_for_code(C.INTERNAL_SERVER_ERROR)
    assert sdk.should_resend(internal, idempotent=True)
    assert not sdk.should_resend(internal, idempotent=False)
    assert not sdk.should_resend(sdk.error_for_code(C.KEY_EXISTS), idempotent=True)
    unknown = sdk.error_for_code(4242, "?")
    assert type(unknown) is sdk.TableKeeperError and unknown.code == 4242
    not_here = sdk.error_for_result(C.INTERNAL_SERVER_ERROR, "moved", retryable=True)
    assert type(not_here) is sdk.UnavailableError and str(not_here) == "NOT_FOUND: moved"
    assert sdk.should_resend(not_here, idempotent=False)
