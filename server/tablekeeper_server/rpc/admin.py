"""The Admin service: checkpoints on demand and per-range status (for `tablekeeper admin`), and
listings of namespaces and tables (for `tablekeeper ns list` / `table list`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tablekeeper_proto.v1 import admin_pb2, admin_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import InvalidNamespaceNameError
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.proxy import RemoteCatalogClient, local_or_forward
from tablekeeper_server.rpc.status import serve, serve_admin

_ADMIN_SERVICE = "/tablekeeper.v1.Admin/"
M = TypeVar("M")


def _code(response: Any) -> int:
    return int(response.code)


def range_status(range_: Range, clock: Clock) -> admin_pb2.RangeStatus:
    status = admin_pb2.RangeStatus(
        container_id=range_.name.container_id,
        stream_id=range_.name.stream_id,
        range_id=range_.name.range_id,
        applied_sequence=range_.applied_sequence,
        wal_bytes=range_.wal_bytes(),
        estimated_keys=range_.estimate_num_keys(),
        checkpoint_age_ms=-1,
        error=range_.failure or "",
    )
    checkpointer = range_.checkpointer
    if checkpointer is not None:
        stats = checkpointer.stats
        status.restored_from = stats.restored_from
        if stats.count:
            status.checkpoint_sequence = stats.applied_sequence
            status.checkpoint_age_ms = clock.now_ms() - stats.created_at_ms
            status.checkpoint_seconds = stats.duration_s
            status.checkpoint_bytes_uploaded = stats.bytes_uploaded
            status.checkpoint_files_uploaded = stats.files_uploaded
            status.checkpoint_files_reused = stats.files_reused
    return status


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(
        self, registry: ContainerRegistry, *, checkpoint_store: str, interval_s: float
    ) -> None:
        self._registry = registry
        self._checkpoint_store = checkpoint_store
        self._interval_s = interval_s

    async def Checkpoint(  # noqa: N802
        self, request: admin_pb2.CheckpointRequest, context: Any
    ) -> admin_pb2.CheckpointResponse:
        async def handle() -> admin_pb2.CheckpointResponse:
            ranges = await self._registry.checkpoint(request.stream_id)
            clock = self._registry.env.clock
            return admin_pb2.CheckpointResponse(ranges=[range_status(r, clock) for r in ranges])

        return await serve_admin("Checkpoint", context, handle)

    async def Status(  # noqa: N802
        self, request: admin_pb2.StatusRequest, context: Any
    ) -> admin_pb2.StatusResponse:
        clock = self._registry.env.clock
        ranges = sorted(
            self._registry.all_ranges(),
            key=lambda r: (r.name.container_id, r.name.stream_id, r.name.range_id),
        )
        return admin_pb2.StatusResponse(
            ranges=[range_status(r, clock) for r in ranges],
            num_storage_containers=self._registry.env.num_containers,
            checkpoint_store=self._checkpoint_store,
            checkpoint_interval_s=self._interval_s,
        )

    async def ListNamespaces(  # noqa: N802
        self, request: admin_pb2.ListNamespacesRequest, context: Any
    ) -> admin_pb2.ListNamespacesResponse:
        async def local() -> admin_pb2.ListNamespacesResponse:
            found = sorted(self._registry.root.namespaces(), key=lambda p: p.namespace_name)
            return admin_pb2.ListNamespacesResponse(namespaces=found)

        return await self._from_root(
            "ListNamespaces", context, request, local, admin_pb2.ListNamespacesResponse
        )

    async def ListTables(  # noqa: N802
        self, request: admin_pb2.ListTablesRequest, context: Any
    ) -> admin_pb2.ListTablesResponse:
        async def local() -> admin_pb2.ListTablesResponse:
            if not request.namespace:
                raise InvalidNamespaceNameError("ListTables needs a namespace")
            tables = self._registry.root.streams(request.namespace)
            found = sorted(tables, key=lambda p: p.stream_name)
            return admin_pb2.ListTablesResponse(tables=found)

        return await self._from_root(
            "ListTables", context, request, local, admin_pb2.ListTablesResponse
        )

    async def _from_root(
        self,
        method: str,
        context: Any,
        request: Any,
        local: Callable[[], Awaitable[M]],
        response_type: Callable[..., M],
    ) -> M:
        """Answer from the root range here, or forward to its owner (cluster mode), with
        BookKeeper's error convention (see `rpc/status.serve`). Listings only read, so sending
        one again after a lost answer is safe."""
        remote = self._registry.remote
        forwarder = remote.forwarder if isinstance(remote, RemoteCatalogClient) else None

        async def routed() -> M:
            return await local_or_forward(
                forwarder,
                context,
                local,
                _ADMIN_SERVICE + method,
                request,
                response_type,
                _code,
                idempotent=True,
            )

        return await serve(
            method,
            context,
            None,
            routed,
            lambda code: response_type(code=code),
            _code,
        )
