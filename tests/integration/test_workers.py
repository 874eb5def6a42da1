"""`tablekeeper server --workers N` (issue 12): worker processes sharing one host's containers.

Each worker hosts its share of the containers on its own port; GetStorageContainerEndpoint names
the owner, so routing clients go straight to it, and a request sent to the wrong worker is
forwarded. A worker killed with -9 is started again and loses nothing acknowledged; SIGTERM to
the server stops every worker."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from tablekeeper import Client
from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc, storage_pb2, storage_pb2_grpc
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = pytest.mark.integration

WORKERS = 2
CONTAINERS = 8
TIMEOUT_S = 30


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return sorted(int(p) for p in text.split())


def _endpoints(target: str) -> dict[int, str]:
    """Each container's endpoint, as GetStorageContainerEndpoint names it."""
    with grpc.insecure_channel(target) as channel:
        stub = storage_pb2_grpc.StorageContainerServiceStub(channel)
        request = storage_pb2.GetStorageContainerEndpointRequest(
            requests=[
                storage_pb2.OneStorageContainerEndpointRequest(storage_container=c)
                for c in range(CONTAINERS)
            ]
        )
        response = stub.GetStorageContainerEndpoint(request, timeout=TIMEOUT_S)
    found = {}
    for cid, one in enumerate(response.responses):
        endpoint = one.endpoint.rw_endpoint
        found[cid] = f"{endpoint.hostname}:{endpoint.port}"
    return found


@pytest.fixture
def workers(tmp_path: Path, server_factory: list[ServerProcess]) -> ServerProcess:
    server = ServerProcess(tmp_path / "data", extra_args=["--workers", str(WORKERS)])
    server_factory.append(server)
    return server.start()


def test_workers_share_the_containers_and_forward(workers: ServerProcess) -> None:
    assert workers.process is not None
    assert len(_children(workers.process.pid)) == WORKERS
    endpoints = _endpoints(workers.target)
    # Worker i hosts containers c with c % WORKERS == i; worker 0 listens on --port.
    assert endpoints[0] == workers.target
    assert len(set(endpoints.values())) == WORKERS
    for cid in range(CONTAINERS):
        assert endpoints[cid] == endpoints[cid % WORKERS], endpoints
    with Client(workers.service) as client:
        client.create_namespace("w")
        info = client.create_table("w", "t", ranges=8)
        table = client.table("w", "t")
        for i in range(300):
            table.put(f"p{i}", "k", f"v{i}")
        assert all(table.get(f"p{i}", "k").value == f"v{i}".encode() for i in range(300))  # type: ignore[union-attr]
        # The whole host's ranges are checkpointed and listed, whichever worker hosts them.
        statuses = client.checkpoint("w", "t").ranges
        assert len({(r.container_id, r.range_id) for r in statuses}) == info.ranges
        assert {r.container_id % WORKERS for r in statuses} == set(range(WORKERS))
    # A client that does not route sends everything to --port: worker 0 forwards what it
    # does not host (every pkey lands on some range; half of them on worker 1's containers).
    with grpc.insecure_channel(workers.target) as channel:
        stub = kv_rpc_pb2_grpc.TableServiceStub(channel)
        for i in range(300):
            header = kv.RoutingHeader(stream_id=info.table_id, r_key=f"p{i}".encode())
            got = stub.Range(kv.RangeRequest(key=b"k", header=header), timeout=TIMEOUT_S)
            assert got.header.code == 0 and got.kvs[0].value == f"v{i}".encode()


def test_a_killed_worker_is_restarted_and_loses_nothing(workers: ServerProcess) -> None:
    assert workers.process is not None
    supervisor = workers.process.pid
    with Client(workers.service) as client:
        client.create_namespace("w")
        client.create_table("w", "t", ranges=8)
        table = client.table("w", "t")
        for i in range(200):
            table.put(f"p{i}", "k", f"v{i}")
        before = _children(supervisor)
        victim = before[1]
        os.kill(victim, signal.SIGKILL)
        workers.wait_for(
            lambda: len(_children(supervisor)) == WORKERS and victim not in _children(supervisor),
            "the killed worker to be started again",
        )
        # Every acknowledged write is there (the SDK retries while the worker recovers), and
        # the restarted worker takes new ones.
        assert all(table.get(f"p{i}", "k").value == f"v{i}".encode() for i in range(200))  # type: ignore[union-attr]
        for i in range(200):
            table.put(f"p{i}", "k", f"w{i}")
        assert all(table.get(f"p{i}", "k").value == f"w{i}".encode() for i in range(200))  # type: ignore[union-attr]
    assert workers.stop() == 0
    assert not Path(f"/proc/{victim}").exists()
    for pid in before:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )


def test_workers_refuse_the_etcd_and_oxia_ports(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            str(SERVER_COMMAND),
            "server",
            "--data-dir",
            str(tmp_path),
            "--workers",
            "2",
            "--etcd-port",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 2
    assert "--workers 1" in result.stderr
