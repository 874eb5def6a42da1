"""Client-side coalescing of concurrent single-key operations into Batch RPCs.

One Python gRPC process handles a few thousand unary calls per second, whatever the call does; the
server's own work per put or get is a few tens of microseconds. So when many tasks of one client
issue puts, gets, increments or deletes at the same time, sending them as one `Batch` RPC is what
makes throughput scale (the server then also group-commits them together).

How: an op is queued; a flush runs on the next event-loop iteration and sends everything queued
as one RPC (up to `ops_max` ops / `bytes_max` bytes), keeping at most `in_flight_max` RPCs
outstanding; whatever arrives meanwhile waits for the next flush, so batches grow with load and
shrink to single unary calls (lowest latency) when the load is light. Each op keeps its own
result and error; nothing about an op's meaning changes (ops in one batch are independent, as
ops from concurrent tasks are anyway).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tablekeeper._transport import RetryPolicy, retryable_rpc_error, trailer_message
from tablekeeper.errors import UnavailableError, error_for_code
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc

UNARY_METHODS = {"put": "Put", "increment": "Increment", "delete_range": "Delete", "range": "Range"}


@dataclass(slots=True)
class _Outcome:
    response: Any = None
    error: str = ""
    retryable: bool = False
    transport: grpc.aio.AioRpcError | None = None


@dataclass(slots=True)
class _Op:
    kind: str
    request: Any
    metadata: Sequence[tuple[str, bytes | str]]
    size: int
    future: asyncio.Future[_Outcome]


class Coalescer:
    """Sends one client's single-key table ops, batching those that are in flight together."""

    def __init__(
        self,
        table_stub: kv_rpc_pb2_grpc.TableServiceStub,
        tablekeeper_stub: tablekeeper_pb2_grpc.TableKeeperStub,
        policy: RetryPolicy,
        *,
        ops_max: int = 256,
        bytes_max: int = 2 * 1024 * 1024,
        in_flight_max: int = 2,
    ) -> None:
        self._table_stub = table_stub
        self._tk_stub = tablekeeper_stub
        self._policy = policy
        self._ops_max = ops_max
        self._bytes_max = bytes_max
        self._in_flight_max = in_flight_max
        self._pending: list[_Op] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(
        self,
        kind: str,
        request: Any,
        metadata: Sequence[tuple[str, bytes | str]],
        *,
        idempotent: bool,
    ) -> Any:
        """Send one op (coalesced with concurrent ones); return its response or raise its error.

        Retries follow the SDK's rule: reads may always be retried; a write only when it
        certainly was not applied (the server said "not served here", or no connection).
        """
        deadline = time.monotonic() + self._policy.deadline_s
        backoff = self._policy.initial_backoff_s
        size = request.ByteSize() + 16
        while True:
            future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
            self._enqueue(_Op(kind, request, metadata, size, future))
            outcome = await future
            expired = time.monotonic() >= deadline
            if outcome.transport is not None:
                if expired or not retryable_rpc_error(outcome.transport, idempotent):
                    error = outcome.transport
                    raise UnavailableError(
                        f"{error.code().name}: {error.details() or ''}".strip()
                    ) from error
            else:
                code = outcome.response.header.code
                if code == 0:
                    return outcome.response
                exc = error_for_code(code, outcome.error)
                if outcome.retryable and expired:
                    # "Not served here (yet)" until the deadline: as a unary NOT_FOUND would.
                    raise UnavailableError(f"NOT_FOUND: {outcome.error}".strip())
                retry = outcome.retryable or (idempotent and exc.retryable)
                if expired or not retry:
                    raise exc
            await asyncio.sleep(random.uniform(0, backoff))
            backoff = min(self._policy.max_backoff_s, backoff * 2)

    def _enqueue(self, op: _Op) -> None:
        self._pending.append(op)
        if not self._scheduled and self._in_flight < self._in_flight_max:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending and self._in_flight < self._in_flight_max:
            taken, size = 0, 0
            for op in self._pending:
                if taken and (taken >= self._ops_max or size + op.size > self._bytes_max):
                    break
                taken += 1
                size += op.size
            ops, self._pending = self._pending[:taken], self._pending[taken:]
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(ops))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, ops: list[_Op]) -> None:
        try:
            if len(ops) == 1:
                outcomes = [await self._send_unary(ops[0])]
            else:
                outcomes = await self._send_batch(ops)
            for op, outcome in zip(ops, outcomes, strict=True):
                if not op.future.done():
                    op.future.set_result(outcome)
        except BaseException as exc:  # never leave a caller waiting
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(exc)
            raise
        finally:
            self._in_flight -= 1
            if self._pending and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    async def _send_unary(self, op: _Op) -> _Outcome:
        method = getattr(self._table_stub, UNARY_METHODS[op.kind])
        rpc = method(op.request, metadata=op.metadata, timeout=self._policy.call_timeout_s)
        try:
            response = await rpc
        except grpc.aio.AioRpcError as error:
            return _Outcome(transport=error)
        message = await trailer_message(rpc) if response.header.code else ""
        return _Outcome(response=response, error=message)

    async def _send_batch(self, ops: list[_Op]) -> list[_Outcome]:
        request = tablekeeper_pb2.BatchRequest()
        for op in ops:
            getattr(request.ops.add(), op.kind).CopyFrom(op.request)
        try:
            response = await self._tk_stub.Batch(request, timeout=self._policy.call_timeout_s)
        except grpc.aio.AioRpcError as error:
            return [_Outcome(transport=error) for _ in ops]
        outcomes = []
        for op, result in zip(ops, response.results, strict=True):
            outcomes.append(
                _Outcome(
                    response=getattr(result, op.kind),
                    error=result.error,
                    retryable=result.retryable,
                )
            )
        return outcomes

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
