"""Oxia namespaces and shards on TableKeeper tables and ranges.

An Oxia namespace `N` is the table `oxia/N`; its shards are the table's ranges (a table's ranges
never change, so neither do its shards). Namespace `default` is created when the front-end
starts; others with `tablekeeper table create oxia/NAME --ranges K`.

A shard id is `table id << 32 | range id`, so shard ids are unique over all namespaces, as the
Oxia protocol needs (reads and writes name only the shard). Oxia's client picks a shard by the
low 32 bits of XXH3-64 of the key (or partition key): shard `i` of `n` gets the `i`-th of `n`
equal slices of that 32-bit space. That is independent of TableKeeper's own pkey routing: the
front-end addresses ranges by id and keeps all Oxia keys of a range under one pkey.

In cluster mode the root range, a table's meta range and its ranges may each be on another
server: the catalog is read through their owners (`rpc.frontends`, the registry's remote
catalog), and a shard is served by the server that owns its range's container (its leader in
`GetShardAssignments`). Namespace `default` is then made in the background, through the root
range's owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.names import invalid_name_reason
from tablekeeper_server.errors import BadRequestError, NotServedHereError, StreamNotFoundError
from tablekeeper_server.oxia.errors import OxiaError
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.frontends import ensure_table, find_table
from tablekeeper_server.rpc.proxy import Forwarder

TABLE_NAMESPACE = "oxia"
DEFAULT_NAMESPACE = "default"
DEFAULT_SHARDS = 4
HASH_SPACE = 2**32


@dataclass(frozen=True, slots=True)
class Shard:
    shard_id: int
    stream_id: int
    range_id: int
    container_id: int
    ttl_seconds: int
    hash_min: int
    hash_max: int


def shard_id_of(stream_id: int, range_id: int) -> int:
    return stream_id << 32 | range_id


def split_shards(
    stream_id: int, ttl_seconds: int, ranges: list[stream_pb2.RangeProperties]
) -> list[Shard]:
    """The shards of a table's ranges (in range-id order), each with its slice of the hash."""
    ordered = sorted(ranges, key=lambda r: r.range_id)
    n = len(ordered)
    return [
        Shard(
            shard_id_of(stream_id, r.range_id),
            stream_id,
            r.range_id,
            r.storage_container_id,
            ttl_seconds,
            i * HASH_SPACE // n,
            (i + 1) * HASH_SPACE // n - 1,
        )
        for i, r in enumerate(ordered)
    ]


class Namespaces:
    """Resolves namespaces and shards (cached: a table's ranges never change while it exists)."""

    def __init__(self, registry: ContainerRegistry, forwarder: Forwarder | None = None) -> None:
        """`forwarder`: cluster mode (the catalog ranges may be on other servers)."""
        self.registry = registry
        self._forwarder = forwarder
        self._by_namespace: dict[str, list[Shard]] = {}
        self._by_id: dict[int, Shard] = {}
        self.default_pending = False
        """Cluster mode: namespace `default` is being made (not found yet means "retry")."""

    async def create_default(self, shards: int = DEFAULT_SHARDS) -> None:
        conf = stream_pb2.StreamConfiguration(
            min_num_ranges=shards, initial_num_ranges=shards, storage_type=stream_pb2.TABLE
        )
        await ensure_table(self.registry, self._forwarder, TABLE_NAMESPACE, DEFAULT_NAMESPACE, conf)

    async def shards(self, namespace: str) -> list[Shard]:
        """The namespace's shards; `OxiaError` namespace-not-found if there is no such table.
        The table is looked up every time (a read of the root range, here or on its owner): a
        namespace deleted and created again is a new table with new shards."""
        if invalid_name_reason(namespace):
            raise OxiaError.namespace_not_found()
        props = await find_table(self.registry, self._forwarder, TABLE_NAMESPACE, namespace)
        if props is None:
            self.forget(namespace)
            if namespace == DEFAULT_NAMESPACE and self.default_pending:
                raise OxiaError.unavailable("namespace default is being created")
            raise OxiaError.namespace_not_found()
        cached = self._by_namespace.get(namespace)
        if cached is not None and cached[0].stream_id == props.stream_id:
            return cached
        self.forget(namespace)
        ranges = await self._active_ranges(props.stream_id)
        shards = split_shards(props.stream_id, props.stream_conf.ttl_seconds, ranges)
        self._by_namespace[namespace] = shards
        for shard in shards:
            self._by_id[shard.shard_id] = shard
        return shards

    def forget(self, namespace: str) -> None:
        for shard in self._by_namespace.pop(namespace, []):
            self._by_id.pop(shard.shard_id, None)

    async def _active_ranges(self, stream_id: int) -> list[stream_pb2.RangeProperties]:
        """A table's ranges, from its meta range here or (cluster mode) on its owner."""
        try:
            return await self.registry.active_ranges(stream_id)
        except NotServedHereError as elsewhere:
            if self.registry.remote is None:
                raise
            return await self.registry.remote.active_ranges(stream_id, elsewhere.container_id)

    async def shard(self, shard_id: int) -> Shard:
        shard = self._by_id.get(shard_id)
        if shard is not None:
            return shard
        stream_id, range_id = shard_id >> 32, shard_id & 0xFFFFFFFF
        try:
            props = await self.registry.stream_props(stream_id)
            ranges = await self._active_ranges(stream_id)
        except StreamNotFoundError:
            raise OxiaError.shard_not_found(shard_id) from None
        for candidate in split_shards(stream_id, props.stream_conf.ttl_seconds, ranges):
            self._by_id[candidate.shard_id] = candidate
        shard = self._by_id.get(shard_id)
        if shard is None or range_id != shard.range_id:
            raise OxiaError.shard_not_found(shard_id)
        return shard

    def open_range(self, shard_id: int) -> Range | None:
        """The shard's range when it is known and open here (`range`'s cached path, without
        an await); None otherwise (then `range` resolves it)."""
        shard = self._by_id.get(shard_id)
        if shard is None:
            return None
        return self.registry.open_range_by_id(shard.stream_id, shard.range_id)

    async def range(self, shard_id: int) -> Range:
        """The open range of a shard (opened on first use); `OxiaError` shard-not-found once its
        table is gone (nothing is written into the ranges of a deleted table). `NotServedHereError`
        (cluster mode) if its container is on another server.

        Resolved through the registry's route cache, as every table request is: while the
        route is current (standalone: until the table is deleted; a route read from another
        server: for `REMOTE_ROUTE_TTL_S`) no catalog read is made."""
        shard = self._by_id.get(shard_id)
        if shard is not None:
            open_range = self.registry.open_range_by_id(shard.stream_id, shard.range_id)
            if open_range is not None:
                return open_range
        shard = await self.shard(shard_id)
        try:
            return await self.registry.range_by_id(shard.stream_id, shard.range_id)
        except (StreamNotFoundError, BadRequestError):
            self._by_id.pop(shard.shard_id, None)
            raise OxiaError.shard_not_found(shard.shard_id) from None
