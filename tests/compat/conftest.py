"""The compat suite's servers: standalone servers, or with `TABLEKEEPER_TEST_CLUSTER=N` clusters of
N servers (deploy/cluster.sh on the session's ZooKeeper and Pulsar).

`server` is one server (or cluster) shared by the tests of a module: starts dominate the suite's
time, so each test names its own namespaces and tables and compares the ids it is given with
those it was given before, not with a fresh server's first ones. In the cluster pass every test
talks to one endpoint only (which server of the module's cluster depends on the test's name, so
the suite enters through each); requests for containers owned by another server are forwarded
server-side. `fresh_server` is a server (or cluster) of the test's own, for what only a fresh one
shows (its first ids) and for tests that stop, restart or reconfigure it. Tests marked
`standalone_only(reason)` (a standalone server's own life cycle) are skipped in the cluster pass.

`make test-compat` runs every test once on standalone servers, then only the tests marked
`on_cluster(reason)` against clusters and those marked `on_grpc_aio(reason)` on grpc.aio: the
properties that differ there (topology; the HTTP/2 server), not every scenario again. A test
marked `cluster_only(reason)` as well shows on a cluster all it would show on a standalone
server, and runs only there.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.compat.cluster import (
    ClusterServer,
    DeployedCluster,
    Server,
    StopInProgress,
    cluster_size,
)
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
    config.addinivalue_line(
        "markers",
        "on_cluster(reason): what it shows depends on the topology (routing, forwarding, a "
        "root range on another server): `make test-compat` runs it once more against a cluster "
        "(`-m on_cluster`); it must use the `server` or `fresh_server` fixture",
    )
    config.addinivalue_line(
        "markers",
        "on_grpc_aio(reason): what it shows depends on the HTTP/2 server (status codes and "
        "trailers, streams, flow control, many calls in flight, TLS, several ports): `make "
        "test-compat` runs it once more with every server on grpc.aio (`-m on_grpc_aio`)",
    )
    config.addinivalue_line(
        "markers",
        "cluster_only(reason): on a cluster the test shows all it shows on a standalone server "
        "and more; skipped against standalone servers (it must also be on_cluster)",
    )


def _reason(marker: pytest.Mark) -> str:
    return str(marker.kwargs.get("reason") or (marker.args[0] if marker.args else ""))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    other_runtime = os.environ.get(RUNTIME_ENV_VAR, "") not in ("", "auto")
    for item in items:
        marker = item.get_closest_marker("on_cluster")
        if marker is not None and (
            item.get_closest_marker("standalone_only") is not None
            or not {"server", "fresh_server"} & set(getattr(item, "fixturenames", ()))
        ):
            raise pytest.UsageError(
                f"{item.nodeid} is marked on_cluster but runs no cluster: it must use the "
                "`server` or `fresh_server` fixture and not be standalone_only"
            )
        marker = item.get_closest_marker("cluster_only")
        if marker is not None and item.get_closest_marker("on_cluster") is None:
            raise pytest.UsageError(f"{item.nodeid} is cluster_only but not on_cluster")
        if marker is not None and not cluster_size():
            item.add_marker(pytest.mark.skip(reason=f"cluster only: {_reason(marker)}"))
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


def _entry(request: pytest.FixtureRequest, cluster: DeployedCluster) -> ClusterServer:
    """The server of `cluster` the test talks to: chosen by the test's name."""
    request.node.stash[CLUSTER_KEY] = cluster
    return cluster.servers[zlib.crc32(request.node.nodeid.encode()) % len(cluster.servers)]


@pytest.fixture
def fresh_server(
    request: pytest.FixtureRequest, tmp_path: Path, server_factory: list[ServerProcess]
) -> Iterator[Server]:
    """A fresh standalone server; or, with TABLEKEEPER_TEST_CLUSTER=N, one server of a fresh
    N-server cluster.

    A cluster is stopped in the background (a stopping server can take seconds to hand its
    containers over), overlapping the next test; `cluster_base` checks every stop at the end."""
    n = cluster_size()
    if not n:
        s = ServerProcess(tmp_path / "data")
        server_factory.append(s)
        yield s.start()
        return
    base: ClusterBase = request.getfixturevalue("cluster_base")
    cluster = DeployedCluster(
        tmp_path / "cluster", unique_namespace("compat"), base.zookeeper.hosts, base.pulsar
    )
    try:
        cluster.start(n)
        yield _entry(request, cluster)
    finally:
        base.stopping.append(cluster.stop_in_background())


@pytest.fixture(scope="module")
def module_servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess | DeployedCluster]:
    """The module's standalone server, or its N-server cluster (stopped in the background at
    the module's end, like `fresh_server`'s)."""
    n = cluster_size()
    directory = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    if not n:
        s = ServerProcess(directory / "data")
        try:
            yield s.start()
        finally:
            if s.running:
                s.kill()
        return
    base: ClusterBase = request.getfixturevalue("cluster_base")
    cluster = DeployedCluster(
        directory / "cluster", unique_namespace("compat"), base.zookeeper.hosts, base.pulsar
    )
    try:
        yield cluster.start(n)
    finally:
        base.stopping.append(cluster.stop_in_background())


@pytest.fixture
def server(
    request: pytest.FixtureRequest, module_servers: ServerProcess | DeployedCluster
) -> Server:
    """The module's shared server; with TABLEKEEPER_TEST_CLUSTER=N one server of the module's
    N-server cluster. Fails at once, with the logs, if an earlier test left it dead."""
    if isinstance(module_servers, ServerProcess):
        assert module_servers.running, (
            f"the module's server has exited:\n{module_servers.log_tail()}"
        )
        return module_servers
    dead = [s.target for s in module_servers.servers if not s.running()]
    assert not dead, f"servers of the module's cluster have exited: {dead}\n" + (
        module_servers.log_tails()
    )
    return _entry(request, module_servers)
