"""A checkpoint's manifest: the files of a RocksDB checkpoint and the log position it reflects.

Stored as JSON with a SHA-256 of its own body, so a torn or altered manifest is recognised as
damaged rather than trusted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from tablekeeper_server.errors import CorruptionError

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    """The file's name inside the RocksDB directory."""
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class Manifest:
    range_name: str
    applied_sequence: int
    """Every log record up to and including this sequence is reflected in the files."""
    created_at_ms: int
    files: tuple[FileEntry, ...]

    @property
    def object_name(self) -> str:
        return manifest_name(self.range_name, self.applied_sequence, self.created_at_ms)

    def encode(self) -> bytes:
        body = {
            "format": FORMAT_VERSION,
            "range": self.range_name,
            "applied_sequence": self.applied_sequence,
            "created_at_ms": self.created_at_ms,
            "files": [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in self.files],
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        return json.dumps({"body": body, "sha256": digest}, indent=1).encode()

    @staticmethod
    def decode(raw: bytes, where: str) -> Manifest:
        try:
            doc = json.loads(raw)
            body = doc["body"]
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
            if hashlib.sha256(canonical.encode()).hexdigest() != doc["sha256"]:
                raise CorruptionError(f"manifest {where}: checksum mismatch")
            if body["format"] != FORMAT_VERSION:
                raise CorruptionError(f"manifest {where}: unknown format {body['format']}")
            files = tuple(FileEntry(f["name"], f["sha256"], int(f["size"])) for f in body["files"])
            return Manifest(
                body["range"], int(body["applied_sequence"]), int(body["created_at_ms"]), files
            )
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptionError(f"manifest {where} is damaged: {exc!r}") from exc


def manifests_prefix(range_name: str) -> str:
    return f"{range_name}/manifests"


def manifest_name(range_name: str, applied_sequence: int, created_at_ms: int) -> str:
    return f"{manifests_prefix(range_name)}/{applied_sequence:020d}-{created_at_ms:015d}.json"


def object_name(range_name: str, sha256: str) -> str:
    return f"{range_name}/objects/{sha256}"
