"""A checkpoint store that holds back deletions of pinned objects (a backup copying them).

A checkpoint's garbage collection deletes manifests beyond the newest `--checkpoints-kept` and
the objects no kept manifest names. A backup streams one checkpoint's objects for as long as the
copy takes, while the range goes on checkpointing (every `--checkpoint-records` commands): a
busy range could collect the very objects being copied. Pinning them makes `delete` of those
names a no-op until they are unpinned; the range's next garbage collection after that deletes
whatever is still unreferenced (an unpin deletes nothing itself: a newer checkpoint may have
referenced the same content-addressed object again meanwhile).

Everything else passes through unchanged. Thread-safe: checkpoints delete from worker threads
while backups pin and unpin on the event loop.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tablekeeper_server.checkpoint.api import CheckpointStore


class PinningCheckpointStore:
    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._pins: Counter[str] = Counter()
        self.deletes_held = 0
        """Deletions skipped because the object was pinned (since start)."""

    @contextmanager
    def pinned(self, names: Iterable[str]) -> Iterator[None]:
        """Hold back deletions of `names` inside the block (pins nest and count)."""
        held = list(dict.fromkeys(names))
        with self._lock:
            self._pins.update(held)
        try:
            yield
        finally:
            with self._lock:
                self._pins.subtract(held)
                for name in held:
                    if self._pins[name] <= 0:
                        del self._pins[name]

    def is_pinned(self, name: str) -> bool:
        with self._lock:
            return self._pins[name] > 0

    # ------------------------------------------------------------------ CheckpointStore

    def put_file(self, name: str, source: Path) -> int:
        return self.store.put_file(name, source)

    def put_bytes(self, name: str, data: bytes) -> None:
        self.store.put_bytes(name, data)

    def get_file(self, name: str, dest: Path) -> None:
        self.store.get_file(name, dest)

    def get_bytes(self, name: str) -> bytes:
        return self.store.get_bytes(name)

    def exists(self, name: str) -> bool:
        return self.store.exists(name)

    def sha256(self, name: str) -> str:
        return self.store.sha256(name)

    def list(self, prefix: str) -> list[str]:
        return self.store.list(prefix)

    def delete(self, name: str) -> None:
        with self._lock:
            if self._pins[name] > 0:
                self.deletes_held += 1
                return
            # Deleted under the lock: a pin taken meanwhile must not see its object vanish.
            self.store.delete(name)

    def describe(self) -> str:
        return self.store.describe()
