"""The Admin service: checkpoints on demand and per-range status (for `tablekeeper admin`)."""

from __future__ import annotations

from typing import Any

from tablekeeper_proto.v1 import admin_pb2, admin_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.status import serve_admin


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
