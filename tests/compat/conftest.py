"""The compat suite's `server`: a standalone server, or with `TABLEKEEPER_TEST_CLUSTER=N` one
server of a fresh N-server cluster (deploy/cluster.sh on the session's ZooKeeper and Pulsar).

In the cluster pass every test talks to that one endpoint only; requests for containers owned
by another server are forwarded server-side. Each test gets a cluster of its own (a new cluster
name and Pulsar namespace), because the tests expect fresh id counters (namespace ids from 0,
stream ids from 1024) and reuse names. Tests marked `standalone_only(reason)` (a standalone
server's own life cycle) are skipped in the cluster pass.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.compat.cluster import DeployedCluster, Server, StopInProgress, cluster_size
from tests.support.pulsar import PulsarService, unique_namespace
from tests.support.server import RUNTIME_ENV_VAR, ServerProcess
from tests.support.zookeeper import ZooKeeperProcess

CLUSTER_KEY = pytest.StashKey[DeployedCluster]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "standalone_only(reason): about a standalone server's own process; skipped when the "
        "suite runs against a cluster (TABLEKEEPER_TEST_CLUSTER)",
    )
    config.addinivalue_line(
        "markers",
        "default_runtime_only(reason): proves nothing about the gRPC runtime that the suite's "
        "other tests do not; skipped when the suite runs again on another runtime "
        f"({RUNTIME_ENV_VAR})",
    )


def _reason(marker: pytest.Mark) -> str:
    return str(marker.kwargs.get("reason") or (marker.args[0] if marker.args else ""))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    other_runtime = os.environ.get(RUNTIME_ENV_VAR, "") not in ("", "auto")
    for item in items:
        marker = item.get_closest_marker("standalone_only")
        if marker is not None and cluster_size():
            item.add_marker(pytest.mark.skip(reason=f"standalone only: {_reason(marker)}"))
        marker = item.get_closest_marker("default_runtime_only")
        if marker is not None and other_runtime:
            item.add_marker(pytest.mark.skip(reason=f"default runtime only: {_reason(marker)}"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test of the cluster pass shows the end of every server's log."""
    report = yield
    cluster = item.stash.get(CLUSTER_KEY, None)
    if cluster is not None and report.failed:
        report.sections.append(("cluster server logs", cluster.log_tails()))
    return report


@dataclass
class ClusterBase:
    """What every cluster of the session shares, and the stops still under way."""

    zookeeper: ZooKeeperProcess
    pulsar: PulsarService
    stopping: list[StopInProgress] = field(default_factory=list)


@pytest.fixture(scope="session")
def cluster_base(
    tmp_path_factory: pytest.TempPathFactory, pulsar_service: PulsarService
) -> Iterator[ClusterBase]:
    """One ZooKeeper (every cluster has its own name in it) and the session's Pulsar (every
    cluster has its own namespace in it). At the end, waits for the clusters' stops, before
    ZooKeeper and Pulsar stop."""
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper")).start()
    base = ClusterBase(zk, pulsar_service)
    try:
        yield base
        errors = []
        for stop in base.stopping:
            try:
                stop.wait()
            except RuntimeError as exc:
                errors.append(str(exc))
        assert not errors, "\n".join(errors)
    finally:
        zk.stop()


@pytest.fixture
def server(
    request: pytest.FixtureRequest, tmp_path: Path, server_factory: list[ServerProcess]
) -> Iterator[Server]:
    """A fresh standalone server; or, with TABLEKEEPER_TEST_CLUSTER=N, one server of a fresh
    N-server cluster (which one depends on the test's name, so the suite enters through each).

    A cluster is stopped in the background (a stopping server can take seconds to hand its
    containers over), overlapping the next test; `cluster_base` checks every stop at the end."""
    n = cluster_size()
    if not n:
        s = ServerProcess(tmp_path / "data")
        server_factory.append(s)
        yield s.start()
        return
    base: ClusterBase = request.getfixturevalue("cluster_base")
    name = unique_namespace("compat")
    cluster = DeployedCluster(tmp_path / "cluster", name, base.zookeeper.hosts, base.pulsar)
    request.node.stash[CLUSTER_KEY] = cluster
    try:
        cluster.start(n)
        yield cluster.servers[zlib.crc32(request.node.nodeid.encode()) % n]
    finally:
        base.stopping.append(cluster.stop_in_background())
