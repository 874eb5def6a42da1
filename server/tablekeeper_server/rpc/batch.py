"""The pieces of TableKeeper's Batch that are not the servicer: what one Batch may spend on its
response (`BatchBudget`, checked before anything runs), a range's share of its writes queued as
one entry (`QueuedWrites`), and each op's result from its outcome (`batch_result`,
`fill_result`). The servicer (`rpc.servicers.TableKeeperServicer.Batch`) drives them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tablekeeper_proto.v1 import tablekeeper_pb2, wal_pb2
from tablekeeper_server.errors import Code, ResourceLimitError, TableKeeperError, wire_rule
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.replica import Outcome
from tablekeeper_server.rpc.status import command_status_reason
from tablekeeper_server.rpc.table_ops import TABLE_METHODS

log = logging.getLogger(__name__)


def batch_result(
    kind: str, request: Any, outcome: asyncio.Future[Any]
) -> tablekeeper_pb2.BatchResult:
    """One Batch op's result from its (done) outcome: the response, or the error it raised."""
    result = tablekeeper_pb2.BatchResult()
    exc = outcome.exception()
    fill_result(result, kind, request, None if exc is not None else outcome.result(), exc)
    return result


def fill_result(
    result: tablekeeper_pb2.BatchResult,
    kind: str,
    request: Any,
    response: Any,
    exc: BaseException | None,
) -> None:
    """Fill an empty Batch op's result: the response, or the error `exc` the op raised."""
    target = getattr(result, kind)
    if exc is None:
        target.CopyFrom(response)
        if code := target.header.code:
            result.error = command_status_reason(TABLE_METHODS[kind], code) or ""
    elif isinstance(exc, TableKeeperError):
        target.header.code = exc.code
        result.error = exc.message
        # A read over the Batch's response bound is answered retryable: send it alone.
        over_bound = kind == "range" and isinstance(exc, ResourceLimitError)
        result.retryable = wire_rule(exc).retryable or over_bound
    else:
        log.error("batch op failed", exc_info=exc)
        target.header.code = Code.INTERNAL_SERVER_ERROR
        result.error = f"internal error: {exc}"
    target.header.routing_header.CopyFrom(request.header)


class QueuedWrites:
    """A Batch's writes queued on one range as one entry (`Range.submit_many`)."""

    __slots__ = ("commands", "future", "indices")

    def __init__(self) -> None:
        self.indices: list[int] = []
        """The ops' indices in the Batch, in order."""
        self.commands: list[wal_pb2.WalCommand] = []
        self.future: asyncio.Future[list[Outcome]]

    def place(self, outcomes: list[Any]) -> None:
        """Put each op's outcome (its response, or the error it got) at its index."""
        exc = self.future.exception()
        if exc is not None:  # the whole entry failed (the log, the range closing)
            for i in self.indices:
                outcomes[i] = exc
            return
        for i, outcome in zip(self.indices, self.future.result(), strict=True):
            outcomes[i] = outcome


class BatchBudget:
    """The response bytes one Batch may still spend on reads.

    Writes run whatever their response size, so their worst case is reserved up front: a put or
    single-key delete with `prev_kv` may return a key and a value (`key_bytes_max +
    value_bytes_max`), a ranged delete with `prev_kv` or a txn with a read up to
    `response_bytes_max`. A Batch whose reservations exceed `response_bytes_max`, or with more
    than `batch_ops_max` ops, is refused before anything runs. Reads then share the rest: each
    reserves nothing, runs while some budget is left, and a result that does not fit is dropped
    and answered over-limit; after that no later read runs. Headers and echoed routing keys are
    not counted (they are bounded by the request's own size)."""

    def __init__(self, bytes_max: int, limits: Limits) -> None:
        self.left = bytes_max
        self.limits = limits
        self.exhausted = False

    @classmethod
    def of(cls, request: tablekeeper_pb2.BatchRequest, limits: Limits) -> BatchBudget:
        n_ops = len(request.ops)
        if n_ops > limits.batch_ops_max:
            raise ResourceLimitError(
                f"Batch has {n_ops} ops; the limit is {limits.batch_ops_max} (--max-batch-ops): "
                "nothing was applied, send fewer ops per Batch"
            )
        reserved = sum(write_response_bytes_max(op, limits) for op in request.ops)
        if reserved > limits.response_bytes_max:
            raise ResourceLimitError(
                f"Batch has writes that may return up to {reserved} bytes (prev_kv, txns with "
                f"reads); a response may carry {limits.response_bytes_max} "
                "(--max-response-bytes): nothing was applied, send them in smaller Batches"
            )
        return cls(limits.response_bytes_max - reserved, limits)

    def _over(self) -> ResourceLimitError:
        return ResourceLimitError(
            f"read not executed: the Batch's response would exceed "
            f"{self.limits.response_bytes_max} bytes (--max-response-bytes); send it again in "
            "a smaller Batch, or alone"
        )

    def before_read(self) -> None:
        if self.exhausted:
            raise self._over()

    def after_read(self, size: int) -> None:
        if size > self.left:
            self.exhausted = True
            raise self._over()
        self.left -= size


def write_response_bytes_max(op: tablekeeper_pb2.BatchOp, limits: Limits) -> int:
    """Worst-case bytes of stored data the write `op` may return (0 for reads)."""
    one_kv = limits.key_bytes_max + limits.value_bytes_max
    kind = op.WhichOneof("op")
    if kind == "put":
        return one_kv if op.put.prev_kv else 0
    if kind == "delete_range":
        if not op.delete_range.prev_kv:
            return 0
        return limits.response_bytes_max if op.delete_range.range_end else one_kv
    if kind == "txn":
        total = 0
        for request_op in list(op.txn.success) + list(op.txn.failure):
            inner = request_op.WhichOneof("request")
            if inner == "request_range":
                return limits.response_bytes_max
            if inner == "request_put" and request_op.request_put.prev_kv:
                total += one_kv
            elif inner == "request_delete_range" and request_op.request_delete_range.prev_kv:
                ranged = bool(request_op.request_delete_range.range_end)
                total += limits.response_bytes_max if ranged else one_kv
        return min(total, limits.response_bytes_max)
    return 0
