"""Whole-range scans (TableKeeper's `ScanRange`): every pkey of one range of a table, in pages.

A full-table export (the Spark connector's read) needs one reader per range, and the per-pkey
`Range` request cannot list the pkeys of a range. The page itself is read by
`RangeStateMachine.scan_range`; this module finds the range by id and checks that it serves.
"""

from __future__ import annotations

from tablekeeper_proto.v1 import tablekeeper_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import BadRequestError, UnavailableError
from tablekeeper_server.range.replica import Range


async def table_range_by_id(registry: ContainerRegistry, stream_id: int, range_id: int) -> Range:
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
