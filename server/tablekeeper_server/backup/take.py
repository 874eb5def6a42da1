"""Taking a backup: which ranges, in which order, and checking what arrives.

Order: the root range first; the tables the backup holds are those of *its* copy (read with
`backup.catalog`), so a table made while the backup runs is not in it and one deleted meanwhile
fails it (its ranges are gone). Then the meta ranges (all of them for the whole service, else
those of the chosen tables' containers), whose copies say which ranges each table has; then
those data ranges. Each range is a checkpoint taken when its turn comes (`backup.source`): a
consistent cut of that range at one log position, holding every write acknowledged before the
backup started. Different ranges are cut at different moments; see the README ("Backup and
restore") for what that does and does not promise.

Every file is checked as it arrives: its size and SHA-256 against the range's header.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from tablekeeper_proto.v1 import admin_pb2
from tablekeeper_server.backup.catalog import CatalogTable, read_meta, read_root
from tablekeeper_server.backup.format import (
    BackupError,
    BackupManifest,
    FileEntry,
    RangeEntry,
    Sink,
    TableEntry,
)
from tablekeeper_server.catalog.meta import CONTAINER_META_RANGE_ID, CONTAINER_META_STREAM_ID
from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.range.replica import RangeName
from tablekeeper_server.storage.api import StoreOpener

_CLOCK = SystemClock()  # progress and elapsed time of an offline command


ROOT = RangeName(0, 0, 0)


class RangeFetcher(Protocol):
    def __call__(
        self, container_id: int, stream_id: int, range_id: int
    ) -> AsyncIterator[admin_pb2.BackupChunk]:
        """The range's backup stream (`Admin.BackupRange`), from wherever it is served."""
        ...


@dataclass(frozen=True, slots=True)
class RangeDone:
    """Progress: one range copied."""

    index: int
    total: int
    """Ranges known so far (grows as the meta ranges are read)."""
    entry: RangeEntry
    seconds: float


@dataclass(frozen=True, slots=True)
class BytesCopied:
    """Progress: bytes of the range being copied."""

    name: str
    done: int
    size: int


Progress = Callable[[RangeDone | BytesCopied], None]


@dataclass(frozen=True, slots=True)
class Scope:
    """What to back up: everything, a namespace, or one table."""

    namespace: str = ""
    table: str = ""

    def __str__(self) -> str:
        if not self.namespace:
            return ""
        return f"{self.namespace}/{self.table}" if self.table else self.namespace

    @property
    def whole(self) -> bool:
        return not self.namespace

    def selects(self, namespace: str, table: str) -> bool:
        if not self.namespace:
            return True
        return namespace == self.namespace and (not self.table or table == self.table)


class BackupTaker:
    def __init__(
        self,
        fetch: RangeFetcher,
        sink: Sink,
        *,
        scratch: Path,
        opener: StoreOpener,
        progress: Progress = lambda event: None,
    ) -> None:
        """`scratch`: an empty directory for copies of the catalog ranges (removed after);
        `opener` opens those copies (the server's RocksDB store)."""
        self._fetch = fetch
        self._sink = sink
        self._scratch = scratch
        self._opener = opener
        self._progress = progress
        self._ranges: list[RangeEntry] = []
        self._total = 1

    async def take(
        self, scope: Scope, *, num_containers: int, source: str, version: str
    ) -> BackupManifest:
        try:
            manifest = await self._take(scope, num_containers, source, version)
            await asyncio.to_thread(self._sink.finish, manifest)
            return manifest
        except BaseException:
            self._sink.abort()
            raise
        finally:
            await asyncio.to_thread(shutil.rmtree, self._scratch, True)

    async def _take(
        self, scope: Scope, num_containers: int, source: str, version: str
    ) -> BackupManifest:
        self._scratch.mkdir(parents=True, exist_ok=True)
        root_copy = self._scratch / "root"
        await self._copy("root", ROOT, keep=root_copy)
        catalog = await read_root(ROOT, root_copy, self._opener)
        chosen = [t for t in catalog if scope.selects(t.namespace, t.props.stream_name)]
        if scope.namespace and not chosen:
            what = "table" if scope.table else "namespace"
            raise BackupError(str(scope), f"no such {what} in the service")
        tables = [t for t in chosen if t.props.stream_id]
        if scope.whole:
            containers = list(range(num_containers))
        else:
            containers = sorted({t.props.storage_container_id for t in tables})
        self._total = 1 + len(containers)
        data: list[tuple[CatalogTable, int, int]] = []  # (table, container, range)
        for container_id in containers:
            name = RangeName(container_id, CONTAINER_META_STREAM_ID, CONTAINER_META_RANGE_ID)
            meta_copy = self._scratch / f"meta-{container_id}"
            await self._copy("meta", name, keep=meta_copy)
            here = [t for t in tables if t.props.storage_container_id == container_id]
            before = len(data)
            view = await read_meta(name, meta_copy, self._opener, [t.props.stream_id for t in here])
            splitting = {plan.stream_id for plan in view.splits_under_way}
            for table in here:
                if table.props.stream_id in splitting:
                    raise BackupError(
                        f"{table.namespace}/{table.props.stream_name}",
                        "a range of this table is being split; back up again once it is done",
                    )
                for r in view.ranges.get(table.props.stream_id, []):
                    data.append((table, r.storage_container_id, r.range_id))
            await asyncio.to_thread(shutil.rmtree, meta_copy, True)
            self._total += len(data) - before
        for table, container_id, range_id in data:
            label = f"{table.namespace}/{table.props.stream_name}"
            name = RangeName(container_id, table.props.stream_id, range_id)
            await self._copy("data", name, label)
        return BackupManifest(
            created_at_ms=_CLOCK.now_ms(),
            num_containers=num_containers,
            ranges=tuple(self._ranges),
            tables=tuple(
                TableEntry(
                    t.namespace,
                    t.props.stream_name,
                    t.props.stream_id,
                    t.props.storage_container_id,
                )
                for t in tables
            ),
            namespaces=tuple(sorted({t.namespace for t in chosen})),
            scope=str(scope),
            source=source,
            version=version,
        )

    async def _copy(
        self, kind: str, name: RangeName, table: str = "", *, keep: Path | None = None
    ) -> RangeEntry:
        """Stream one range's files into the sink (and into `keep`, a scratch copy to read)."""
        started = _CLOCK.monotonic_s()
        header: admin_pb2.BackupRangeHeader | None = None
        files: dict[str, FileEntry] = {}
        received: dict[str, tuple[int, hashlib._Hash]] = {}
        current: str | None = None
        copy: IO[bytes] | None = None
        entry_dir = _directory(name)
        done = 0
        size = 0
        try:
            chunks = self._fetch(name.container_id, name.stream_id, name.range_id)
            async for chunk in chunks:
                if header is None:
                    if not chunk.HasField("header"):
                        raise BackupError(name.log_name, "the server sent no header first")
                    header = chunk.header
                    files = {f.name: FileEntry(f.name, f.sha256, f.size) for f in header.files}
                    size = sum(f.size for f in files.values())
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                    continue
                file = files.get(chunk.file)
                if file is None:
                    raise BackupError(name.log_name, f"unexpected file {chunk.file!r}")
                if chunk.file != current:
                    if current is not None:
                        await self._end_file(name, files[current], received, copy)
                    if chunk.file in received or chunk.offset != 0:
                        raise BackupError(name.log_name, f"file {chunk.file} out of order")
                    current = chunk.file
                    received[current] = (0, hashlib.sha256())
                    await asyncio.to_thread(
                        self._sink.begin_file, f"{entry_dir}/{current}", file.size
                    )
                    copy = open(keep / current, "wb") if keep is not None else None  # noqa: SIM115
                got, digest = received[current]
                if chunk.offset != got:
                    raise BackupError(f"{entry_dir}/{current}", "bytes arrived out of order")
                digest.update(chunk.data)
                received[current] = (got + len(chunk.data), digest)
                await asyncio.to_thread(self._write, chunk.data, copy)
                done += len(chunk.data)
                self._progress(BytesCopied(name.log_name, done, size))
            if header is None:
                raise BackupError(name.log_name, "the server sent nothing")
            if current is not None:
                await self._end_file(name, files[current], received, copy)
                copy = None
            missing = sorted(set(files) - set(received))
            if missing:
                raise BackupError(name.log_name, f"the stream ended before {missing[0]}")
        finally:
            if copy is not None:
                copy.close()
        entry = RangeEntry(
            kind=kind,
            container_id=name.container_id,
            stream_id=name.stream_id,
            range_id=name.range_id,
            applied_sequence=header.applied_sequence,
            created_at_ms=header.created_at_ms,
            files=tuple(files[f.name] for f in header.files),
            table=table,
            checkpoint=header.checkpoint,
        )
        self._ranges.append(entry)
        self._progress(
            RangeDone(len(self._ranges), self._total, entry, _CLOCK.monotonic_s() - started)
        )
        return entry

    def _write(self, data: bytes, copy: IO[bytes] | None) -> None:
        self._sink.write(data)
        if copy is not None:
            copy.write(data)

    async def _end_file(
        self,
        name: RangeName,
        entry: FileEntry,
        received: dict[str, tuple[int, hashlib._Hash]],
        copy: IO[bytes] | None,
    ) -> None:
        got, digest = received[entry.name]
        where = f"{_directory(name)}/{entry.name}"
        if got != entry.size:
            raise BackupError(where, f"{got} bytes arrived, the range's header said {entry.size}")
        if digest.hexdigest() != entry.sha256:
            raise BackupError(where, "arrived damaged: fails its SHA-256 check")
        await asyncio.to_thread(self._sink.end_file)
        if copy is not None:
            copy.close()


def _directory(name: RangeName) -> str:
    return f"ranges/{name.log_name}"
