"""Whole-range scans (TableKeeper's `ScanRange`): every pkey of one range of a table, in pages.

A full-table export (the Spark connector's read) needs one reader per range, and the per-pkey
`Range` request cannot list the pkeys of a range. The page itself is read by
`RangeStateMachine.scan_range`; this module finds the range by id and checks that it serves.

It knows the containers only through the two protocols below (the container registry and its
containers satisfy them), so `range/` does not import `container/`.
"""

from __future__ import annotations

from typing import Protocol

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2
from tablekeeper_server.errors import BadRequestError, UnavailableError
from tablekeeper_server.range.replica import Range


class RangeOpener(Protocol):
    """What hosts a table's ranges (a storage container)."""

    async def data_range(self, stream_id: int, range_id: int, ttl_seconds: int) -> Range:
        """The open range (stream_id, range_id), opening it on first use."""
        ...


class TableRanges(Protocol):
    """Where a table's properties, its ranges and their containers are found (the registry)."""

    async def stream_props(self, stream_id: int) -> stream_pb2.StreamProperties:
        """The table's properties; `StreamNotFoundError` for an unknown table."""
        ...

    async def active_ranges(self, stream_id: int) -> list[stream_pb2.RangeProperties]:
        """The table's active ranges."""
        ...

    def container(self, container_id: int) -> RangeOpener:
        """The container `container_id` hosted here (`NotServedHereError` otherwise)."""
        ...


async def table_range_by_id(registry: TableRanges, stream_id: int, range_id: int) -> Range:
    """The open range `range_id` of table `stream_id` (opened if needed).

    Raises `StreamNotFoundError` for an unknown table and `BadRequestError` for a range id the
    table does not have.
    """
    props = await registry.stream_props(stream_id)
    for range_props in await registry.active_ranges(stream_id):
        if range_props.range_id == range_id:
            container = registry.container(range_props.storage_container_id)
            return await container.data_range(stream_id, range_id, props.stream_conf.ttl_seconds)
    raise BadRequestError(f"table {stream_id} has no active range {range_id}")


def scan_page(
    range_: Range, request: tablekeeper_pb2.ScanRangeRequest
) -> tablekeeper_pb2.ScanRangeResponse:
    """One page of `range_`, from its applied state (what `Range.read` serves)."""
    # Range keeps its state machine and clock private; this reads them the way `Range.read`
    # does. (A `Range.scan_range` method belongs beside `read` once replica.py's checkpoint
    # rework has landed; it is kept out of that file until then.)
    sm = range_._sm
    if sm is None or not range_._accepting or range_.failed:
        raise UnavailableError(f"range {range_.name.log_name} is not serving")
    if request.limit < 0:
        raise BadRequestError("limit must be >= 0")
    return sm.scan_range(request, range_._clock.now_ms())
