"""Reading the catalog as a backup's cut of it holds: the namespaces and tables of a copy of
the root range, a table's ranges from a copy of its meta range.

A backup lists the tables it copies from its own copy of the root range (not from the live
service, which moves on while the backup runs), so the tables it holds are exactly those its
root range knows. The copy is opened as a range of its own on an in-memory log (nothing is
written to it: the catalogs are only read), with the server's own catalog code.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.appliers import server_appliers
from tablekeeper_server.catalog.meta import MetaCatalog, SplitPlan
from tablekeeper_server.catalog.root import RootCatalog
from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.storage.api import StoreOpener


@dataclass(frozen=True, slots=True)
class CatalogTable:
    namespace: str
    props: stream_pb2.StreamProperties


@contextlib.asynccontextmanager
async def opened_copy(name: RangeName, path: Path, opener: StoreOpener) -> AsyncIterator[Range]:
    """The range whose files are in `path` (a scratch copy: opening it writes RocksDB's own
    bookkeeping files there), open for reads."""
    range_ = Range(
        name, MemoryLogBackend(), lambda: opener(path), SystemClock(), appliers=server_appliers()
    )
    await range_.open()
    try:
        yield range_
    finally:
        await range_.close()


async def read_root(name: RangeName, path: Path, opener: StoreOpener) -> list[CatalogTable]:
    """Every table of every namespace in a copy of the root range, by namespace then name; a
    namespace without tables appears once with `props` empty (stream id 0)."""
    found: list[CatalogTable] = []
    async with opened_copy(name, path, opener) as range_:
        root = RootCatalog(range_, lambda: 1)
        for namespace in sorted(root.namespaces(), key=lambda p: p.namespace_name):
            tables = sorted(root.streams(namespace.namespace_name), key=lambda p: p.stream_name)
            if not tables:
                found.append(CatalogTable(namespace.namespace_name, stream_pb2.StreamProperties()))
            found.extend(CatalogTable(namespace.namespace_name, props) for props in tables)
    return found


@dataclass(frozen=True, slots=True)
class MetaView:
    ranges: dict[int, list[stream_pb2.RangeProperties]]
    """Stream id -> its current ranges (tables with ranges recorded in this meta range)."""
    splits_under_way: list[SplitPlan]


async def read_meta(
    name: RangeName, path: Path, opener: StoreOpener, stream_ids: list[int]
) -> MetaView:
    """The current ranges of tables `stream_ids` in a copy of a container's meta range, and the
    splits under way there."""
    async with opened_copy(name, path, opener) as range_:
        meta = MetaCatalog(range_, lambda: 1, lambda: 0)
        ranges = {}
        for stream_id in stream_ids:
            current = meta.current_ranges(stream_id)
            if current is not None:
                ranges[stream_id] = current
        pending, _ = meta.splits()
    return MetaView(ranges, pending)
