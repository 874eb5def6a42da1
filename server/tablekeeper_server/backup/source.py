"""One range's backup, served by the server that owns it (the Admin service's `BackupRange`).

The range is checkpointed through its usual path (`Range.checkpoint`, forced): a RocksDB
checkpoint of its applied state, files the checkpoint store holds already reused, the others
uploaded, the log truncated as after any checkpoint. Writes go on meanwhile; the checkpoint's
files are exactly the range's state at one log position (the cut), which the header reports.
That checkpoint's objects are then pinned (`PinningCheckpointStore`: the range's next
checkpoints may not collect them) and streamed from the checkpoint store, each checked against
its SHA-256 as it is read, so a damaged stored object fails the backup (naming it) instead of
being copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import grpc

from tablekeeper_proto.v1 import admin_pb2
from tablekeeper_server.catalog.meta import CONTAINER_META_RANGE_ID, CONTAINER_META_STREAM_ID
from tablekeeper_server.checkpoint.manifest import Manifest, object_name
from tablekeeper_server.checkpoint.pinning import PinningCheckpointStore
from tablekeeper_server.container.container import (
    ROOT_CONTAINER_ID,
    ROOT_RANGE_ID,
    ROOT_STREAM_ID,
)
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import (
    BadRequestError,
    CorruptionError,
    NotServedHereError,
    RouteNotFoundError,
    UnavailableError,
)
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.proxy import RemoteCatalogClient

log = logging.getLogger(__name__)

ADMIN_SERVICE = "/tablekeeper.v1.Admin/"
CHUNK_BYTES = 1024 * 1024
"""Bytes of a file per streamed message (the receiving side's default limit is 4 MiB)."""


class RangeBackups:
    """Backups of the ranges hosted here. `scratch_parent`: where objects are staged while they
    are streamed (a directory next to the server's stores)."""

    def __init__(
        self,
        registry: ContainerRegistry,
        store: PinningCheckpointStore,
        scratch_parent: Path,
    ) -> None:
        self._registry = registry
        self._store = store
        self._scratch_parent = scratch_parent
        self._running = 0

    async def locate(self, container_id: int, stream_id: int, range_id: int) -> Range:
        """The open range, here; `NotServedHereError` (naming the container) when another
        server owns it, `BadRequestError` for a range that does not exist (any more)."""
        registry = self._registry
        if (container_id, stream_id, range_id) == (
            ROOT_CONTAINER_ID,
            ROOT_STREAM_ID,
            ROOT_RANGE_ID,
        ):
            return registry.root.range
        if stream_id == CONTAINER_META_STREAM_ID and range_id == CONTAINER_META_RANGE_ID:
            meta = registry.container(container_id).meta
            if meta is None:
                raise RouteNotFoundError(f"container {container_id} is not open yet")
            return meta.range
        if stream_id < 1024:
            raise BadRequestError(f"no range {container_id}/{stream_id}/{range_id}")
        range_ = await registry.range_by_id(stream_id, range_id)
        if range_.name.container_id != container_id:
            raise BadRequestError(
                f"range {range_id} of table {stream_id} is in container "
                f"{range_.name.container_id}, not {container_id}"
            )
        return range_

    async def fetch(
        self, container_id: int, stream_id: int, range_id: int
    ) -> AsyncGenerator[admin_pb2.BackupChunk, None]:
        """A range's backup from wherever it is served: here, or from its owner through the
        server's forwarder (cluster mode, `--workers`); what a backup taken inside the server
        (etcd's Snapshot) copies its ranges with."""
        request = admin_pb2.BackupRangeRequest(
            container_id=container_id, stream_id=stream_id, range_id=range_id
        )
        try:
            await self.locate(container_id, stream_id, range_id)
        except NotServedHereError as elsewhere:
            remote = self._registry.remote
            if not isinstance(remote, RemoteCatalogClient):
                raise
            forwarder = remote.forwarder
            relayed = forwarder.stream(
                forwarder.owner(elsewhere.container_id),
                ADMIN_SERVICE + "BackupRange",
                request,
                admin_pb2.BackupChunk,
                None,
            )
            try:
                async with contextlib.aclosing(relayed) as chunks:
                    async for chunk in chunks:
                        yield chunk
            except grpc.aio.AioRpcError as exc:
                raise UnavailableError(
                    f"range {container_id}/{stream_id}/{range_id}: its owner answered "
                    f"{exc.code().name}: {exc.details()}"
                ) from None
            return
        async with contextlib.aclosing(self.chunks(request)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def chunks(
        self, request: admin_pb2.BackupRangeRequest
    ) -> AsyncGenerator[admin_pb2.BackupChunk, None]:
        """The header, then every file's bytes (see `BackupChunk`)."""
        range_ = await self.locate(request.container_id, request.stream_id, request.range_id)
        container = self._registry.container(range_.name.container_id)
        still_owns = self._registry.still_owns
        if still_owns is not None and not await still_owns(container):
            raise UnavailableError(
                f"range {range_.name.log_name}: container {container.id} is no longer owned by "
                "this server"
            )
        manifest = await range_.checkpoint(force=True)
        if manifest is None:
            raise UnavailableError(
                f"range {range_.name.log_name} cannot be checkpointed now: "
                f"{range_.failure or 'it is closed or moved'}"
            )
        name = range_.name.log_name
        with self._store.pinned(object_name(name, f.sha256) for f in manifest.files):
            yield admin_pb2.BackupChunk(header=_header(manifest))
            scratch = self._scratch()
            try:
                for entry in manifest.files:
                    async for chunk in self._file(name, entry.name, entry.sha256, scratch):
                        yield chunk
            finally:
                await asyncio.to_thread(shutil.rmtree, scratch, True)
                self._running -= 1
        log.info(
            "range %s: backup of its checkpoint at %d sent (%d files, %d bytes)",
            name,
            manifest.applied_sequence,
            len(manifest.files),
            sum(f.size for f in manifest.files),
        )

    def _scratch(self) -> Path:
        """A fresh staging directory. With no backup running, the leftovers of one a crash cut
        short are removed first."""
        if self._running == 0 and self._scratch_parent.is_dir():
            for stale in self._scratch_parent.glob(".backup-*"):
                shutil.rmtree(stale, ignore_errors=True)
        path = self._scratch_parent / f".backup-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        self._running += 1
        return path

    async def _file(
        self, range_name: str, file_name: str, sha256: str, scratch: Path
    ) -> AsyncIterator[admin_pb2.BackupChunk]:
        stored = object_name(range_name, sha256)
        staged = scratch / sha256
        try:
            await asyncio.to_thread(self._store.get_file, stored, staged)
        except FileNotFoundError:
            raise CorruptionError(
                f"range {range_name}: checkpoint object {stored} ({file_name}) is missing from "
                f"{self._store.describe()}"
            ) from None
        digest = hashlib.sha256()
        offset = 0
        try:
            with open(staged, "rb") as source:
                while True:
                    data = await asyncio.to_thread(source.read, CHUNK_BYTES)
                    if not data and offset:
                        break
                    digest.update(data)
                    yield admin_pb2.BackupChunk(file=file_name, offset=offset, data=data)
                    offset += len(data)
                    if not data:
                        break
        finally:
            staged.unlink(missing_ok=True)
        if digest.hexdigest() != sha256:
            raise CorruptionError(
                f"range {range_name}: checkpoint object {stored} ({file_name}) in "
                f"{self._store.describe()} fails its SHA-256 check: the backup stops here"
            )


def _header(manifest: Manifest) -> admin_pb2.BackupRangeHeader:
    return admin_pb2.BackupRangeHeader(
        applied_sequence=manifest.applied_sequence,
        created_at_ms=manifest.created_at_ms,
        checkpoint=manifest.object_name,
        files=[
            admin_pb2.BackupFile(name=f.name, sha256=f.sha256, size=f.size) for f in manifest.files
        ],
    )
