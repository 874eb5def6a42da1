"""The Batch RPC's bounds: ops per Batch, worst-case response bytes of its writes reserved up
front, reads sharing what is left."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2
from tablekeeper_server.errors import ResourceLimitError
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.rpc.batch import BatchBudget, write_response_bytes_max

pytestmark = pytest.mark.unit

LIMITS = Limits(
    key_bytes_max=1000, value_bytes_max=9000, response_bytes_max=50_000, batch_ops_max=5
)


def op(**kind: object) -> tablekeeper_pb2.BatchOp:
    return tablekeeper_pb2.BatchOp(**kind)  # type: ignore[arg-type]


def put(prev_kv: bool = False) -> tablekeeper_pb2.BatchOp:
    return op(put=kv_rpc_pb2.PutRequest(key=b"k", value=b"v", prev_kv=prev_kv))


def test_worst_case_response_of_writes() -> None:
    assert write_response_bytes_max(put(), LIMITS) == 0
    assert write_response_bytes_max(put(prev_kv=True), LIMITS) == 10_000
    ranged = kv_rpc_pb2.DeleteRangeRequest(key=b"a", range_end=b"z", prev_kv=True)
    assert write_response_bytes_max(op(delete_range=ranged), LIMITS) == 50_000
    single = kv_rpc_pb2.DeleteRangeRequest(key=b"a", prev_kv=True)
    assert write_response_bytes_max(op(delete_range=single), LIMITS) == 10_000
    read = kv_rpc_pb2.RequestOp(request_range=kv_rpc_pb2.RangeRequest(key=b"a"))
    assert write_response_bytes_max(op(txn=kv_rpc_pb2.TxnRequest(success=[read])), LIMITS) == 50_000
    writes = kv_rpc_pb2.TxnRequest(
        success=[kv_rpc_pb2.RequestOp(request_put=kv_rpc_pb2.PutRequest(key=b"k", prev_kv=True))]
    )
    assert write_response_bytes_max(op(txn=writes), LIMITS) == 10_000
    assert write_response_bytes_max(op(range=kv_rpc_pb2.RangeRequest(key=b"a")), LIMITS) == 0


def test_too_many_ops_or_too_much_reserved_is_refused_whole() -> None:
    with pytest.raises(ResourceLimitError, match="--max-batch-ops"):
        BatchBudget.of(tablekeeper_pb2.BatchRequest(ops=[put()] * 6), LIMITS)
    ranged = kv_rpc_pb2.DeleteRangeRequest(key=b"a", range_end=b"z", prev_kv=True)
    over = [put(prev_kv=True), op(delete_range=ranged)]  # 60,000 > 50,000
    with pytest.raises(ResourceLimitError, match="--max-response-bytes"):
        BatchBudget.of(tablekeeper_pb2.BatchRequest(ops=over), LIMITS)
    at_bound = BatchBudget.of(tablekeeper_pb2.BatchRequest(ops=[put(prev_kv=True)] * 5), LIMITS)
    assert at_bound.left == 0
    budget = BatchBudget.of(tablekeeper_pb2.BatchRequest(ops=[put(prev_kv=True)] * 2), LIMITS)
    assert budget.left == 30_000


def test_reads_share_the_rest_and_stop_once_one_did_not_fit() -> None:
    budget = BatchBudget.of(tablekeeper_pb2.BatchRequest(ops=[put()] * 3), LIMITS)
    budget.before_read()
    budget.after_read(30_000)
    budget.before_read()
    with pytest.raises(ResourceLimitError, match="read not executed"):
        budget.after_read(30_000)
    with pytest.raises(ResourceLimitError):
        budget.before_read()  # nothing runs after the bound was reached
