"""Where a table operation is served: routing by pkey to the range that holds it, forwarding
to the owner of that range's container (cluster mode), reads from this server's follower of a
range owned elsewhere, and scans of a range a split retired (one page of each descendant,
merged). Shared by the BookKeeper TableService and TableKeeper's own service
(`rpc.servicers`), which only convert requests and answers."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, stream_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2, wal_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import BadRequestError, NotServedHereError, RouteNotFoundError
from tablekeeper_server.range import scan, validation
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc import follower_reads
from tablekeeper_server.rpc.proxy import (
    TABLE_SERVICE,
    TABLEKEEPER_SERVICE,
    Forwarder,
    local_or_forward,
    was_forwarded,
)
from tablekeeper_server.rpc.status import command_status_reason

Context: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type stubs)
M = TypeVar("M")
STREAM_ID_METADATA_KEY = "bk-rt-sid-bin"
WRITE_CHECKS: dict[str, Callable[[Any, Limits], None]] = {
    "put": validation.check_put,
    "increment": validation.check_increment,
    "delete_range": validation.check_delete,
    "txn": validation.check_txn,
}
"""The writes, by `WalCommand` field, and their checks (unary or in a Batch). In a Batch they are
queued at once when their range is open here, forwarded to a range's owner in one Batch per
container."""
TABLE_METHODS = {
    "put": "Put",
    "increment": "Increment",
    "delete_range": "Delete",
    "range": "Range",
    "txn": "Txn",
}
"""The TableService method of each op (by `WalCommand` / `BatchOp` field): forwarded calls and
status reasons name it."""


def header_code(response: Any) -> int:
    return int(response.header.code)


def stream_id_of(header: kv_rpc_pb2.RoutingHeader, context: Context) -> int:
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
        limits: Limits,
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
                header_code,
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
        WRITE_CHECKS[op](req, self.limits)

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

        return await self._routed(TABLE_METHODS[op], req, context, local, response_type)

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
            header_code,
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
                header_code,
                idempotent=True,
                context=context,
            )
        return scan.scan_page(range_, request)
