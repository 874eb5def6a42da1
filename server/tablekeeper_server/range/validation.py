"""Checks a request must pass before it is appended to a range's log.

Only stateless checks live here (sizes, empty keys, unsupported options, numbers out of what a
stored record can hold, enum values this server does not know); anything that depends on the
stored state is decided when the command is applied, so replay reaches the same answer. A request
these checks pass is always encodable into a log record (its size is bounded by the gRPC message
limit, far below what the log's framing holds) and always applies (the state machine is total:
see `RangeStateMachine.apply_batch`).
"""

from __future__ import annotations

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_server.core.keys import SEQUENCE_DIGITS
from tablekeeper_server.errors import BadRequestError, InvalidKeyError
from tablekeeper_server.range.limits import Limits

TTL_MS_MAX = 2**62
"""Largest per-key TTL (about 146 million years): expiry = command time + TTL must fit the
signed 64-bit expiry of a stored record, with room for any clock this side of that."""
_SORT_ORDERS = frozenset(kv_rpc_pb2.RangeRequest.SortOrder.values())
_SORT_TARGETS = frozenset(kv_rpc_pb2.RangeRequest.SortTarget.values())
_COMPARE_RESULTS = frozenset(kv_rpc_pb2.Compare.CompareResult.values())
_COMPARE_FIELD = {
    kv_rpc_pb2.Compare.VERSION: "version",
    kv_rpc_pb2.Compare.CREATE: "create_revision",
    kv_rpc_pb2.Compare.MOD: "mod_revision",
    kv_rpc_pb2.Compare.VALUE: "value",
}


def _check_pkey(header: kv_rpc_pb2.RoutingHeader, limits: Limits) -> None:
    if len(header.r_key) > limits.key_bytes_max:
        raise InvalidKeyError(
            f"routing key is {len(header.r_key)} bytes; the limit is {limits.key_bytes_max}"
        )


def _check_key(key: bytes, limits: Limits, *, allow_empty: bool = False) -> None:
    if not key and not allow_empty:
        raise InvalidKeyError("key is empty")
    if len(key) > limits.key_bytes_max:
        raise InvalidKeyError(f"key is {len(key)} bytes; the limit is {limits.key_bytes_max}")


def check_put(req: kv_rpc_pb2.PutRequest, limits: Limits) -> None:
    _check_key(req.key, limits, allow_empty=req.sequential)
    if req.sequential and len(req.key) + SEQUENCE_DIGITS > limits.key_bytes_max:
        raise InvalidKeyError(
            f"a sequential key prefix may be at most {limits.key_bytes_max - SEQUENCE_DIGITS} bytes"
        )
    if req.ttl_ms < 0:
        raise BadRequestError("ttl_ms must be >= 0 (0 = the table's TTL)")
    if req.ttl_ms > TTL_MS_MAX:
        raise BadRequestError(f"ttl_ms must be at most {TTL_MS_MAX} (0 = the table's TTL)")
    if len(req.value) > limits.value_bytes_max:
        raise BadRequestError(
            f"value is {len(req.value)} bytes; the limit is {limits.value_bytes_max}"
        )
    if req.lease < 0:
        raise BadRequestError("lease must be a session id (> 0), or 0 for none")
    if req.ignore_value or req.ignore_lease:
        raise BadRequestError("ignore_value and ignore_lease are not supported")
    if req.HasField("expected_version") and req.expected_version < -1:
        raise BadRequestError("expected_version must be -1 (absent) or a version >= 0")


def check_increment(req: kv_rpc_pb2.IncrementRequest, limits: Limits) -> None:
    _check_key(req.key, limits)


def check_delete(req: kv_rpc_pb2.DeleteRangeRequest, limits: Limits) -> None:
    _check_key(req.key, limits, allow_empty=bool(req.range_end))
    _check_key(req.range_end, limits, allow_empty=True)
    if req.HasField("expected_version"):
        if req.range_end:
            raise BadRequestError("expected_version applies to one key, not a range_end")
        if req.expected_version < 0:
            raise BadRequestError("a delete's expected_version must be a version >= 0")


def check_range(req: kv_rpc_pb2.RangeRequest, limits: Limits) -> None:
    _check_pkey(req.header, limits)
    _check_key(req.key, limits, allow_empty=bool(req.range_end))
    _check_key(req.range_end, limits, allow_empty=True)
    # limit <= 0 means "no limit", as BookKeeper's server reads it: the Java client's default read
    # options send -1.
    if req.revision:
        raise BadRequestError("reads at a past revision are not supported (no history is kept)")
    if req.sort_order not in _SORT_ORDERS or req.sort_target not in _SORT_TARGETS:
        raise BadRequestError(
            f"unknown sort_order {req.sort_order} or sort_target {req.sort_target}"
        )
    if req.sort_order == kv_rpc_pb2.RangeRequest.DESCEND or (
        req.sort_order == kv_rpc_pb2.RangeRequest.ASCEND
        and req.sort_target != kv_rpc_pb2.RangeRequest.KEY
    ):
        raise BadRequestError("only ascending key order is supported")


def check_txn(req: kv_rpc_pb2.TxnRequest, limits: Limits) -> None:
    n_ops = len(req.compare) + len(req.success) + len(req.failure)
    if n_ops > limits.txn_ops_max:
        raise BadRequestError(
            f"txn has {n_ops} compares and ops; the limit is {limits.txn_ops_max}"
        )
    for compare in req.compare:
        _check_compare(compare, limits)
    for op in list(req.success) + list(req.failure):
        kind = op.WhichOneof("request")
        if kind == "request_put":
            check_put(op.request_put, limits)
        elif kind == "request_delete_range":
            check_delete(op.request_delete_range, limits)
        elif kind == "request_range":
            check_range(op.request_range, limits)
        elif kind == "request_increment":
            check_increment(op.request_increment, limits)
        else:
            raise BadRequestError("txn op has no request")


def _check_compare(compare: kv_rpc_pb2.Compare, limits: Limits) -> None:
    _check_key(compare.key, limits)
    if compare.result not in _COMPARE_RESULTS:
        raise BadRequestError(f"unknown compare result {compare.result}")
    field = _COMPARE_FIELD.get(compare.target)
    if field is None:
        raise BadRequestError(f"unknown compare target {compare.target}")
    given = compare.WhichOneof("target_union")
    if given is None and compare.target != compare.VALUE:
        raise BadRequestError("a compare on version, create or mod needs a value to compare")
    if given is not None and given != field:
        raise BadRequestError(f"a compare on {field} carries {given} instead")
    if len(compare.value) > limits.value_bytes_max:
        raise BadRequestError(
            f"compare value is {len(compare.value)} bytes; the limit is {limits.value_bytes_max}"
        )


def check_routing(header: kv_rpc_pb2.RoutingHeader, limits: Limits) -> None:
    _check_pkey(header, limits)
