"""The containers this server hosts, and routing of table requests to their ranges.

Routing: (stream id, pkey) -> the table's ranges (from the meta range on the table's container,
cached) -> the range whose hash interval holds the pkey -> that range's container -> the range.
In standalone mode every container is local; a container that is not hosted here answers
`RouteNotFoundError` (gRPC NOT_FOUND, which clients retry).
"""

from __future__ import annotations

import asyncio
import logging

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.root import RootCatalog
from tablekeeper_server.container.container import (
    ROOT_CONTAINER_ID,
    ContainerEnv,
    StorageContainer,
)
from tablekeeper_server.core.routing import RangeRouter
from tablekeeper_server.errors import RouteNotFoundError
from tablekeeper_server.range.replica import Range

log = logging.getLogger(__name__)


class _TableRoute:
    def __init__(
        self, props: stream_pb2.StreamProperties, ranges: list[stream_pb2.RangeProperties]
    ) -> None:
        self.props = props
        self.ranges = {r.range_id: r for r in ranges}
        self.router = RangeRouter([r.start_hash_key for r in ranges], [r.range_id for r in ranges])


class ContainerRegistry:
    def __init__(self, env: ContainerEnv, container_ids: list[int]) -> None:
        self.env = env
        self.containers = {cid: StorageContainer(cid, env) for cid in container_ids}
        self._routes: dict[int, _TableRoute] = {}
        self._resolving: dict[int, asyncio.Task[_TableRoute]] = {}

    async def start(self) -> None:
        # The root container first: it is what every table operation starts from.
        ordered = sorted(self.containers.values(), key=lambda c: c.id != ROOT_CONTAINER_ID)
        for container in ordered:
            await container.start()
        log.info("serving %d storage containers", len(self.containers))

    async def stop(self) -> None:
        await asyncio.gather(*(c.stop() for c in self.containers.values()))

    def container(self, container_id: int) -> StorageContainer:
        container = self.containers.get(container_id)
        if container is None:
            raise RouteNotFoundError(f"storage container {container_id} is not served here")
        return container

    @property
    def root(self) -> RootCatalog:
        root = self.container(ROOT_CONTAINER_ID).root
        if root is None:
            raise RouteNotFoundError("the root range is not open yet")
        return root

    async def stream_props(self, stream_id: int) -> stream_pb2.StreamProperties:
        return self.root.get_stream_by_id(stream_id)

    async def active_ranges(self, stream_id: int) -> list[stream_pb2.RangeProperties]:
        props = self.root.get_stream_by_id(stream_id)  # raises StreamNotFoundError
        meta = self.container(props.storage_container_id).meta
        if meta is None:
            raise RouteNotFoundError(f"container {props.storage_container_id} is not open yet")
        return await meta.active_ranges(stream_id, self.stream_props)

    async def _route(self, stream_id: int) -> _TableRoute:
        route = self._routes.get(stream_id)
        if route is not None:
            return route
        # One resolution per table however many requests arrive before it is cached.
        task = self._resolving.get(stream_id)
        if task is None:
            task = asyncio.create_task(self._resolve(stream_id))
            self._resolving[stream_id] = task
            task.add_done_callback(lambda _: self._resolving.pop(stream_id, None))
        return await asyncio.shield(task)

    async def _resolve(self, stream_id: int) -> _TableRoute:
        props = self.root.get_stream_by_id(stream_id)
        ranges = await self.active_ranges(stream_id)
        route = _TableRoute(props, ranges)
        self._routes[stream_id] = route
        return route

    async def table_range(self, stream_id: int, pkey: bytes, range_id: int = 0) -> Range:
        """The range that serves `pkey` of table `stream_id`, opened if needed.

        Requests are routed by their pkey. A request that also names a range (`range_id` > 0,
        as proxies and Java clients send) must name that same range; otherwise it was routed
        with stale information and gets `RouteNotFoundError` (clients retry after refreshing).
        """
        route = await self._route(stream_id)
        range_props = route.ranges[route.router.route(pkey)]
        if range_id > 0 and range_id != range_props.range_id:
            raise RouteNotFoundError(
                f"range {range_id} of table {stream_id} does not hold this key "
                f"(it belongs to range {range_props.range_id})"
            )
        container = self.container(range_props.storage_container_id)
        return await container.data_range(
            stream_id, range_props.range_id, route.props.stream_conf.ttl_seconds
        )

    async def drop_tables(self, tables: list[stream_pb2.StreamProperties]) -> None:
        """Remove the ranges and data of deleted tables (best effort; logged on failure)."""
        for props in tables:
            self._routes.pop(props.stream_id, None)
            try:
                meta = self.container(props.storage_container_id).meta
                if meta is None:
                    continue
                for range_props in await meta.forget_stream(props.stream_id):
                    container = self.containers.get(range_props.storage_container_id)
                    if container is not None:
                        await container.drop_range(props.stream_id, range_props.range_id)
            except Exception:
                log.exception("could not remove the data of deleted table %d", props.stream_id)

    async def open_table_ranges(self, stream_id: int) -> list[Range]:
        """Open every range of a table (for checkpoints and status of a whole table)."""
        route = await self._route(stream_id)
        ranges = []
        for range_props in route.ranges.values():
            container = self.container(range_props.storage_container_id)
            ranges.append(
                await container.data_range(
                    stream_id, range_props.range_id, route.props.stream_conf.ttl_seconds
                )
            )
        return ranges

    def all_ranges(self) -> list[Range]:
        return [r for c in self.containers.values() for r in c.ranges.values()]

    async def checkpoint(self, stream_id: int = 0, *, force: bool = True) -> list[Range]:
        """Checkpoint one table's ranges (`stream_id`), or every open range (0)."""
        ranges = await self.open_table_ranges(stream_id) if stream_id else self.all_ranges()
        for range_ in ranges:
            await range_.checkpoint(force=force)
        return ranges

    def open_ranges(self) -> int:
        return sum(len(c.ranges) for c in self.containers.values())
