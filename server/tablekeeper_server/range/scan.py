"""Whole-range scans (TableKeeper's `ScanRange`): every pkey of one range of a table, in pages.

A full-table export (the Spark connector's read) needs one reader per range, and the per-pkey
`Range` request cannot list the pkeys of a range. The page itself is read by
`RangeStateMachine.scan_range`; this module opens the range and checks that it serves. A range
a split retired is read from its descendants (`scan_targets`), one page of each merged into one
page in the retired range's order (`merge_pages`): an export planned before the split (a Spark
job) reads on through it.

It knows the containers only through the two protocols below (the container registry and its
containers satisfy them), so `range/` does not import `container/`.
"""

from __future__ import annotations

from typing import Protocol

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2
from tablekeeper_server.core.keys import store_key
from tablekeeper_server.errors import BadRequestError, UnavailableError
from tablekeeper_server.range.bookkeeper_reads import SCAN_BYTES_MAX, SCAN_ROWS_MAX
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

    async def scan_targets(self, stream_id: int, range_id: int) -> list[stream_pb2.RangeProperties]:
        """The current ranges to read for `range_id`: itself, or (a split retired it) its
        descendants in hash order; `BadRequestError` for an id the table never had."""
        ...

    def container(self, container_id: int) -> RangeOpener:
        """The container `container_id` hosted here (`NotServedHereError` otherwise)."""
        ...


async def open_range(
    registry: TableRanges, stream_id: int, props: stream_pb2.RangeProperties
) -> Range:
    """The open range `props` of table `stream_id`, in its container here (opened if needed;
    `NotServedHereError` when the container is elsewhere)."""
    ttl_seconds = (await registry.stream_props(stream_id)).stream_conf.ttl_seconds
    container = registry.container(props.storage_container_id)
    return await container.data_range(stream_id, props.range_id, ttl_seconds)


def merge_pages(
    pages: list[tablekeeper_pb2.ScanRangeResponse], request: tablekeeper_pb2.ScanRangeRequest
) -> tablekeeper_pb2.ScanRangeResponse:
    """One page of a range a split retired, from one page of each of its descendants read
    from the same cursor: their rows in store order (the order the retired range had), at most
    the request's limit and `SCAN_BYTES_MAX` bytes, `more` if any descendant has more. The next
    page resumes after its last row in every descendant, so no key is skipped or repeated."""
    rows = sorted(
        (row for page in pages for row in page.rows),
        key=lambda row: store_key(row.pkey, row.kv.key),
    )
    limit = min(request.limit, SCAN_ROWS_MAX) if request.limit > 0 else SCAN_ROWS_MAX
    response = tablekeeper_pb2.ScanRangeResponse()
    if pages:
        response.header.CopyFrom(pages[0].header)
    size = 0
    for row in rows:
        row_bytes = row.ByteSize()
        if len(response.rows) >= limit or (response.rows and size + row_bytes > SCAN_BYTES_MAX):
            response.more = True
            return response
        response.rows.append(row)
        size += row_bytes
    response.more = any(page.more for page in pages)
    return response


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
