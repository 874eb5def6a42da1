"""An in-memory `KvStore` for unit tests and simulations."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path

from tablekeeper_server.storage.api import WriteBatch


class MemoryWriteBatch:
    def __init__(self) -> None:
        self.ops: list[tuple[str, bytes, bytes]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.ops.append(("put", key, value))

    def delete(self, key: bytes) -> None:
        self.ops.append(("del", key, b""))

    def delete_range(self, start: bytes, end: bytes) -> None:
        self.ops.append(("delrange", start, end))


class MemoryKvStore:
    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []
        self.closed = False
        self.damage: str | None = None

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        lo = bisect.bisect_left(self._keys, start)
        hi = bisect.bisect_left(self._keys, end)
        snapshot = [(k, self._data[k]) for k in self._keys[lo:hi]]
        yield from snapshot

    def keys(self, start: bytes, end: bytes) -> list[bytes]:
        lo = bisect.bisect_left(self._keys, start)
        hi = bisect.bisect_left(self._keys, end)
        return self._keys[lo:hi]

    def new_batch(self) -> MemoryWriteBatch:
        return MemoryWriteBatch()

    def write(self, batch: WriteBatch) -> None:
        assert isinstance(batch, MemoryWriteBatch)
        for op, a, b in batch.ops:
            if op == "put":
                if a not in self._data:
                    bisect.insort(self._keys, a)
                self._data[a] = b
            elif op == "del":
                if a in self._data:
                    del self._data[a]
                    self._keys.pop(bisect.bisect_left(self._keys, a))
            else:
                lo = bisect.bisect_left(self._keys, a)
                hi = bisect.bisect_left(self._keys, b)
                for k in self._keys[lo:hi]:
                    del self._data[k]
                del self._keys[lo:hi]

    def estimate_num_keys(self) -> int:
        return len(self._keys)

    def flush(self) -> None:
        pass

    def compact(self) -> None:
        pass  # holds live keys only: nothing to drop

    def create_checkpoint(self, dest: Path) -> None:
        raise RuntimeError("the in-memory store has no checkpoints; use RocksKvStore")

    def live_file_names(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True
