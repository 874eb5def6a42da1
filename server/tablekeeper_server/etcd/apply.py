"""Applying an etcd write (`WalCommand.etcd_txn`) inside the range's state machine.

Every etcd write (Put, DeleteRange, Txn) is logged as one etcd TxnRequest and applied here,
atomically, at the command's revision, with etcd's semantics: compares see the state before the
txn (a compare over a range holds for every key in it; on no key, VALUE fails and the others
compare against zero); ops run in order and later ops see earlier ops' writes; a txn may not write
one key twice; a put naming a lease that does not exist, or `ignore_value`/`ignore_lease` on a
missing key, refuses the whole command (nothing changes). Writes are staged with
`ApplyContext.stage_writes`, so they produce the same change events, history and lease (session)
index as every other write. The result depends only on the store and the command: replay agrees.

`EtcdApplier` is the applier (see `range.apply`) of `WalCommand.etcd_txn` and `etcd_compact`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.etcd import apply_pb2, rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import prefix_end, system_key
from tablekeeper_server.etcd.errors import EtcdError
from tablekeeper_server.etcd.keys import COMPACTED_KEY, PREFIX, span, to_kv
from tablekeeper_server.etcd.state import StoreView, compacted_revision, do_range
from tablekeeper_server.range.apply import ApplyContext, Rejected, Response
from tablekeeper_server.range.records import StoredRecord, encode_number
from tablekeeper_server.range.session_keys import session_key

TXN_OPS_MAX = 128
"""etcd's default --max-txn-ops."""

Compare = rpc_pb2.Compare
NAME = "etcd"
_BOOKKEEPING_PREFIX = system_key(b"etcd-")
"""The keyspace's own system keys (its compaction): a split could not divide them by pkey."""


class EtcdApplier:
    """Applies `WalCommand.etcd_txn` (every etcd write) and `etcd_compact`."""

    name = NAME
    ops = ("etcd_txn", "etcd_compact")
    keeps_history = True

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        if command.WhichOneof("op") == "etcd_compact":
            return apply_etcd_compact(ctx, command.etcd_compact)
        return apply_etcd_txn(ctx, command.etcd_txn)

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        return apply_pb2.ApplyResult(header=kv_rpc_pb2.ResponseHeader(code=code))  # type: ignore[arg-type]

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        return None

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        end = prefix_end(_BOOKKEEPING_PREFIX)
        if next(ctx.scan(_BOOKKEEPING_PREFIX, end), None) is not None:
            return "this range holds etcd or Oxia bookkeeping: splitting it is not supported"
        return None


class _TxnState(Protocol):
    writes: dict[bytes, StoredRecord | None]
    leases: dict[bytes, int]

    def get(self, key: bytes) -> StoredRecord | None: ...

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]: ...

    def lease(self, key: bytes) -> int: ...

    def lease_exists(self, lease: int) -> bool: ...


class _Overlay:
    """The range's state during the apply plus this txn's own writes (not yet flushed)."""

    def __init__(self, view: ApplyContext) -> None:
        self.view = view
        self.now = view.now_ms
        self.writes: dict[bytes, StoredRecord | None] = {}
        self.leases: dict[bytes, int] = {}

    def get(self, key: bytes) -> StoredRecord | None:
        if key in self.writes:
            return self.writes[key]
        return self.view.get_live(key, self.now)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        self.view.write_settled()  # earlier commands of this batch: scans read the store
        base = [(k, r) for k, r in self.view.scan(start, end) if r.is_live(self.now)]
        own = {k: r for k, r in self.writes.items() if start <= k < end}
        if not own:
            yield from base
            return
        merged: dict[bytes, StoredRecord | None] = dict(base)
        merged.update(own)
        for key in sorted(merged):
            record = merged[key]
            if record is not None:
                yield key, record

    def lease(self, key: bytes) -> int:
        if key in self.leases:
            return self.leases[key]
        if key in self.writes:
            return 0
        return self.view.session_of(key)

    def lease_exists(self, lease: int) -> bool:
        return self.view.session_exists(lease)


class _ReadState:
    """A txn without writes, run on the applied state outside the log (as etcd serves them)."""

    def __init__(self, view: StoreView) -> None:
        self.view = view
        self.writes: dict[bytes, StoredRecord | None] = {}
        self.leases: dict[bytes, int] = {}

    def get(self, key: bytes) -> StoredRecord | None:
        return self.view.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, StoredRecord]]:
        return self.view.scan(start, end)

    def lease(self, key: bytes) -> int:
        return self.view.lease(key)

    def lease_exists(self, lease: int) -> bool:
        return self.view.get(session_key(lease)) is not None


def read_only_txn(request: rpc_pb2.TxnRequest) -> bool:
    """Whether neither branch (nor a nested txn) writes."""
    for op in (*request.success, *request.failure):
        kind = op.WhichOneof("request")
        if kind in ("request_put", "request_delete_range"):
            return False
        if kind == "request_txn" and not read_only_txn(op.request_txn):
            return False
    return True


def run_read_only_txn(view: StoreView, request: rpc_pb2.TxnRequest) -> rpc_pb2.TxnResponse:
    response = _txn(_ReadState(view), request, view.revision)
    response.header.revision = view.revision
    return response


def apply_etcd_txn(view: ApplyContext, payload: bytes) -> apply_pb2.ApplyResult:
    revision = view.revision
    request = rpc_pb2.TxnRequest.FromString(payload)
    state = _Overlay(view)
    try:
        response = _txn(state, request, revision)
    except EtcdError as exc:
        return apply_pb2.ApplyResult(error=exc.name)
    for key, lease in state.leases.items():
        view.leases[key] = lease
    view.stage_writes(state.writes)
    response.header.revision = revision
    return apply_pb2.ApplyResult(response=response)


def apply_etcd_compact(view: ApplyContext, target: int) -> apply_pb2.ApplyResult:
    """etcd's Compact to `target`, applied at `revision` (it changes no key): refused if
    `target` is past the keyspace's revision before this command or not past the last
    compaction; else recorded, and the range's event history below `target` goes at this
    batch's commit (reads and watches from before it are then answered "compacted")."""
    revision = view.revision
    if target > revision - 1:
        return apply_pb2.ApplyResult(error="future_rev")
    if target <= compacted_revision(view.get(COMPACTED_KEY)):
        return apply_pb2.ApplyResult(error="compacted")
    view.write_settled()  # earlier commands of this batch: their events reach the store first
    view.put(COMPACTED_KEY, StoredRecord(revision, revision, 0, True, 0, encode_number(target)))
    if view.history is not None:
        view.history.compact(target)
    response = rpc_pb2.TxnResponse(succeeded=True)
    response.header.revision = revision
    return apply_pb2.ApplyResult(response=response)


def _txn(state: _TxnState, req: rpc_pb2.TxnRequest, revision: int) -> rpc_pb2.TxnResponse:
    succeeded = all(_compare(state, compare) for compare in req.compare)
    response = rpc_pb2.TxnResponse(succeeded=succeeded)
    for op in req.success if succeeded else req.failure:
        kind = op.WhichOneof("request")
        out = response.responses.add()
        if kind == "request_range":
            out.response_range.CopyFrom(do_range(state, op.request_range))
            out.response_range.header.revision = revision
        elif kind == "request_put":
            out.response_put.CopyFrom(_put(state, op.request_put, revision))
            out.response_put.header.revision = revision
        elif kind == "request_delete_range":
            out.response_delete_range.CopyFrom(_delete(state, op.request_delete_range))
            out.response_delete_range.header.revision = revision
        elif kind == "request_txn":
            out.response_txn.CopyFrom(_txn(state, op.request_txn, revision))
            out.response_txn.header.revision = revision
    return response


def _put(state: _TxnState, req: rpc_pb2.PutRequest, revision: int) -> rpc_pb2.PutResponse:
    key = PREFIX + req.key
    if key in state.writes:
        raise EtcdError("duplicate_key")
    prev = state.get(key)
    if (req.ignore_value or req.ignore_lease) and prev is None:
        raise EtcdError("key_not_found")
    prev_lease = state.lease(key) if prev is not None else 0
    lease = prev_lease if req.ignore_lease else req.lease
    if lease and not state.lease_exists(lease):
        raise EtcdError("lease_not_found")
    value = prev.value if req.ignore_value and prev is not None else req.value
    if prev is None:
        record = StoredRecord(revision, revision, 0, False, 0, value)
    else:
        record = StoredRecord(prev.create_revision, revision, prev.version + 1, False, 0, value)
    state.writes[key] = record
    state.leases[key] = lease
    response = rpc_pb2.PutResponse()
    if req.prev_kv and prev is not None:
        response.prev_kv.CopyFrom(to_kv(key, prev, prev_lease))
    return response


def _delete(state: _TxnState, req: rpc_pb2.DeleteRangeRequest) -> rpc_pb2.DeleteRangeResponse:
    start, end = span(req.key, req.range_end)
    if req.range_end:
        items = list(state.scan(start, end))
    else:
        record = state.get(start)
        items = [] if record is None else [(start, record)]
    response = rpc_pb2.DeleteRangeResponse(deleted=len(items))
    for key, record in items:
        if state.writes.get(key) is not None:
            raise EtcdError("duplicate_key")  # put earlier in this txn
        if req.prev_kv:
            response.prev_kvs.append(to_kv(key, record, state.lease(key)))
        state.writes[key] = None
        state.leases.pop(key, None)
    return response


def _compare(state: _TxnState, compare: rpc_pb2.Compare) -> bool:
    if compare.range_end:
        items = list(state.scan(*span(compare.key, compare.range_end)))
    else:
        record = state.get(PREFIX + compare.key)
        items = [] if record is None else [(PREFIX + compare.key, record)]
    if not items:
        # No key: a value compare fails; the others compare against zero (etcd's semantics).
        return compare.target != Compare.VALUE and _holds(compare, None, 0)
    return all(_holds(compare, record, state.lease(key)) for key, record in items)


def _holds(compare: rpc_pb2.Compare, record: StoredRecord | None, lease: int) -> bool:
    target = compare.target
    actual: bytes | int
    expected: bytes | int
    if target == Compare.VALUE:
        actual, expected = (record.value if record else b""), compare.value
    elif target == Compare.VERSION:
        actual, expected = (record.version + 1 if record else 0), compare.version
    elif target == Compare.CREATE:
        actual, expected = (record.create_revision if record else 0), compare.create_revision
    elif target == Compare.MOD:
        actual, expected = (record.mod_revision if record else 0), compare.mod_revision
    else:
        actual, expected = lease, compare.lease
    sign = (actual > expected) - (actual < expected)  # type: ignore[operator]
    result = compare.result
    if result == Compare.EQUAL:
        return sign == 0
    if result == Compare.GREATER:
        return sign > 0
    if result == Compare.LESS:
        return sign < 0
    return sign != 0
