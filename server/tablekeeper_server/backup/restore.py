"""Restoring a backup into a server that is not running (`tablekeeper admin restore`).

A restore writes each range of the backup into the target's checkpoint store as that range's
only checkpoint (its files as content-addressed objects, then its manifest at the backup's
position). The target's range stores and logs stay empty: when the server starts, every range
finds no local store, restores that checkpoint and numbers its empty log on from its position,
exactly as a range moving to a new server does. So the restored service continues each range's
revisions where the backup cut it.

Only the stores a server reads are touched: the configured `--checkpoint-dir` (or Pulsar
checkpoint store), `--data-dir`'s range stores and the WAL (`--wal-dir` or the Pulsar log). A
target that already holds data is refused, naming what was found, unless `force`: then what is
there is removed first (local directories entirely; on Pulsar the logs and checkpoints of the
ranges the backup holds). The data directory is locked as a server locks it, so a running
server's data is never restored over.

A backup of one namespace or one table restores the catalog as its root range held it, then
deletes, through the restored catalog itself, every namespace and table the backup does not
hold: the target ends with exactly the backup's tables (and their namespaces' permissions).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tablekeeper_server.appliers import server_appliers
from tablekeeper_server.backup.format import Backup, BackupManifest, RangeEntry
from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.checkpoint.manifest import FileEntry as CheckpointFile
from tablekeeper_server.checkpoint.manifest import Manifest, object_name
from tablekeeper_server.config import ServerConfig
from tablekeeper_server.container.container import ContainerEnv
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.log.local import LocalLogBackend
from tablekeeper_server.storage.rocksdb import RocksKvStore

_CLOCK = SystemClock()  # progress and elapsed time of an offline command


log = logging.getLogger(__name__)

Say = Callable[[str], None]


class RestoreRefusedError(Exception):
    """The target cannot take the backup (it holds data, a server runs on it, ...)."""


@dataclass(frozen=True, slots=True)
class RestoreResult:
    ranges: int
    files: int
    bytes: int
    tables: int
    pruned: tuple[str, ...]
    """Namespaces and tables of the backup's catalog that it does not hold, deleted."""
    seconds: float


@dataclass
class _Target:
    config: ServerConfig
    checkpoints: CheckpointStore
    log: LogBackend
    close: Callable[[], None]


def _target(config: ServerConfig) -> _Target:
    closers: list[Callable[[], None]] = []
    checkpoints: CheckpointStore
    if config.checkpoint_store == "pulsar":
        from tablekeeper_server.checkpoint.pulsar import PulsarCheckpointStore

        tenant, namespace = config.pulsar_tenant_and_namespace
        pulsar_store = PulsarCheckpointStore(
            config.pulsar_url,
            config.pulsar_admin_url,
            tenant=tenant,
            namespace=f"{namespace}-checkpoints",
            timeout_s=config.pulsar_timeout_s,
            clock=SystemClock(),
        )
        checkpoints = pulsar_store
        closers.append(pulsar_store.close)
    else:
        checkpoints = DirectoryCheckpointStore(config.effective_checkpoint_dir)
    log_backend: LogBackend
    if config.log_backend == "pulsar":
        from tablekeeper_server.log.pulsar import PulsarLogBackend

        tenant, namespace = config.pulsar_tenant_and_namespace
        pulsar_log = PulsarLogBackend(
            config.pulsar_url,
            config.pulsar_admin_url,
            tenant=tenant,
            namespace=namespace,
            timeout_s=config.pulsar_timeout_s,
        )
        log_backend = pulsar_log
        closers.append(pulsar_log.close)
    else:
        log_backend = LocalLogBackend(config.effective_wal_dir)

    def close() -> None:
        for closer in closers:
            closer()

    return _Target(config, checkpoints, log_backend, close)


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Hold the data directory's lock, as a server does, for the whole restore."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RestoreRefusedError(
                f"{data_dir} is in use by a running TableKeeper server: stop it first"
            ) from None
        yield
    finally:
        os.close(fd)


def _non_empty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _found_data(target: _Target, manifest: BackupManifest) -> list[str]:
    """What the target holds already (empty: nothing)."""
    config = target.config
    found = []
    if _non_empty(config.db_dir):
        found.append(f"range stores in {config.db_dir}")
    if config.log_backend == "local":
        if _non_empty(config.effective_wal_dir):
            found.append(f"write-ahead logs in {config.effective_wal_dir}")
    else:
        logged = [r.log_name for r in manifest.ranges if target.log.size_bytes(r.log_name)]
        if logged:
            found.append(f"{len(logged)} range logs in Pulsar (e.g. {logged[0]})")
    if config.checkpoint_store == "dir":
        if _non_empty(config.effective_checkpoint_dir):
            found.append(f"checkpoints in {config.effective_checkpoint_dir}")
    else:
        held = [r.log_name for r in manifest.ranges if target.checkpoints.list(r.log_name)]
        if held:
            found.append(f"checkpoints of {len(held)} ranges in Pulsar (e.g. {held[0]})")
    return found


def _clear(target: _Target, manifest: BackupManifest, say: Say) -> None:
    config = target.config
    local = [config.db_dir]
    if config.log_backend == "local":
        local.append(config.effective_wal_dir)
    if config.checkpoint_store == "dir":
        local.append(config.effective_checkpoint_dir)
    for path in local:
        if path.is_dir():
            say(f"--force: removing {path}")
            shutil.rmtree(path)
    if config.log_backend != "local":
        count = len(manifest.ranges)
        say(f"--force: deleting the Pulsar logs of the backup's {count} ranges")
        for entry in manifest.ranges:
            target.log.delete(entry.log_name)
    if config.checkpoint_store != "dir":
        count = len(manifest.ranges)
        say(f"--force: deleting the Pulsar checkpoints of the backup's {count} ranges")
        for entry in manifest.ranges:
            for name in target.checkpoints.list(entry.log_name):
                target.checkpoints.delete(name)


def _write_range(backup: Backup, entry: RangeEntry, store: CheckpointStore, scratch: Path) -> int:
    """Store the range's files and its manifest; return the bytes written."""
    written = 0
    for file in entry.files:
        staged = scratch / f"{uuid.uuid4().hex}-{file.name}"
        try:
            backup.copy_file(entry, file, staged)
            written += store.put_file(object_name(entry.log_name, file.sha256), staged)
        finally:
            staged.unlink(missing_ok=True)
    manifest = Manifest(
        entry.log_name,
        entry.applied_sequence,
        entry.created_at_ms,
        tuple(CheckpointFile(f.name, f.sha256, f.size) for f in entry.files),
    )
    store.put_bytes(manifest.object_name, manifest.encode())
    return written


async def _prune(target: _Target, manifest: BackupManifest, say: Say) -> list[str]:
    """Delete, through the restored catalog, what the backup's root range names but the backup
    does not hold (a namespace or table backup)."""
    config = target.config
    env = ContainerEnv(
        num_containers=max(manifest.num_containers, 1),
        log_backend=target.log,
        store_factory=functools.partial(RocksKvStore),
        appliers=server_appliers(),
        db_dir=config.db_dir,
        clock=SystemClock(),
        checkpoint_store=target.checkpoints,
        checkpoints_kept=config.checkpoints_kept,
    )
    registry = ContainerRegistry(env, list(range(env.num_containers)))
    held = {t.stream_id for t in manifest.tables}
    pruned: list[str] = []
    await registry.start()
    try:
        root = registry.root
        for namespace in sorted(root.namespaces(), key=lambda p: p.namespace_name):
            name = namespace.namespace_name
            if name not in manifest.namespaces:
                await registry.drop_tables(await root.delete_namespace(name))
                pruned.append(name)
                continue
            for props in root.streams(name):
                if props.stream_id not in held:
                    deleted = await root.delete_stream(name, props.stream_name)
                    await registry.drop_tables([deleted])
                    pruned.append(f"{name}/{props.stream_name}")
        for what in pruned:
            say(f"not in the backup, deleted from the restored catalog: {what}")
        await registry.checkpoint()
    finally:
        await registry.stop()
    return pruned


def restore(
    backup: Backup,
    config: ServerConfig,
    *,
    force: bool,
    say: Say,
) -> RestoreResult:
    """Restore `backup` (opened and verified) into the stores `config` names. Raises
    `RestoreRefusedError` when the target holds data (without `force`) or cannot take it."""
    started = _CLOCK.monotonic_s()
    manifest = backup.manifest
    if not config.cluster_mode and config.containers < manifest.num_containers:
        raise RestoreRefusedError(
            f"the backup comes from a service of {manifest.num_containers} storage containers; "
            f"restore into a server with --containers {manifest.num_containers} (this one has "
            f"{config.containers}), since each range stays in its container"
        )
    target = _target(config)
    try:
        with _locked(config.data_dir):
            found = _found_data(target, manifest)
            if found and not force:
                raise RestoreRefusedError(
                    "the target already holds data: " + "; ".join(found) + ". Restore into an "
                    "empty one, or pass --force to replace it (its data is deleted)"
                )
            if found:
                _clear(target, manifest, say)
            scratch = config.data_dir / f".restore-{uuid.uuid4().hex}"
            scratch.mkdir(parents=True)
            written = files = 0
            try:
                for index, entry in enumerate(manifest.ranges, 1):
                    written += _write_range(backup, entry, target.checkpoints, scratch)
                    files += len(entry.files)
                    say(
                        f"[{index:>{len(str(len(manifest.ranges)))}}/{len(manifest.ranges)}] "
                        f"{_describe(entry)}: {len(entry.files)} files, {_mib(entry.size)}, "
                        f"at position {entry.applied_sequence}"
                    )
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            pruned: list[str] = []
            if not manifest.whole:
                pruned = asyncio.run(_prune(target, manifest, say))
    finally:
        target.close()
    return RestoreResult(
        ranges=len(manifest.ranges),
        files=files,
        bytes=written,
        tables=len(manifest.tables),
        pruned=tuple(pruned),
        seconds=_CLOCK.monotonic_s() - started,
    )


def _describe(entry: RangeEntry) -> str:
    if entry.kind == "root":
        return "root range (namespaces, tables)"
    if entry.kind == "meta":
        return f"meta range of container {entry.container_id}"
    return f"{entry.table} range {entry.range_id} (container {entry.container_id})"


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def check_backup(backup: Backup, say: Say) -> None:
    """Verify every file (size and SHA-256), saying how far it got on long runs."""
    total = backup.manifest.size
    state = {"done": 0, "said": _CLOCK.monotonic_s()}

    def progress(_: str, read: int) -> None:
        state["done"] += read
        now = _CLOCK.monotonic_s()
        if now - state["said"] >= 2.0:
            state["said"] = now
            say(f"checking: {_mib(int(state['done']))} of {_mib(total)}")

    backup.verify(progress)
    say(
        f"checked {sum(len(r.files) for r in backup.manifest.ranges)} files "
        f"({_mib(total)}) of {len(backup.manifest.ranges)} ranges: every SHA-256 matches"
    )
