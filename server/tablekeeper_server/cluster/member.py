"""This server's part in a cluster: it registers, contends for the controller role, and hosts
exactly the containers the assignment gives it.

Taking a container over: claim it in ZooKeeper (the ownership epoch grows by one), open its
ranges (opening a range's log fences the previous writer: see `log/pulsar.py`), restore them from
the shared checkpoints and log, and only then serve. Giving one up: close its ranges.

ZooKeeper session states:
- suspended (connection lost, session maybe still alive): refuse every request (retryable);
  another server may be taking the containers over. Requests already appending finish: what the
  log acknowledged is durable whoever owns the range next.
- lost (session expired): close every container; our ephemeral nodes are gone and the controller
  has given the containers to others. Once reconnected, register again (a new session).
- connected: serve again.

All state changes happen on the server's event loop; kazoo's threads only post to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tablekeeper_server.cluster.placement import Assignment
from tablekeeper_server.cluster.zookeeper import RECONCILE_INTERVAL_S, Controller, ZkCoordinator
from tablekeeper_server.container.container import StorageContainer
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock

log = logging.getLogger(__name__)


class ClusterMember:
    def __init__(
        self,
        coordinator: ZkCoordinator,
        endpoint: str,
        registry: ContainerRegistry,
        clock: Clock | None = None,
    ) -> None:
        self._zk = coordinator
        self.endpoint = endpoint
        self._registry = registry
        self._clock = clock or registry.env.clock
        """What hand-over deadlines, lingering and retry pauses wait on (the containers' clock
        unless given)."""
        self._owners: dict[int, str] = {}
        self._wanted: frozenset[int] = frozenset()
        self._changed = asyncio.Event()
        self._lost = False
        self._leaving = False
        self.draining = False
        """Shutting down, containers handed over: refuse (retryably) instead of forwarding."""
        self._task: asyncio.Task[None] | None = None
        self._assignment_listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Join the cluster (the coordinator is started); return its number of containers.
        Containers start in the background as the assignment arrives."""
        loop = asyncio.get_running_loop()
        num_containers = await asyncio.to_thread(self._zk.num_containers)

        def on_session(state: str) -> None:  # on a kazoo thread
            loop.call_soon_threadsafe(self._on_session, state)

        def on_assignment(assignment: Assignment, version: int) -> None:  # on a kazoo thread
            loop.call_soon_threadsafe(self._on_assignment, assignment, version)

        def on_containers(count: int) -> None:  # on a kazoo thread
            loop.call_soon_threadsafe(self._on_containers, count)

        self._zk.add_state_listener(on_session)
        self._zk.watch_num_containers(on_containers)
        await asyncio.to_thread(self._zk.register, self.endpoint)
        self._zk.run_for_controller(self.endpoint, Controller(self._zk).lead)
        self._zk.watch_assignment(on_assignment)
        self._task = asyncio.create_task(self._reconcile_loop(), name="cluster-reconcile")
        log.info("joined the cluster as %s (%d containers)", self.endpoint, num_containers)
        return num_containers

    async def stop(self, *, handoff_timeout_s: float = 5.0, linger_s: float = 1.0) -> None:
        """Leave gracefully. Deregister first, so the controller moves our containers while we
        still run: each is closed here (in-flight writes finish) and released, and the next
        owner takes it at once. Then `draining()` turns true for `linger_s`: requests get "not
        served here" (clients refresh their routes; our GetStorageContainerEndpoint still
        answers the new owners), instead of being cut off when the process exits. Finally
        close what is left and end the session."""
        if self._registry.suspended is None and not self._lost:
            try:
                await asyncio.to_thread(self._zk.deregister, self.endpoint)
                deadline = self._clock.monotonic_s() + handoff_timeout_s
                while (self._wanted or self._registry.containers) and (
                    self._clock.monotonic_s() < deadline
                ):
                    await self._clock.sleep(0.05)
            except Exception as exc:  # ZooKeeper unreachable: the session end does it
                log.warning("could not hand containers over before leaving: %s", exc)
            self.draining = True
            await self._clock.sleep(linger_s)
        self._leaving = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(
            *(self._give_up(c) for c in list(self._registry.containers)), return_exceptions=True
        )
        await asyncio.to_thread(self._zk.stop)

    async def _give_up(self, container_id: int) -> None:
        container = self._registry.containers.get(container_id)
        if container is None:
            return
        await self._registry.remove(container_id)
        if self._registry.suspended is None:
            await asyncio.to_thread(self._zk.release, container_id, self.endpoint, container.epoch)

    def _on_containers(self, count: int) -> None:
        """`cluster add-containers` raised the number of containers: new tables are placed
        over all of them from now on (the controller assigns them)."""
        current = self._registry.env.container_count
        if count > current.value:
            log.info("the cluster has %d storage containers now (was %d)", count, current.value)
            current.value = count

    # ------------------------------------------------------------------ views

    def on_assignment_changed(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on the event loop whenever a new assignment is known here (after
        `owner_of` answers from it), e.g. to tell clients a shard's new leader."""
        self._assignment_listeners.append(listener)

    def owner_of(self, container_id: int) -> str | None:
        """The container's server per the assignment (None: unassigned right now)."""
        return self._owners.get(container_id)

    async def still_owns(self, container: StorageContainer) -> bool:
        """Whether ZooKeeper still names us the container's owner at our epoch (checked before
        checkpointing: a server that lost a container must not truncate its log)."""
        if self._registry.suspended is not None:
            return False
        owner = await asyncio.to_thread(self._zk.owner, container.id)
        return owner is not None and (owner.endpoint, owner.epoch) == (
            self.endpoint,
            container.epoch,
        )

    # ------------------------------------------------------------------ events (event loop)

    def _on_assignment(self, assignment: Assignment, version: int) -> None:
        self._owners = {c: server for server, cs in assignment.items() for c in cs}
        self._wanted = assignment.get(self.endpoint, frozenset())
        log.info("assignment %d: this server hosts %s", version, sorted(self._wanted))
        self._changed.set()
        for listener in self._assignment_listeners:
            try:
                listener()
            except Exception:
                log.exception("an assignment listener failed")

    def _on_session(self, state: str) -> None:
        if self._leaving:
            return  # our own session close
        if state == "suspended":
            log.warning("ZooKeeper connection suspended: refusing requests until it is back")
            self._registry.suspended = (
                f"server {self.endpoint} lost its ZooKeeper connection; retry (its containers "
                "may be moving)"
            )
        elif state == "lost":
            log.warning("ZooKeeper session expired: closing all containers")
            self._lost = True
            self._registry.suspended = f"server {self.endpoint} is rejoining the cluster; retry"
            self._changed.set()
        elif state == "connected":
            if self._lost:
                log.info("ZooKeeper reconnected with a new session: registering again")
            else:
                log.info("ZooKeeper connection is back")
                self._registry.suspended = None
            self._changed.set()

    async def _reconcile_loop(self) -> None:
        while True:
            await self._clock.wait(self._changed, RECONCILE_INTERVAL_S)
            self._changed.clear()
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("could not apply the assignment; retrying")
                await self._clock.sleep(0.5)
                self._changed.set()

    async def _reconcile(self) -> None:
        if self._lost:
            await self._rejoin()
            return
        if self._registry.suspended is not None:
            return
        wanted, running = self._wanted, set(self._registry.containers)
        for container_id in sorted(running - wanted):
            log.info("container %d moved away: closing it", container_id)
            await self._give_up(container_id)
        for container_id in sorted(running & wanted):
            container = self._registry.containers.get(container_id)
            reason = container.needs_reopen() if container is not None else None
            if reason is not None:
                # E.g. another server opened one of its logs (it claimed the container from an
                # assignment that has since moved on) while the assignment still names us: open
                # it again with a new epoch rather than refuse its requests for good.
                log.warning("container %d must be reopened: %s", container_id, reason)
                await self._registry.remove(container_id)
        starting = sorted(wanted - set(self._registry.containers))
        if starting:
            results = await asyncio.gather(
                *(self._take_over(c) for c in starting), return_exceptions=True
            )
            for container_id, result in zip(starting, results, strict=True):
                if isinstance(result, BaseException):
                    log.error("could not start container %d: %s", container_id, result)
                    self._changed.set()

    async def _take_over(self, container_id: int) -> None:
        started = self._clock.monotonic_s()
        epoch = await asyncio.to_thread(
            self._zk.claim,
            container_id,
            self.endpoint,
            still_wanted=lambda: container_id in self._wanted,
        )
        if container_id not in self._wanted:
            # The assignment moved on while we waited for the previous owner: opening the logs
            # now would fence the server that has it.
            log.info(
                "container %d: assignment changed during the takeover; not opening it", container_id
            )
            await asyncio.to_thread(self._zk.release, container_id, self.endpoint, epoch)
            return
        await self._registry.add(container_id, epoch)
        log.info(
            "container %d serving (epoch %d) after %.3fs",
            container_id,
            epoch,
            self._clock.monotonic_s() - started,
        )

    async def _rejoin(self) -> None:
        """After an expired session: close everything, then register with the new session."""
        for container_id in list(self._registry.containers):
            await self._registry.remove(container_id)
        if not self._zk.zk.connected:
            return  # the next "connected" event brings us back here
        await asyncio.to_thread(self._zk.register, self.endpoint)
        self._lost = False
        self._registry.suspended = None
        log.info("registered again as %s", self.endpoint)
        self._changed.set()
