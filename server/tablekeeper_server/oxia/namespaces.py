"""Oxia namespaces and shards on TableKeeper tables and ranges.

An Oxia namespace `N` is the table `oxia/N`; its shards are the table's ranges (a table's ranges
never change, so neither do its shards). Namespace `default` is created when the front-end
starts; others with `tablekeeper table create oxia/NAME --ranges K`.

A shard id is `table id << 32 | range id`, so shard ids are unique over all namespaces, as the
Oxia protocol needs (reads and writes name only the shard). Oxia's client picks a shard by the
low 32 bits of XXH3-64 of the key (or partition key): shard `i` of `n` gets the `i`-th of `n`
equal slices of that 32-bit space. That is independent of TableKeeper's own pkey routing: the
front-end addresses ranges by id and keeps all Oxia keys of a range under one pkey.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.names import invalid_name_reason
from tablekeeper_server.errors import (
    NamespaceExistsError,
    NamespaceNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
)
from tablekeeper_server.oxia.errors import OxiaError
from tablekeeper_server.range.replica import Range

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

    def __init__(self, registry: ContainerRegistry) -> None:
        self.registry = registry
        self._by_namespace: dict[str, list[Shard]] = {}
        self._by_id: dict[int, Shard] = {}

    async def create_default(self, shards: int = DEFAULT_SHARDS) -> None:
        root = self.registry.root
        with contextlib.suppress(NamespaceExistsError):
            await root.create_namespace(TABLE_NAMESPACE, stream_pb2.NamespaceConfiguration())
        conf = stream_pb2.StreamConfiguration(
            min_num_ranges=shards, initial_num_ranges=shards, storage_type=stream_pb2.TABLE
        )
        with contextlib.suppress(StreamExistsError):
            await root.create_stream(TABLE_NAMESPACE, DEFAULT_NAMESPACE, conf)

    async def shards(self, namespace: str) -> list[Shard]:
        """The namespace's shards; `OxiaError` namespace-not-found if there is no such table.
        The table is looked up every time (a local read): a namespace deleted and created again
        is a new table with new shards."""
        if invalid_name_reason(namespace):
            raise OxiaError.namespace_not_found()
        try:
            props = self.registry.root.get_stream(TABLE_NAMESPACE, namespace)
        except (NamespaceNotFoundError, StreamNotFoundError):
            self.forget(namespace)
            raise OxiaError.namespace_not_found() from None
        cached = self._by_namespace.get(namespace)
        if cached is not None and cached[0].stream_id == props.stream_id:
            return cached
        self.forget(namespace)
        ranges = await self.registry.active_ranges(props.stream_id)
        shards = split_shards(props.stream_id, props.stream_conf.ttl_seconds, ranges)
        self._by_namespace[namespace] = shards
        for shard in shards:
            self._by_id[shard.shard_id] = shard
        return shards

    def forget(self, namespace: str) -> None:
        for shard in self._by_namespace.pop(namespace, []):
            self._by_id.pop(shard.shard_id, None)

    async def shard(self, shard_id: int) -> Shard:
        shard = self._by_id.get(shard_id)
        if shard is not None:
            return shard
        stream_id, range_id = shard_id >> 32, shard_id & 0xFFFFFFFF
        try:
            props = await self.registry.stream_props(stream_id)
            ranges = await self.registry.active_ranges(stream_id)
        except StreamNotFoundError:
            raise OxiaError.shard_not_found(shard_id) from None
        for candidate in split_shards(stream_id, props.stream_conf.ttl_seconds, ranges):
            self._by_id[candidate.shard_id] = candidate
        shard = self._by_id.get(shard_id)
        if shard is None or range_id != shard.range_id:
            raise OxiaError.shard_not_found(shard_id)
        return shard

    async def range(self, shard_id: int) -> Range:
        """The open range of a shard (opened on first use); `OxiaError` shard-not-found once its
        table is gone (nothing is written into the ranges of a deleted table)."""
        shard = await self.shard(shard_id)
        try:
            await self.registry.stream_props(shard.stream_id)
        except StreamNotFoundError:
            self._by_id.pop(shard_id, None)
            raise OxiaError.shard_not_found(shard_id) from None
        container = self.registry.container(shard.container_id)
        return await container.data_range(shard.stream_id, shard.range_id, shard.ttl_seconds)
