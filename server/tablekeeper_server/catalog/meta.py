"""A container's meta range: the hash ranges of every table whose home is that container.

Key layout (BookKeeper's): `stream_id 0x01` -> StreamMetadata, `stream_id 0x02 range_id` ->
RangeMetadata. A table's ranges are created lazily on the first GetActiveRanges, from its
`initial_num_ranges`, in one txn guarded by "no metadata yet".

TableKeeper adds `-1 0x03 stream_id range_id` -> the range's TTL (8 bytes): the data ranges that
have been opened on this container (of any table), so the next owner of the container can open
them all as soon as it takes the container over instead of on their first request.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.kv import MetadataKv
from tablekeeper_server.core.routing import split_hash_space
from tablekeeper_server.range.replica import Range

_LONG = struct.Struct(">q")
MIN_DATA_RANGE_ID = 1024
CONTAINER_META_STREAM_ID = 1
CONTAINER_META_RANGE_ID = 0


def _stream_key(stream_id: int) -> bytes:
    return _LONG.pack(stream_id) + b"\x01"


def _range_key(stream_id: int, range_id: int) -> bytes:
    return _LONG.pack(stream_id) + b"\x02" + _LONG.pack(range_id)


_HOSTED_PREFIX = _LONG.pack(-1) + b"\x03"


def _hosted_key(stream_id: int, range_id: int) -> bytes:
    return _HOSTED_PREFIX + _LONG.pack(stream_id) + _LONG.pack(range_id)


def place_range(stream_id: int, range_index: int, num_containers: int) -> int:
    """The container of a table's range: consecutive containers from the table's own."""
    return (stream_id + range_index) % num_containers


class MetaCatalog:
    def __init__(
        self, meta_range: Range, num_containers: Callable[[], int], now_ms: Callable[[], int]
    ) -> None:
        """`num_containers()`: the cluster's containers now (new ranges are placed over them)."""
        self._kv = MetadataKv(meta_range)
        self._num_containers = num_containers
        self._now_ms = now_ms
        self._lock = asyncio.Lock()

    @property
    def range(self) -> Range:
        """The range this catalog lives in."""
        return self._kv.range

    async def active_ranges(
        self,
        stream_id: int,
        stream_props: Callable[[int], Awaitable[stream_pb2.StreamProperties]],
    ) -> list[stream_pb2.RangeProperties]:
        """The table's ranges in ascending hash order, creating them on first use."""
        ranges = self._read(stream_id)
        if ranges is not None:
            return ranges
        props = await stream_props(stream_id)  # raises StreamNotFoundError
        async with self._lock:
            ranges = self._read(stream_id)
            if ranges is not None:
                return ranges
            now = self._now_ms()
            split = split_hash_space(props.stream_conf.initial_num_ranges)
            range_props = [
                stream_pb2.RangeProperties(
                    start_hash_key=hash_range.start,
                    end_hash_key=hash_range.end,
                    range_id=MIN_DATA_RANGE_ID + i,
                    storage_container_id=place_range(stream_id, i, self._num_containers()),
                )
                for i, hash_range in enumerate(split)
            ]
            metadata = stream_pb2.StreamMetadata(
                props=props,
                lifecycle_state=stream_pb2.StreamMetadata.CREATED,
                serving_state=stream_pb2.StreamMetadata.WRITABLE,
                c_time=now,
                m_time=now,
                next_range_id=MIN_DATA_RANGE_ID + len(split),
                current_ranges=[r.range_id for r in range_props],
            )
            puts = [(_stream_key(stream_id), metadata.SerializeToString())]
            for r in range_props:
                range_metadata = stream_pb2.RangeMetadata(
                    props=r,
                    state=stream_pb2.RANGE_ACTIVE,
                    create_time=now,
                    fence_time=2**63 - 1,
                )
                puts.append((_range_key(stream_id, r.range_id), range_metadata.SerializeToString()))
            await self._kv.commit(absent=[_stream_key(stream_id)], puts=puts)
            return range_props

    def _read(self, stream_id: int) -> list[stream_pb2.RangeProperties] | None:
        raw = self._kv.get(_stream_key(stream_id))
        if raw is None:
            return None
        metadata = stream_pb2.StreamMetadata.FromString(raw)
        ranges = []
        for range_id in metadata.current_ranges:
            raw_range = self._kv.get(_range_key(stream_id, range_id))
            if raw_range is not None:
                ranges.append(stream_pb2.RangeMetadata.FromString(raw_range).props)
        ranges.sort(key=lambda r: r.start_hash_key)
        return ranges

    async def forget_stream(self, stream_id: int) -> list[stream_pb2.RangeProperties]:
        """Drop a deleted table's range metadata; return its ranges so their data can go."""
        async with self._lock:
            ranges = self._read(stream_id) or []
            prefix = _LONG.pack(stream_id)
            await self._kv.commit(
                delete_ranges=[(prefix + b"\x01", prefix + b"\x02" + b"\xff" * 8)]
            )
            return ranges

    def hosted_ranges(self) -> list[tuple[int, int, int]]:
        """(stream id, range id, TTL seconds) of every data range opened on this container."""
        rows = self._kv.scan(_HOSTED_PREFIX, _HOSTED_PREFIX + b"\xff" * 16)
        hosted = []
        for key, value in rows:
            stream_id, range_id = struct.unpack_from(">qq", key, len(_HOSTED_PREFIX))
            hosted.append((stream_id, range_id, _LONG.unpack(value)[0]))
        return hosted

    async def record_hosted(self, stream_id: int, range_id: int, ttl_seconds: int) -> None:
        """Remember that this data range lives here (once; later calls read only)."""
        key = _hosted_key(stream_id, range_id)
        if self._kv.get(key) is None:
            await self._kv.commit(puts=[(key, _LONG.pack(ttl_seconds))])

    async def forget_hosted(self, stream_id: int, range_id: int) -> None:
        await self._kv.commit(deletes=[_hosted_key(stream_id, range_id)])
