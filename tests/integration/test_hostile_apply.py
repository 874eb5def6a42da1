"""Hostile requests against a real server (issue 17): a number apply cannot hold is refused before
it is logged and never poisons its range, a txn applies its whole branch or nothing, and one
Range or Txn response stays within `--max-response-bytes`."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tablekeeper import Client, TableKeeperError
from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration

RESPONSE_BYTES_MAX = 64 * 1024
TIMEOUT_S = 30


def _routing(table_id: int, pkey: bytes) -> kv.RoutingHeader:
    return kv.RoutingHeader(stream_id=table_id, r_key=pkey)


def _trailer(call: grpc.Call) -> str:
    return str(dict(call.trailing_metadata() or ()).get("tk-error", ""))


def _get(stub: kv_rpc_pb2_grpc.TableServiceStub, table_id: int, key: bytes) -> kv.RangeResponse:
    request = kv.RangeRequest(key=key, header=_routing(table_id, b"p"))
    response: kv.RangeResponse = stub.Range(request, timeout=TIMEOUT_S)
    return response


def test_a_put_with_an_overflowing_ttl_is_refused_and_poisons_nothing(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(tmp_path / "data")
    server_factory.append(server)
    server.start()
    with Client(server.service) as client:
        client.create_namespace("hostile")
        table_id = client.create_table("hostile", "ttl").table_id
    acknowledged: dict[bytes, bytes] = {}
    with grpc.insecure_channel(server.target) as channel:
        stub = kv_rpc_pb2_grpc.TableServiceStub(channel)

        def put(key: bytes, value: bytes, **kw: object) -> tuple[kv.PutResponse, grpc.Call]:
            request = kv.PutRequest(key=key, value=value, header=_routing(table_id, b"p"), **kw)  # type: ignore[arg-type]
            response, call = stub.Put.with_call(request, timeout=TIMEOUT_S)
            return response, call

        assert put(b"before", b"1")[0].header.code == 0
        acknowledged[b"before"] = b"1"
        for hostile in (2**63 - 1, 2**62 + 1):
            response, call = put(b"poison", b"x", ttl_ms=hostile)
            assert response.header.code == 400  # BAD_REQUEST, decided before anything is logged
            assert "ttl_ms" in _trailer(call)
        # The range still serves reads and writes: puts, increments, a TTL that fits.
        assert _get(stub, table_id, b"before").kvs[0].value == b"1"
        for i in range(20):
            key, value = b"k%02d" % i, b"v%d" % i
            assert put(key, value)[0].header.code == 0
            acknowledged[key] = value
        assert put(b"ttl", b"t", ttl_ms=3_600_000)[0].header.code == 0
        acknowledged[b"ttl"] = b"t"
        increment = kv.IncrementRequest(key=b"n", amount=7, header=_routing(table_id, b"p"))
        assert stub.Increment(increment, timeout=TIMEOUT_S).header.code == 0
    server.stop()
    server.start()  # replays the range's log
    with grpc.insecure_channel(server.target) as channel:
        stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
        for key, value in acknowledged.items():
            got = _get(stub, table_id, key)
            assert got.header.code == 0 and [x.value for x in got.kvs] == [value], key
        assert _get(stub, table_id, b"poison").count == 0
        assert _get(stub, table_id, b"n").kvs[0].number_value == 7
        after = kv.PutRequest(key=b"after", value=b"a", header=_routing(table_id, b"p"))
        assert stub.Put(after, timeout=TIMEOUT_S).header.code == 0


def test_a_txn_with_a_failing_op_applies_nothing(server: ServerProcess) -> None:
    with Client(server.service) as client:
        client.create_namespace("atomic")
        table_id = client.create_table("atomic", "t").table_id
        table = client.table("atomic", "t")
        table.increment("p", "n", 1)
        with grpc.insecure_channel(server.target) as channel:
            stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
            request = kv.TxnRequest(header=_routing(table_id, b"p"))
            request.success.add().request_put.CopyFrom(kv.PutRequest(key=b"a", value=b"x"))
            request.success.add().request_put.CopyFrom(kv.PutRequest(key=b"n", value=b"bytes"))
            request.success.add().request_increment.CopyFrom(kv.IncrementRequest(key=b"c"))
            response = stub.Txn(request, timeout=TIMEOUT_S)
            assert response.header.code == 400 and response.succeeded
            assert len(response.responses) == 2  # ends with the op that failed
            assert response.responses[1].response_put.header.code == 400
            assert _get(stub, table_id, b"a").count == 0
            assert _get(stub, table_id, b"c").count == 0
        # The SDK's txn: the same, as an exception; nothing of the branch applied.
        with pytest.raises(TableKeeperError):
            table.txn("p").then_put("b", "y").then_put("n", "z").commit()
        assert table.get("p", "b") is None
        kv_n = table.get("p", "n")
        assert kv_n is not None and kv_n.number == 1 and kv_n.version == 0
        result = table.txn("p").then_put("b", "y").then_get("n").commit()
        assert result.succeeded
        got = table.get("p", "b")
        assert got is not None and got.value == b"y"


def test_range_and_txn_responses_stay_within_the_bound(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    server = ServerProcess(
        tmp_path / "data", extra_args=["--max-response-bytes", str(RESPONSE_BYTES_MAX)]
    )
    server_factory.append(server)
    server.start()
    with Client(server.service) as client:
        client.create_namespace("big")
        table_id = client.create_table("big", "t").table_id
        table = client.table("big", "t")
        keys = [f"k{i:03d}" for i in range(60)]
        for key in keys:
            table.put("p", key, "v" * 4000)  # 240 KB under one pkey
    with grpc.insecure_channel(server.target) as channel:
        stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
        # A Range scan pages: each response within the bound, all keys exactly once.
        seen: list[bytes] = []
        start = b"k"
        while True:
            request = kv.RangeRequest(
                key=start, range_end=b"k\xff", header=_routing(table_id, b"p")
            )
            page = stub.Range(request, timeout=TIMEOUT_S)
            assert page.header.code == 0 and page.kvs
            assert page.ByteSize() <= RESPONSE_BYTES_MAX + 1024
            seen += [x.key for x in page.kvs]
            if not page.more:
                break
            start = page.kvs[-1].key + b"\x00"
        assert seen == [k.encode() for k in keys]

        # A read-only txn whose reads would carry more: RESOURCE_EXHAUSTED, a clear reason.
        reads = kv.TxnRequest(header=_routing(table_id, b"p"))
        for _ in range(10):
            reads.success.add().request_range.CopyFrom(
                kv.RangeRequest(key=b"k", range_end=b"k\xff")
            )
        with pytest.raises(grpc.RpcError) as raised:
            stub.Txn(reads, timeout=TIMEOUT_S)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-response-bytes" in (raised.value.details() or "")

        # A txn that also writes is applied whole; its reads stop early (more = true).
        writes = kv.TxnRequest(header=_routing(table_id, b"p"))
        writes.CopyFrom(reads)
        writes.success.add().request_put.CopyFrom(kv.PutRequest(key=b"w", value=b"written"))
        response = stub.Txn(writes, timeout=TIMEOUT_S)
        assert response.header.code == 0
        assert response.ByteSize() <= RESPONSE_BYTES_MAX + 4096
        assert any(r.response_range.more for r in response.responses[:10])
        assert _get(stub, table_id, b"w").kvs[0].value == b"written"

        # Writes whose previous values (prev_kv) would carry more than the bound are refused
        # before they are logged: RESOURCE_EXHAUSTED naming the flag, nothing changed.
        txn = kv.TxnRequest(header=_routing(table_id, b"p"))
        for key in keys[:30]:  # 120 KB of previous values, twice the bound
            txn.success.add().request_put.CopyFrom(
                kv.PutRequest(key=key.encode(), value=b"new", prev_kv=True)
            )
        with pytest.raises(grpc.RpcError) as raised:
            stub.Txn(txn, timeout=TIMEOUT_S)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "prev_kv" in (raised.value.details() or "")
        assert _get(stub, table_id, b"k000").kvs[0].value == b"v" * 4000
        span = kv.DeleteRangeRequest(
            key=b"k", range_end=b"k\xff", prev_kv=True, header=_routing(table_id, b"p")
        )
        with pytest.raises(grpc.RpcError) as raised:
            stub.Delete(span, timeout=TIMEOUT_S)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _get(stub, table_id, b"k059").count == 1
        # Within the bound, the previous values come back whole.
        few = kv.TxnRequest(header=_routing(table_id, b"p"))
        for key in keys[:5]:
            few.success.add().request_put.CopyFrom(
                kv.PutRequest(key=key.encode(), value=b"new", prev_kv=True)
            )
        response = stub.Txn(few, timeout=TIMEOUT_S)
        assert response.header.code == 0
        assert [r.response_put.prev_kv.value for r in response.responses] == [b"v" * 4000] * 5
        # Without prev_kv the same span deletes, whatever its size.
        span.prev_kv = False
        assert stub.Delete(span, timeout=TIMEOUT_S).deleted == 60
