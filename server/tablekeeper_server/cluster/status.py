"""The cluster as one server sees it, for `tablekeeper cluster status` (the Admin service's
ClusterStatus): ZooKeeper's record (live servers, the controller, the assignment and its
revision, each container's owner and ownership epoch) plus what each live server says it serves
(its ServerInfo), and whether that adds up to a ready cluster.

A standalone server has no ZooKeeper: its containers are fixed (all of them; with `--workers N`,
container c belongs to worker c % N, each worker on its own port), so its view is made of that
split and each process's ServerInfo (`FixedView`).

ZooKeeper is read with blocking kazoo calls, in a thread (never on the event loop); kazoo is
imported only then, so a standalone server needs no kazoo for its view. Other
servers are asked through an `AskServing` function that the caller supplies: the RPC layer asks
them with the credentials (TLS, the server's token) it uses to forward requests to them. This
server itself is not asked over the network: `serving_here` says what it serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tablekeeper_server.cluster.placement import Assignment
from tablekeeper_server.errors import UnavailableError

if TYPE_CHECKING:
    from tablekeeper_server.cluster.zookeeper import ZkCoordinator

AskServing = Callable[[str, float], Awaitable[Iterable[int]]]
"""`ask(endpoint, timeout_s)`: the containers the server at `endpoint` reports serving (its
ServerInfo), answered within `timeout_s`. Raises when that server cannot be asked; the view then
carries `str(exception)` as the reason."""

PEER_TIMEOUT_S = 2.0
"""How long a live server gets to answer its ServerInfo."""
ZOOKEEPER_TIMEOUT_S = 10.0
"""How long reading the cluster's record from ZooKeeper may take."""


@dataclass(frozen=True, slots=True)
class ContainerOwner:
    """A container's owner as the cluster records it."""

    endpoint: str
    epoch: int
    """The ownership epoch: every takeover raises it by one (0 on a standalone server)."""
    released: bool = False
    """The owner has closed the container (the next owner need not wait for it)."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One snapshot of a cluster: its coordination record plus what each live server serves."""

    name: str
    """The cluster's name; empty for a standalone server."""
    containers: int
    servers: tuple[str, ...]
    """Live servers, sorted."""
    controller: str | None
    assignment: Mapping[str, frozenset[int]]
    revision: int
    owners: Mapping[int, ContainerOwner | None]
    """Per container: its current owner, or None if nobody claimed it."""
    serving: Mapping[str, frozenset[int] | str]
    """Per live server: the containers its ServerInfo lists, or why it could not be asked."""

    def assigned_to(self) -> dict[int, str]:
        """container -> the server the assignment gives it to (unassigned ones are missing)."""
        return {c: server for server, cs in self.assignment.items() for c in cs}

    def problems(self) -> list[str]:
        """Why the cluster is not ready (empty when ready): ready means every container is
        assigned to a live server and every live server serves exactly its containers."""
        found: list[str] = []
        assigned = self.assigned_to()
        unassigned = sorted(set(range(self.containers)) - set(assigned))
        if unassigned:
            found.append(f"containers {unassigned} are unassigned")
        for server, owned in sorted(self.assignment.items()):
            if owned and server not in self.servers:
                found.append(f"{server} is assigned {sorted(owned)} but is not live")
        for server in self.servers:
            serving = self.serving.get(server, "not asked")
            wanted = self.assignment.get(server, frozenset())
            if isinstance(serving, str):
                found.append(f"{server}: {serving}")
            elif serving != wanted:
                found.append(f"{server} serves {sorted(serving)}, assigned {sorted(wanted)}")
        return found


class ViewSource(Protocol):
    """Where a server's view of its cluster comes from."""

    async def view(self, ask: AskServing | None) -> ClusterView:
        """A fresh snapshot. `ask` reaches the other servers (None: there is no way to, and
        each of them is reported as not asked). Raises `UnavailableError` when the cluster's
        record cannot be read right now (another server may be able to)."""
        ...


async def _serving(
    servers: Sequence[str],
    here: str,
    serving_here: Callable[[], Iterable[int]],
    ask: AskServing | None,
    timeout_s: float,
) -> dict[str, frozenset[int] | str]:
    """What each of `servers` serves, asked concurrently (this server, `here`, locally)."""

    async def one(server: str) -> frozenset[int] | str:
        if server == here:
            return frozenset(serving_here())
        if ask is None:
            return "not asked: this server has no channel to it"
        try:
            return frozenset(await ask(server, timeout_s))
        except Exception as exc:
            return f"ServerInfo failed: {exc}"

    answers = await asyncio.gather(*(one(server) for server in servers))
    return dict(zip(servers, answers, strict=True))


@dataclass(frozen=True, slots=True)
class _Record:
    containers: int
    servers: tuple[str, ...]
    controller: str | None
    assignment: Assignment
    revision: int
    owners: dict[int, ContainerOwner | None]


def _read_record(coordinator: ZkCoordinator) -> _Record:
    """The cluster's record in ZooKeeper (blocking: run it in a thread)."""
    containers = coordinator.num_containers()
    assignment, revision = coordinator.read_assignment()
    owners: dict[int, ContainerOwner | None] = {}
    for container in range(containers):
        owner = coordinator.owner(container)
        owners[container] = (
            None if owner is None else ContainerOwner(owner.endpoint, owner.epoch, owner.released)
        )
    return _Record(
        containers=containers,
        servers=tuple(coordinator.live_servers()),
        controller=coordinator.controller(),
        assignment=assignment,
        revision=revision,
        owners=owners,
    )


class ZooKeeperView:
    """A cluster-mode server's view: the record in ZooKeeper (read through this server's own
    session), and the ServerInfo of every live server."""

    def __init__(
        self,
        coordinator: ZkCoordinator,
        cluster: str,
        endpoint: str,
        serving_here: Callable[[], Iterable[int]],
        *,
        peer_timeout_s: float = PEER_TIMEOUT_S,
        zookeeper_timeout_s: float = ZOOKEEPER_TIMEOUT_S,
    ) -> None:
        """`endpoint`: this server's, as registered; `serving_here()`: what it serves."""
        self._zk = coordinator
        self._cluster = cluster
        self._endpoint = endpoint
        self._serving_here = serving_here
        self._peer_timeout_s = peer_timeout_s
        self._zookeeper_timeout_s = zookeeper_timeout_s

    async def view(self, ask: AskServing | None) -> ClusterView:
        record = await self._read()
        serving = await _serving(
            record.servers, self._endpoint, self._serving_here, ask, self._peer_timeout_s
        )
        return ClusterView(
            name=self._cluster,
            containers=record.containers,
            servers=record.servers,
            controller=record.controller,
            assignment=record.assignment,
            revision=record.revision,
            owners=record.owners,
            serving=serving,
        )

    async def _read(self) -> _Record:
        from kazoo.exceptions import KazooException

        from tablekeeper_server.cluster.zookeeper import ClusterError

        where = f"cluster {self._cluster}'s state in ZooKeeper"
        if not self._zk.zk.connected:
            raise UnavailableError(
                f"server {self._endpoint} cannot read {where}: its ZooKeeper connection is down"
            )
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(_read_record, self._zk), self._zookeeper_timeout_s
            )
        except TimeoutError:
            raise UnavailableError(
                f"server {self._endpoint} could not read {where} within "
                f"{self._zookeeper_timeout_s:g}s"
            ) from None
        except (ClusterError, KazooException) as exc:
            reason = str(exc) or type(exc).__name__
            raise UnavailableError(
                f"server {self._endpoint} cannot read {where}: {reason}"
            ) from None


class FixedView:
    """A standalone server's view: no ZooKeeper, a fixed split of the containers. Alone, one
    server holds them all; with `--workers N`, worker i (at `endpoints[i]`) holds the containers
    c with c % N == i. A container's owner is the process that serves it (epoch 0: nothing is
    ever claimed); one that is not open (yet) has none."""

    def __init__(
        self,
        endpoints: Sequence[str],
        index: int,
        containers: int,
        serving_here: Callable[[], Iterable[int]],
        *,
        peer_timeout_s: float = PEER_TIMEOUT_S,
    ) -> None:
        """`endpoints`: every process's endpoint (one, unless `--workers`); `index`: this
        one's; `serving_here()`: what this process serves."""
        if not 0 <= index < len(endpoints):
            raise ValueError(f"index {index} is not one of {len(endpoints)} endpoints")
        self._endpoints = tuple(endpoints)
        self._index = index
        self._containers = containers
        self._serving_here = serving_here
        self._peer_timeout_s = peer_timeout_s

    async def view(self, ask: AskServing | None) -> ClusterView:
        endpoints, count = self._endpoints, len(self._endpoints)
        assignment = {
            endpoint: frozenset(c for c in range(self._containers) if c % count == i)
            for i, endpoint in enumerate(endpoints)
        }
        serving = await _serving(
            endpoints, endpoints[self._index], self._serving_here, ask, self._peer_timeout_s
        )
        owners: dict[int, ContainerOwner | None] = {}
        for container in range(self._containers):
            holder = endpoints[container % count]
            served = serving.get(holder)
            held = not isinstance(served, str) and served is not None and container in served
            owners[container] = ContainerOwner(holder, 0) if held else None
        return ClusterView(
            name="",
            containers=self._containers,
            servers=tuple(sorted(endpoints)),
            controller=None,
            assignment=assignment,
            revision=0,
            owners=owners,
            serving={endpoint: serving[endpoint] for endpoint in sorted(endpoints)},
        )
