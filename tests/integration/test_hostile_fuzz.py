"""Fuzzing every request type's numeric and size fields against a real server (issue 17): each
request gets a clear answer (a status in its body, or INVALID_ARGUMENT / RESOURCE_EXHAUSTED /
OUT_OF_RANGE), never an internal error, and the range still serves afterwards, also after a
restart, with every acknowledged write readable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tablekeeper import Client
from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration
TIMEOUT_S = 30
INTERNAL_SERVER_ERROR = 500
CLEAR_GRPC_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
}
INT64 = st.one_of(
    st.sampled_from([0, 1, -1, 2, 2**31, -(2**31), 2**62, 2**62 + 1, 2**63 - 1, -(2**63)]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
KEYS = st.one_of(
    st.sampled_from([b"", b"k", b"\x00", b"\xff" * 8]), st.binary(min_size=0, max_size=40)
)
SMALL = st.binary(max_size=64)
ENUM = st.integers(min_value=-3, max_value=12)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("fuzz") / "data", extra_args=["--max-response-bytes", "65536"]
    ).start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.stop()


@pytest.fixture(scope="module")
def table_id(server: ServerProcess) -> int:
    with Client(server.service) as client:
        client.create_namespace("fuzz")
        return client.create_table("fuzz", "t", ranges=2).table_id


def _header(table_id: int, pkey: bytes) -> kv.RoutingHeader:
    return kv.RoutingHeader(stream_id=table_id, r_key=pkey)


@st.composite
def puts(draw: st.DrawFn) -> kv.PutRequest:
    request = kv.PutRequest(
        key=draw(KEYS),
        value=draw(SMALL),
        lease=draw(INT64),
        prev_kv=draw(st.booleans()),
        ttl_ms=draw(INT64),
        sequential=draw(st.booleans()),
    )
    if draw(st.booleans()):
        request.expected_version = draw(INT64)
    return request


@st.composite
def ranges(draw: st.DrawFn) -> kv.RangeRequest:
    return kv.RangeRequest(
        key=draw(KEYS),
        range_end=draw(KEYS),
        limit=draw(INT64),
        revision=draw(st.sampled_from([0, 0, 0, 1, -1, 2**63 - 1])),
        sort_order=draw(ENUM),  # type: ignore[arg-type]
        sort_target=draw(ENUM),  # type: ignore[arg-type]
        keys_only=draw(st.booleans()),
        count_only=draw(st.booleans()),
        min_mod_revision=draw(INT64),
        max_mod_revision=draw(INT64),
        min_create_revision=draw(INT64),
        max_create_revision=draw(INT64),
    )


@st.composite
def deletes(draw: st.DrawFn) -> kv.DeleteRangeRequest:
    request = kv.DeleteRangeRequest(
        key=draw(KEYS), range_end=draw(KEYS), prev_kv=draw(st.booleans())
    )
    if draw(st.booleans()):
        request.expected_version = draw(INT64)
    return request


@st.composite
def increments(draw: st.DrawFn) -> kv.IncrementRequest:
    return kv.IncrementRequest(key=draw(KEYS), amount=draw(INT64), get_total=draw(st.booleans()))


@st.composite
def compares(draw: st.DrawFn) -> kv.Compare:
    compare = kv.Compare(result=draw(ENUM), target=draw(ENUM), key=draw(KEYS))  # type: ignore[arg-type]
    which = draw(st.sampled_from(["version", "create_revision", "mod_revision", "value", None]))
    if which == "value":
        compare.value = draw(SMALL)
    elif which is not None:
        setattr(compare, which, draw(INT64))
    return compare


@st.composite
def request_ops(draw: st.DrawFn) -> kv.RequestOp:
    kind = draw(st.sampled_from(["put", "range", "delete", "increment"]))
    if kind == "put":
        return kv.RequestOp(request_put=draw(puts()))
    if kind == "range":
        return kv.RequestOp(request_range=draw(ranges()))
    if kind == "delete":
        return kv.RequestOp(request_delete_range=draw(deletes()))
    return kv.RequestOp(request_increment=draw(increments()))


@st.composite
def txns(draw: st.DrawFn) -> kv.TxnRequest:
    return kv.TxnRequest(
        compare=draw(st.lists(compares(), max_size=3)),
        success=draw(st.lists(request_ops(), max_size=4)),
        failure=draw(st.lists(request_ops(), max_size=3)),
    )


def _call(method: Any, request: Any) -> int | None:
    """The body status of the answer, or None for a clear gRPC refusal."""
    try:
        response = method(request, timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        assert exc.code() in CLEAR_GRPC_REFUSALS, (exc.code(), exc.details(), request)
        return None
    code = int(response.header.code) if response.HasField("header") else 0
    assert code != INTERNAL_SERVER_ERROR, request
    return code


REQUESTS = st.one_of(
    puts().map(lambda r: ("Put", r)),
    ranges().map(lambda r: ("Range", r)),
    deletes().map(lambda r: ("Delete", r)),
    increments().map(lambda r: ("Increment", r)),
    txns().map(lambda r: ("Txn", r)),
)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(REQUESTS, min_size=1, max_size=4), st.sampled_from([b"p", b"q", b"r"]))
def test_every_request_gets_a_clear_answer(
    server: ServerProcess, table_id: int, requests: list[tuple[str, Any]], pkey: bytes
) -> None:
    with grpc.insecure_channel(server.target) as channel:
        table = kv_rpc_pb2_grpc.TableServiceStub(channel)
        batch_ops = []
        for method, request in requests:
            request.header.CopyFrom(_header(table_id, pkey))
            _call(getattr(table, method), request)
            field = {
                "Put": "put",
                "Range": "range",
                "Delete": "delete_range",
                "Increment": "increment",
                "Txn": "txn",
            }[method]
            batch_ops.append(tablekeeper_pb2.BatchOp(**{field: request}))
        batch = tablekeeper_pb2_grpc.TableKeeperStub(channel).Batch
        try:
            response = batch(tablekeeper_pb2.BatchRequest(ops=batch_ops), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            assert exc.code() in CLEAR_GRPC_REFUSALS, (exc.code(), exc.details())
        else:
            for result in response.results:
                kind = result.WhichOneof("result")
                if kind is not None:
                    assert getattr(result, kind).header.code != INTERNAL_SERVER_ERROR, result


def test_the_fuzzed_ranges_still_serve_after_a_restart(
    server: ServerProcess, table_id: int
) -> None:
    """Runs after the fuzzing (file order): whatever it logged, every range replays and serves."""
    with Client(server.service) as client:
        table = client.table("fuzz", "t")
        for pkey in ("p", "q", "r", "fresh"):
            table.put(pkey, "after-fuzz", "1")
    assert server.stop() == 0
    server.start()
    with Client(server.service) as client:
        table = client.table("fuzz", "t")
        for pkey in ("p", "q", "r", "fresh"):
            kv_ = table.get(pkey, "after-fuzz")
            assert kv_ is not None and kv_.value == b"1"
            table.put(pkey, "after-restart", "2")
    assert "Traceback" not in server.log_path.read_text(errors="replace"), server.log_tail()
