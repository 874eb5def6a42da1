"""The RocksDB `KvStore`, through `rocksdict`.

RocksDB's own WAL is disabled: the range's log is the source of truth and each write batch carries
the log position it reflects, so after a crash the range replays the log from the position that
RocksDB still has. LZ4 compression and a modest write buffer keep many ranges per process cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import rocksdict

from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.storage.api import WriteBatch

_WRITE_BUFFER_BYTES = 16 * 1024 * 1024


def _options() -> rocksdict.Options:
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    opts.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    opts.set_max_background_jobs(2)
    opts.set_keep_log_file_num(2)
    return opts


class RocksKvStore:
    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        if not read_only:
            path.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            if read_only:
                self._db = rocksdict.Rdict(
                    str(path), options=_options(), access_type=rocksdict.AccessType.read_only()
                )
            else:
                self._db = rocksdict.Rdict(str(path), options=_options())
        except Exception as exc:  # rocksdict raises plain exceptions for corruption and locks
            raise CorruptionError(f"cannot open RocksDB at {path}: {exc}") from exc
        self._write_opts = rocksdict.WriteOptions()
        # A property at runtime; rocksdict's stub declares it a method.
        self._write_opts.disable_wal = True  # type: ignore[method-assign,assignment]

    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        read_opts = rocksdict.ReadOptions()
        read_opts.set_iterate_upper_bound(end)
        it = self._db.iter(read_opts)
        it.seek(start)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    def new_batch(self) -> rocksdict.WriteBatch:
        return rocksdict.WriteBatch(raw_mode=True)

    def write(self, batch: WriteBatch) -> None:
        assert isinstance(batch, rocksdict.WriteBatch)
        self._db.write(batch, self._write_opts)

    def estimate_num_keys(self) -> int:
        value = self._db.property_int_value("rocksdb.estimate-num-keys")
        return int(value or 0)

    def flush(self) -> None:
        self._db.flush()

    def create_checkpoint(self, dest: Path) -> None:
        rocksdict.Checkpoint(self._db).create_checkpoint(str(dest))

    def live_file_names(self) -> list[str]:
        return sorted(str(f["name"]).lstrip("/") for f in self._db.live_files())

    def close(self) -> None:
        self._db.close()
