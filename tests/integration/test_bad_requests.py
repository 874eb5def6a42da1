"""Malformed requests and requests for ranges this server does not host: a specific status,
nothing changes, the server keeps serving."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import grpc
import pytest

from tablekeeper import (
    BadRequestError,
    Client,
    InvalidNamespaceNameError,
    InvalidTableNameError,
    RetryPolicy,
    UnexpectedError,
)
from tablekeeper_proto.bookkeeper import kv_rpc_pb2, kv_rpc_pb2_grpc, storage_pb2, storage_pb2_grpc
from tablekeeper_server.core.routing import RangeRouter, split_hash_space
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


def test_garbage_and_truncated_requests_get_a_clear_error(server: ServerProcess) -> None:
    with Client(server.service) as client:
        client.create_namespace("bad")
        info = client.create_table("bad", "t")
        table = client.table("bad", "t")
        table.put("p", "k", "before")
        good = kv_rpc_pb2.PutRequest(
            key=b"k",
            value=b"after",
            header=kv_rpc_pb2.RoutingHeader(stream_id=info.table_id, r_key=b"p"),
        ).SerializeToString()
        with grpc.insecure_channel(server.target) as channel:
            raw_put = channel.unary_unary(
                "/bookkeeper.proto.kv.rpc.TableService/Put",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            # Bytes that are not a PutRequest: INVALID_ARGUMENT naming the method, nothing
            # applied, one warning line in the log per request (no traceback).
            for payload in (b"\xff\xff\xff\xff", b"\x0a\xff", good[:-3]):
                with pytest.raises(grpc.RpcError) as raised:
                    raw_put(payload, timeout=10)
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = raised.value.details() or ""
                assert "malformed request" in details and "TableService/Put" in details
            # The same for a streaming method.
            raw_watch = channel.unary_stream(
                "/tablekeeper.v1.Watch/Watch",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.RpcError) as raised:
                list(raw_watch(b"\x0a\xff", timeout=10))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            log = server.log_path.read_text()
            assert log.count("malformed request") == 4
            assert "Traceback" not in log
            # A message cut at a field boundary parses as a smaller message: without its routing
            # header it is a BAD_REQUEST (400) in the body, not a retryable error.
            key_only = kv_rpc_pb2.PutRequest(key=b"k", value=b"after").SerializeToString()
            response = kv_rpc_pb2.PutResponse.FromString(raw_put(key_only, timeout=10))
            assert response.header.code == 400
            unknown = channel.unary_unary(
                "/bookkeeper.proto.kv.rpc.TableService/NoSuchMethod",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.RpcError) as raised:
                unknown(b"", timeout=10)
            assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
        kv = table.get("p", "k")
        assert kv is not None and kv.value == b"before" and kv.version == 0


def test_names_and_table_sizes_are_bounded(server: ServerProcess) -> None:
    with Client(server.service) as client:
        client.create_namespace("n" * 255)
        with pytest.raises(InvalidNamespaceNameError, match="256 bytes of UTF-8; the limit is 255"):
            client.create_namespace("n" * 256)
        with pytest.raises(InvalidNamespaceNameError, match="separator"):
            client.create_namespace("a/b")
        client.create_namespace("ok")
        with pytest.raises(InvalidTableNameError, match="separator"):
            client.create_table("ok", "t/x")
        with pytest.raises(InvalidTableNameError, match="the limit is 255"):
            client.create_table("ok", "t" * 256)
        with pytest.raises(BadRequestError, match="--max-table-ranges"):
            client.create_table("ok", "huge", ranges=400_000)
        client.create_table("ok", "most", ranges=1024)
        assert sorted(t.name for t in client.list_tables("ok")) == ["most"]
        assert sorted(n.name for n in client.list_namespaces()) == sorted(["n" * 255, "ok"])
    # A 4 MiB name over the BookKeeper protocol: INVALID_NAMESPACE_NAME with a short reason.
    with grpc.insecure_channel(server.target) as channel:
        stub = storage_pb2_grpc.RootRangeServiceStub(channel)
        call = stub.CreateNamespace.with_call(
            storage_pb2.CreateNamespaceRequest(name="x" * (4 * 1024 * 1024)), timeout=30
        )
        response, rpc = call
        assert response.code == 2000  # INVALID_NAMESPACE_NAME
        reason = dict(rpc.trailing_metadata())["tk-error"]
        assert "the limit is 255" in reason and len(reason) < 300


def test_a_request_naming_another_range_is_not_served_here(server: ServerProcess) -> None:
    with Client(server.service) as client:
        client.create_namespace("routes")
        info = client.create_table("routes", "t", ranges=4)
        table = client.table("routes", "t")
        table.put("p", "k", "v")
        split = split_hash_space(4)
        router = RangeRouter([r.start for r in split], [1024 + i for i in range(len(split))])
        right = router.route(b"p")
        with grpc.insecure_channel(server.target) as channel:
            stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
            for range_id in (1024, 1025, 1026, 1027, 999_999):
                header = kv_rpc_pb2.RoutingHeader(
                    stream_id=info.table_id, r_key=b"p", range_id=range_id
                )
                request = kv_rpc_pb2.PutRequest(key=b"k", value=b"%d" % range_id, header=header)
                if range_id == right:
                    assert stub.Put(request, timeout=10).header.code == 0
                    continue
                with pytest.raises(grpc.RpcError) as raised:
                    stub.Put(request, timeout=10)
                assert raised.value.code() == grpc.StatusCode.NOT_FOUND
                assert "does not hold this key" in (raised.value.details() or "")
        kv = table.get("p", "k")
        assert kv is not None and kv.value == b"%d" % right and kv.version == 1


def test_a_range_that_cannot_be_recovered_fails_fast(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """A range whose log was truncated past a checkpoint that is gone refuses to serve. That is
    not transient: clients get UNEXPECTED at once (no retry loop re-running recovery)."""
    dirs = [
        "--wal-dir",
        str(tmp_path / "wal"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--wal-segment-bytes",
        "4096",
        "--checkpoint-interval",
        "0",
    ]
    server = ServerProcess(tmp_path / "data", extra_args=dirs)
    server_factory.append(server)
    server.start()
    with Client(server.service) as client:
        client.create_namespace("gone")
        client.create_table("gone", "t", ranges=2)
        table = client.table("gone", "t")
        for i in range(300):
            table.put("p", f"k{i:03d}", "v" * 100)
        client.checkpoint("gone", "t")
    server.stop()
    shutil.rmtree(tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "data" / "db")
    server.start()
    policy = RetryPolicy(deadline_s=60.0)
    with Client(server.service, retry=policy) as client:
        table = client.table("gone", "t")
        started = time.monotonic()
        with pytest.raises(UnexpectedError, match="were truncated"):
            table.get("p", "k000")
        # Not retried: a retryable refusal would have been tried again for the policy's 60 s.
        assert time.monotonic() - started < policy.deadline_s
