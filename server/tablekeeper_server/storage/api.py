"""The sorted key/value engine interface a range keeps its state in.

The engine is a materialized index of the range's write-ahead log, not the source of truth: it may
lose its most recent writes in a crash (RocksDB runs without its own WAL), which is safe because
every `WriteBatch` also records the log position it reflects and recovery replays the log from
there. Calls are synchronous and short; they run on the serving event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class WriteBatch(Protocol):
    """Writes applied atomically by `KvStore.write`."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def delete_range(self, start: bytes, end: bytes) -> None:
        """Delete every key k with start <= k < end."""
        ...


class StoreOpener(Protocol):
    def __call__(self, path: Path, *, read_only: bool = False) -> KvStore:
        """Open (creating if absent, unless `read_only`) the store in directory `path`.

        Raises `CorruptionError` when the store is damaged (the range may set it aside and
        restore a checkpoint) and `StorageUnavailableError` when a resource is exhausted, a lock
        is held or permission is denied (the store is fine: never set it aside)."""
        ...


class KvStore(Protocol):
    damage: str | None
    """Why the store is damaged, once any call found it so (and raised `StoreCorruptionError`);
    None while it is sound. The range owning a damaged store stops serving and rebuilds it."""

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Yield (key, value) for start <= key < end in key order, from a consistent view."""
        ...

    def keys(self, start: bytes, end: bytes) -> list[bytes]:
        """Every key k with start <= k < end, in key order, from a consistent view, in one call
        (no value is read: listings that need only the keys do not pay a Python step each)."""
        ...

    def new_batch(self) -> WriteBatch: ...

    def write(self, batch: WriteBatch) -> None:
        """Apply the batch atomically. Not fsynced: durability comes from the log."""
        ...

    def estimate_num_keys(self) -> int: ...

    def flush(self) -> None:
        """Persist everything written so far (used at clean shutdown to shorten replay)."""
        ...

    def compact(self) -> None:
        """Rewrite the store's files to drop deleted and overwritten data (RocksDB: a manual
        compaction of every key; etcd's Defragment). Slow; callable from a worker thread."""
        ...

    def create_checkpoint(self, dest: Path) -> None:
        """Write a consistent, openable copy of the store to the new directory `dest` (RocksDB:
        hard links to the live files plus a flushed memtable). Callable from a worker thread."""
        ...

    def live_file_names(self) -> list[str]:
        """Names of the files that make up the store now (for status)."""
        ...

    def close(self) -> None:
        """Release the store (and its lock) even when the final flush fails; idempotent. An
        unfinished `scan` of a closed store raises `UnavailableError` when resumed."""
        ...
