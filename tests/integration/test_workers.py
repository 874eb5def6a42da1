"""`tablekeeper server --workers N` (issue 12): worker processes sharing one host's containers.

Each worker hosts its share of the containers on its own port; GetStorageContainerEndpoint names
the owner, so routing clients go straight to it, and a request sent to the wrong worker is
forwarded. A worker killed with -9 is started again and loses nothing acknowledged; SIGTERM to
the server stops every worker. The etcd and Oxia ports work with workers too."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from tablekeeper import Client
from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc, storage_pb2, storage_pb2_grpc
from tablekeeper_proto.etcd import rpc_pb2
from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tests.integration.test_etcd_cluster import Etcd, retry_unavailable
from tests.support.oxia import shard_leaders
from tests.support.routes import etcd_keyspace_container
from tests.support.server import ServerProcess, free_port

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


def test_the_etcd_and_oxia_ports_are_served_by_every_worker(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """Worker 0 listens on the configured etcd and Oxia ports, the others on their own: an etcd
    keyspace is served by the worker owning its range (worker 0 passes calls through to it),
    each Oxia shard's leader is the worker owning its container. A worker killed with -9 comes
    back on the same ports with everything acknowledged."""
    keyspaces = {"keyspace": free_port(), **{name: free_port() for name in ("a", "b", "c")}}
    oxia_port = free_port()
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            *("--workers", str(WORKERS), "--containers", "2"),
            *("--etcd-port", str(keyspaces["keyspace"])),
            *(
                "--etcd-keyspaces",
                ",".join(f"{n}={p}" for n, p in keyspaces.items() if n != "keyspace"),
            ),
            *("--oxia-port", str(oxia_port)),
        ],
    )
    server_factory.append(server)
    server.start()
    etcd = {name: Etcd(f"127.0.0.1:{port}") for name, port in keyspaces.items()}
    try:
        for stub in etcd.values():
            retry_unavailable(lambda stub=stub: stub.get("probe"))  # type: ignore[misc]
        # Four keyspace tables (and Oxia's) made at start, one range each over two containers:
        # both workers serve some.
        with grpc.insecure_channel(server.target) as channel:
            owners = {name: etcd_keyspace_container(channel, name) % WORKERS for name in etcd}
        assert set(owners.values()) == {0, 1}, owners
        for name, stub in etcd.items():
            for i in range(10):
                stub.put(f"k/{i}", f"{name}-{i}")
            members = stub.cluster.MemberList(rpc_pb2.MemberListRequest(), timeout=TIMEOUT_S)
            assert len(members.members) == WORKERS
        leaders = shard_leaders(f"127.0.0.1:{oxia_port}", "default")
        assert len(set(leaders.values())) == WORKERS, leaders  # a leader in each worker
        for shard, leader in leaders.items():
            assert oxia_put(leader, shard, f"/w/{shard}", b"v").status == client_pb2.OK

        assert server.process is not None
        supervisor = server.process.pid
        victim = _children(supervisor)[1]  # worker 1
        os.kill(victim, signal.SIGKILL)
        server.wait_for(
            lambda: len(_children(supervisor)) == WORKERS and victim not in _children(supervisor),
            "the killed worker to be started again",
        )
        for name, stub in etcd.items():
            got = retry_unavailable(lambda stub=stub: stub.get("k/", prefix=True))  # type: ignore[misc]
            assert [kv.value.decode() for kv in got.kvs] == [f"{name}-{i}" for i in range(10)]
        assert shard_leaders(f"127.0.0.1:{oxia_port}", "default") == leaders  # same ports
        for shard, leader in leaders.items():
            got = oxia_get_until_served(leader, shard, f"/w/{shard}")
            assert got.status == client_pb2.OK and got.value == b"v"
    finally:
        for stub in etcd.values():
            stub.close()
    assert server.stop() == 0


def oxia_put(address: str, shard: int, key: str, value: bytes) -> client_pb2.PutResponse:
    with grpc.insecure_channel(address) as channel:
        request = client_pb2.WriteRequest(
            shard=shard, puts=[client_pb2.PutRequest(key=key, value=value)]
        )
        response = client_pb2_grpc.OxiaClientStub(channel).Write(request, timeout=TIMEOUT_S)
    put: client_pb2.PutResponse = response.puts[0]
    return put


def oxia_get_until_served(address: str, shard: int, key: str) -> client_pb2.GetResponse:
    """`oxia_get`, again while the worker is not back (UNAVAILABLE: not listening yet, or its
    namespaces not resolved yet)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return oxia_get(address, shard, key)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def oxia_get(address: str, shard: int, key: str) -> client_pb2.GetResponse:
    with grpc.insecure_channel(address) as channel:
        request = client_pb2.ReadRequest(
            shard=shard, gets=[client_pb2.GetRequest(key=key, include_value=True)]
        )
        (response,) = list(client_pb2_grpc.OxiaClientStub(channel).Read(request, timeout=TIMEOUT_S))
    got: client_pb2.GetResponse = response.gets[0]
    return got
