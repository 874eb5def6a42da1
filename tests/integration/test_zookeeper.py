"""Cluster coordination against a real ZooKeeper: metadata, membership, controller election,
assignment reconciliation and ownership epochs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tablekeeper_server.cluster.status import ContainerOwner, ZooKeeperView
from tablekeeper_server.cluster.zookeeper import (
    ClusterError,
    Controller,
    Ownership,
    ZkCoordinator,
)
from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.errors import UnavailableError
from tests.support.zookeeper import ZooKeeperProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperProcess]:
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper")).start()
    yield zk
    zk.stop()


@pytest.fixture
def connect(
    zookeeper: ZooKeeperProcess, request: pytest.FixtureRequest
) -> Iterator[Callable[[], ZkCoordinator]]:
    cluster = request.node.name.replace("[", "-").replace("]", "")
    made: list[ZkCoordinator] = []

    def make() -> ZkCoordinator:
        # Sessions end by `stop()` (closed at once) in these tests, never by expiry: a long
        # timeout keeps a test process that a busy machine leaves unscheduled for a while from
        # losing its session.
        coordinator = ZkCoordinator(
            zookeeper.hosts, cluster, session_timeout_s=20.0, clock=SystemClock()
        )
        coordinator.start()
        made.append(coordinator)
        return coordinator

    yield make
    for coordinator in made:
        if coordinator.zk.connected:
            coordinator.stop()


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Until `condition()` holds (the timeout only guards against a hang)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_cluster_init_is_idempotent_and_checked(connect: Callable[[], ZkCoordinator]) -> None:
    zk = connect()
    with pytest.raises(ClusterError, match="not initialised"):
        zk.num_containers()
    assert zk.init_cluster(8) is True
    assert zk.init_cluster(8) is False
    assert zk.init_cluster(4) is False  # it has at least that many
    with pytest.raises(ClusterError, match="already exists with 8.*add-containers"):
        zk.init_cluster(16)
    assert zk.num_containers() == 8
    assert zk.read_assignment() == ({}, 0)


def test_adding_containers_is_a_compare_and_set_watched_by_servers(
    connect: Callable[[], ZkCoordinator],
) -> None:
    admin, other = connect(), connect()
    with pytest.raises(ClusterError, match="not initialised"):
        admin.add_containers(1)
    admin.init_cluster(4)
    seen: list[int] = []
    other.watch_num_containers(seen.append)
    with pytest.raises(ValueError, match="at least one"):
        admin.add_containers(0)
    # Two writers at once: each addition counts (the loser of a race reads again).
    results: list[tuple[int, int]] = []
    writers = [
        threading.Thread(target=lambda c=c: results.append(c.add_containers(2)))
        for c in (admin, other)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(results) == [(4, 6), (6, 8)]
    assert admin.num_containers() == 8
    wait_for(lambda: seen[-1:] == [8])
    assert seen[0] == 4 and seen == sorted(seen)
    # `cluster init` with the original number (a deployment script run again) is satisfied.
    assert admin.init_cluster(4) is False


def test_membership_follows_sessions(connect: Callable[[], ZkCoordinator]) -> None:
    admin = connect()
    admin.init_cluster(4)
    seen: list[list[str]] = []
    admin.watch_servers(seen.append)
    a, b = connect(), connect()
    a.register("127.0.0.1:1001")
    b.register("127.0.0.1:1002")
    wait_for(lambda: admin.live_servers() == ["127.0.0.1:1001", "127.0.0.1:1002"])
    b.stop()  # a server's session ends: its node goes
    wait_for(lambda: admin.live_servers() == ["127.0.0.1:1001"])
    wait_for(lambda: bool(seen) and seen[-1] == ["127.0.0.1:1001"])


def test_controller_assigns_and_reassigns_a_dead_servers_containers(
    connect: Callable[[], ZkCoordinator],
) -> None:
    admin = connect()
    admin.init_cluster(8)
    servers = {endpoint: connect() for endpoint in ("s1:1", "s2:1", "s3:1")}
    for endpoint, zk in servers.items():
        zk.register(endpoint)
        zk.run_for_controller(endpoint, Controller(zk).lead)

    def owners() -> dict[str, frozenset[int]]:
        return {s: c for s, c in admin.read_assignment()[0].items() if c}

    wait_for(lambda: sorted(len(c) for c in owners().values()) == [2, 3, 3])
    leader = admin.controller()
    assert leader in servers
    before = owners()
    victim = next(s for s in servers if s != leader)
    servers[victim].stop()  # the server dies
    wait_for(
        lambda: victim not in owners() and sum(len(c) for c in owners().values()) == 8,
        timeout_s=60,
    )
    after = owners()
    moved = {c for s, cs in after.items() for c in cs if c not in before.get(s, frozenset())}
    assert moved == set(before[victim])  # only the dead server's containers moved

    # The controller dies: another server takes over and keeps reconciling.
    servers[leader].stop()
    survivor = next(s for s in servers if s not in (leader, victim))
    wait_for(lambda: admin.controller() == survivor)
    wait_for(lambda: owners() == {survivor: frozenset(range(8))})


def test_claims_raise_the_epoch_under_contention(connect: Callable[[], ZkCoordinator]) -> None:
    admin = connect()
    admin.init_cluster(2)
    a, b = connect(), connect()
    assert admin.owner(0) is None
    epochs: list[int] = []

    def claim(zk: ZkCoordinator, endpoint: str) -> None:
        for _ in range(20):
            epochs.append(zk.claim(0, endpoint))

    threads = [threading.Thread(target=claim, args=(zk, e)) for zk, e in ((a, "a:1"), (b, "b:1"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(epochs) == list(range(1, 41))  # every claim got its own, higher epoch
    final = admin.owner(0)
    assert final is not None and final.epoch == 40


def test_claim_waits_for_a_live_owner_not_a_released_or_dead_one(
    connect: Callable[[], ZkCoordinator],
) -> None:
    old, new = connect(), connect()
    old.init_cluster(2)
    old.register("old:1")
    new.register("new:1")
    assert old.claim(0, "old:1") == 1
    assert old.claim(1, "old:1") == 1
    # Alive and not released: the claimant waits for the handoff (here: until its timeout).
    started = time.monotonic()
    assert new.claim(0, "new:1", handoff_timeout_s=1.0) == 2
    assert time.monotonic() - started >= 1.0
    # Released: taken at once, and a stale release (old epoch) changes nothing.
    old.release(1, "old:1", 1)
    assert old.owner(1) == Ownership("old:1", 1, released=True)
    started = time.monotonic()
    assert new.claim(1, "new:1", handoff_timeout_s=60.0) == 2
    assert time.monotonic() - started < 60.0  # did not wait out the handoff
    old.release(1, "old:1", 1)
    assert new.owner(1) == Ownership("new:1", 2)
    # Dead (its session ended): taken at once.
    new.stop()
    third = connect()
    started = time.monotonic()
    assert third.claim(0, "third:1", handoff_timeout_s=60.0) == 3
    assert time.monotonic() - started < 60.0  # did not wait out the handoff


def test_assignment_writes_are_compare_and_set(
    connect: Callable[[], ZkCoordinator], tmp_path: Path
) -> None:
    zk = connect()
    zk.init_cluster(2)
    _, version = zk.read_assignment()
    assert zk.write_assignment({"x:1": frozenset({0, 1})}, version)
    assert not zk.write_assignment({"y:1": frozenset({0, 1})}, version)
    assert zk.read_assignment()[0] == {"x:1": frozenset({0, 1})}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    tablekeeper = Path(sys.executable).parent / "tablekeeper"
    return subprocess.run(
        [str(tablekeeper), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_cluster_cli_init_and_the_status_view(
    zookeeper: ZooKeeperProcess, connect: Callable[[], ZkCoordinator]
) -> None:
    """`tablekeeper cluster init`, then the view a server's ClusterStatus composes from
    ZooKeeper (`cluster.status.ZooKeeperView`; the CLI's `cluster status` asks a server for it,
    see test_cli and test_cluster_status)."""
    zk = ["--zk", zookeeper.hosts, "--cluster", "cli-cluster"]
    server = ZkCoordinator(zookeeper.hosts, "cli-cluster", clock=SystemClock())
    server.start()
    try:
        view = ZooKeeperView(server, "cli-cluster", "127.0.0.1:7001", lambda: [0, 1, 2, 3])
        with pytest.raises(UnavailableError, match="not initialised"):
            asyncio.run(view.view(None))
        first = run_cli("cluster", "init", *zk, "--containers", "4")
        assert first.returncode == 0, first.stderr
        assert "initialised with 4 storage containers" in first.stdout
        again = run_cli("cluster", "init", *zk, "--containers", "4")
        assert again.returncode == 0 and "already initialised" in again.stdout
        conflict = run_cli("cluster", "init", *zk, "--containers", "8")
        assert conflict.returncode == 3 and "already exists with 4" in conflict.stderr

        server.register("127.0.0.1:7001")
        server.run_for_controller("127.0.0.1:7001", Controller(server).lead)
        wait_for(lambda: server.read_assignment()[0] == {"127.0.0.1:7001": frozenset(range(4))})
        wait_for(lambda: server.controller() == "127.0.0.1:7001")
        for container in range(4):
            server.claim(container, "127.0.0.1:7001")
        status = asyncio.run(view.view(None))
    finally:
        server.stop()
    assert status.name == "cli-cluster" and status.containers == 4
    assert status.servers == ("127.0.0.1:7001",) and status.controller == "127.0.0.1:7001"
    assert status.assignment == {"127.0.0.1:7001": frozenset(range(4))}
    assert status.serving == {"127.0.0.1:7001": frozenset(range(4))}
    assert status.owners == {c: ContainerOwner("127.0.0.1:7001", 1) for c in range(4)}
    assert status.problems() == []
