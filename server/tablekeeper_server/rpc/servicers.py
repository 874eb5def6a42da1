"""gRPC servicers: each method converts the request, calls the domain, converts the result.

No business logic lives here; errors become statuses by `errors.ERROR_TABLE`, through
`rpc.status` (and, for each op of a Batch, `wire_rule`).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from tablekeeper_proto.bookkeeper import (
    common_pb2,
    kv_rpc_pb2,
    kv_rpc_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
    stream_pb2,
)
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc, wal_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import (
    BadRequestError,
    Code,
    IllegalOpError,
    IndeterminateError,
    NotServedHereError,
    ResourceLimitError,
    RouteNotFoundError,
    TableKeeperError,
    wire_rule,
)
from tablekeeper_server.metrics import ServerMetrics
from tablekeeper_server.range import scan, validation
from tablekeeper_server.range.replica import Outcome, Range
from tablekeeper_server.rpc import follower_reads
from tablekeeper_server.rpc.proxy import (
    META_SERVICE,
    ROOT_SERVICE,
    TABLE_SERVICE,
    TABLEKEEPER_SERVICE,
    Forwarder,
    local_or_forward,
    was_forwarded,
)
from tablekeeper_server.rpc.status import command_status_reason, serve, serve_admin

log = logging.getLogger(__name__)
_WRITE_CHECKS: dict[str, Callable[[Any, validation.Limits], None]] = {
    "put": validation.check_put,
    "increment": validation.check_increment,
    "delete_range": validation.check_delete,
    "txn": validation.check_txn,
}
"""The writes, by `WalCommand` field, and their checks (unary or in a Batch). In a Batch they are
queued at once when their range is open here, forwarded to a range's owner in one Batch per
container."""
_BATCH_METHODS = {
    "put": "Put",
    "increment": "Increment",
    "delete_range": "Delete",
    "range": "Range",
    "txn": "Txn",
}
Context: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type stubs)
M = TypeVar("M")
STREAM_ID_METADATA_KEY = "bk-rt-sid-bin"
SERVER_VERSION = "0.1.0"


def _code(response: Any) -> int:
    return int(response.code)


def _header_code(response: Any) -> int:
    return int(response.header.code)


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


def _stream_id(header: kv_rpc_pb2.RoutingHeader, context: Context) -> int:
    """The table id from the body's routing header, else from the `bk-rt-sid-bin` metadata."""
    if header.stream_id:
        return header.stream_id
    for key, value in context.invocation_metadata() or ():
        if key == STREAM_ID_METADATA_KEY and isinstance(value, bytes) and len(value) == 8:
            stream_id = int(struct.unpack(">q", value)[0])
            header.stream_id = stream_id
            return stream_id
    raise BadRequestError("request has no table (stream) id")


class TableOps:
    """The table operations, shared by the BookKeeper TableService and TableKeeper's Batch.

    Each is validated here, then served by the range that holds its pkey, or forwarded to the
    server that owns that range's container (cluster mode). `context` is the incoming call's
    (None for calls that must not be forwarded)."""

    def __init__(
        self,
        registry: ContainerRegistry,
        limits: validation.Limits,
        forwarder: Forwarder | None = None,
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.forwarder = forwarder

    async def _routed(
        self,
        method: str,
        req: Any,
        context: Context,
        local: Callable[[], Awaitable[M]],
        response_type: Callable[..., M],
    ) -> M:
        try:
            return await local_or_forward(
                self.forwarder,
                context,
                local,
                TABLE_SERVICE + method,
                req,
                response_type,
                _header_code,
                idempotent=method == "Range",
                passthrough_codes=lambda code: command_status_reason(method, code) is not None,
            )
        except RouteNotFoundError:
            # Perhaps routed by ranges a split replaced: read them again for the retry.
            if req.header.stream_id:
                self.registry.forget_route(req.header.stream_id)
            raise

    def _check_write(self, op: str, req: Any) -> None:
        """A write's validation, whichever way it is then served."""
        validation.check_routing(req.header, self.limits)
        _WRITE_CHECKS[op](req, self.limits)

    async def _write(
        self, stream_id: int, req: Any, op: str, context: Context, response_type: Callable[..., M]
    ) -> M:
        """Validate, route by pkey, append to the range's log as `WalCommand.<op>`, apply."""
        self._check_write(op, req)

        async def local() -> M:
            range_ = await self.registry.table_range(
                stream_id, req.header.r_key, req.header.range_id
            )
            response: M = await range_.execute(wal_pb2.WalCommand(**{op: req}))  # type: ignore[assignment]
            return response

        return await self._routed(_BATCH_METHODS[op], req, context, local, response_type)

    async def put(
        self, stream_id: int, req: kv_rpc_pb2.PutRequest, context: Context = None
    ) -> kv_rpc_pb2.PutResponse:
        return await self._write(stream_id, req, "put", context, kv_rpc_pb2.PutResponse)

    def open_range_for_write(self, kind: str, stream_id: int, req: Any) -> Range | None:
        """Where a write's local path needs no waiting: the range of `req`, open on this server
        (queue `WalCommand.<kind>` there); None when `put` / `increment` / `delete` / `txn`
        must serve it. Raises what those raise for a bad request."""
        self._check_write(kind, req)
        return self.registry.open_table_range(stream_id, req.header.r_key, req.header.range_id)

    async def increment(
        self, stream_id: int, req: kv_rpc_pb2.IncrementRequest, context: Context = None
    ) -> kv_rpc_pb2.IncrementResponse:
        return await self._write(stream_id, req, "increment", context, kv_rpc_pb2.IncrementResponse)

    async def delete(
        self, stream_id: int, req: kv_rpc_pb2.DeleteRangeRequest, context: Context = None
    ) -> kv_rpc_pb2.DeleteRangeResponse:
        return await self._write(
            stream_id, req, "delete_range", context, kv_rpc_pb2.DeleteRangeResponse
        )

    async def txn(
        self, stream_id: int, req: kv_rpc_pb2.TxnRequest, context: Context = None
    ) -> kv_rpc_pb2.TxnResponse:
        return await self._write(stream_id, req, "txn", context, kv_rpc_pb2.TxnResponse)

    async def range(
        self, stream_id: int, req: kv_rpc_pb2.RangeRequest, context: Context = None
    ) -> kv_rpc_pb2.RangeResponse:
        validation.check_range(req, self.limits)
        wish = follower_reads.requested(context)

        async def local() -> kv_rpc_pb2.RangeResponse:
            try:
                range_ = await self.registry.table_range(
                    stream_id, req.header.r_key, req.header.range_id
                )
            except NotServedHereError:
                if wish is None or self.registry.env.followers is None or was_forwarded(context):
                    raise
                return await self._follower_read(stream_id, req, wish, context)
            response = range_.read(req)
            if wish is not None:
                follower_reads.report(
                    context, "leader", range_.name.range_id, range_.applied_sequence, 0.0
                )
            return response

        return await self._routed("Range", req, context, local, kv_rpc_pb2.RangeResponse)

    async def _follower_read(
        self,
        stream_id: int,
        req: kv_rpc_pb2.RangeRequest,
        wish: follower_reads.FollowerRead,
        context: Context,
    ) -> kv_rpc_pb2.RangeResponse:
        """Serve a read from this server's follower of the range (another server owns it)."""
        follower = await self.registry.follower_of(stream_id, req.header.r_key, req.header.range_id)
        range_id = follower.name.range_id
        got = await follower.read(
            req,
            max_staleness_s=wish.max_staleness_s,
            min_applied=wish.min_applied.get(range_id, 0),
        )
        follower_reads.report(context, "follower", range_id, got.applied, got.staleness_s)
        return got.response

    async def scan_range(
        self, req: tablekeeper_pb2.ScanRangeRequest, context: Context = None
    ) -> tablekeeper_pb2.ScanRangeResponse:
        async def local() -> tablekeeper_pb2.ScanRangeResponse:
            targets = await self.registry.scan_targets(req.stream_id, req.range_id)
            if len(targets) == 1 and targets[0].range_id == req.range_id:
                range_ = await scan.open_range(self.registry, req.stream_id, targets[0])
                if range_.sealed is None:
                    return scan.scan_page(range_, req)
                # Split: read the children once the table switched to them (a sealed range
                # still being split serves its final keys).
                self.registry.forget_route(req.stream_id)
                targets = await self.registry.scan_targets(req.stream_id, req.range_id)
                if len(targets) == 1 and targets[0].range_id == req.range_id:
                    return scan.scan_page(range_, req)
            # A range a split retired: one page of each descendant (here or on its owner).
            pages = [await self._scan_descendant(req, target, context) for target in targets]
            return scan.merge_pages(pages, req)

        return await local_or_forward(
            self.forwarder,
            context,
            local,
            TABLEKEEPER_SERVICE + "ScanRange",
            req,
            tablekeeper_pb2.ScanRangeResponse,
            _header_code,
            idempotent=True,
        )

    async def _scan_descendant(
        self,
        req: tablekeeper_pb2.ScanRangeRequest,
        target: stream_pb2.RangeProperties,
        context: Context,
    ) -> tablekeeper_pb2.ScanRangeResponse:
        request = tablekeeper_pb2.ScanRangeRequest()
        request.CopyFrom(req)
        request.range_id = target.range_id
        try:
            range_ = await scan.open_range(self.registry, req.stream_id, target)
        except NotServedHereError:
            if self.forwarder is None:
                raise
            return await self.forwarder.forward(
                target.storage_container_id,
                TABLEKEEPER_SERVICE + "ScanRange",
                request,
                tablekeeper_pb2.ScanRangeResponse,
                _header_code,
                idempotent=True,
                context=context,
            )
        return scan.scan_page(range_, request)


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
            response = await op(_stream_id(header, context), request, context)
            response.header.routing_header.CopyFrom(header)  # type: ignore[attr-defined]
            return response

        def error(code: StatusCode.ValueType) -> M:
            return kind(header=kv_rpc_pb2.ResponseHeader(code=code, routing_header=header))

        return await serve(method, context, self._metrics, handle, error, _header_code)

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

        Bounds (see `_BatchBudget`): more than `batch_ops_max` ops, or writes that could return
        more than `response_bytes_max` bytes of stored data, refuse the whole Batch before
        anything runs (gRPC RESOURCE_EXHAUSTED); read ops share what is left of
        `response_bytes_max`, and a read that does not fit is not executed (or its result is
        dropped) and answered with its own over-limit status, marked retryable."""

        async def handle() -> tablekeeper_pb2.BatchResponse:
            budget = _BatchBudget.of(request, self._ops.limits)
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
                    _fill_result(results.add(), kind, getattr(op, kind), None, outcome)
                else:
                    _fill_result(results.add(), kind, getattr(op, kind), outcome, None)
            return response

        return await serve_admin("Batch", context, handle)

    async def ScanRange(  # noqa: N802
        self, request: tablekeeper_pb2.ScanRangeRequest, context: Context
    ) -> tablekeeper_pb2.ScanRangeResponse:
        async def handle() -> tablekeeper_pb2.ScanRangeResponse:
            return await self._ops.scan_range(request, context)

        def error(code: StatusCode.ValueType) -> tablekeeper_pb2.ScanRangeResponse:
            return tablekeeper_pb2.ScanRangeResponse(header=kv_rpc_pb2.ResponseHeader(code=code))

        return await serve("ScanRange", context, self._metrics, handle, error, _header_code)

    def _submit_writes(
        self, ops: list[tablekeeper_pb2.BatchOp], context: Context
    ) -> tuple[list[_QueuedWrites], dict[int, BaseException], list[int]]:
        """Queue the Batch's writes that need no waiting on their ranges at once, each range's
        as one entry of its write queue (what most of a bulk load's Batch is): the queued
        groups, the ops refused on the way (by op index: a bad request, a range that refuses),
        and the indices of the other ops, in order. Once a write needs more (a range to open
        or forward to), every later write goes the general way too, after it; a range whose
        queue is full sends all its writes of the Batch that way. So each range gets the
        Batch's writes in their order. Reads always go the general way (a read in a Batch sees
        what is applied when it runs, as before)."""
        by_range: dict[Range, _QueuedWrites] = {}  # in the order of their first write
        refused: dict[int, BaseException] = {}
        rest: list[int] = []
        blocked = False
        for i, op in enumerate(ops):
            kind = op.WhichOneof("op")
            if blocked or kind not in _WRITE_CHECKS:
                rest.append(i)
                continue
            request = getattr(op, kind)
            try:
                range_ = self._ops.open_range_for_write(
                    kind, _stream_id(request.header, context), request
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
                group = by_range[range_] = _QueuedWrites()
            group.indices.append(i)
            group.commands.append(wal_pb2.WalCommand(**{kind: request}))
        queued: list[_QueuedWrites] = []
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
            if kind not in _WRITE_CHECKS:
                continue
            request = getattr(op, kind)
            try:
                container = await registry.container_of(
                    _stream_id(request.header, context), request.header.r_key
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
            results.append(_batch_result(kind, getattr(op, kind), outcome))
        return results

    async def _one(
        self, op: tablekeeper_pb2.BatchOp, context: Context, budget: _BatchBudget
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
            response = await handler(_stream_id(request.header, context), request, context)
            if kind == "range":
                budget.after_read(response.ByteSize())
            outcome.set_result(response)
        except Exception as exc:
            outcome.set_exception(exc)
        return _batch_result(kind, request, outcome)


def _batch_result(
    kind: str, request: Any, outcome: asyncio.Future[Any]
) -> tablekeeper_pb2.BatchResult:
    """One Batch op's result from its (done) outcome: the response, or the error it raised."""
    result = tablekeeper_pb2.BatchResult()
    exc = outcome.exception()
    _fill_result(result, kind, request, None if exc is not None else outcome.result(), exc)
    return result


def _fill_result(
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
            result.error = command_status_reason(_BATCH_METHODS[kind], code) or ""
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


class _QueuedWrites:
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


class _BatchBudget:
    """The response bytes one Batch may still spend on reads.

    Writes run whatever their response size, so their worst case is reserved up front: a put or
    single-key delete with `prev_kv` may return a key and a value (`key_bytes_max +
    value_bytes_max`), a ranged delete with `prev_kv` or a txn with a read up to
    `response_bytes_max`. A Batch whose reservations exceed `response_bytes_max`, or with more
    than `batch_ops_max` ops, is refused before anything runs. Reads then share the rest: each
    reserves nothing, runs while some budget is left, and a result that does not fit is dropped
    and answered over-limit; after that no later read runs. Headers and echoed routing keys are
    not counted (they are bounded by the request's own size)."""

    def __init__(self, bytes_max: int, limits: validation.Limits) -> None:
        self.left = bytes_max
        self.limits = limits
        self.exhausted = False

    @classmethod
    def of(cls, request: tablekeeper_pb2.BatchRequest, limits: validation.Limits) -> _BatchBudget:
        n_ops = len(request.ops)
        if n_ops > limits.batch_ops_max:
            raise ResourceLimitError(
                f"Batch has {n_ops} ops; the limit is {limits.batch_ops_max} (--max-batch-ops): "
                "nothing was applied, send fewer ops per Batch"
            )
        reserved = sum(_write_response_bytes_max(op, limits) for op in request.ops)
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


def _write_response_bytes_max(op: tablekeeper_pb2.BatchOp, limits: validation.Limits) -> int:
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


def stream_conf_default() -> stream_pb2.StreamConfiguration:
    return stream_pb2.StreamConfiguration(initial_num_ranges=4, storage_type=stream_pb2.TABLE)


# ---------------------------------------------------------------------- malformed requests


class _Malformed:
    """What a request that does not parse as its method's message becomes (instead of an
    exception inside gRPC, which answers UNKNOWN and logs a traceback per request)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    parse = deserializer

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as exc:  # DecodeError, or whatever a deserializer raises
            return _Malformed(f"{type(exc).__name__}: {exc}")

    return deserialize


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Answers a request (or a message of a request stream) that is not valid protobuf for its
    method with INVALID_ARGUMENT and one warning line in the log, before any other interceptor
    or the servicer sees it. Must be the first (outermost) interceptor."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method
        # Wrapped once per method, not per call: each call's wrapping (and gRPC inspecting the
        # new functions) cost CPU on the per-call path.
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, _checked_handler(handler, method))
            self._wrapped[method] = cached
        return cached[1]


async def _refuse(method: str, malformed: _Malformed, context: Context) -> None:
    log.warning(
        "refused %s from %s: malformed request (%s)", method, context.peer(), malformed.reason
    )
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"malformed request: not a valid message for {method} ({malformed.reason})"[:1024],
    )


def _checked_handler(handler: grpc.RpcMethodHandler, method: str) -> Any:
    serializers = {
        "request_deserializer": _tolerant(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }

    async def checked(requests: Any, context: Context) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, _Malformed):
                await _refuse(method, request, context)
            yield request

    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Context) -> Any:
            if isinstance(request, _Malformed):
                await _refuse(method, request, context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **serializers)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, _Malformed):
                await _refuse(method, request, context)
            async for response in inner_us(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **serializers)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Context) -> Any:
            return await inner_su(checked(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **serializers)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
        async for response in inner_ss(checked(requests, context), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(stream_stream, **serializers)
