"""`tablekeeper cluster status` without processes: the view the cluster package composes (from a
stand-in for ZooKeeper's record, or a standalone server's fixed split, and each server's
ServerInfo), its readiness, the Admin service's message, and the client's report and JSON of
it."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import pytest

from tablekeeper._cli_cluster import report, status_doc
from tablekeeper_server.cluster.placement import Assignment
from tablekeeper_server.cluster.status import (
    ClusterView,
    ContainerOwner,
    FixedView,
    ZooKeeperView,
)
from tablekeeper_server.cluster.zookeeper import ClusterError, Ownership
from tablekeeper_server.errors import UnavailableError
from tablekeeper_server.rpc.admin import cluster_status_response

pytestmark = pytest.mark.unit


class FakeRecord:
    """What `ZooKeeperView` reads of a `ZkCoordinator`, without ZooKeeper."""

    def __init__(
        self,
        containers: int,
        servers: list[str],
        assignment: Assignment,
        owners: dict[int, Ownership],
        controller: str | None,
    ) -> None:
        self.zk = SimpleNamespace(connected=True)
        self._containers = containers
        self._servers = servers
        self._assignment = assignment
        self._owners = owners
        self._controller = controller
        self.failure: Exception | None = None

    def num_containers(self) -> int:
        if self.failure is not None:
            raise self.failure
        return self._containers

    def read_assignment(self) -> tuple[Assignment, int]:
        return self._assignment, 7

    def live_servers(self) -> list[str]:
        return sorted(self._servers)

    def controller(self) -> str | None:
        return self._controller

    def owner(self, container: int) -> Ownership | None:
        return self._owners.get(container)


class Asker:
    """An `AskServing` with fixed answers (an exception: that server cannot be asked); it
    records whom it asked."""

    def __init__(self, answers: dict[str, Iterable[int] | Exception]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, float]] = []

    async def __call__(self, endpoint: str, timeout_s: float) -> Iterable[int]:
        self.asked.append((endpoint, timeout_s))
        answer = self.answers[endpoint]
        if isinstance(answer, Exception):
            raise answer
        return answer


A, B, C = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"


def zookeeper_view(
    record: FakeRecord, serving_here: list[int], peer_timeout_s: float = 2.0
) -> ZooKeeperView:
    """The view of server A of cluster "c" over `record`."""
    return ZooKeeperView(
        record,  # type: ignore[arg-type]  # it has what the view reads of a ZkCoordinator
        "c",
        A,
        lambda: serving_here,
        peer_timeout_s=peer_timeout_s,
    )


async def test_zookeeper_view_owners_moving_unclaimed_and_a_server_that_cannot_be_asked() -> None:
    record = FakeRecord(
        containers=4,
        servers=[A, B],
        assignment={A: frozenset({0, 1}), B: frozenset({2}), C: frozenset()},
        owners={0: Ownership(A, 1), 1: Ownership(C, 2, released=True), 2: Ownership(B, 3)},
        controller=A,
    )
    ask = Asker({B: UnavailableError("UNAVAILABLE (connection refused)")})
    view = await zookeeper_view(record, [0, 1], peer_timeout_s=1.5).view(ask)
    assert ask.asked == [(B, 1.5)]  # A is this server: not asked
    assert view.servers == (A, B) and view.controller == A and view.revision == 7
    assert view.serving == {
        A: frozenset({0, 1}),
        B: "ServerInfo failed: UNAVAILABLE (connection refused)",
    }
    assert view.owners[1] == ContainerOwner(C, 2, released=True) and view.owners[3] is None
    assert view.problems() == [
        "containers [3] are unassigned",
        f"{B}: ServerInfo failed: UNAVAILABLE (connection refused)",
    ]

    doc = status_doc(cluster_status_response(view))
    assert doc == {
        "cluster": "c",
        "containers": 4,
        "servers": [A, B],
        "controller": A,
        "assignment_revision": 7,
        "assignment": {A: [0, 1], B: [2], C: []},
        "serving": {A: [0, 1], B: "ServerInfo failed: UNAVAILABLE (connection refused)"},
        "owners": [
            {"container": 0, "assigned_to": A, "owner": A, "epoch": 1, "released": False},
            {"container": 1, "assigned_to": A, "owner": C, "epoch": 2, "released": True},
            {"container": 2, "assigned_to": B, "owner": B, "epoch": 3, "released": False},
            {"container": 3, "assigned_to": None, "owner": None, "epoch": None, "released": None},
        ],
        "ready": False,
        "problems": view.problems(),
    }
    lines = report(cluster_status_response(view))
    assert lines[:4] == [
        "cluster c: 4 storage containers",
        f"servers: {A}, {B}",
        f"controller: {A}",
        "assignment (revision 7):",
    ]
    assert f"  {A}: [0, 1]" in lines and "  unassigned: [3]" in lines
    rows = {int(line.split()[0]): line.split()[1:] for line in lines if line[:11].strip().isdigit()}
    assert rows == {
        0: [A, A, "(1)"],
        1: [A, C, "(2)", "moving", "released"],
        2: [B, B, "(3)"],
        3: ["-", "-"],
    }
    assert lines[-1].startswith(f"ready: no (containers [3] are unassigned; {B}: ServerInfo")


async def test_zookeeper_view_of_a_ready_cluster() -> None:
    record = FakeRecord(
        containers=2,
        servers=[A, B],
        assignment={A: frozenset({0}), B: frozenset({1})},
        owners={0: Ownership(A, 1), 1: Ownership(B, 1)},
        controller=B,
    )
    view = await zookeeper_view(record, [0]).view(Asker({B: [1]}))
    response = cluster_status_response(view)
    assert response.ready and not response.problems
    assert report(response)[-1] == "ready: yes"
    # A server that serves other containers than it is assigned.
    view = await zookeeper_view(record, []).view(Asker({B: [0, 1]}))
    assert view.problems() == [f"{A} serves [], assigned [0]", f"{B} serves [0, 1], assigned [1]"]


async def test_an_unreadable_record_is_unavailable() -> None:
    record = FakeRecord(2, [A], {A: frozenset({0, 1})}, {}, A)
    record.failure = ClusterError("cluster /tablekeeper/c is not initialised")
    source = zookeeper_view(record, [])
    with pytest.raises(UnavailableError, match="is not initialised"):
        await source.view(None)
    record.zk.connected = False
    with pytest.raises(UnavailableError, match="ZooKeeper connection is down"):
        await source.view(None)


async def test_standalone_view_is_this_server_alone() -> None:
    served: list[int] = [0, 1, 2]
    source = FixedView([A], 0, 4, lambda: served)
    view = await source.view(None)
    assert view.name == "" and view.servers == (A,) and view.controller is None
    assert view.assignment == {A: frozenset(range(4))}
    assert view.owners == {
        0: ContainerOwner(A, 0),
        1: ContainerOwner(A, 0),
        2: ContainerOwner(A, 0),
        3: None,
    }
    assert view.problems() == [f"{A} serves [0, 1, 2], assigned [0, 1, 2, 3]"]
    served.append(3)  # container 3 is open now
    response = cluster_status_response(await source.view(None))
    assert response.ready and response.cluster == ""
    doc = status_doc(response)
    assert doc["cluster"] is None and doc["controller"] is None and doc["ready"] is True
    assert report(response)[0] == f"standalone server {A}: 4 storage containers"


async def test_workers_view_asks_every_other_worker() -> None:
    """`--workers 3`: worker 1 answers for all three; container c is worker c % 3's."""
    ask = Asker({A: [0, 3], C: UnavailableError("UNAVAILABLE")})
    view = await FixedView([A, B, C], 1, 5, lambda: [1, 4]).view(ask)
    assert sorted(endpoint for endpoint, _ in ask.asked) == [A, C]
    assert view.assignment == {A: frozenset({0, 3}), B: frozenset({1, 4}), C: frozenset({2})}
    assert view.serving == {
        A: frozenset({0, 3}),
        B: frozenset({1, 4}),
        C: "ServerInfo failed: UNAVAILABLE",
    }
    assert view.owners[2] is None and view.owners[4] == ContainerOwner(B, 0)
    assert view.problems() == [f"{C}: ServerInfo failed: UNAVAILABLE"]
    assert report(cluster_status_response(view))[0] == (
        "standalone server, 3 workers: 5 storage containers"
    )


def test_problems_name_assigned_servers_that_are_not_live() -> None:
    view = ClusterView(
        name="c",
        containers=2,
        servers=(A,),
        controller=A,
        assignment={A: frozenset({0}), B: frozenset({1})},
        revision=3,
        owners={0: ContainerOwner(A, 1), 1: None},
        serving={A: frozenset({0})},
    )
    assert view.problems() == [f"{B} is assigned [1] but is not live"]
