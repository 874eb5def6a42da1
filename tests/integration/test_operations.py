"""Operations hygiene against a real server: /metrics has the process and platform collectors,
`tablekeeper_build_info` and gauges of open watches and live sessions; `--log-format json`
writes one JSON object per line; gRPC server reflection lists the services on the main port."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tablekeeper import Client
from tests.support.server import ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tmp_path_factory.mktemp("ops") / "data", extra_args=["--log-format", "json"]
    ).start()
    yield server
    server.stop()


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def _open_streams(text: str) -> dict[tuple[str, str], float]:
    """`tablekeeper_open_streams` by (front-end, method); a method with none is not listed."""
    series = re.findall(
        r'^tablekeeper_open_streams\{front_end="([^"]*)",method="([^"]*)"\} (\S+)$', text, re.M
    )
    return {(front_end, method): float(n) for front_end, method, n in series}


def test_metrics_process_build_info_watches_and_sessions(server: ServerProcess) -> None:
    text = server.metrics()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert re.search(rf"^{name}", text, re.M), name
    build = re.search(r"^tablekeeper_build_info\{(.*)\} 1\.0$", text, re.M)
    assert build and re.search(r'version="[^"]+"', build.group(1)), build
    assert _gauge(text, "tablekeeper_open_watches") == 0
    assert _gauge(text, "tablekeeper_live_sessions") == 0
    assert _open_streams(text) == {}
    shared = ("bookkeeper", "WatchMany")  # the SDK's watches share one stream

    with Client(server.service) as client:
        client.create_namespace("ops")
        table = client.create_table("ops", "t", ranges=2)
        handle = client.table("ops", table.name)
        with handle.session("p", ttl_s=10), handle.watch("p", "k"):

            def counts() -> tuple[float, float, float]:
                text = server.metrics()
                return (
                    _gauge(text, "tablekeeper_open_watches"),
                    _gauge(text, "tablekeeper_live_sessions"),
                    _open_streams(text).get(shared, 0),
                )

            deadline = time.monotonic() + 30
            while counts() != (1, 1, 1):
                assert time.monotonic() < deadline, counts()
                time.sleep(0.1)
        deadline = time.monotonic() + 30
        while counts() != (0, 0, 0):
            assert time.monotonic() < deadline, counts()
            time.sleep(0.1)


def test_json_log_lines(server: ServerProcess) -> None:
    lines = [line for line in server.log_path.read_text().splitlines() if line.strip()]
    assert lines
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        assert "worker" not in entry
    assert any(
        e["logger"] == "tablekeeper_server.main" and "serving on" in e["message"] for e in entries
    )


def test_reflection_lists_the_services(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        services = {s.name for s in answer.list_services_response.service}
        assert {
            "bookkeeper.proto.kv.rpc.TableService",
            "bookkeeper.proto.storage.RootRangeService",
            "tablekeeper.v1.TableKeeper",
            "tablekeeper.v1.Admin",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= services, services
        # A service's descriptor can be fetched too (what `grpcurl describe` does).
        request = reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="tablekeeper.v1.TableKeeper"
        )
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        assert answer.file_descriptor_response.file_descriptor_proto
