"""The containers this server hosts, and routing of table requests to their ranges.

Routing: (stream id, pkey) -> the table's ranges (from the meta range on the table's container,
cached) -> the range whose hash interval holds the pkey -> that range's container -> the range.
In standalone mode every container is local. In cluster mode the containers come and go as the
assignment changes (`add` / `remove`); a request for a container hosted elsewhere raises
`NotServedHereError`, which the RPC layer forwards to the owner, and the catalog ranges another
server owns (the root range, a table's meta range) are read through `RemoteCatalog`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from collections.abc import Awaitable, Callable
from typing import Protocol

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.root import RootCatalog
from tablekeeper_server.container.container import (
    REMOTE_ROUTE_TTL_S,
    ROOT_CONTAINER_ID,
    ContainerEnv,
    StorageContainer,
)
from tablekeeper_server.container.splitter import RangeStep, Splitter
from tablekeeper_server.core.routing import RangeRouter
from tablekeeper_server.errors import (
    BadRequestError,
    NotServedHereError,
    RangeMovedError,
    RouteNotFoundError,
    UnavailableError,
)
from tablekeeper_server.range.follower import Follower
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.range.watch import HistoryBudget

log = logging.getLogger(__name__)


class _TableRoute:
    def __init__(
        self,
        props: stream_pb2.StreamProperties,
        ranges: list[stream_pb2.RangeProperties],
        resolved_at: float,
        lineage: dict[int, tuple[int, ...]] | None = None,
    ) -> None:
        self.props = props
        self.ranges = {r.range_id: r for r in ranges}
        self.ordered = sorted(ranges, key=lambda r: r.start_hash_key)
        self.lineage = lineage or {}
        """Current range id -> the retired ranges it descends from (`MetaCatalog.lineage`)."""
        self.router = RangeRouter([r.start_hash_key for r in ranges], [r.range_id for r in ranges])
        self.resolved_at = resolved_at
        """When (the clock's `monotonic_s`) the route was read."""


class RemoteCatalog(Protocol):
    """Reads catalog ranges that other servers own (cluster mode; implemented by the RPC layer,
    which knows the owners). Raises `RouteNotFoundError` when the owner cannot be reached."""

    async def stream_props(self, stream_id: int) -> stream_pb2.StreamProperties: ...

    async def active_ranges(
        self, stream_id: int, container_id: int
    ) -> list[stream_pb2.RangeProperties]: ...

    async def ranges_and_lineage(
        self, stream_id: int, container_id: int
    ) -> tuple[list[stream_pb2.RangeProperties], dict[int, tuple[int, ...]]]:
        """`active_ranges` and `MetaCatalog.lineage`, from the meta range's owner in one call."""
        ...

    async def range_step(
        self,
        container_id: int,
        stream_id: int,
        range_id: int,
        step: RangeStep,
        children: tuple[int, ...],
        start_hashes: tuple[int, ...] = (),
    ) -> int:
        """`Splitter.step_here` on the container's owner."""
        ...


class ContainerRegistry:
    def __init__(
        self,
        env: ContainerEnv,
        container_ids: list[int],
        *,
        remote: RemoteCatalog | None = None,
    ) -> None:
        if env.history_budget is None:  # one per server: every range's watch ring shares it
            budget = HistoryBudget(env.limits.history_bytes_total_max)
            env = dataclasses.replace(env, history_budget=budget)
        self.env = env
        self.containers = {cid: StorageContainer(cid, env) for cid in container_ids}
        self.remote = remote
        self.still_owns: Callable[[StorageContainer], Awaitable[bool]] | None = None
        """Cluster mode: whether ZooKeeper still names this server the container's owner
        (checked before a checkpoint truncates a shared log)."""
        self.suspended: str | None = None
        """Why this server refuses every request right now (its ZooKeeper session is
        suspended: another server may be taking its containers over), or None."""
        self._routes: dict[int, _TableRoute] = {}
        self._resolving: dict[int, asyncio.Task[_TableRoute]] = {}
        self.splitter = Splitter(self)

    async def start(self) -> None:
        # The root container first: it is what every table operation starts from.
        ordered = sorted(self.containers.values(), key=lambda c: c.id != ROOT_CONTAINER_ID)
        for container in ordered:
            await container.start()
            self.splitter.resume(container)
        log.info("serving %d storage containers", len(self.containers))

    async def stop(self) -> None:
        await self.splitter.stop()
        await asyncio.gather(*(c.stop() for c in self.containers.values()))

    async def add(self, container_id: int, epoch: int) -> None:
        """Start hosting `container_id` (cluster mode), its previous owner being fenced by the
        ownership `epoch`. Local state from an earlier ownership is discarded first: the shared
        log and checkpoints are the truth, and a restored store keeps the checkpoints of all
        owners one lineage (incremental checkpoints match files by name)."""
        if container_id in self.containers:
            return
        container = StorageContainer(container_id, self.env, epoch=epoch)
        self.containers[container_id] = container
        try:
            await asyncio.to_thread(shutil.rmtree, container.local_dir, True)
            await container.start()
        except BaseException:
            self.containers.pop(container_id, None)
            await container.stop()
            raise
        self._routes.clear()  # routes trusted for as long as their meta range is not here
        self.splitter.resume(container)

    async def remove(self, container_id: int) -> None:
        """Stop hosting `container_id`: close its ranges (the new owner fences their logs)."""
        container = self.containers.pop(container_id, None)
        if container is not None:
            await container.stop()

    def serving(self) -> list[int]:
        """The containers that serve requests now."""
        return sorted(cid for cid, c in self.containers.items() if c.serving)

    def container(self, container_id: int) -> StorageContainer:
        if self.suspended is not None:
            raise UnavailableError(self.suspended)
        container = self.containers.get(container_id)
        if container is None:
            raise NotServedHereError(container_id)
        return container

    @property
    def root(self) -> RootCatalog:
        container = self.container(ROOT_CONTAINER_ID)
        root = container.root
        if root is None:
            raise RouteNotFoundError("the root range is not open yet")
        self._heal(container)
        return root

    def _heal(self, container: StorageContainer) -> None:
        """Standalone (and a worker of `--workers`): a failed catalog range of `container` (out
        of disk space, say) starts reopening; until it is back its requests get a retryable
        error. Cluster mode leaves that to the cluster member, which reopens the whole
        container."""
        if self.still_owns is None:
            container.heal_catalogs()

    async def stream_props(self, stream_id: int) -> stream_pb2.StreamProperties:
        """A table's properties, from the root range here or on its owner."""
        try:
            root = self.root
        except NotServedHereError:
            if self.remote is None:
                raise
            return await self.remote.stream_props(stream_id)
        return root.get_stream_by_id(stream_id)

    async def active_ranges(self, stream_id: int) -> list[stream_pb2.RangeProperties]:
        """A table's ranges from its meta range, which must be hosted here (`NotServedHereError`
        names the container otherwise)."""
        props = await self.stream_props(stream_id)  # raises StreamNotFoundError
        container = self.container(props.storage_container_id)
        meta = container.meta
        if meta is None:
            raise RouteNotFoundError(f"container {props.storage_container_id} is not open yet")
        self._heal(container)
        return await meta.active_ranges(stream_id, self.stream_props)

    def forget_route(self, stream_id: int) -> None:
        """Read the table's ranges again on its next request (they changed: a split)."""
        self._routes.pop(stream_id, None)

    def _current(self, route: _TableRoute | None) -> bool:
        """Whether a cached route may be used: always while the root range and the table's
        meta range are both here (deleting the table and splitting its ranges then drop the
        route here), else for `REMOTE_ROUTE_TTL_S`."""
        containers = self.containers
        return route is not None and (
            (ROOT_CONTAINER_ID in containers and route.props.storage_container_id in containers)
            or self.env.clock.monotonic_s() - route.resolved_at < REMOTE_ROUTE_TTL_S
        )

    async def _route(self, stream_id: int) -> _TableRoute:
        route = self._routes.get(stream_id)
        if route is not None and self._current(route):
            return route
        # One resolution per table however many requests arrive before it is cached.
        task = self._resolving.get(stream_id)
        if task is None:
            task = asyncio.create_task(self._resolve(stream_id))
            self._resolving[stream_id] = task
            task.add_done_callback(lambda _: self._resolving.pop(stream_id, None))
        return await asyncio.shield(task)

    async def _resolve(self, stream_id: int) -> _TableRoute:
        props = await self.stream_props(stream_id)
        try:
            ranges = await self.active_ranges(stream_id)
            lineage = await self.table_lineage(stream_id)
        except NotServedHereError as elsewhere:
            if self.remote is None:
                raise
            ranges, lineage = await self.remote.ranges_and_lineage(
                stream_id, elsewhere.container_id
            )
        route = _TableRoute(props, ranges, self.env.clock.monotonic_s(), lineage)
        self._routes[stream_id] = route
        return route

    async def _holder(
        self, stream_id: int, pkey: bytes, range_id: int
    ) -> tuple[_TableRoute, stream_pb2.RangeProperties]:
        """The table's route and the range in it that holds `pkey`; a request naming a range
        (`range_id` > 0) must name that one or a retired ancestor of it (see `table_range`)."""
        route = await self._route(stream_id)
        if range_id > max(route.ranges):  # the client knows of a split this route predates
            self.forget_route(stream_id)
            route = await self._route(stream_id)
        range_props = route.ranges[route.router.route(pkey)]
        if (
            range_id > 0
            and range_id != range_props.range_id
            and range_id not in route.lineage.get(range_props.range_id, ())
        ):
            # (A range a split retired is an ancestor of the one holding the key now: a client
            # still routing by it is served there.)
            raise RouteNotFoundError(
                f"range {range_id} of table {stream_id} does not hold this key "
                f"(it belongs to range {range_props.range_id})"
            )
        return route, range_props

    async def table_range(self, stream_id: int, pkey: bytes, range_id: int = 0) -> Range:
        """The range that serves `pkey` of table `stream_id`, opened if needed.

        Requests are routed by their pkey. A request that also names a range (`range_id` > 0,
        as proxies and Java clients send) must name that same range, or a range a split retired
        that it descends from; otherwise it was routed with stale information and gets
        `RouteNotFoundError` (clients retry after refreshing). A range being split answers
        `RangeMovedError` (retryable) until the switch; after it, the child holding the key.
        """
        route, range_props = await self._holder(stream_id, pkey, range_id)
        container = self.container(range_props.storage_container_id)
        range_ = await container.data_range(
            stream_id, range_props.range_id, route.props.stream_conf.ttl_seconds
        )
        if range_.sealed is None:
            return range_
        # Split: once the switch is done the table's ranges read again route to a child. (When
        # this server runs the split, the request waits for the switch instead of being refused
        # and sent again.)
        await self.splitter.switched(stream_id, range_props.range_id)
        self.forget_route(stream_id)
        route = await self._route(stream_id)
        moved_to = route.ranges[route.router.route(pkey)]
        if moved_to.range_id == range_props.range_id:
            raise RangeMovedError(
                f"range {range_props.range_id} of table {stream_id} is being split; retry",
                range_.sealed,
            )
        container = self.container(moved_to.storage_container_id)
        return await container.data_range(
            stream_id, moved_to.range_id, route.props.stream_conf.ttl_seconds
        )

    async def range_by_id(self, stream_id: int, range_id: int) -> Range:
        """Range `range_id` of table `stream_id`, opened if needed, for front-ends that address
        ranges by id rather than by pkey (Oxia's shards). Resolved through the same route cache
        as `table_range`: `StreamNotFoundError` once the table is gone, `NotServedHereError`
        (cluster mode) when its container is on another server, `BadRequestError` when the
        table has no such range now."""
        route = await self._route(stream_id)
        range_props = route.ranges.get(range_id)
        if range_props is None:
            self.forget_route(stream_id)
            route = await self._route(stream_id)
            range_props = route.ranges.get(range_id)
            if range_props is None:
                raise BadRequestError(f"table {stream_id} has no range {range_id}")
        container = self.container(range_props.storage_container_id)
        return await container.data_range(stream_id, range_id, route.props.stream_conf.ttl_seconds)

    def open_range_by_id(self, stream_id: int, range_id: int) -> Range | None:
        """`range_by_id` when the answer is at hand (the route cached and current, the range
        open and healthy here, not sealed); None otherwise: then call `range_by_id`."""
        route = self._routes.get(stream_id)
        if route is None or self.suspended is not None or not self._current(route):
            return None
        range_props = route.ranges.get(range_id)
        if range_props is None:
            return None
        container = self.containers.get(range_props.storage_container_id)
        if container is None:
            return None
        range_ = container.open_data_range(stream_id, range_id)
        return None if range_ is None or range_.sealed is not None else range_

    async def follower_of(self, stream_id: int, pkey: bytes, range_id: int = 0) -> Follower:
        """This server's follower of the range holding `pkey` of table `stream_id` (a range
        another server owns), opened and caught up if it was not. `range_id`: as for
        `table_range`. Raises `UnavailableError` when this server keeps no followers."""
        followers = self.env.followers
        if followers is None:
            raise UnavailableError("this server keeps no followers (it needs a shared log)")
        route, range_props = await self._holder(stream_id, pkey, range_id)
        name = RangeName(range_props.storage_container_id, stream_id, range_props.range_id)
        return await followers.get(name, route.props.stream_conf.ttl_seconds)

    async def table_lineage(self, stream_id: int) -> dict[int, tuple[int, ...]]:
        """`MetaCatalog.lineage` of a table whose meta range is hosted here
        (`NotServedHereError` names its container otherwise)."""
        props = await self.stream_props(stream_id)
        meta = self.container(props.storage_container_id).meta
        return {} if meta is None else meta.lineage(stream_id)

    async def scan_targets(self, stream_id: int, range_id: int) -> list[stream_pb2.RangeProperties]:
        """What to read for range `range_id` of the table: the range itself while it is
        current; once a split retired it, the current ranges that hold its keys (its
        descendants, in hash order). Raises `BadRequestError` for an id the table never had."""
        route = await self._route(stream_id)
        if range_id not in route.ranges and not any(
            range_id in ancestors for ancestors in route.lineage.values()
        ):
            self.forget_route(stream_id)  # perhaps split since it was read
            route = await self._route(stream_id)
        if range_id in route.ranges:
            return [route.ranges[range_id]]
        found = [r for r in route.ordered if range_id in route.lineage.get(r.range_id, ())]
        if not found:
            raise BadRequestError(f"table {stream_id} has no range {range_id}")
        return found

    async def container_of(self, stream_id: int, pkey: bytes) -> int:
        """The storage container of the range that holds `pkey` of table `stream_id` (here or
        elsewhere; raises what routing raises, e.g. `StreamNotFoundError`)."""
        route = await self._route(stream_id)
        return route.ranges[route.router.route(pkey)].storage_container_id

    def open_table_range(self, stream_id: int, pkey: bytes, range_id: int = 0) -> Range | None:
        """`table_range` when the answer is at hand: the table's route is cached and current,
        and the range is open and healthy in a container here. None otherwise (including every
        case where `table_range` would raise): then call `table_range`."""
        route = self._routes.get(stream_id)
        if route is None or self.suspended is not None or not self._current(route):
            return None
        range_props = route.ranges[route.router.route(pkey)]
        if range_id > 0 and range_id != range_props.range_id:
            return None
        container = self.containers.get(range_props.storage_container_id)
        if container is None:
            return None
        range_ = container.open_data_range(stream_id, range_props.range_id)
        return None if range_ is None or range_.sealed is not None else range_

    async def drop_tables(self, tables: list[stream_pb2.StreamProperties]) -> None:
        """Remove the ranges and data of deleted tables (best effort; logged on failure)."""
        for props in tables:
            self._routes.pop(props.stream_id, None)
            try:
                if props.storage_container_id not in self.containers:
                    # Cluster mode: the table's meta range is elsewhere; its ranges stay until
                    # that container removes them (not done yet: see README, cluster mode).
                    continue
                meta = self.container(props.storage_container_id).meta
                if meta is None:
                    continue
                for range_props in await meta.forget_stream(props.stream_id):
                    container = self.containers.get(range_props.storage_container_id)
                    if container is not None:
                        await container.drop_range(props.stream_id, range_props.range_id)
            except Exception:
                log.exception("could not remove the data of deleted table %d", props.stream_id)

    async def open_table_ranges(self, stream_id: int, *, hosted_only: bool = False) -> list[Range]:
        """Open every range of a table (for checkpoints and status of a whole table); with
        `hosted_only`, those in the containers hosted here."""
        route = await self._route(stream_id)
        ranges = []
        for range_props in route.ranges.values():
            if hosted_only and range_props.storage_container_id not in self.containers:
                continue
            container = self.container(range_props.storage_container_id)
            ranges.append(
                await container.data_range(
                    stream_id, range_props.range_id, route.props.stream_conf.ttl_seconds
                )
            )
        return ranges

    def all_ranges(self) -> list[Range]:
        return [r for c in list(self.containers.values()) for r in c.ranges.values()]

    async def checkpoint(
        self, stream_id: int = 0, *, force: bool = True, hosted_only: bool = False
    ) -> list[Range]:
        """Checkpoint one table's ranges (`stream_id`), or every open range (0). `hosted_only`:
        of the table's ranges, those in containers hosted here (the others are not an error)."""
        ranges = (
            await self.open_table_ranges(stream_id, hosted_only=hosted_only)
            if stream_id
            else self.all_ranges()
        )
        for range_ in ranges:
            await self.checkpoint_range(range_, force=force)
        return ranges

    async def checkpoint_range(self, range_: Range, *, force: bool = False) -> None:
        """Checkpoint one open range (and truncate its log), if its container is still ours."""
        container = self.containers.get(range_.name.container_id)
        if container is None:
            return  # moved away meanwhile
        if self.still_owns is not None and not await self.still_owns(container):
            raise UnavailableError(
                f"not checkpointing {range_.name.log_name}: container {container.id} is no "
                "longer owned by this server"
            )
        await range_.checkpoint(force=force)

    def open_ranges(self) -> int:
        return sum(len(c.ranges) for c in self.containers.values())
