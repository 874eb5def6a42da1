"""A checkpoint store in a directory: local disk or a shared filesystem mount.

Writes go to a temporary file in the destination directory, are fsynced, renamed into place, and
the directory is fsynced, so an object is either absent or complete after any crash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

_COPY_CHUNK = 1024 * 1024


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryCheckpointStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"directory {self.root}"

    def _path(self, name: str) -> Path:
        parts = name.split("/")
        if not name or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"invalid checkpoint object name {name!r}")
        return self.root.joinpath(*parts)

    def _publish(self, target: Path, write: object) -> int:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex}"
        written = 0
        try:
            with open(tmp, "wb") as out:
                if isinstance(write, bytes):
                    out.write(write)
                    written = len(write)
                else:
                    assert isinstance(write, Path)
                    with open(write, "rb") as src:
                        while chunk := src.read(_COPY_CHUNK):
                            out.write(chunk)
                            written += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)
        return written

    def put_file(self, name: str, source: Path) -> int:
        target = self._path(name)
        if target.exists():
            return 0
        return self._publish(target, source)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._publish(self._path(name), data)

    def get_file(self, name: str, dest: Path) -> None:
        shutil.copyfile(self._path(name), dest)

    def get_bytes(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def sha256(self, name: str) -> str:
        digest = hashlib.sha256()
        with open(self._path(name), "rb") as f:
            while chunk := f.read(_COPY_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        names = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                names.append(path.relative_to(self.root).as_posix())
        return sorted(names)

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)
