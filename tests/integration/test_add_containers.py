"""`tablekeeper cluster add-containers N` on a running cluster (issue 16, "more containers"): the
controller assigns the new containers at once, every server places new tables over all of them,
existing tables keep their ranges and data, and the new containers fail over like the others.
Real ZooKeeper, Pulsar and server processes."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable

import grpc
import pytest

from tablekeeper import Client
from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc, stream_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc
from tests.support.cluster import TestCluster
from tests.support.server import TABLEKEEPER

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

WAIT_S = 90.0
KEYS = 100


def ranges_containers(cluster: TestCluster, namespace: str, table: str) -> list[int]:
    """The container of each of the table's ranges, in range order."""
    with grpc.insecure_channel(cluster.endpoint(0)) as channel:
        found = storage_pb2_grpc.RootRangeServiceStub(channel).GetStream(
            storage_pb2.GetStreamRequest(
                stream_name=stream_pb2.StreamName(namespace_name=namespace, stream_name=table)
            ),
            timeout=30,
        )
        assert found.code == storage_pb2.SUCCESS, found
        ranges = storage_pb2_grpc.MetaRangeServiceStub(channel).GetActiveRanges(
            storage_pb2.GetActiveRangesRequest(stream_id=found.stream_props.stream_id),
            timeout=30,
        )
    assert ranges.code == storage_pb2.SUCCESS, ranges
    return [r.props.storage_container_id for r in ranges.ranges]


def known_containers(endpoint: str) -> int:
    """The number of containers the server at `endpoint` places tables over (ServerInfo)."""
    with grpc.insecure_channel(endpoint) as channel:
        info = tablekeeper_pb2_grpc.TableKeeperStub(channel).ServerInfo(
            tablekeeper_pb2.ServerInfoRequest(), timeout=10
        )
    return int(info.num_storage_containers)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def add_containers(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TABLEKEEPER), "cluster", "add-containers", *args]
        + ["--zk", cluster.zk_hosts, "--cluster", cluster.name],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("TABLEKEEPER_")},
        check=False,
    )


def test_added_containers_take_new_tables_and_fail_over(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(containers=2).start(2)
    with Client(cluster.service_all()) as client:
        client.create_namespace("grow")
        client.create_table("grow", "before", ranges=4)
        before = client.table("grow", "before")
        for i in range(KEYS):
            before.put(f"p{i}", "k", f"b{i}")
        assert set(ranges_containers(cluster, "grow", "before")) == {0, 1}

        refused = add_containers(cluster, "0")
        assert refused.returncode != 0 and "at least one" in refused.stderr
        done = add_containers(cluster, "2", "-o", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"cluster": cluster.name, "before": 2, "containers": 4}

        # The controller assigns the new containers (two per server), and every server learns
        # the new count from ZooKeeper.
        cluster.containers = 4
        cluster.wait_ready(WAIT_S, balanced=True)
        assert sorted(len(owned) for owned in cluster.assignment().values()) == [2, 2]
        for i in range(2):
            wait_until(lambda i=i: known_containers(cluster.endpoint(i)) == 4, f"server {i}")  # type: ignore[misc]
        assert client.cluster_status().num_storage_containers == 4

        # A new table's ranges are placed over all four containers; the old one keeps its own.
        client.create_table("grow", "after", ranges=4)
        assert sorted(ranges_containers(cluster, "grow", "after")) == [0, 1, 2, 3]
        assert set(ranges_containers(cluster, "grow", "before")) == {0, 1}
        after = client.table("grow", "after")
        for i in range(KEYS):
            after.put(f"p{i}", "k", f"a{i}")

        # The server owning a new container dies: it moves with its data, like any other.
        victim = cluster.index(cluster.assigned_to(3) or "")
        cluster.kill(victim)
        cluster.wait_ready(WAIT_S)
        for table, prefix in ((before, "b"), (after, "a")):
            for i in range(KEYS):
                got = table.get(f"p{i}", "k")
                assert got is not None and got.value == f"{prefix}{i}".encode()
    status = add_containers(cluster, "1")
    assert status.returncode == 0 and status.stdout.strip() == (
        f"cluster {cluster.name}: 4 -> 5 storage containers"
    )
