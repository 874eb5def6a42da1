"""etcd's `Maintenance.Snapshot` on a TableKeeper keyspace.

etcd streams its bbolt database file in chunks, then one last message whose blob is the
SHA-256 of all the bytes before it; `etcdctl snapshot save` (3.4) writes every blob to the
file as it comes, and later versions also check that the file's length is a multiple of 512
plus 32 (that a SHA-256 ends it). `etcdctl snapshot restore` verifies that SHA-256 and then
opens the file as a bbolt database.

TableKeeper has no bbolt database: a keyspace is a range whose state is RocksDB files. The
snapshot is TableKeeper's own backup of the keyspace's table (its range, and the root and meta
ranges that name it: `backup.take`), as an archive (`backup.format`: a tar, whose length is a
multiple of 512, then the SHA-256), sent exactly as etcd sends its file. So `etcdctl snapshot
save` works against TableKeeper and writes a file that `tablekeeper admin restore` restores
(into a server whose etcd keyspace is then the snapshot's, at its revision); `etcdctl snapshot
restore` and `snapshot status`, which read bbolt, cannot read it.

The archive is made in a scratch file next to the server's stores before the first byte is
sent, so `remaining_bytes` is exact (as etcd's) and a failure is reported before any data.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncGenerator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tablekeeper_proto.etcd import rpc_pb2
from tablekeeper_server.backup.format import TRAILER_BYTES, ArchiveSink
from tablekeeper_server.backup.source import RangeBackups
from tablekeeper_server.backup.take import BackupTaker, Scope
from tablekeeper_server.etcd.keyspace import NAMESPACE, Keyspace

SEND_BYTES = 64 * 1024
"""Bytes per message (etcd sends 32 KiB; its clients accept far more)."""


def _version() -> str:
    try:
        return version("tablekeeper")
    except PackageNotFoundError:
        return "unknown"


class KeyspaceSnapshots:
    def __init__(self, keyspace: Keyspace, backups: RangeBackups, scratch_parent: Path) -> None:
        self._keyspace = keyspace
        self._backups = backups
        self._scratch_parent = scratch_parent
        self._running = 0

    async def stream(self) -> AsyncGenerator[rpc_pb2.SnapshotResponse, None]:
        """The keyspace's backup as etcd's snapshot messages."""
        range_ = await self._keyspace.range()  # raises etcd's "no leader" while not found
        header = self._keyspace.header(range_.applied_sequence)
        registry = self._keyspace.registry
        if self._running == 0:  # what a snapshot cut short by a crash left behind
            await asyncio.to_thread(_remove_stale, self._scratch_parent)
        self._running += 1
        token = uuid.uuid4().hex
        archive = self._scratch_parent / f".snapshot-{token}"
        try:
            with open(archive, "wb") as out:
                taker = BackupTaker(
                    self._backups.fetch,
                    ArchiveSink(out),
                    scratch=self._scratch_parent / f".snapshot-{token}.d",
                    opener=registry.env.store_factory,
                )
                await taker.take(
                    Scope(NAMESPACE, self._keyspace.name),
                    num_containers=registry.env.containers(),
                    source=f"etcd keyspace {self._keyspace.name}",
                    version=_version(),
                )
            size = archive.stat().st_size
            data = size - TRAILER_BYTES
            with open(archive, "rb") as source:
                sent = 0
                while sent < data:
                    blob = await asyncio.to_thread(source.read, min(SEND_BYTES, data - sent))
                    sent += len(blob)
                    yield rpc_pb2.SnapshotResponse(
                        header=header, remaining_bytes=data - sent, blob=blob
                    )
                trailer = source.read(TRAILER_BYTES)
            yield rpc_pb2.SnapshotResponse(header=header, remaining_bytes=0, blob=trailer)
        finally:
            self._running -= 1
            await asyncio.to_thread(archive.unlink, True)


def _remove_stale(parent: Path) -> None:
    for stale in parent.glob(".snapshot-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
