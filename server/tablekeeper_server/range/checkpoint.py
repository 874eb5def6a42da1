"""Checkpoints of one range: create (incremental), garbage-collect, truncate the log, restore.

Create, in order (each step durable before the next; `failpoints` name the gaps a crash test
stops the process in):
  1. RocksDB checkpoint into a scratch directory (flushes the memtable; hard links otherwise);
     the applied log position is read from the checkpoint itself, so it matches its files.
  2. Upload each file the store does not hold yet, content-addressed by SHA-256. An SST whose
     name and size equal an entry of the previous manifest is the same immutable file: its hash
     is reused without reading it. The object it reuses is read back and checked (bit rot is
     repaired, not spread), at most every `REVERIFY_S` per object: a range checkpointed every
     few seconds (`--checkpoint-records`) would otherwise download its whole store each time.
                                                                     [checkpoint.during_upload]
  3. Publish the manifest atomically.                                [checkpoint.before_manifest]
  4. Delete manifests beyond the newest `keep`, then objects no kept manifest references.
  5. Truncate the log before the OLDEST kept checkpoint's position, so falling back to an older
     checkpoint never meets a gap in the log.                        [checkpoint.before_truncate]
     Mark the records after the NEWEST one as where the next owner's log recovery may begin.

Restore (the local store is missing or unusable): take manifests newest first; download every
file into a scratch directory, several at once, verifying SHA-256 [restore.during_download];
move it into place atomically [restore.before_open]. A damaged checkpoint is skipped for the
next one; if none is valid the range refuses to open rather than serve incomplete data.
Running out of a resource while restoring (a full disk) is no verdict on the checkpoint: it
raises `StorageUnavailableError` and nothing is set aside or skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.checkpoint.manifest import (
    FileEntry,
    Manifest,
    manifests_prefix,
    object_name,
)
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.errors import CorruptionError, StorageUnavailableError
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.range.apply import applied_sequence
from tablekeeper_server.storage.api import KvStore, StoreOpener

log = logging.getLogger(__name__)
_HASH_CHUNK = 1024 * 1024
RESTORE_PARALLELISM = 8
"""Checkpoint files downloaded at once by a restore."""
REVERIFY_S = 300.0
"""A stored object a checkpoint reuses is read back and checked if this checkpointer has not
uploaded or checked it for this long (the default `--checkpoint-interval`, so a range
checkpointed by time alone checks every object it reuses, as it always did)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class CheckpointStats:
    """What the last checkpoint of a range did (for metrics and `admin status`)."""

    applied_sequence: int = 0
    created_at_ms: int = 0
    duration_s: float = 0.0
    bytes_uploaded: int = 0
    files_uploaded: int = 0
    files_reused: int = 0
    count: int = 0
    restored_from: str = ""
    errors: list[str] = field(default_factory=list)


class RangeCheckpointer:
    """Checkpoints of one range. Methods block: run them in a worker thread, one at a time."""

    def __init__(
        self,
        range_name: str,
        store_path: Path,
        store_opener: StoreOpener,
        checkpoint_store: CheckpointStore,
        log_backend: LogBackend,
        clock: Clock,
        *,
        keep: int = 2,
        failpoints: Failpoints = NO_FAILPOINTS,
    ) -> None:
        if keep < 1:
            raise ValueError("keep at least one checkpoint")
        self.range_name = range_name
        self.store_path = store_path
        self._open = store_opener
        self._store = checkpoint_store
        self._log = log_backend
        self._clock = clock
        self._keep = keep
        self._failpoints = failpoints
        self.stats = CheckpointStats()
        self.files_unknown = False
        """The local store's files are not known to be those the newest manifest names under
        the same names (it was a follower's: RocksDB numbered its files on its own), so the
        next checkpoint hashes every file instead of trusting name and size."""
        self._checked_at: dict[str, float] = {}
        """Digest -> when this checkpointer last uploaded or read back that object."""
        self._read_manifests: dict[str, tuple[Manifest, float]] = {}
        """Manifest name -> the manifest and when this checkpointer wrote or read it (a
        published manifest never changes: each checkpoint reads the newest one and garbage
        collection the newest `keep`, which it would otherwise fetch again and again)."""
        self._last_manifest: tuple[Manifest, float] | None = None
        """The last manifest this checkpointer published or restored, and when."""

    # ------------------------------------------------------------------ create

    def checkpoint(self, store: KvStore, *, publish_only: bool = False) -> Manifest:
        """Checkpoint `store` (the range's open store) and truncate the log. See module doc.
        `publish_only`: a split publishing a child it builds (`range.split`): upload and
        publish, but leave the log alone (the child's does not exist yet), collect no garbage
        (the child's owner does, at its first checkpoint), and trust the files the previous
        manifest has (this same build uploaded them moments ago) instead of reading them back."""
        started = time.monotonic()
        self._remove_stale_scratch(".checkpoint")
        scratch = self.store_path.parent / f".checkpoint-{self.store_path.name}-{uuid.uuid4().hex}"
        try:
            store.create_checkpoint(scratch)
            applied = self._applied_sequence_of(scratch)
            previous = self._previous_manifest()
            known = {}
            if previous is not None and not self.files_unknown:
                known = {(f.name, f.size): f.sha256 for f in previous.files}
            entries = []
            uploaded_bytes = uploaded = reused = 0
            for path in sorted(scratch.iterdir()):
                if not path.is_file():
                    continue
                size = path.stat().st_size
                digest = known.get((path.name, size)) if path.suffix == ".sst" else None
                if digest is not None and (publish_only or self._stored_intact(digest)):
                    reused += 1
                else:
                    digest = sha256_of(path)
                    written = self._store.put_file(object_name(self.range_name, digest), path)
                    if written:
                        uploaded += 1
                        uploaded_bytes += written
                        self._checked_at[digest] = self._clock.monotonic_s()
                        self._failpoints.hit("checkpoint.during_upload")
                    else:
                        reused += 1
                entries.append(FileEntry(path.name, digest, size))
            manifest = Manifest(self.range_name, applied, self._clock.now_ms(), tuple(entries))
            self._failpoints.hit("checkpoint.before_manifest")
            self._store.put_bytes(manifest.object_name, manifest.encode())
            self._read_manifests[manifest.object_name] = (manifest, self._clock.monotonic_s())
            self._last_manifest = (manifest, self._clock.monotonic_s())
            if not publish_only:
                kept = self._collect_garbage()
                self._failpoints.hit("checkpoint.before_truncate")
                oldest_kept = min(m.applied_sequence for m in kept)
                self._log.truncate(self.range_name, oldest_kept + 1)
                self._log.mark_recovery_start(self.range_name, applied + 1)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self.files_unknown = False
        referenced = {entry.sha256 for entry in manifest.files}
        self._checked_at = {d: t for d, t in self._checked_at.items() if d in referenced}
        duration = time.monotonic() - started
        stats = self.stats
        stats.applied_sequence = applied
        stats.created_at_ms = manifest.created_at_ms
        stats.duration_s = duration
        stats.bytes_uploaded = uploaded_bytes
        stats.files_uploaded = uploaded
        stats.files_reused = reused
        stats.count += 1
        log.info(
            "range %s: checkpoint at %d in %.3fs: %d files uploaded (%d bytes), %d reused",
            self.range_name,
            applied,
            duration,
            uploaded,
            uploaded_bytes,
            reused,
        )
        return manifest

    def _stored_intact(self, digest: str) -> bool:
        """Whether the store holds an intact object `digest` (read back and hashed). A damaged
        object is deleted, so the caller uploads the file again: a reused object is verified by
        every checkpoint that references it, and bit rot in the store heals instead of spreading
        into every later checkpoint (and, after GC, into all of them). An object this checkpointer
        uploaded or checked less than `REVERIFY_S` ago is taken as intact without reading it."""
        now = self._clock.monotonic_s()
        checked = self._checked_at.get(digest)
        if checked is not None and now - checked < REVERIFY_S:
            return True
        name = object_name(self.range_name, digest)
        try:
            if self._store.sha256(name) == digest:
                self._checked_at[digest] = now
                return True
        except FileNotFoundError:
            return False
        except CorruptionError:
            pass
        log.warning(
            "range %s: stored object %s is damaged; uploading it again", self.range_name, name
        )
        self._store.delete(name)
        return False

    def _remove_stale_scratch(self, kind: str) -> None:
        """Delete `<kind>-<store>-<uuid>` scratch directories a crashed process left next to
        the store (a checkpoint's hard links would otherwise pin deleted SSTs on disk forever).
        Checkpoints of a range run one at a time and restores only while it opens, so any such
        directory found now is stale."""
        pattern = re.compile(re.escape(f"{kind}-{self.store_path.name}-") + "[0-9a-f]{32}")
        parent = self.store_path.parent
        if not parent.is_dir():
            return
        for path in parent.iterdir():
            if pattern.fullmatch(path.name) and path.is_dir():
                log.info("range %s: removing %s left by a crash", self.range_name, path)
                shutil.rmtree(path, ignore_errors=True)

    def _applied_sequence_of(self, directory: Path) -> int:
        store = self._open(directory, read_only=True)
        try:
            return applied_sequence(store)
        finally:
            store.close()

    def _manifests(self, listing: list[str] | None = None) -> list[str]:
        """Manifest object names, newest (highest position, then latest) first; from `listing`
        (every name under the range) if given, else listed now."""
        prefix = manifests_prefix(self.range_name)
        if listing is None:
            listing = self._store.list(prefix)
        else:
            listing = [name for name in listing if name.startswith(prefix + "/")]
        names = sorted(listing, reverse=True)
        listed = set(names)
        for gone in [name for name in self._read_manifests if name not in listed]:
            del self._read_manifests[gone]
        return names

    def _load(self, name: str, *, fresh: bool = False) -> Manifest | None:
        """The manifest `name`; None if it holds nothing (listed, but its publication was cut
        off by a crash, or it was deleted meanwhile): that is no checkpoint, not a damaged one.
        One this checkpointer wrote or read less than `REVERIFY_S` ago is not read again,
        unless `fresh` (a restore reads what the store holds now)."""
        now = self._clock.monotonic_s()
        known = self._read_manifests.get(name)
        if not fresh and known is not None and now - known[1] < REVERIFY_S:
            return known[0]
        try:
            raw = self._store.get_bytes(name)
        except FileNotFoundError:
            log.info(
                "range %s: ignoring %s: listed but empty (never published)", self.range_name, name
            )
            return None
        manifest = Manifest.decode(raw, f"{self._store.describe()}:{name}")
        self._read_manifests[name] = (manifest, now)
        return manifest

    def _previous_manifest(self) -> Manifest | None:
        """The manifest whose SSTs a checkpoint may take by name and size: this checkpointer's
        own last one while it is recent (the store's SSTs it names are still these files, even
        should another writer have published since), else the newest valid one in the store."""
        last = self._last_manifest
        if last is not None and self._clock.monotonic_s() - last[1] < REVERIFY_S:
            return last[0]
        return self._newest_valid_manifest()

    def _newest_valid_manifest(self) -> Manifest | None:
        for name in self._manifests():
            try:
                manifest = self._load(name)
            except CorruptionError as exc:
                log.warning("range %s: skipping %s", self.range_name, exc.message)
                continue
            if manifest is not None:
                return manifest
        return None

    def _collect_garbage(self) -> list[Manifest]:
        """Keep the newest `keep` valid manifests; delete the rest and unreferenced objects."""
        kept: list[Manifest] = []
        listing = self._store.list(self.range_name)  # one listing: a namespace-wide call on Pulsar
        for name in self._manifests(listing):
            manifest: Manifest | None = None
            if len(kept) < self._keep:
                try:
                    manifest = self._load(name)
                except CorruptionError as exc:
                    log.warning("range %s: deleting damaged %s", self.range_name, exc.message)
            if manifest is not None:
                kept.append(manifest)
            else:
                self._store.delete(name)
        referenced = {object_name(self.range_name, f.sha256) for m in kept for f in m.files}
        objects = f"{self.range_name}/objects/"
        for name in listing:
            if name.startswith(objects) and name not in referenced:
                self._store.delete(name)
        return kept

    def delete_all(self) -> None:
        """Delete every checkpoint of the range (its manifests first, then their objects): the
        range is gone (a split retired it)."""
        for name in self._manifests():
            self._store.delete(name)
        for name in self._store.list(f"{self.range_name}/objects"):
            self._store.delete(name)

    # ------------------------------------------------------------------ restore

    def needs_restore(self) -> bool:
        return not (self.store_path / "CURRENT").is_file()

    def set_aside_local_store(self, reason: str) -> None:
        """Move an unusable local store out of the way (kept for inspection, never deleted)."""
        if not self.store_path.exists():
            return
        self._last_manifest = None  # it named that store's files
        stamp = self._clock.now_ms() // 1000
        aside = self.store_path.with_name(f"{self.store_path.name}.unusable-{stamp}")
        log.warning("range %s: moving local store to %s: %s", self.range_name, aside, reason)
        os.replace(self.store_path, aside)

    def has_checkpoints(self) -> bool:
        return bool(self._manifests())  # never-published names count: restore sorts them out

    def restore(self) -> int | None:
        """Rebuild the local store from the newest valid checkpoint; return its position.

        None when there is no checkpoint at all (the range starts empty). Raises
        `CorruptionError` when checkpoints exist but none is valid.
        """
        self._remove_stale_scratch(".restore")
        names = self._manifests()
        if not names:
            return None
        scratch = self.store_path.parent / f".restore-{self.store_path.name}-{uuid.uuid4().hex}"
        problems = []
        for name in names:
            started = time.monotonic()
            try:
                manifest = self._load(name, fresh=True)
                if manifest is None:
                    continue
                self._download(manifest, scratch)
            except (CorruptionError, OSError) as exc:
                if isinstance(exc, OSError) and StorageUnavailableError.is_resource_error(exc):
                    # The disk here is full (or out of descriptors...): the checkpoint is fine,
                    # an older one would fail the same way. Retry the whole restore later.
                    shutil.rmtree(scratch, ignore_errors=True)
                    raise StorageUnavailableError(
                        f"range {self.range_name}: cannot restore checkpoint {name}: {exc}"
                    ) from exc
                message = exc.message if isinstance(exc, CorruptionError) else repr(exc)
                log.warning("range %s: checkpoint %s unusable: %s", self.range_name, name, message)
                problems.append(f"{name}: {message}")
                shutil.rmtree(scratch, ignore_errors=True)
                continue
            self._failpoints.hit("restore.before_open")
            if self.store_path.exists():
                self.set_aside_local_store("replaced by a restored checkpoint")
            self.store_path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(scratch, self.store_path)
            _fsync_dir(self.store_path.parent)
            self.stats.restored_from = name
            self._last_manifest = (manifest, self._clock.monotonic_s())
            log.info(
                "range %s: restored checkpoint at %d (%d files) in %.3fs",
                self.range_name,
                manifest.applied_sequence,
                len(manifest.files),
                time.monotonic() - started,
            )
            return manifest.applied_sequence
        if not problems:
            return None  # only never-published names: no checkpoint at all
        raise CorruptionError(
            f"range {self.range_name}: no valid checkpoint in {self._store.describe()} "
            f"({'; '.join(problems)}); refusing to start it with incomplete data"
        )

    def _download(self, manifest: Manifest, scratch: Path) -> None:
        """Fetch every file of `manifest` into `scratch`, up to `RESTORE_PARALLELISM` at once: a
        remote store answers each file after a round trip or two, and a takeover waits on all."""
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        workers = max(1, min(RESTORE_PARALLELISM, len(manifest.files)))
        with ThreadPoolExecutor(workers, thread_name_prefix="restore") as pool:
            futures = [pool.submit(self._download_file, f, scratch) for f in manifest.files]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:  # start no more files
                    future.cancel()
                raise
        _fsync_dir(scratch)

    def _download_file(self, entry: FileEntry, scratch: Path) -> None:
        dest = scratch / entry.name
        try:
            self._store.get_file(object_name(self.range_name, entry.sha256), dest)
        except FileNotFoundError as exc:
            raise CorruptionError(f"file {entry.name} ({entry.sha256}) is missing") from exc
        if sha256_of(dest) != entry.sha256:
            raise CorruptionError(f"file {entry.name} fails its SHA-256 check")
        with open(dest, "rb") as f:
            os.fsync(f.fileno())
        self._failpoints.hit("restore.during_download")
