"""Bulk access to a table: its ranges, whole-range scans, batched writes, effectively-once
increments. Used by `tablekeeper.spark`; usable on its own with an `AsyncClient`.

- `table_ranges` lists a table's hash ranges (BookKeeper's `MetaRangeService.GetActiveRanges`);
  `tablekeeper.routing.RangeRouter` tells which of them holds a pkey.
- `scan_range` pages through every key of one range (TableKeeper's `ScanRange`), whatever its
  pkey, so a table can be read range by range in parallel.

Each function takes the `AsyncClient` (or its `ClientContext`) whose channels, routes and retry
policy it uses.
- `BatchSender` sends many independent ops per `Batch` RPC and retries exactly what is safe:
  ops the server reports as certainly not applied (`retryable`) always; a whole call that failed
  in an unknown state only when its ops are idempotent (puts, marker-guarded txns), never for
  plain increments.
- `once_txns` builds the effectively-once increment txns: one txn per pkey (and per chunk of at
  most `TXN_INCREMENTS_MAX` lkeys) that applies the increments and writes a marker, unless the
  marker says this (scope, partition, chunk) was already applied. See `Epoch`.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from tablekeeper._context import ClientContext, ContextSource, context_of
from tablekeeper._routes import Target
from tablekeeper.errors import (
    BatchOpError,
    TableNotFoundError,
    UnavailableError,
    error_for_code,
    error_for_rpc_error,
    should_resend,
)
from tablekeeper.types import KeyValue, RangeInfo, TableLayout
from tablekeeper_proto.bookkeeper import kv_rpc_pb2, storage_pb2, storage_pb2_grpc, stream_pb2
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc

MARKER_PREFIX = b"\xfftk-once\x00"
"""Every lkey of an effectively-once marker starts with this. 0xff never occurs in UTF-8, so no
string lkey can collide with a marker; readers hide these keys."""
TXN_INCREMENTS_MAX = 1000
"""Increments per marker txn (the server allows 1024 compares and ops per txn)."""
BATCH_OPS_MAX = 1000
"""Ops per `Batch` RPC this module sends (the server refuses more than `--max-batch-ops`,
10,000 by default); more ops for one server go in several Batches."""
_NOT_SERVED_HERE = StatusCode.INTERNAL_SERVER_ERROR
"""The header code of a Batch result marked retryable because its range is not served there."""
_SC_METADATA_KEY = "bk-rt-sc-id-bin"
_ID = struct.Struct(">q")
_MARKER_TAIL = struct.Struct(">II")


async def table_layout(client: ContextSource, namespace: str, name: str) -> TableLayout:
    """The table's id and its active ranges. Raises `TableNotFoundError`."""
    context = context_of(client)
    request = storage_pb2.GetStreamRequest(
        stream_name=stream_pb2.StreamName(namespace_name=namespace, stream_name=name)
    )
    props = (await context.root("GetStream", request, idempotent=True)).stream_props
    stub = context.stub("meta", storage_pb2_grpc.MetaRangeServiceStub)
    response = await context.call(
        stub.GetActiveRanges,
        storage_pb2.GetActiveRangesRequest(stream_id=props.stream_id),
        metadata=((_SC_METADATA_KEY, _ID.pack(props.storage_container_id)),),
        idempotent=True,
        status_of=lambda r: r.code,
    )
    ranges = [
        RangeInfo(
            range_id=r.props.range_id,
            start_hash=r.props.start_hash_key,
            end_hash=r.props.end_hash_key,
            container_id=r.props.storage_container_id,
        )
        for r in response.ranges
    ]
    if not ranges:
        raise TableNotFoundError(f"table {namespace}/{name} has no active ranges")
    return TableLayout(
        namespace, name, props.stream_id, props.storage_container_id, sorted_ranges(ranges)
    )


def sorted_ranges(ranges: Iterable[RangeInfo]) -> list[RangeInfo]:
    """The table's ranges, ordered by their start hash."""
    return sorted(ranges, key=lambda r: r.start_hash)


async def scan_range(
    client: ContextSource,
    table_id: int,
    range_id: int,
    *,
    page_size: int = 1000,
    start_after: tuple[bytes, bytes] | None = None,
    keys_only: bool = False,
) -> AsyncIterator[list[KeyValue]]:
    """Yield the keys of one range, one page (list) at a time, in the range's store order.

    Each page is a consistent read; the scan as a whole is not a snapshot (keys written during
    the scan may or may not be seen). Pages are retried on transport errors (reads are safe).
    """
    context = context_of(client)
    method = context.routed(
        "tk", tablekeeper_pb2_grpc.TableKeeperStub, "ScanRange", table_id, range_id=range_id
    )
    cursor = start_after
    while True:
        request = tablekeeper_pb2.ScanRangeRequest(
            stream_id=table_id, range_id=range_id, limit=page_size, keys_only=keys_only
        )
        if cursor is not None:
            request.start_after.pkey, request.start_after.lkey = cursor
        response = await context.call(
            method, request, idempotent=True, status_of=lambda r: r.header.code
        )
        page = [KeyValue.from_proto(row.pkey, row.kv) for row in response.rows]
        if page:
            yield page
            cursor = (page[-1].pkey, page[-1].lkey)
        if not response.more or not page:
            return


# ---------------------------------------------------------------------------------- writes


def put_op(table_id: int, pkey: bytes, lkey: bytes, value: bytes) -> tablekeeper_pb2.BatchOp:
    """A Batch op putting `value` at (pkey, lkey) of the table."""
    op = tablekeeper_pb2.BatchOp()
    put = op.put
    put.header.stream_id = table_id
    put.header.r_key = pkey
    put.key = lkey
    put.value = value
    return op


def increment_op(table_id: int, pkey: bytes, lkey: bytes, amount: int) -> tablekeeper_pb2.BatchOp:
    """A Batch op adding `amount` to the number key (pkey, lkey) of the table."""
    op = tablekeeper_pb2.BatchOp()
    inc = op.increment
    inc.header.stream_id = table_id
    inc.header.r_key = pkey
    inc.key = lkey
    inc.amount = amount
    return op


def _op_key(op: tablekeeper_pb2.BatchOp) -> tuple[bytes, bytes]:
    inner = getattr(op, str(op.WhichOneof("op")))
    if isinstance(inner, kv_rpc_pb2.TxnRequest):
        keys = [o.request_increment.key for o in inner.failure if o.HasField("request_increment")]
        return inner.header.r_key, keys[0] if keys else b""
    return inner.header.r_key, inner.key


class BatchSender:
    """Sends ops in `Batch` RPCs and retries what is safe to retry.

    `idempotent`: the ops may be applied twice without harm (puts of fixed values, marker-guarded
    txns), so a call that failed in an unknown state (timeout, dropped connection) is sent again.
    Otherwise (plain increments) only ops the server reports as not applied are resent, and an
    unknown outcome raises `UnavailableError`: the caller must not resend those ops.
    """

    def __init__(self, client: ContextSource, *, idempotent: bool) -> None:
        self._context = context_of(client)
        self._idempotent = idempotent

    async def send(
        self, ops: Sequence[tablekeeper_pb2.BatchOp]
    ) -> list[tablekeeper_pb2.BatchResult]:
        """Apply every op; returns their results in order. Raises `BatchOpError` for the first op
        that failed for a reason of its own, `UnavailableError` if the deadline passes."""
        results = await send_batch(self._context, ops, idempotent=self._idempotent)
        not_accepted = 0
        for op, result in zip(ops, results, strict=True):
            code = _inner(result).header.code
            if code and result.retryable:
                not_accepted += 1
            elif code:
                pkey, lkey = _op_key(op)
                raise BatchOpError(error_for_code(code), pkey, lkey, result.error)
        if not_accepted:
            raise UnavailableError(
                f"{not_accepted} ops of a batch were not accepted before the deadline"
            )
        return results


def _inner(result: tablekeeper_pb2.BatchResult) -> Any:
    return getattr(result, str(result.WhichOneof("result")))


async def send_batch(
    client: ContextSource, ops: Sequence[tablekeeper_pb2.BatchOp], *, idempotent: bool
) -> list[tablekeeper_pb2.BatchResult]:
    """Send `ops` as one `Batch` per server that owns some of their ranges (see `_routes`).

    Ops a server reports as not applied (`retryable`) are located again and resent until the
    deadline; a whole Batch that failed is resent by `_transport`'s rules (`idempotent`: its
    ops may be applied twice), else `UnavailableError`. Returns one result per op, in order
    (an op still not accepted at the deadline keeps its `retryable` result).
    """
    context = context_of(client)
    policy = context.retry
    results: dict[int, tablekeeper_pb2.BatchResult] = {}
    pending = list(range(len(ops)))
    deadline = time.monotonic() + policy.deadline_s
    backoff = policy.initial_backoff_s
    while pending:
        groups: dict[str | None, list[tuple[int, Target]]] = {}
        for index in pending:
            header = getattr(ops[index], str(ops[index].WhichOneof("op"))).header
            target = await context.routes.locate(header.stream_id, header.r_key)
            groups.setdefault(target.endpoint, []).append((index, target))
        answers = await asyncio.gather(
            *(_send_group(context, endpoint, ops, group) for endpoint, group in groups.items()),
            return_exceptions=True,
        )
        expired = time.monotonic() >= deadline
        pending = []
        for group, answer in zip(groups.values(), answers, strict=True):
            if isinstance(answer, grpc.aio.AioRpcError):
                for _, target in group:
                    context.routes.failed(target, answer)
                failed = error_for_rpc_error(answer, idempotent=idempotent)
                if expired or not should_resend(failed, idempotent):
                    raise failed from answer
                pending += [index for index, _ in group]
            elif isinstance(answer, BaseException):
                raise answer
            else:
                for (index, target), result in zip(group, answer.results, strict=True):
                    results[index] = result
                    code = _inner(result).header.code
                    if code and result.retryable:
                        if code == _NOT_SERVED_HERE:  # else: a read over the response bound
                            context.routes.failed(target)
                        pending.append(index)
        if pending:
            if expired:
                break
            pending.sort()
            await asyncio.sleep(random.uniform(0, backoff))
            backoff = min(policy.max_backoff_s, backoff * 2)
    return [results[index] for index in range(len(ops))]


async def _send_group(
    context: ClientContext,
    endpoint: str | None,
    ops: Sequence[tablekeeper_pb2.BatchOp],
    group: list[tuple[int, Target]],
) -> tablekeeper_pb2.BatchResponse:
    """One endpoint's ops, in Batches of at most `BATCH_OPS_MAX`; their results in order."""
    stub = context.stub("tk", tablekeeper_pb2_grpc.TableKeeperStub, endpoint)
    response = tablekeeper_pb2.BatchResponse()
    for start in range(0, len(group), BATCH_OPS_MAX):
        chunk = group[start : start + BATCH_OPS_MAX]
        request = tablekeeper_pb2.BatchRequest(ops=[ops[index] for index, _ in chunk])
        part: tablekeeper_pb2.BatchResponse = await stub.Batch(
            request, timeout=context.retry.call_timeout_s
        )
        response.results.extend(part.results)
    return response


# ------------------------------------------------------------------- effectively-once txns


@dataclass(frozen=True, slots=True)
class Epoch:
    """What a marker records, and which existing marker means "already applied".

    - `Epoch.sequence(n)` (streaming batch ids): the marker holds n as 8 bytes big-endian; a marker
      at n or later skips the txn, so a replay of batch n, or a late attempt of an older batch,
      never applies again.
    - `Epoch.token(t)` (one batch write job): the marker holds the job's token; only a marker
      equal to it skips the txn (a retried task of the same job). A later job with a new token
      applies and takes the marker over, so markers do not pile up job after job.
    """

    value: bytes
    skip_if: Literal["==", ">"]
    compare_to: bytes

    @staticmethod
    def sequence(n: int) -> Epoch:
        """The epoch's sequence number."""
        if n < 0:
            raise ValueError("a sequence epoch is >= 0")
        previous = (n - 1).to_bytes(8, "big") if n else b""  # b"": any marker is > "absent"
        return Epoch(n.to_bytes(8, "big"), ">", previous)

    @staticmethod
    def token(token: bytes) -> Epoch:
        """The epoch's marker value (what its marker key holds)."""
        if not token:
            raise ValueError("a token epoch needs a non-empty token")
        return Epoch(token, "==", token)


def marker_lkey(scope: bytes, partition: int, chunk: int) -> bytes:
    """The lkey of the marker of (scope, partition, chunk) under a pkey."""
    return MARKER_PREFIX + scope + b"\x00" + _MARKER_TAIL.pack(partition, chunk)


def once_txns(
    table_id: int,
    increments: Mapping[bytes, Mapping[bytes, int]],
    *,
    scope: bytes,
    partition: int,
    epoch: Epoch,
) -> list[tablekeeper_pb2.BatchOp]:
    """Marker-guarded increment txns for `increments` ({pkey: {lkey: amount}}).

    Per pkey, lkeys are sorted and cut into chunks of `TXN_INCREMENTS_MAX`, so the same input
    always gives the same txns (and markers) however it was ordered. Each txn: compare the
    marker; if it says "applied", do nothing (the txn *succeeds*); otherwise (the txn's failure
    branch) apply the increments and write the marker, all at one revision.
    """
    compare_result = (
        kv_rpc_pb2.Compare.EQUAL if epoch.skip_if == "==" else kv_rpc_pb2.Compare.GREATER
    )
    ops: list[tablekeeper_pb2.BatchOp] = []
    for pkey in sorted(increments):
        items = sorted(increments[pkey].items())
        for chunk, start in enumerate(range(0, len(items), TXN_INCREMENTS_MAX)):
            marker = marker_lkey(scope, partition, chunk)
            op = tablekeeper_pb2.BatchOp()
            txn = op.txn
            txn.header.stream_id = table_id
            txn.header.r_key = pkey
            txn.compare.add(
                key=marker,
                target=kv_rpc_pb2.Compare.VALUE,
                result=compare_result,
                value=epoch.compare_to,
            )
            for lkey, amount in items[start : start + TXN_INCREMENTS_MAX]:
                inc = txn.failure.add().request_increment
                inc.key = lkey
                inc.amount = amount
            put = txn.failure.add().request_put
            put.key = marker
            put.value = epoch.value
            ops.append(op)
    return ops


@dataclass(slots=True)
class OnceOutcome:
    """What `check_once_results` counted: txns applied now, and txns applied before."""

    applied_txns: int = 0
    skipped_txns: int = 0
    """Txns whose marker said they had been applied before (a retry or a replay)."""


def check_once_results(
    ops: Sequence[tablekeeper_pb2.BatchOp], results: Sequence[tablekeeper_pb2.BatchResult]
) -> OnceOutcome:
    """Count applied / skipped txns; raise `BatchOpError` for an increment that failed on its
    own (an lkey holding bytes, not a number)."""
    outcome = OnceOutcome()
    for op, result in zip(ops, results, strict=True):
        response = result.txn
        if response.succeeded:
            outcome.skipped_txns += 1
            continue
        outcome.applied_txns += 1
        for request, answer in zip(op.txn.failure, response.responses, strict=True):
            code = (
                answer.response_increment.header.code
                if answer.HasField("response_increment")
                else answer.response_put.header.code
            )
            if code:
                key = (
                    request.request_increment.key
                    if request.HasField("request_increment")
                    else request.request_put.key
                )
                bytes_not_number = code == StatusCode.BAD_REQUEST
                reason = "the key holds bytes, not a number" if bytes_not_number else result.error
                raise BatchOpError(error_for_code(code), op.txn.header.r_key, key, reason)
    return outcome


def is_marker(lkey: bytes) -> bool:
    """Whether `lkey` is a marker key of the exactly-once protocol."""
    return lkey.startswith(MARKER_PREFIX)


__all__ = [
    "MARKER_PREFIX",
    "BATCH_OPS_MAX",
    "TXN_INCREMENTS_MAX",
    "BatchOpError",
    "BatchSender",
    "Epoch",
    "OnceOutcome",
    "RangeInfo",
    "TableLayout",
    "check_once_results",
    "increment_op",
    "is_marker",
    "marker_lkey",
    "once_txns",
    "put_op",
    "scan_range",
    "send_batch",
    "table_layout",
]
