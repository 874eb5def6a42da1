"""The checkpoint store interface: immutable named objects plus atomic small writes.

Names are `/`-separated paths such as `<range>/objects/<sha256>`. Objects are never modified once
written: `put_file` of an existing name is a no-op (content-addressed callers make that safe).
Every method blocks; call them from a worker thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class CheckpointStore(Protocol):
    def put_file(self, name: str, source: Path) -> int:
        """Store a copy of `source` under `name`, durably, and return the bytes written.
        Visible under `name` only once complete."""
        ...

    def put_bytes(self, name: str, data: bytes) -> None:
        """Store `data` under `name` atomically and durably (a reader sees all of it or none)."""
        ...

    def get_file(self, name: str, dest: Path) -> None:
        """Copy the object to `dest`. Raises `FileNotFoundError` if it does not exist."""
        ...

    def get_bytes(self, name: str) -> bytes: ...

    def exists(self, name: str) -> bool: ...

    def sha256(self, name: str) -> str:
        """The SHA-256 (hex) of the object's stored bytes, read back in full: how a checkpoint
        verifies an object it reuses. Raises `FileNotFoundError` if it does not exist."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Names under `prefix` (a directory-like path), sorted. A name whose write was cut off
        by a crash may be listed although reading it raises `FileNotFoundError` (a shared store
        cannot always create and fill an object in one step): readers treat it as absent."""
        ...

    def delete(self, name: str) -> None:
        """Remove an object; a no-op if it does not exist."""
        ...

    def describe(self) -> str:
        """Where the store is, for messages."""
        ...
