"""The Oxia port in cluster mode: every server runs one; clients ask any server for the shard
assignments and talk to each shard's leader, the server that owns the shard's range's container.
Three real servers, ZooKeeper and Pulsar; the real Oxia Java client (through
tests/integration/oxia/OxiaClusterDriver.java) writes keys and its session's ephemeral records
to a namespace whose shards are spread over the servers, then one server that leads shards is
killed with SIGKILL: the keys, the ephemeral records (the session lives on at the new leaders)
and the client's notifications survive."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc, stream_pb2
from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tests.support.caches import pulsar_classpath
from tests.support.cluster import TestCluster
from tests.support.oxia import wait_leaders
from tests.support.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

REPO = Path(__file__).resolve().parents[2]
DRIVER_SOURCE = Path(__file__).parent / "oxia" / "OxiaClusterDriver.java"
CONTAINERS = 4
SHARDS = 6
KEYS = 60
CALL_TIMEOUT_S = 10.0
WAIT_S = 90.0
DRIVER_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def driver_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    classes = tmp_path_factory.mktemp("oxia-cluster-driver")
    classpath = pulsar_classpath()
    subprocess.run(
        ["javac", "-d", str(classes), "-cp", classpath, str(DRIVER_SOURCE)],
        check=True,
        timeout=DRIVER_TIMEOUT_S,
    )
    return f"{classpath}:{classes}"


class Assignments:
    """One GetShardAssignments stream: each message's leader of every shard."""

    def __init__(self, address: str, namespace: str) -> None:
        self.channel = grpc.insecure_channel(address)
        stub = client_pb2_grpc.OxiaClientStub(self.channel)
        self._stream = stub.GetShardAssignments(
            client_pb2.ShardAssignmentsRequest(namespace=namespace), timeout=WAIT_S
        )
        self.namespace = namespace

    def next(self) -> dict[int, str]:
        message: client_pb2.ShardAssignments = next(self._stream)
        return {a.shard: a.leader for a in message.namespaces[self.namespace].assignments}

    def close(self) -> None:
        self._stream.cancel()
        self.channel.close()


def first_assignments(address: str, namespace: str) -> dict[int, str]:
    """The namespace's first assignment message from `address`, once the server answers one
    (namespace `default` is made in the background: until then "unavailable")."""
    deadline = time.monotonic() + WAIT_S
    while True:
        stream = Assignments(address, namespace)
        try:
            return stream.next()
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, (exc.code(), exc.details())
            if time.monotonic() > deadline:
                raise
        finally:
            stream.close()
        time.sleep(0.1)


def create_namespace(cluster: TestCluster, name: str, shards: int) -> None:
    """Oxia namespace `name` = table oxia/`name` with `shards` ranges."""
    with grpc.insecure_channel(cluster.endpoint(0)) as channel:
        root = storage_pb2_grpc.RootRangeServiceStub(channel)
        made = root.CreateStream(
            storage_pb2.CreateStreamRequest(
                ns_name="oxia",
                name=name,
                stream_conf=stream_pb2.StreamConfiguration(
                    min_num_ranges=shards, initial_num_ranges=shards, storage_type=stream_pb2.TABLE
                ),
            ),
            timeout=CALL_TIMEOUT_S,
        )
    assert made.code == storage_pb2.SUCCESS, made


def test_java_client_through_the_cluster_and_after_a_shard_leader_dies(
    make_cluster: Callable[..., TestCluster], driver_classpath: str
) -> None:
    cluster = make_cluster(containers=CONTAINERS).init()
    addresses = []
    for _ in range(3):
        port = free_port()
        cluster.add_server(["--oxia-port", str(port)])
        addresses.append(f"127.0.0.1:{port}")
    # Balanced: the controller has spread the containers over all three (no move follows).
    cluster.wait_ready(WAIT_S, balanced=True)
    for address in addresses:  # every server has found (or made) namespace default
        assert len(first_assignments(address, "default")) == 4

    create_namespace(cluster, "spread", SHARDS)
    leaders = first_assignments(addresses[0], "spread")
    assert len(leaders) == SHARDS
    # Each shard's leader is the Oxia port of its container's owner: spread over the servers,
    # and every server names the same ones.
    assert set(leaders.values()) <= set(addresses)
    assert len(set(leaders.values())) >= 2, leaders
    for address in addresses[1:]:  # each server's view follows ZooKeeper's a moment later
        wait_leaders(address, "spread", lambda now: now == leaders, WAIT_S)
    victim_address = max(set(leaders.values()), key=list(leaders.values()).count)
    victim = addresses.index(victim_address)
    bootstrap = addresses[(victim + 1) % 3]  # the client's service address stays up

    driver = subprocess.Popen(
        [
            "java",
            "-Xmx128m",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            driver_classpath,
            "OxiaClusterDriver",
            bootstrap,
            "spread",
        ]
        + [str(KEYS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watching: Assignments | None = None
    try:
        assert driver.stdout is not None and driver.stdin is not None
        printed: list[str] = []  # the client's own log lines (sessions) come first
        while not printed or printed[-1] not in ("WRITTEN", "EOF"):
            line = driver.stdout.readline()
            printed.append(line.strip() if line else "EOF")
        if printed[-1] != "WRITTEN":
            out, err = driver.communicate(timeout=DRIVER_TIMEOUT_S)
            pytest.fail(f"driver: {printed}\n{out}\n{err[-6000:]}")

        watching = Assignments(bootstrap, "spread")
        assert watching.next() == leaders
        cluster.kill(victim)
        # The open assignment stream tells of the new leaders once the dead server's containers
        # have moved: none is the dead server any more.
        moved = watching.next()
        while victim_address in moved.values():
            moved = watching.next()
        assert set(moved) == set(leaders)
        assert set(moved.values()) <= set(addresses) - {victim_address}
        cluster.wait_ready(WAIT_S)

        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=DRIVER_TIMEOUT_S)
        assert driver.returncode == 0 and out.strip().endswith("PASS"), f"{out}\n{err[-6000:]}"
    finally:
        if watching is not None:
            watching.close()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
