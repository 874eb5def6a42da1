"""The RocksDB `KvStore`, through `rocksdict`.

RocksDB's own WAL is disabled: the range's log is the source of truth and each write batch carries
the log position it reflects, so after a crash the range replays the log from the position that
RocksDB still has. LZ4 compression and a modest write buffer keep many ranges per process cheap.

Memory: every range has a RocksDB of its own, so per-database defaults would grow with the open
ranges (a 16 MiB memtable and a block cache each). A server's stores share one `RocksMemory`
instead: one block cache (data, index and filter blocks) that the memtables are charged to as
well, kept to half of it by a write buffer manager (a soft limit: a write that finds them over it
schedules a flush; writers are not stalled, so a burst overshoots while flushes run). The
server's RocksDB memory is then about `RocksMemory.bytes`, whatever the number of open ranges.

Errors: rocksdict raises plain exceptions. Those that report exhausted resources (no space, no
file descriptors, a held LOCK, permissions) become `StorageUnavailableError` (retryable: the store
is fine and opens once the resource is back). RocksDB's "Corruption" status (a block failing its
checksum, found by a read, a scan, a write or a background compaction) and any other failure to
open is `StoreCorruptionError`; the store then keeps the reason in `damage`, so the range that
owns it stops serving and rebuilds it from its checkpoint and log (`Range`).

Closing: rocksdict releases RocksDB (and its LOCK file) only when the last Python object sharing
the database is gone: the `Rdict`, but also every iterator and column-family handle. `close`
therefore drops the iterators of unfinished scans (the scan then raises `UnavailableError`) and
its own handle, and does so even when the final flush fails (a full disk), so the store can be
opened again in this process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import rocksdict

from tablekeeper_server.errors import (
    CorruptionError,
    StorageUnavailableError,
    StoreCorruptionError,
    UnavailableError,
)
from tablekeeper_server.storage.api import WriteBatch

_WRITE_BUFFER_BYTES = 16 * 1024 * 1024


class RocksMemory:
    """The RocksDB memory all of a server's stores share (see the module doc): a block cache of
    `bytes`, with the memtables charged to it and capped at half of it."""

    def __init__(self, bytes_: int) -> None:
        self.bytes = bytes_
        self.cache = rocksdict.Cache(bytes_)
        self.memtables = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            bytes_ // 2, False, self.cache
        )

    def usage(self) -> int:
        """Bytes in use now (blocks cached and memtables charged)."""
        return int(self.cache.get_usage())


def _options(memory: RocksMemory | None = None) -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    opts.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    opts.set_max_background_jobs(2)
    opts.set_keep_log_file_num(2)
    if memory is not None:
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(memory.cache)
        # Index and filter blocks in the shared cache too (else each open file holds its own).
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(memory.memtables)
    return opts


def _is_corruption(exc: Exception) -> bool:
    """RocksDB's `Status::Corruption`, which rocksdict raises as a plain exception whose text
    starts with the status name."""
    return str(exc).startswith("Corruption")


class RocksKvStore:
    def __init__(
        self, path: Path, *, read_only: bool = False, memory: RocksMemory | None = None
    ) -> None:
        """`memory`: the server's shared RocksDB memory (None: RocksDB's per-database
        defaults, for tools and tests)."""
        self.path = path
        try:
            if not read_only:
                path.mkdir(parents=True, exist_ok=True)
            if read_only:
                db = rocksdict.Rdict(
                    str(path),
                    options=_options(memory),
                    access_type=rocksdict.AccessType.read_only(),
                )
            else:
                db = rocksdict.Rdict(str(path), options=_options(memory))
        except Exception as exc:  # rocksdict raises plain exceptions for corruption and locks
            if StorageUnavailableError.is_resource_error(exc):
                raise StorageUnavailableError(f"cannot open RocksDB at {path}: {exc}") from exc
            raise StoreCorruptionError(f"cannot open RocksDB at {path}: {exc}") from exc
        self._db: rocksdict.Rdict | None = db
        self._iterators: dict[int, rocksdict.RdictIter] = {}
        """The iterators of unfinished scans, the only references to them (see module doc)."""
        self._iterator_ids = itertools.count()
        self._write_opts = rocksdict.WriteOptions()
        # A property at runtime; rocksdict's stub declares it a method.
        self._write_opts.disable_wal = True  # type: ignore[method-assign,assignment]
        self.damage: str | None = None
        """Why the store is damaged, once a call found it so (it stays damaged)."""

    def _raise_classified(self, what: str, exc: Exception) -> NoReturn:
        """Re-raise a RocksDB failure: `StorageUnavailableError` for resource exhaustion,
        `StoreCorruptionError` (remembered in `damage`) for a failed checksum, else unchanged."""
        if isinstance(exc, (CorruptionError, UnavailableError)):
            raise exc
        if StorageUnavailableError.is_resource_error(exc):
            raise StorageUnavailableError(f"RocksDB at {self.path}: {what} failed: {exc}") from exc
        if _is_corruption(exc):
            self.damage = f"RocksDB at {self.path}: {what} failed: {exc}"
            raise StoreCorruptionError(self.damage) from exc
        raise exc

    @property
    def db(self) -> rocksdict.Rdict:
        db = self._db
        if db is None:
            raise UnavailableError(f"RocksDB at {self.path} is closed")
        return db

    def get(self, key: bytes) -> bytes | None:
        try:
            value = self.db.get(key)
        except Exception as exc:
            self._raise_classified("read", exc)
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        read_opts = rocksdict.ReadOptions()
        read_opts.set_iterate_upper_bound(end)
        it_id = next(self._iterator_ids)
        self._iterators[it_id] = self.db.iter(read_opts)
        try:
            self._iterators[it_id].seek(start)
            while True:
                it = self._iterators.get(it_id)
                if it is None:
                    raise UnavailableError(f"RocksDB at {self.path} closed during a scan")
                if not it.valid():
                    try:  # the end of the range, or a block that failed its checksum
                        it.status()
                    except Exception as exc:
                        self._raise_classified("scan", exc)
                    break
                item = it.key(), it.value()
                del it  # between items, the store holds the only reference
                yield item
                it = self._iterators.get(it_id)
                if it is not None:
                    it.next()
                del it
        finally:
            self._iterators.pop(it_id, None)

    def keys(self, start: bytes, end: bytes) -> list[bytes]:
        if start >= end:
            return []
        read_opts = rocksdict.ReadOptions()
        read_opts.set_iterate_upper_bound(end)
        try:
            found: list[bytes] = list(self.db.keys(from_key=start, read_opt=read_opts))  # type: ignore[arg-type]
            return found
        except Exception as exc:
            self._raise_classified("scan", exc)

    def new_batch(self) -> rocksdict.WriteBatch:
        return rocksdict.WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch) -> None:
        assert isinstance(batch, rocksdict.WriteBatch)
        try:
            self.db.write(batch, self._write_opts)
        except Exception as exc:
            self._raise_classified("write", exc)

    def estimate_num_keys(self) -> int:
        value = self.db.property_int_value("rocksdb.estimate-num-keys")
        return int(value or 0)

    def flush(self) -> None:
        try:
            self.db.flush()
        except Exception as exc:
            self._raise_classified("flush", exc)

    def compact(self) -> None:
        try:
            self.db.compact_range(None, None)
        except Exception as exc:
            self._raise_classified("compaction", exc)

    def create_checkpoint(self, dest: Path) -> None:
        try:
            rocksdict.Checkpoint(self.db).create_checkpoint(str(dest))
        except Exception as exc:
            self._raise_classified("checkpoint", exc)

    def live_file_names(self) -> list[str]:
        return sorted(str(f["name"]).lstrip("/") for f in self.db.live_files())

    def close(self) -> None:
        """Release the store and its LOCK. Idempotent. The memtable is flushed first; if that
        fails (a full disk) the store is released all the same and the error is raised: what
        was not flushed is in the range's log."""
        db, self._db = self._db, None
        if db is None:
            return
        self._iterators.clear()
        try:
            db.close()
        except Exception as exc:
            self._raise_classified("close", exc)
        finally:
            del db  # a traceback of the error must not keep the handle alive
