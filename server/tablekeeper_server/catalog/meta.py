"""A container's meta range: the hash ranges of every table whose home is that container.

Key layout (BookKeeper's): `stream_id 0x01` -> StreamMetadata, `stream_id 0x02 range_id` ->
RangeMetadata. A table's ranges are created lazily on the first GetActiveRanges, from its
`initial_num_ranges`, in one txn guarded by "no metadata yet".

TableKeeper adds `-1 0x03 stream_id range_id` -> the range's TTL (8 bytes): the data ranges that
have been opened on this container (of any table), so the next owner of the container can open
them all as soon as it takes the container over instead of on their first request.

Splits (`container.splitter`) keep their state here too. `begin_split` reserves the children's
range ids and records the parent as RANGE_FENCING with its `children` (whose RangeMetadata,
`parents` = the parent, are written at once but are not current yet); `finish_split` is the one
atomic switch: the children replace the parent in `current_ranges`, the parent becomes
RANGE_FENCED, and `stream_id 0x05 range_id` marks its data as still to be deleted until
`forget_retired`. A split found RANGE_FENCING after a crash is resumed by the container's owner.
"""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.kv import MetadataKv
from tablekeeper_server.core.routing import split_hash_space
from tablekeeper_server.errors import IllegalOpError, KeyNotFoundError
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
HOSTED_SPAN = (_HOSTED_PREFIX, _HOSTED_PREFIX + b"\xff" * 16)
"""The meta range's keys recording the data ranges opened on its container (first, last)."""


def decode_hosted(key: bytes, value: bytes) -> tuple[int, int, int]:
    """(stream id, range id, TTL seconds) of one `HOSTED_SPAN` key."""
    stream_id, range_id = struct.unpack_from(">qq", key, len(_HOSTED_PREFIX))
    return stream_id, range_id, _LONG.unpack(value)[0]


def _retired_key(stream_id: int, range_id: int) -> bytes:
    return _LONG.pack(stream_id) + b"\x05" + _LONG.pack(range_id)


@dataclass(frozen=True, slots=True)
class SplitPlan:
    """A split under way or done: the parent range and its children, in hash order."""

    stream_id: int
    parent: stream_pb2.RangeProperties
    children: tuple[stream_pb2.RangeProperties, ...]
    fenced_at_ms: int = 0
    """When the split switched the table to the children (0: not yet)."""


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
            conf = props.stream_conf
            split = split_hash_space(conf.initial_num_ranges, exact=conf.exact_num_ranges)
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

    def lineage(self, stream_id: int) -> dict[int, tuple[int, ...]]:
        """For each current range of the table that a split made: the ranges it descends
        from (its parent first, then the parent's parent, ...). Retired ranges keep their
        metadata (RANGE_FENCED) for this."""
        raw = self._kv.get(_stream_key(stream_id))
        if raw is None:
            return {}
        out: dict[int, tuple[int, ...]] = {}
        for range_id in stream_pb2.StreamMetadata.FromString(raw).current_ranges:
            ancestors: list[int] = []
            metadata = self._range_metadata(stream_id, range_id)
            while metadata is not None and metadata.parents:
                parent = metadata.parents[0]
                ancestors.append(parent)
                metadata = self._range_metadata(stream_id, parent)
            if ancestors:
                out[range_id] = tuple(ancestors)
        return out

    def current_ranges(self, stream_id: int) -> list[stream_pb2.RangeProperties] | None:
        """The table's ranges in ascending hash order as recorded; None if none are recorded
        yet (they are made on the table's first use). Reads only: a backup reads its copy of
        the meta range with it."""
        return self._read(stream_id)

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

    # ------------------------------------------------------------------ splits

    def _range_metadata(self, stream_id: int, range_id: int) -> stream_pb2.RangeMetadata | None:
        raw = self._kv.get(_range_key(stream_id, range_id))
        return None if raw is None else stream_pb2.RangeMetadata.FromString(raw)

    def _plan(self, stream_id: int, parent: stream_pb2.RangeMetadata) -> SplitPlan:
        children = []
        for child_id in parent.children:
            child = self._range_metadata(stream_id, child_id)
            if child is None:
                raise KeyNotFoundError(f"range {child_id} of table {stream_id} has no metadata")
            children.append(child.props)
        fenced_at = parent.fence_time if parent.state == stream_pb2.RANGE_FENCED else 0
        return SplitPlan(stream_id, parent.props, tuple(children), fenced_at)

    async def begin_split(self, stream_id: int, range_id: int) -> SplitPlan:
        """Record a split of range `range_id` into two halves of its hash interval (or return
        the one already under way). The first child stays on the parent's container; the
        second goes to the container holding the fewest of the table's ranges (the next ones
        after the parent's first), so splitting spreads a table over the containers, new ones
        included. Raises `KeyNotFoundError` if the range is not one of the table's current
        ranges, `IllegalOpError` if its hash interval cannot be halved."""
        async with self._lock:
            raw = self._kv.get(_stream_key(stream_id))
            metadata = None if raw is None else stream_pb2.StreamMetadata.FromString(raw)
            parent = self._range_metadata(stream_id, range_id)
            if metadata is None or parent is None or range_id not in metadata.current_ranges:
                raise KeyNotFoundError(f"table {stream_id} has no current range {range_id}")
            if parent.state == stream_pb2.RANGE_FENCING:
                return self._plan(stream_id, parent)
            props = parent.props
            middle = props.start_hash_key + (props.end_hash_key - props.start_hash_key) // 2
            if middle <= props.start_hash_key:
                raise IllegalOpError(f"range {range_id} holds too few hashes to split")
            count = self._num_containers()
            load = Counter(
                r.storage_container_id
                for r in self._read(stream_id) or []
                if r.range_id != range_id
            )
            load[props.storage_container_id] += 1  # the first child
            order = [(props.storage_container_id + 1 + i) % count for i in range(count)]
            second = min(order, key=lambda c: (load[c], order.index(c)))
            now = self._now_ms()
            first_id = metadata.next_range_id
            children = (
                stream_pb2.RangeProperties(
                    start_hash_key=props.start_hash_key,
                    end_hash_key=middle,
                    range_id=first_id,
                    storage_container_id=props.storage_container_id,
                ),
                stream_pb2.RangeProperties(
                    start_hash_key=middle,
                    end_hash_key=props.end_hash_key,
                    range_id=first_id + 1,
                    storage_container_id=second,
                ),
            )
            metadata.next_range_id = first_id + len(children)
            metadata.m_time = now
            parent.state = stream_pb2.RANGE_FENCING
            parent.children[:] = [c.range_id for c in children]
            puts = [
                (_stream_key(stream_id), metadata.SerializeToString()),
                (_range_key(stream_id, range_id), parent.SerializeToString()),
            ]
            for child in children:
                child_metadata = stream_pb2.RangeMetadata(
                    props=child,
                    state=stream_pb2.RANGE_ACTIVE,
                    create_time=now,
                    fence_time=2**63 - 1,
                    parents=[range_id],
                )
                puts.append(
                    (_range_key(stream_id, child.range_id), child_metadata.SerializeToString())
                )
            await self._kv.commit(puts=puts)
            return SplitPlan(stream_id, props, children)

    async def finish_split(self, plan: SplitPlan) -> None:
        """The switch: the children replace the parent in the table's current ranges, in one
        txn (idempotent: a split already switched is left alone)."""
        async with self._lock:
            raw = self._kv.get(_stream_key(plan.stream_id))
            parent = self._range_metadata(plan.stream_id, plan.parent.range_id)
            if raw is None or parent is None or parent.state != stream_pb2.RANGE_FENCING:
                return
            metadata = stream_pb2.StreamMetadata.FromString(raw)
            current: list[int] = []
            for range_id in metadata.current_ranges:
                if range_id == plan.parent.range_id:
                    current.extend(c.range_id for c in plan.children)
                else:
                    current.append(range_id)
            now = self._now_ms()
            metadata.current_ranges[:] = current
            metadata.m_time = now
            parent.state = stream_pb2.RANGE_FENCED
            parent.fence_time = now
            await self._kv.commit(
                puts=[
                    (_stream_key(plan.stream_id), metadata.SerializeToString()),
                    (_range_key(plan.stream_id, plan.parent.range_id), parent.SerializeToString()),
                    (_retired_key(plan.stream_id, plan.parent.range_id), b"\x01"),
                ]
            )

    def splits(self) -> tuple[list[SplitPlan], list[SplitPlan]]:
        """(splits under way, finished splits whose parent's data is still to be deleted)."""
        pending, retired = [], []
        for key, value in self._kv.scan(_LONG.pack(0), _LONG.pack(2**63 - 1) + b"\xff" * 9):
            if len(key) != 17:
                continue
            stream_id, kind, range_id = struct.unpack(">qcq", key)
            if kind == b"\x02":
                metadata = stream_pb2.RangeMetadata.FromString(value)
                if metadata.state == stream_pb2.RANGE_FENCING:
                    pending.append(self._plan(stream_id, metadata))
            elif kind == b"\x05":
                metadata_or_none = self._range_metadata(stream_id, range_id)
                if metadata_or_none is not None:
                    retired.append(self._plan(stream_id, metadata_or_none))
        return pending, retired

    async def forget_retired(self, plan: SplitPlan) -> None:
        """The parent of a finished split has been deleted."""
        await self._kv.commit(deletes=[_retired_key(plan.stream_id, plan.parent.range_id)])

    async def forget_stream(self, stream_id: int) -> list[stream_pb2.RangeProperties]:
        """Drop a deleted table's range metadata; return every range it has had data in so
        their data can go: the current ones, and those of splits (a retired parent not deleted
        yet, the children of a split under way)."""
        async with self._lock:
            prefix = _LONG.pack(stream_id)
            rows = self._kv.scan(prefix + b"\x02", prefix + b"\x02" + b"\xff" * 8)
            ranges = [stream_pb2.RangeMetadata.FromString(value).props for _, value in rows]
            await self._kv.commit(
                delete_ranges=[(prefix + b"\x01", prefix + b"\x05" + b"\xff" * 8)]
            )
            return ranges

    def hosted_ranges(self) -> list[tuple[int, int, int]]:
        """(stream id, range id, TTL seconds) of every data range opened on this container."""
        return [decode_hosted(key, value) for key, value in self._kv.scan(*HOSTED_SPAN)]

    async def record_hosted(self, stream_id: int, range_id: int, ttl_seconds: int) -> None:
        """Remember that this data range lives here (once; later calls read only)."""
        key = _hosted_key(stream_id, range_id)
        if self._kv.get(key) is None:
            await self._kv.commit(puts=[(key, _LONG.pack(ttl_seconds))])

    async def forget_hosted(self, stream_id: int, range_id: int) -> None:
        await self._kv.commit(deletes=[_hosted_key(stream_id, range_id)])
