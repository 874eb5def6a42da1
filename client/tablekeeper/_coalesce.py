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

Ops are grouped by the server that owns their range (`_routes`): one queue, one Batch and
`in_flight_max` RPCs per endpoint. Every attempt locates the op again, so a retry after a
"not served here" finds the container's new owner.

Limits: `ops_max` (256) stays far below the server's `--max-batch-ops` (10,000 by default) and
`bytes_max` bounds the request; a Batch refused as over the server's limits (RESOURCE_EXHAUSTED:
nothing applied) halves `ops_max` and its ops are sent alone. A read the server did not execute
because the Batch's response would have exceeded `--max-response-bytes` (retryable, not a "not
served here") is sent again on its own, as a unary call.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tablekeeper._routes import RouteCache
from tablekeeper._transport import RetryPolicy, trailer_message
from tablekeeper.errors import (
    error_for_code,
    error_for_result,
    error_for_rpc_error,
    should_resend,
)
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import tablekeeper_pb2

_NOT_SERVED_HERE = StatusCode.INTERNAL_SERVER_ERROR
"""The header code of a Batch result marked retryable because its range is not served there."""
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
    endpoint: str | None
    alone: bool = False
    """Send it in a call of its own (the server said a Batch's response had no room for it)."""


class Coalescer:
    """Sends one client's single-key table ops, batching those that are in flight together."""

    def __init__(
        self,
        stubs: Callable[[str | None], tuple[Any, Any]],
        routes: RouteCache,
        policy: RetryPolicy,
        *,
        ops_max: int = 256,
        bytes_max: int = 2 * 1024 * 1024,
        in_flight_max: int = 2,
    ) -> None:
        """`stubs(endpoint)`: the (TableService, TableKeeper) stubs for an endpoint (None = the
        bootstrap endpoint)."""
        self._stubs = stubs
        self._routes = routes
        self._policy = policy
        self._ops_max = ops_max
        self._bytes_max = bytes_max
        self._in_flight_max = in_flight_max
        self._pending: dict[str | None, list[_Op]] = {}
        self._in_flight: dict[str | None, int] = {}
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
        stream_id, pkey = request.header.stream_id, request.header.r_key
        alone = False
        while True:
            target = await self._routes.locate(stream_id, pkey)
            future: asyncio.Future[_Outcome] = asyncio.get_running_loop().create_future()
            self._enqueue(_Op(kind, request, metadata, size, future, target.endpoint, alone))
            outcome = await future
            if outcome.transport is not None:
                self._routes.failed(target, outcome.transport)
            elif outcome.retryable and outcome.response.header.code != _NOT_SERVED_HERE:
                alone = True  # no room in the Batch's response: the route is fine
            elif outcome.retryable:
                self._routes.failed(target)
            expired = time.monotonic() >= deadline
            if outcome.transport is not None:
                failed = error_for_rpc_error(outcome.transport, idempotent=idempotent)
                if expired or not should_resend(failed, idempotent):
                    raise failed from outcome.transport
            else:
                code = outcome.response.header.code
                if code == 0:
                    return outcome.response
                if outcome.retryable and expired:
                    # "Not served here (yet)" until the deadline: as a unary NOT_FOUND would.
                    raise error_for_result(code, outcome.error, retryable=True)
                exc = error_for_code(code, outcome.error)
                if expired or not (outcome.retryable or should_resend(exc, idempotent)):
                    raise exc
            await asyncio.sleep(random.uniform(0, backoff))
            backoff = min(self._policy.max_backoff_s, backoff * 2)

    def _enqueue(self, op: _Op) -> None:
        self._pending.setdefault(op.endpoint, []).append(op)
        if not self._scheduled and self._in_flight.get(op.endpoint, 0) < self._in_flight_max:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        for endpoint in list(self._pending):
            pending = self._pending.pop(endpoint)
            while pending and self._in_flight.get(endpoint, 0) < self._in_flight_max:
                taken, size = 0, 0
                for op in pending:
                    if taken and (
                        op.alone or taken >= self._ops_max or size + op.size > self._bytes_max
                    ):
                        break
                    taken += 1
                    size += op.size
                    if op.alone:
                        break
                ops, pending = pending[:taken], pending[taken:]
                self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1
                task = asyncio.get_running_loop().create_task(self._send(endpoint, ops))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if pending:
                self._pending[endpoint] = pending

    async def _send(self, endpoint: str | None, ops: list[_Op]) -> None:
        try:
            if len(ops) == 1:
                outcomes = [await self._send_unary(endpoint, ops[0])]
            else:
                outcomes = await self._send_batch(endpoint, ops)
            for op, outcome in zip(ops, outcomes, strict=True):
                if not op.future.done():
                    op.future.set_result(outcome)
        except BaseException as exc:  # never leave a caller waiting
            for op in ops:
                if not op.future.done():
                    op.future.set_exception(exc)
            raise
        finally:
            self._in_flight[endpoint] -= 1
            if not self._in_flight[endpoint]:
                del self._in_flight[endpoint]
            if self._pending.get(endpoint) and not self._scheduled:
                self._schedule()

    async def _send_unary(self, endpoint: str | None, op: _Op) -> _Outcome:
        method = getattr(self._stubs(endpoint)[0], UNARY_METHODS[op.kind])
        rpc = method(op.request, metadata=op.metadata, timeout=self._policy.call_timeout_s)
        try:
            response = await rpc
        except grpc.aio.AioRpcError as error:
            return _Outcome(transport=error)
        message = await trailer_message(rpc) if response.header.code else ""
        return _Outcome(response=response, error=message)

    async def _send_batch(self, endpoint: str | None, ops: list[_Op]) -> list[_Outcome]:
        request = tablekeeper_pb2.BatchRequest()
        for op in ops:
            getattr(request.ops.add(), op.kind).CopyFrom(op.request)
        try:
            response = await self._stubs(endpoint)[1].Batch(
                request, timeout=self._policy.call_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # Over the server's --max-batch-ops (set lower than ours): nothing was applied.
                # Smaller Batches from now on; these ops go alone.
                self._ops_max = max(1, len(ops) // 2)
                return list(await asyncio.gather(*(self._send_unary(endpoint, op) for op in ops)))
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
