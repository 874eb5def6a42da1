"""The backup format: what `tablekeeper admin backup` writes and `admin restore` reads.

A backup is a set of range checkpoints plus a manifest, in one of two containers:

- a **directory**: `backup.json` (the manifest) and `ranges/<range>/<file>`, each range's
  RocksDB files as its checkpoint named them. The manifest is written last (atomically), so a
  backup cut short has none and is refused as incomplete.
- an **archive**, one file: the same paths as members of a tar (POSIX ustar/pax, blocks of 512
  bytes, `backup.json` last) followed by the SHA-256 of every byte before it, 32 bytes. That is
  the layout of an etcd snapshot stream (the data, then its SHA-256), so `etcdctl snapshot save`
  against TableKeeper's etcd port writes one (see `etcd.servicers`).

The manifest lists every range (root, meta, data) with its cut (the log position its files
hold, see `admin.proto`'s BackupRangeHeader), every file's size and SHA-256, and the tables the
backup holds; its own body carries a SHA-256, so an altered manifest is refused too. Reading a
backup checks all of it before anything is restored; any problem is a `BackupError` naming the
file and what is wrong with it.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FORMAT = 1
KIND = "tablekeeper-backup"
MANIFEST = "backup.json"
TRAILER_BYTES = 32
"""An archive ends with the SHA-256 of everything before it (as etcd's snapshot stream does)."""
BLOCK = 512
_READ_BYTES = 1024 * 1024

Progress = Callable[[str, int], None]
"""Told (path, bytes read) as a backup is checked."""


class BackupError(Exception):
    """A backup that cannot be used: `path` is the backup (or the file in it) at fault."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    """The file's name in the range's RocksDB directory."""
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class RangeEntry:
    kind: str
    """"root" (namespaces and tables), "meta" (a container's table ranges) or "data"."""
    container_id: int
    stream_id: int
    range_id: int
    applied_sequence: int
    """The cut: every log record of the range up to this position is in the files, none after."""
    created_at_ms: int
    files: tuple[FileEntry, ...]
    table: str = ""
    """NAMESPACE/TABLE of a data range."""
    checkpoint: str = ""
    """The checkpoint (manifest name in the server's checkpoint store) it was copied from."""

    @property
    def log_name(self) -> str:
        """The range's name in logs and checkpoint stores (`range.replica.RangeName`)."""
        return f"{self.container_id:05d}-{self.stream_id:012d}-{self.range_id:012d}"

    @property
    def directory(self) -> str:
        return f"ranges/{self.log_name}"

    def path(self, file: FileEntry) -> str:
        return f"{self.directory}/{file.name}"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True, slots=True)
class TableEntry:
    namespace: str
    name: str
    stream_id: int
    container_id: int
    """The container of the table's meta range."""


@dataclass(frozen=True, slots=True)
class BackupManifest:
    created_at_ms: int
    num_containers: int
    ranges: tuple[RangeEntry, ...]
    tables: tuple[TableEntry, ...]
    namespaces: tuple[str, ...]
    """Every namespace the backup holds (with all its tables, or those of `scope`)."""
    scope: str = ""
    """What was backed up: "" (the whole service), "NAMESPACE" or "NAMESPACE/TABLE"."""
    source: str = ""
    """The service it came from, for people."""
    version: str = ""
    """TableKeeper's version that wrote it."""
    notes: tuple[str, ...] = field(default=())

    @property
    def whole(self) -> bool:
        return self.scope == ""

    @property
    def size(self) -> int:
        return sum(r.size for r in self.ranges)

    def encode(self) -> bytes:
        body = _body(self)
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        return json.dumps({"body": body, "sha256": digest}, indent=1).encode()

    @staticmethod
    def decode(raw: bytes, where: str) -> BackupManifest:
        try:
            doc = json.loads(raw)
            body = doc["body"]
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
            if hashlib.sha256(canonical.encode()).hexdigest() != doc["sha256"]:
                raise BackupError(where, "the manifest fails its SHA-256 check (damaged)")
            if body.get("kind") != KIND:
                raise BackupError(where, "not a TableKeeper backup manifest")
            if body["format"] != FORMAT:
                raise BackupError(
                    where, f"backup format {body['format']} is not one this version reads"
                )
            return _from_body(body)
        except BackupError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackupError(where, f"the manifest is damaged ({exc!r})") from exc


def _body(m: BackupManifest) -> dict[str, Any]:
    return {
        "kind": KIND,
        "format": FORMAT,
        "created_at_ms": m.created_at_ms,
        "num_containers": m.num_containers,
        "scope": m.scope,
        "source": m.source,
        "version": m.version,
        "notes": list(m.notes),
        "namespaces": list(m.namespaces),
        "tables": [
            {
                "namespace": t.namespace,
                "name": t.name,
                "stream_id": t.stream_id,
                "container_id": t.container_id,
            }
            for t in m.tables
        ],
        "ranges": [
            {
                "kind": r.kind,
                "container_id": r.container_id,
                "stream_id": r.stream_id,
                "range_id": r.range_id,
                "table": r.table,
                "applied_sequence": r.applied_sequence,
                "created_at_ms": r.created_at_ms,
                "checkpoint": r.checkpoint,
                "files": [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in r.files],
            }
            for r in m.ranges
        ],
    }


def _from_body(body: dict[str, Any]) -> BackupManifest:
    ranges = tuple(
        RangeEntry(
            kind=str(r["kind"]),
            container_id=int(r["container_id"]),
            stream_id=int(r["stream_id"]),
            range_id=int(r["range_id"]),
            applied_sequence=int(r["applied_sequence"]),
            created_at_ms=int(r["created_at_ms"]),
            files=tuple(
                FileEntry(_file_name(str(f["name"])), str(f["sha256"]), int(f["size"]))
                for f in r["files"]
            ),
            table=str(r["table"]),
            checkpoint=str(r["checkpoint"]),
        )
        for r in body["ranges"]
    )
    tables = tuple(
        TableEntry(str(t["namespace"]), str(t["name"]), int(t["stream_id"]), int(t["container_id"]))
        for t in body["tables"]
    )
    return BackupManifest(
        created_at_ms=int(body["created_at_ms"]),
        num_containers=int(body["num_containers"]),
        ranges=ranges,
        tables=tables,
        namespaces=tuple(str(n) for n in body["namespaces"]),
        scope=str(body["scope"]),
        source=str(body["source"]),
        version=str(body["version"]),
        notes=tuple(str(n) for n in body["notes"]),
    )


def _file_name(name: str) -> str:
    """A RocksDB file name: one path component (a manifest naming `../x` is refused)."""
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise ValueError(f"bad file name {name!r}")
    return name


# ---------------------------------------------------------------------------------- reading


class Backup(abc.ABC):
    """A backup opened for reading: its manifest, checked files, and each file's bytes. Open
    with `open_backup`; `verify` before using the files."""

    def __init__(self, path: Path, manifest: BackupManifest) -> None:
        self.path = path
        self.manifest = manifest

    @abc.abstractmethod
    def verify(self, progress: Progress | None = None) -> None:
        """Check every file of the manifest: present, of its size and SHA-256. Raises
        `BackupError` naming the first file that is not."""

    @abc.abstractmethod
    def copy_file(self, entry: RangeEntry, file: FileEntry, dest: Path) -> None:
        """Write the file's bytes to `dest` (fsynced)."""

    def close(self) -> None:  # noqa: B027 (most backups hold nothing open)
        """Release what reading holds open."""


class DirectoryBackup(Backup):
    def verify(self, progress: Progress | None = None) -> None:
        for entry in self.manifest.ranges:
            for file in entry.files:
                relative = entry.path(file)
                path = self.path / relative
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    raise BackupError(str(path), "missing (the backup is incomplete)") from None
                if size != file.size:
                    raise BackupError(
                        str(path),
                        f"{size} bytes, the manifest says {file.size} "
                        f"({'truncated' if size < file.size else 'altered'})",
                    )
                with open(path, "rb") as source:
                    digest = _hash_stream(source, relative, progress)
                if digest != file.sha256:
                    raise BackupError(str(path), "fails its SHA-256 check (damaged)")

    def copy_file(self, entry: RangeEntry, file: FileEntry, dest: Path) -> None:
        with open(self.path / entry.path(file), "rb") as source:
            _copy(source, dest)


class ArchiveBackup(Backup):
    def __init__(
        self, path: Path, manifest: BackupManifest, tar: tarfile.TarFile, handle: IO[bytes]
    ) -> None:
        super().__init__(path, manifest)
        self._tar = tar
        self._handle = handle

    def verify(self, progress: Progress | None = None) -> None:
        members = {m.name: m for m in self._tar.getmembers()}
        for entry in self.manifest.ranges:
            for file in entry.files:
                relative = entry.path(file)
                member = members.get(relative)
                where = f"{self.path} (member {relative})"
                if member is None or not member.isfile():
                    raise BackupError(where, "missing from the archive")
                if member.size != file.size:
                    raise BackupError(
                        where, f"{member.size} bytes, the manifest says {file.size} (altered)"
                    )
                source = self._tar.extractfile(member)
                assert source is not None
                if _hash_stream(source, relative, progress) != file.sha256:
                    raise BackupError(where, "fails its SHA-256 check (damaged)")

    def copy_file(self, entry: RangeEntry, file: FileEntry, dest: Path) -> None:
        source = self._tar.extractfile(entry.path(file))
        assert source is not None
        _copy(source, dest)

    def close(self) -> None:
        self._tar.close()
        self._handle.close()  # a TarFile given a file object leaves it open


def open_backup(path: Path, progress: Progress | None = None) -> Backup:
    """Open a backup directory or archive and read its manifest (an archive's trailer is
    checked here, reading it once). Raises `BackupError` naming what is wrong."""
    if path.is_dir():
        manifest_path = path / MANIFEST
        try:
            raw = manifest_path.read_bytes()
        except FileNotFoundError:
            raise BackupError(
                str(manifest_path),
                "missing: not a TableKeeper backup, or one that was cut short before it finished",
            ) from None
        return DirectoryBackup(path, BackupManifest.decode(raw, str(manifest_path)))
    if not path.exists():
        raise BackupError(str(path), "no such file or directory")
    return _open_archive(path, progress)


def _open_archive(path: Path, progress: Progress | None) -> ArchiveBackup:
    size = path.stat().st_size
    if size < BLOCK + TRAILER_BYTES or (size - TRAILER_BYTES) % BLOCK:
        raise BackupError(
            str(path),
            f"{size} bytes is not an archive's length (tar blocks of {BLOCK} bytes plus a "
            f"{TRAILER_BYTES}-byte SHA-256): truncated, or not a TableKeeper backup",
        )
    body = size - TRAILER_BYTES
    with open(path, "rb") as source:
        digest = _hash_stream(_Bounded(source, body), path.name, progress)
        trailer = source.read(TRAILER_BYTES)
    if trailer.hex() != digest:
        raise BackupError(
            str(path),
            "its SHA-256 trailer does not match its contents: truncated or damaged",
        )
    handle = open(path, "rb")  # noqa: SIM115 (owned by the ArchiveBackup, closed with it)
    try:
        bounded = _Bounded(handle, body)
        tar = tarfile.open(fileobj=bounded, mode="r:")  # noqa: SIM115
        try:
            raw_file = tar.extractfile(MANIFEST)
        except KeyError:
            raw_file = None
        if raw_file is None:
            raise BackupError(f"{path} (member {MANIFEST})", "missing from the archive")
        manifest = BackupManifest.decode(raw_file.read(), f"{path} (member {MANIFEST})")
    except tarfile.TarError as exc:
        handle.close()
        raise BackupError(str(path), f"not a readable archive ({exc})") from None
    except BaseException:
        handle.close()
        raise
    return ArchiveBackup(path, manifest, tar, handle)


class _Bounded(io.RawIOBase):
    """The first `limit` bytes of a seekable file (an archive without its trailer)."""

    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self._raw.seek(0)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET:
            position = offset
        elif whence == os.SEEK_CUR:
            position = self._pos + offset
        else:
            position = self._limit + offset
        self._pos = max(0, min(position, self._limit))
        self._raw.seek(self._pos)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        wanted = min(len(view), self._limit - self._pos)
        if wanted <= 0:
            return 0
        data = self._raw.read(wanted)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        super().close()  # the underlying file stays open: its opener closes it


def _hash_stream(source: IO[bytes] | io.RawIOBase, label: str, progress: Progress | None) -> str:
    digest = hashlib.sha256()
    done = 0
    while chunk := source.read(_READ_BYTES):
        digest.update(chunk)
        done += len(chunk)
        if progress is not None:
            progress(label, len(chunk))
    return digest.hexdigest()


def _copy(source: IO[bytes], dest: Path) -> None:
    with open(dest, "wb") as out:
        while chunk := source.read(_READ_BYTES):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


# ---------------------------------------------------------------------------------- writing


class Sink(abc.ABC):
    """Where a backup being taken goes. Files arrive one at a time, each as consecutive chunks;
    `finish` writes the manifest last. Methods block (call them from a worker thread)."""

    @abc.abstractmethod
    def begin_file(self, path: str, size: int) -> None: ...

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def end_file(self) -> None: ...

    @abc.abstractmethod
    def finish(self, manifest: BackupManifest) -> None: ...

    def abort(self) -> None:  # noqa: B027 (a stream has nothing to undo)
        """The backup failed: leave nothing that looks like a backup."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectorySink(Sink):
    """A backup directory. `dest` must not exist or be empty: a backup never overwrites."""

    def __init__(self, dest: Path) -> None:
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise BackupError(str(dest), "exists and is not an empty directory; choose another")
        dest.mkdir(parents=True, exist_ok=True)
        self.dest = dest
        self._file: IO[bytes] | None = None
        self._dirs: set[Path] = set()

    def begin_file(self, path: str, size: int) -> None:
        target = self.dest / path
        if target.parent not in self._dirs:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(target.parent)
        self._file = open(target, "wb")  # noqa: SIM115 (closed in end_file)

    def write(self, data: bytes) -> None:
        assert self._file is not None
        self._file.write(data)

    def end_file(self) -> None:
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None

    def finish(self, manifest: BackupManifest) -> None:
        for directory in self._dirs:
            fsync_dir(directory)
        if (self.dest / "ranges").is_dir():
            fsync_dir(self.dest / "ranges")
        tmp = self.dest / f".{MANIFEST}.tmp"
        with open(tmp, "wb") as out:
            out.write(manifest.encode())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.dest / MANIFEST)
        fsync_dir(self.dest)

    def abort(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class ArchiveSink(Sink):
    """A backup archive written to `out` as it goes (a file, or a stream such as etcd's
    Snapshot): tar members, then the SHA-256 trailer at `finish`."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self._digest = hashlib.sha256()
        self.bytes_written = 0
        self._remaining = 0
        self._padding = 0

    def _emit(self, data: bytes) -> None:
        self._out.write(data)
        self._digest.update(data)
        self.bytes_written += len(data)

    def begin_file(self, path: str, size: int) -> None:
        info = tarfile.TarInfo(path)
        info.size = size
        info.mode = 0o644
        self._emit(info.tobuf(format=tarfile.PAX_FORMAT))
        self._remaining = size
        self._padding = -size % BLOCK

    def write(self, data: bytes) -> None:
        if len(data) > self._remaining:
            raise BackupError("archive", "a file sent more bytes than its header said")
        self._remaining -= len(data)
        self._emit(data)

    def end_file(self) -> None:
        if self._remaining:
            raise BackupError("archive", f"a file ended {self._remaining} bytes short")
        self._emit(b"\0" * self._padding)

    def finish(self, manifest: BackupManifest) -> None:
        raw = manifest.encode()
        self.begin_file(MANIFEST, len(raw))
        self.write(raw)
        self.end_file()
        self._emit(b"\0" * (2 * BLOCK))  # tar's end-of-archive marker
        trailer = self._digest.digest()
        self._out.write(trailer)
        self.bytes_written += len(trailer)
        self._out.flush()


def iter_files(manifest: BackupManifest) -> Iterator[tuple[RangeEntry, FileEntry]]:
    for entry in manifest.ranges:
        for file in entry.files:
            yield entry, file
