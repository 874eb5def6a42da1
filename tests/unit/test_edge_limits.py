"""The request limits every front-end shares (`edge.limits`): one bound for a key, a value and a
whole request, answered in each protocol's terms (etcd's "request is too large", Oxia's
INVALID_ARGUMENT / RESOURCE_EXHAUSTED, BookKeeper's INVALID_KEY / BAD_REQUEST)."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.etcd import rpc_pb2
from tablekeeper_server.edge import limits as edge
from tablekeeper_server.errors import BadRequestError, InvalidKeyError
from tablekeeper_server.etcd.errors import EtcdError
from tablekeeper_server.etcd.servicers import _check_put, _check_request_size, _check_txn
from tablekeeper_server.range import validation
from tablekeeper_server.range.limits import Limits

LIMITS = Limits(key_bytes_max=100, value_bytes_max=1000)


def test_the_bounds_and_their_reasons() -> None:
    assert edge.request_bytes_max(LIMITS) == 1000 + 200 + 1024 * 1024
    assert edge.message_bytes_max(LIMITS) == edge.request_bytes_max(LIMITS) + 512 * 1024
    assert edge.key_refusal(100, LIMITS) is None
    assert edge.key_refusal(101, LIMITS) == ("key is 101 bytes; the limit is 100 (--max-key-bytes)")
    assert edge.value_refusal(1000, LIMITS) is None
    assert "--max-value-bytes" in (edge.value_refusal(1001, LIMITS) or "")
    bound = edge.request_bytes_max(LIMITS)
    assert edge.request_refusal(bound, LIMITS) is None
    assert f"the limit is {bound}" in (edge.request_refusal(bound + 1, LIMITS) or "")
    assert edge.packet_refusal(bound, LIMITS) is None
    assert edge.packet_refusal(bound + 1, LIMITS) is not None


@pytest.mark.parametrize(
    "put",
    [
        rpc_pb2.PutRequest(key=b"k" * 101, value=b"v"),  # etcd has no key limit but its request's
        rpc_pb2.PutRequest(key=b"k", value=b"v" * 1001),
    ],
)
def test_etcd_refuses_a_put_over_a_shared_limit_as_too_large(put: rpc_pb2.PutRequest) -> None:
    alone = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_put=put)])
    nested = rpc_pb2.TxnRequest(failure=[rpc_pb2.RequestOp(request_txn=alone)])
    with pytest.raises(EtcdError) as refused:
        _check_put(put, LIMITS)
    assert refused.value.message == "etcdserver: request is too large"
    assert refused.value.code.name == "INVALID_ARGUMENT"
    for txn in (alone, nested):
        with pytest.raises(EtcdError) as refused:
            _check_txn(txn, LIMITS)
        assert refused.value.name == "request_too_large"


def test_etcd_takes_a_put_at_the_limits_and_refuses_a_txn_over_the_request_bound() -> None:
    at_limits = rpc_pb2.PutRequest(key=b"k" * 100, value=b"v" * 1000)
    _check_put(at_limits, LIMITS)
    _check_request_size(at_limits, LIMITS)
    many = rpc_pb2.TxnRequest(
        success=[
            rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=b"k%d" % i, value=b"v" * 1000))
            for i in range(128)
        ]
    )
    _check_txn(many, LIMITS)
    _check_request_size(many, LIMITS)  # 128 KiB: under the bound
    # 128 values of 9000 bytes: each fits, the whole (1.1 MiB) is over 9000 + 200 + 1 MiB.
    larger = Limits(key_bytes_max=100, value_bytes_max=9000)
    for op in many.success:
        op.request_put.value = b"v" * 9000
    _check_txn(many, larger)
    with pytest.raises(EtcdError) as refused:
        _check_request_size(many, larger)
    assert refused.value.name == "request_too_large"


def test_bookkeeper_holds_keys_and_values_to_the_same_numbers() -> None:
    validation.check_put(kv_rpc_pb2.PutRequest(key=b"k" * 100, value=b"v" * 1000), LIMITS)
    with pytest.raises(InvalidKeyError):
        validation.check_put(kv_rpc_pb2.PutRequest(key=b"k" * 101), LIMITS)
    with pytest.raises(BadRequestError):
        validation.check_put(kv_rpc_pb2.PutRequest(key=b"k", value=b"v" * 1001), LIMITS)
