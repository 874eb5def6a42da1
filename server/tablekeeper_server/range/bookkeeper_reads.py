"""BookKeeper's reads of a range's applied state: Range (with paging and a shared byte budget)
and ScanRange, plus the conversions the BookKeeper applier and the watch service share.

A scan response stops at whichever limit comes first (`SCAN_ROWS_MAX` keys, the page's bytes);
`more` tells the caller to continue. Reads see the applied state only: exactly what the range
acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tablekeeper_proto.bookkeeper import kv_pb2, kv_rpc_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2
from tablekeeper_server.core.keys import (
    SYSTEM_PREFIX,
    pkey_prefix,
    prefix_end,
    split_store_key,
    store_key,
)
from tablekeeper_server.errors import Code
from tablekeeper_server.range.records import StoredRecord

# A scan response stops at whichever limit comes first; `more` tells the caller to continue.
SCAN_ROWS_MAX = 10_000
SCAN_BYTES_MAX = 3 * 1024 * 1024
RESPONSE_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
"""What one response may carry unless the server says otherwise (`Limits.response_bytes_max`)."""
ROW_OVERHEAD_BYTES = 48
"""What a returned key costs besides its key and value bytes (revisions, version, framing): so
that a page of many tiny keys is counted too."""

Getter = Callable[[bytes], StoredRecord | None]
Scanner = Callable[[bytes, bytes], Iterator[tuple[bytes, StoredRecord]]]


def key_span(prefix: bytes, key: bytes, range_end: bytes) -> tuple[bytes, bytes]:
    """The store interval [start, end) of a request's `key`..`range_end` within one pkey.

    `range_end` is inclusive (BookKeeper's semantics). An empty `range_end` means the single key;
    `range_end == b"\\x00"` means "to the end of the pkey" (etcd's convention, honoured here).
    """
    start = prefix + key
    if not range_end:
        return start, start + b"\x00"
    if range_end == b"\x00":
        return start, prefix_end(prefix)
    return start, prefix + range_end + b"\x00"


def to_key_value(lkey: bytes, record: StoredRecord, *, keys_only: bool = False) -> kv_pb2.KeyValue:
    kv = kv_pb2.KeyValue(
        key=lkey,
        create_revision=record.create_revision,
        mod_revision=record.mod_revision,
        version=record.version,
        is_number=record.is_number,
        expire_time=record.expire_ms,
    )
    if record.is_number:
        kv.number_value = record.number
    if not keys_only:
        kv.value = record.value
    return kv


_SUCCESS = Code.SUCCESS
"""Looked up once: reading a value off a protobuf enum wrapper is a Python-level call."""


def header(code: int) -> kv_rpc_pb2.ResponseHeader:
    """A response header with status `code`."""
    return kv_rpc_pb2.ResponseHeader(code=code)  # type: ignore[arg-type]


class ReadBudget:
    """What a group of reads (the range reads of one txn; the Range ops of one Batch RPC) may
    still carry, in bytes. Each read given it takes what it returns from `remaining`; a key that
    does not fit ends that read early (`more = true`) and sets `exceeded`, so the work a group
    does stays bounded however many reads it has."""

    __slots__ = ("exceeded", "remaining")

    def __init__(self, total: int) -> None:
        self.remaining = total
        self.exceeded = False


def row_bytes(key: bytes, record: StoredRecord, keys_only: bool) -> int:
    return len(key) + (0 if keys_only else len(record.value)) + ROW_OVERHEAD_BYTES


def _matches(req: kv_rpc_pb2.RangeRequest, record: StoredRecord) -> bool:
    if req.min_mod_revision > 0 and record.mod_revision < req.min_mod_revision:
        return False
    if req.max_mod_revision > 0 and record.mod_revision > req.max_mod_revision:
        return False
    if req.min_create_revision > 0 and record.create_revision < req.min_create_revision:
        return False
    return not (req.max_create_revision > 0 and record.create_revision > req.max_create_revision)


def page_bytes(response_bytes_max: int) -> int:
    """The bytes one scan page (Range or ScanRange) carries at most."""
    return min(SCAN_BYTES_MAX, response_bytes_max)


def scan_range(
    scan: Scanner, req: tablekeeper_pb2.ScanRangeRequest, now_ms: int, page: int
) -> tablekeeper_pb2.ScanRangeResponse:
    """One page of every live key of the range, every pkey, in store order, resuming after
    `req.start_after`. The range's own bookkeeping keys (`SYSTEM_PREFIX`) are never seen.
    A page holds at most `SCAN_ROWS_MAX` keys and `page` bytes (one larger key goes alone)."""
    start = b""
    if req.HasField("start_after"):
        start = store_key(req.start_after.pkey, req.start_after.lkey) + b"\x00"
    limit = min(req.limit, SCAN_ROWS_MAX) if req.limit > 0 else SCAN_ROWS_MAX
    response = tablekeeper_pb2.ScanRangeResponse(header=header(_SUCCESS))
    rows = response.rows
    size = 0
    for key, record in scan(start, SYSTEM_PREFIX):
        if not record.is_live(now_ms):
            continue
        size_of_row = row_bytes(key, record, req.keys_only)
        if len(rows) >= limit or (rows and size + size_of_row > page):
            response.more = True
            break
        pkey, lkey = split_store_key(key)
        row = rows.add()
        row.pkey = pkey
        row.kv.CopyFrom(to_key_value(lkey, record, keys_only=req.keys_only))
        size += size_of_row
    return response


def read_range(
    get: Getter,
    scan: Scanner,
    req: kv_rpc_pb2.RangeRequest,
    now: int,
    response_bytes_max: int,
    budget: ReadBudget | None = None,
) -> kv_rpc_pb2.RangeResponse:
    """A Range request. A scan stops early (`more = true`) at `limit`, `SCAN_ROWS_MAX` keys
    or the page's bytes; a single key larger than a page is returned alone. Inside a txn,
    `budget` is what the txn's reads may still carry: a key that does not fit ends the read
    with `more = true` and marks the budget exceeded."""
    prefix = pkey_prefix(req.header.r_key)
    response = kv_rpc_pb2.RangeResponse(header=header(_SUCCESS))
    bound = response_bytes_max if budget is None else budget.remaining
    if not req.range_end:
        record = get(prefix + req.key)
        if record is not None and record.is_live(now) and _matches(req, record):
            size_of_row = 0 if req.count_only else row_bytes(req.key, record, req.keys_only)
            if budget is not None and size_of_row > bound:
                budget.exceeded = True
                response.more = True
                return response
            response.count = 1
            if not req.count_only:
                response.kvs.append(to_key_value(req.key, record, keys_only=req.keys_only))
            if budget is not None:
                budget.remaining -= size_of_row
        return response
    start, end = key_span(prefix, req.key, req.range_end)
    limit = req.limit if req.limit > 0 else 0
    page = min(SCAN_BYTES_MAX, bound)
    count = 0
    size = 0
    for key, record in scan(start, end):
        if not record.is_live(now) or not _matches(req, record):
            continue
        if req.count_only:
            count += 1
            continue
        if (limit and count >= limit) or count >= SCAN_ROWS_MAX:
            response.more = True
            break
        lkey = key[len(prefix) :]
        size_of_row = row_bytes(lkey, record, req.keys_only)
        # A page is full, unless this is its first key: that one goes alone (a scan must
        # make progress), within the budget if there is one. A key the budget cannot take
        # means the group's reads exceed their bound.
        first = count == 0 and (budget is None or size_of_row <= bound)
        if size + size_of_row > page and not first:
            if budget is not None and size + size_of_row > bound:
                budget.exceeded = True
            response.more = True
            break
        response.kvs.append(to_key_value(lkey, record, keys_only=req.keys_only))
        count += 1
        size += size_of_row
    if budget is not None:
        budget.remaining -= size
    response.count = count
    return response
