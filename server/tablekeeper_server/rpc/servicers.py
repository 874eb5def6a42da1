"""gRPC servicers: each method converts the request, calls the domain, converts the result.

No business logic lives here; errors become statuses by `errors.ERROR_TABLE`, through
`rpc.status` (and, for each op of a Batch, `wire_rule`). Where a table operation is served
(routing, forwarding, follower reads, split-scan merging) is `rpc.table_ops`; a Batch's budget,
queued writes and results are `rpc.batch`; malformed requests are refused by `rpc.malformed`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

from tablekeeper_proto.bookkeeper import (
    common_pb2,
    kv_rpc_pb2,
    kv_rpc_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
)
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc, wal_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import (
    Code,
    IllegalOpError,
    IndeterminateError,
)
from tablekeeper_server.metrics import ServerMetrics
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.batch import BatchBudget, QueuedWrites, batch_result, fill_result
from tablekeeper_server.rpc.proxy import (
    META_SERVICE,
    ROOT_SERVICE,
    TABLEKEEPER_SERVICE,
    Forwarder,
    local_or_forward,
    was_forwarded,
)
from tablekeeper_server.rpc.status import serve, serve_admin
from tablekeeper_server.rpc.table_ops import WRITE_CHECKS, TableOps, header_code, stream_id_of

log = logging.getLogger(__name__)
Context: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type stubs)
M = TypeVar("M")
SERVER_VERSION = "0.1.0"


def _code(response: Any) -> int:
    return int(response.code)


class RootRangeServicer(storage_pb2_grpc.RootRangeServiceServicer):
    """The root range lives on container 0; other servers forward these calls to its owner."""

    def __init__(
        self,
        registry: ContainerRegistry,
        metrics: ServerMetrics | None,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._forwarder = forwarder

    async def _serve(
        self,
        method: str,
        context: Context,
        handler: Callable[[], Awaitable[M]],
        kind: Callable[..., M],
        request: Any = None,
    ) -> M:
        async def routed() -> M:
            return await local_or_forward(
                self._forwarder,
                context,
                handler,
                ROOT_SERVICE + method,
                request,
                kind,
                _code,
                idempotent=method.startswith("Get"),
            )

        return await serve(
            method, context, self._metrics, routed, lambda code: kind(code=code), _code
        )

    async def CreateNamespace(  # noqa: N802 (gRPC method names)
        self, request: storage_pb2.CreateNamespaceRequest, context: Context
    ) -> storage_pb2.CreateNamespaceResponse:
        async def handle() -> storage_pb2.CreateNamespaceResponse:
            props = await self._registry.root.create_namespace(request.name, request.ns_conf)
            return storage_pb2.CreateNamespaceResponse(code=Code.SUCCESS, ns_props=props)

        return await self._serve(
            "CreateNamespace", context, handle, storage_pb2.CreateNamespaceResponse, request
        )

    async def GetNamespace(  # noqa: N802
        self, request: storage_pb2.GetNamespaceRequest, context: Context
    ) -> storage_pb2.GetNamespaceResponse:
        async def handle() -> storage_pb2.GetNamespaceResponse:
            props = self._registry.root.get_namespace(request.name)
            return storage_pb2.GetNamespaceResponse(code=Code.SUCCESS, ns_props=props)

        return await self._serve(
            "GetNamespace", context, handle, storage_pb2.GetNamespaceResponse, request
        )

    async def DeleteNamespace(  # noqa: N802
        self, request: storage_pb2.DeleteNamespaceRequest, context: Context
    ) -> storage_pb2.DeleteNamespaceResponse:
        async def handle() -> storage_pb2.DeleteNamespaceResponse:
            tables = await self._registry.root.delete_namespace(request.name)
            await self._registry.drop_tables(tables)
            return storage_pb2.DeleteNamespaceResponse(code=Code.SUCCESS)

        return await self._serve(
            "DeleteNamespace", context, handle, storage_pb2.DeleteNamespaceResponse, request
        )

    async def CreateStream(  # noqa: N802
        self, request: storage_pb2.CreateStreamRequest, context: Context
    ) -> storage_pb2.CreateStreamResponse:
        async def handle() -> storage_pb2.CreateStreamResponse:
            props = await self._registry.root.create_stream(
                request.ns_name, request.name, request.stream_conf
            )
            return storage_pb2.CreateStreamResponse(code=Code.SUCCESS, stream_props=props)

        return await self._serve(
            "CreateStream", context, handle, storage_pb2.CreateStreamResponse, request
        )

    async def GetStream(  # noqa: N802
        self, request: storage_pb2.GetStreamRequest, context: Context
    ) -> storage_pb2.GetStreamResponse:
        async def handle() -> storage_pb2.GetStreamResponse:
            which = request.WhichOneof("id")
            if which == "stream_name":
                props = self._registry.root.get_stream(
                    request.stream_name.namespace_name, request.stream_name.stream_name
                )
            elif which == "stream_id":
                props = self._registry.root.get_stream_by_id(request.stream_id)
            else:
                raise IllegalOpError("GetStream needs a stream name or a stream id")
            return storage_pb2.GetStreamResponse(code=Code.SUCCESS, stream_props=props)

        return await self._serve(
            "GetStream", context, handle, storage_pb2.GetStreamResponse, request
        )

    async def DeleteStream(  # noqa: N802
        self, request: storage_pb2.DeleteStreamRequest, context: Context
    ) -> storage_pb2.DeleteStreamResponse:
        async def handle() -> storage_pb2.DeleteStreamResponse:
            props = await self._registry.root.delete_stream(request.ns_name, request.name)
            await self._registry.drop_tables([props])
            return storage_pb2.DeleteStreamResponse(code=Code.SUCCESS)

        return await self._serve(
            "DeleteStream", context, handle, storage_pb2.DeleteStreamResponse, request
        )


class MetaRangeServicer(storage_pb2_grpc.MetaRangeServiceServicer):
    """A table's meta range lives on the table's container; other servers forward."""

    def __init__(
        self,
        registry: ContainerRegistry,
        metrics: ServerMetrics | None,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._forwarder = forwarder

    async def GetActiveRanges(  # noqa: N802
        self, request: storage_pb2.GetActiveRangesRequest, context: Context
    ) -> storage_pb2.GetActiveRangesResponse:
        async def handle() -> storage_pb2.GetActiveRangesResponse:
            ranges = await self._registry.active_ranges(request.stream_id)
            lineage = await self._registry.table_lineage(request.stream_id)
            response = storage_pb2.GetActiveRangesResponse(code=Code.SUCCESS)
            for props in ranges:
                # A split's child names the ranges it descends from, parent first.
                response.ranges.add(
                    props=props,
                    type=storage_pb2.PARENTS,
                    related_ranges=lineage.get(props.range_id, ()),
                )
            return response

        async def routed() -> storage_pb2.GetActiveRangesResponse:
            return await local_or_forward(
                self._forwarder,
                context,
                handle,
                META_SERVICE + "GetActiveRanges",
                request,
                storage_pb2.GetActiveRangesResponse,
                _code,
                idempotent=True,
            )

        return await serve(
            "GetActiveRanges",
            context,
            self._metrics,
            routed,
            lambda code: storage_pb2.GetActiveRangesResponse(code=code),
            _code,
        )


class StorageContainerServicer(storage_pb2_grpc.StorageContainerServiceServicer):
    """Where each container is served: this server (standalone), or its owner in the cluster's
    assignment (`owner_of`, "host:port" or None when unassigned)."""

    def __init__(self, owner_of: Callable[[int], str | None]) -> None:
        self._owner_of = owner_of

    async def GetStorageContainerEndpoint(  # noqa: N802
        self, request: storage_pb2.GetStorageContainerEndpointRequest, context: Context
    ) -> storage_pb2.GetStorageContainerEndpointResponse:
        response = storage_pb2.GetStorageContainerEndpointResponse(status_code=Code.SUCCESS)
        for one in request.requests:
            result = response.responses.add()
            owner = self._owner_of(one.storage_container)
            if owner is None:
                result.status_code = Code.INTERNAL_SERVER_ERROR
                continue
            host, _, port = owner.rpartition(":")
            endpoint = common_pb2.Endpoint(hostname=host, port=int(port))
            result.status_code = Code.SUCCESS
            result.endpoint.storage_container_id = one.storage_container
            result.endpoint.revision = 0
            result.endpoint.rw_endpoint.CopyFrom(endpoint)
            result.endpoint.ro_endpoint.add().CopyFrom(endpoint)
        return response


class TableServicer(kv_rpc_pb2_grpc.TableServiceServicer):
    def __init__(self, ops: TableOps, metrics: ServerMetrics | None) -> None:
        self._ops = ops
        self._metrics = metrics

    async def _serve(
        self,
        method: str,
        context: Context,
        request: Any,
        op: Callable[[int, Any, Context], Awaitable[M]],
        kind: Callable[..., M],
    ) -> M:
        header = request.header

        async def handle() -> M:
            response = await op(stream_id_of(header, context), request, context)
            response.header.routing_header.CopyFrom(header)  # type: ignore[attr-defined]
            return response

        def error(code: StatusCode.ValueType) -> M:
            return kind(header=kv_rpc_pb2.ResponseHeader(code=code, routing_header=header))

        return await serve(method, context, self._metrics, handle, error, header_code)

    async def Put(  # noqa: N802
        self, request: kv_rpc_pb2.PutRequest, context: Context
    ) -> kv_rpc_pb2.PutResponse:
        return await self._serve("Put", context, request, self._ops.put, kv_rpc_pb2.PutResponse)

    async def Range(  # noqa: N802
        self, request: kv_rpc_pb2.RangeRequest, context: Context
    ) -> kv_rpc_pb2.RangeResponse:
        return await self._serve(
            "Range", context, request, self._ops.range, kv_rpc_pb2.RangeResponse
        )

    async def Delete(  # noqa: N802
        self, request: kv_rpc_pb2.DeleteRangeRequest, context: Context
    ) -> kv_rpc_pb2.DeleteRangeResponse:
        return await self._serve(
            "Delete", context, request, self._ops.delete, kv_rpc_pb2.DeleteRangeResponse
        )

    async def Txn(  # noqa: N802
        self, request: kv_rpc_pb2.TxnRequest, context: Context
    ) -> kv_rpc_pb2.TxnResponse:
        return await self._serve("Txn", context, request, self._ops.txn, kv_rpc_pb2.TxnResponse)

    async def Increment(  # noqa: N802
        self, request: kv_rpc_pb2.IncrementRequest, context: Context
    ) -> kv_rpc_pb2.IncrementResponse:
        return await self._serve(
            "Increment", context, request, self._ops.increment, kv_rpc_pb2.IncrementResponse
        )


class TableKeeperServicer(tablekeeper_pb2_grpc.TableKeeperServicer):
    def __init__(
        self, ops: TableOps, registry: ContainerRegistry, metrics: ServerMetrics | None
    ) -> None:
        self._ops = ops
        self._registry = registry
        self._metrics = metrics

    async def ServerInfo(  # noqa: N802
        self, request: tablekeeper_pb2.ServerInfoRequest, context: Context
    ) -> tablekeeper_pb2.ServerInfoResponse:
        return tablekeeper_pb2.ServerInfoResponse(
            version=SERVER_VERSION,
            num_storage_containers=self._registry.env.containers(),
            containers=self._registry.serving(),
            open_ranges=self._registry.open_ranges(),
        )

    async def Batch(  # noqa: N802
        self, request: tablekeeper_pb2.BatchRequest, context: Context
    ) -> tablekeeper_pb2.BatchResponse:
        """Run independent ops concurrently, so ops on one range share a group commit. Each
        range gets its ops in the Batch's order (two writes of one key apply as listed): the
        writes on open ranges here are queued at once, the other ops here start in order, and
        the writes on ranges another server owns go to it as one Batch per container.

        Bounds (see `BatchBudget`): more than `batch_ops_max` ops, or writes that could return
        more than `response_bytes_max` bytes of stored data, refuse the whole Batch before
        anything runs (gRPC RESOURCE_EXHAUSTED); read ops share what is left of
        `response_bytes_max`, and a read that does not fit is not executed (or its result is
        dropped) and answered with its own over-limit status, marked retryable."""

        async def handle() -> tablekeeper_pb2.BatchResponse:
            budget = BatchBudget.of(request, self._ops.limits)
            ops = list(request.ops)
            queued, refused, rest = self._submit_writes(ops, context)
            elsewhere = await self._writes_elsewhere(ops, rest, context)
            forwarded = {i for indices in elsewhere.values() for i in indices}
            here = [i for i in rest if i not in forwarded]
            later = asyncio.gather(
                *(self._one(ops[i], context, budget) for i in here),
                *(
                    self._forward_writes(container, [ops[i] for i in indices], context)
                    for container, indices in elsewhere.items()
                ),
            )
            try:
                waits: list[asyncio.Future[Any]] = [group.future for group in queued]
                for future in (*waits, later):
                    if not future.done():
                        await asyncio.wait((future,))
            except asyncio.CancelledError:
                for group in queued:
                    group.future.cancel()
                later.cancel()
                raise
            # Each op's result: a queued write's outcome, a refusal, or a BatchResult made by
            # `_one` / `_forward_writes`.
            outcomes: list[Any] = [None] * len(ops)
            for group in queued:
                group.place(outcomes)
            for i, exc in refused.items():
                outcomes[i] = exc
            answers: list[Any] = later.result()
            for i, result in zip(here, answers[: len(here)], strict=True):
                outcomes[i] = result
            for indices, sub_results in zip(elsewhere.values(), answers[len(here) :], strict=True):
                for i, result in zip(indices, sub_results, strict=True):
                    outcomes[i] = result
            response = tablekeeper_pb2.BatchResponse()
            results = response.results
            for op, outcome in zip(ops, outcomes, strict=True):
                assert outcome is not None, "every op of the Batch is answered"
                if isinstance(outcome, tablekeeper_pb2.BatchResult):
                    results.append(outcome)
                    continue
                kind = op.WhichOneof("op")
                assert kind is not None
                if isinstance(outcome, BaseException):
                    fill_result(results.add(), kind, getattr(op, kind), None, outcome)
                else:
                    fill_result(results.add(), kind, getattr(op, kind), outcome, None)
            return response

        return await serve_admin("Batch", context, handle)

    async def ScanRange(  # noqa: N802
        self, request: tablekeeper_pb2.ScanRangeRequest, context: Context
    ) -> tablekeeper_pb2.ScanRangeResponse:
        async def handle() -> tablekeeper_pb2.ScanRangeResponse:
            return await self._ops.scan_range(request, context)

        def error(code: StatusCode.ValueType) -> tablekeeper_pb2.ScanRangeResponse:
            return tablekeeper_pb2.ScanRangeResponse(header=kv_rpc_pb2.ResponseHeader(code=code))

        return await serve("ScanRange", context, self._metrics, handle, error, header_code)

    def _submit_writes(
        self, ops: list[tablekeeper_pb2.BatchOp], context: Context
    ) -> tuple[list[QueuedWrites], dict[int, BaseException], list[int]]:
        """Queue the Batch's writes that need no waiting on their ranges at once, each range's
        as one entry of its write queue (what most of a bulk load's Batch is): the queued
        groups, the ops refused on the way (by op index: a bad request, a range that refuses),
        and the indices of the other ops, in order. Once a write needs more (a range to open
        or forward to), every later write goes the general way too, after it; a range whose
        queue is full sends all its writes of the Batch that way. So each range gets the
        Batch's writes in their order. Reads always go the general way (a read in a Batch sees
        what is applied when it runs, as before)."""
        by_range: dict[Range, QueuedWrites] = {}  # in the order of their first write
        refused: dict[int, BaseException] = {}
        rest: list[int] = []
        blocked = False
        for i, op in enumerate(ops):
            kind = op.WhichOneof("op")
            if blocked or kind not in WRITE_CHECKS:
                rest.append(i)
                continue
            request = getattr(op, kind)
            try:
                range_ = self._ops.open_range_for_write(
                    kind, stream_id_of(request.header, context), request
                )
            except Exception as exc:  # the write's own outcome, as `_one` would report it
                refused[i] = exc
                continue
            if range_ is None:
                blocked = True
                rest.append(i)
                continue
            group = by_range.get(range_)
            if group is None:
                group = by_range[range_] = QueuedWrites()
            group.indices.append(i)
            group.commands.append(wal_pb2.WalCommand(**{kind: request}))
        queued: list[QueuedWrites] = []
        for range_, group in by_range.items():
            try:
                future = range_.submit_many(group.commands)
            except Exception as exc:  # the range refuses them all (not serving, split)
                refused.update((i, exc) for i in group.indices)
                continue
            if future is None:  # its queue is full: the general way waits for room
                rest.extend(group.indices)
                continue
            group.future = future
            queued.append(group)
        rest.sort()
        return queued, refused, rest

    async def _writes_elsewhere(
        self, ops: list[tablekeeper_pb2.BatchOp], indices: list[int], context: Context
    ) -> dict[int, list[int]]:
        """Of the ops at `indices`, the writes whose ranges another server owns, by container:
        each container's share is forwarded as one Batch, so its owner applies them in their
        order (one forwarded call per op would let two writes of one key race). Empty when
        nothing is forwarded from here (standalone, or this call was itself forwarded); an op
        whose routing fails is left to `_one`, which reports its error."""
        forwarder = self._ops.forwarder
        if forwarder is None or (context is not None and was_forwarded(context)):
            return {}
        registry = self._ops.registry
        elsewhere: dict[int, list[int]] = {}
        for i in indices:
            op = ops[i]
            kind = op.WhichOneof("op")
            if kind not in WRITE_CHECKS:
                continue
            request = getattr(op, kind)
            try:
                container = await registry.container_of(
                    stream_id_of(request.header, context), request.header.r_key
                )
            except Exception:
                continue
            if container not in registry.containers:
                elsewhere.setdefault(container, []).append(i)
        return elsewhere

    async def _forward_writes(
        self, container: int, ops: list[tablekeeper_pb2.BatchOp], context: Context
    ) -> list[tablekeeper_pb2.BatchResult]:
        """Forward `ops` (writes on ranges of `container`) to its owner as one Batch; their
        results, or each op answered with why the Batch could not be forwarded."""
        assert self._ops.forwarder is not None
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            response = await self._ops.forwarder.forward(
                container,
                TABLEKEEPER_SERVICE + "Batch",
                tablekeeper_pb2.BatchRequest(ops=ops),
                tablekeeper_pb2.BatchResponse,
                lambda _: 0,  # a Batch answers per op; a refusal of all of it is a gRPC status
                idempotent=False,
                context=context,
            )
            if len(response.results) == len(ops):
                for op, result in zip(ops, response.results, strict=True):
                    if result.retryable:  # perhaps routed by ranges a split replaced
                        kind = op.WhichOneof("op")
                        stream_id = getattr(op, str(kind)).header.stream_id
                        if stream_id:
                            self._ops.registry.forget_route(stream_id)
                return list(response.results)
            raise IndeterminateError(
                f"container {container}'s owner answered {len(response.results)} results for "
                f"{len(ops)} forwarded ops"
            )
        except Exception as exc:
            outcome.set_exception(exc)
        results = []
        for op in ops:
            kind = op.WhichOneof("op")
            assert kind is not None
            results.append(batch_result(kind, getattr(op, kind), outcome))
        return results

    async def _one(
        self, op: tablekeeper_pb2.BatchOp, context: Context, budget: BatchBudget
    ) -> tablekeeper_pb2.BatchResult:
        kind = op.WhichOneof("op")
        if kind is None:
            result = tablekeeper_pb2.BatchResult()
            result.put.header.code = Code.BAD_REQUEST
            return result
        request = getattr(op, kind)
        handlers: dict[str, Callable[[int, Any, Context], Awaitable[Any]]] = {
            "put": self._ops.put,
            "increment": self._ops.increment,
            "delete_range": self._ops.delete,
            "range": self._ops.range,
            "txn": self._ops.txn,
        }
        handler = handlers[kind]
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            if kind == "range":
                budget.before_read()
            response = await handler(stream_id_of(request.header, context), request, context)
            if kind == "range":
                budget.after_read(response.ByteSize())
            outcome.set_result(response)
        except Exception as exc:
            outcome.set_exception(exc)
        return batch_result(kind, request, outcome)
