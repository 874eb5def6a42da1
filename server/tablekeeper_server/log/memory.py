"""An in-process log backend with the same contract as the local one, for tests.

"Durable" means held by the `MemoryLogBackend` object: records survive closing and reopening a
writer on the same backend, and are lost with the object. Fencing matches the local backend
within a process: opening a writer fences the earlier writer of the same log, which then raises
`LogFencedError` on every append; `delete` fences too. Truncation is exact (every record below
`before_sequence` goes) except that the last record is always kept, which is the most any
backend may delete, so callers cannot come to rely on coarse deletion.

`fail_next_append` injects an append failure, to test how callers handle `UnavailableError`.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tablekeeper_server.errors import LogFencedError, UnavailableError
from tablekeeper_server.log.api import LogBackend, LogFollower, LogRecord, LogWriter
from tablekeeper_server.log.follow import RereadingFollower


@dataclass(slots=True)
class _MemoryLog:
    records: list[LogRecord] = field(default_factory=list)
    last_sequence: int = 0
    writer: MemoryLogWriter | None = None
    fail_next: bool = False
    fail_persists: bool = False


class MemoryLogWriter:
    """The writer of one in-memory log. Same contract as `LocalLogWriter`."""

    def __init__(self, backend: MemoryLogBackend, log_name: str, last_sequence: int) -> None:
        self._backend = backend
        self._log_name = log_name
        self._last = last_sequence
        self._busy = False
        self._closed = False
        self._fenced = False
        self._broken: str | None = None

    @property
    def log_name(self) -> str:
        return self._log_name

    @property
    def last_sequence(self) -> int:
        """The sequence of the last record appended through the backend (see `LogWriter`)."""
        return self._last

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append `payloads` as consecutive records; return the last one's sequence.

        Yields to the event loop once before storing, like a real backend waiting for its sync.
        Raises like `LocalLogWriter.append`: `UnavailableError` when closed, after a failed or
        cancelled append, or for an injected failure; `LogFencedError` once fenced;
        `RuntimeError` for overlapping calls. An empty `payloads` returns `last_sequence`."""
        if self._busy:
            raise RuntimeError(f"log {self._log_name!r}: append calls must not overlap")
        self._check_usable()
        if not payloads:
            return self._last
        self._busy = True
        try:
            await asyncio.sleep(0)
            self._check_usable()
            self._last = self._backend._store(self, payloads)
            return self._last
        except asyncio.CancelledError:
            self._broken = "an append was cancelled while in flight"
            raise
        finally:
            self._busy = False

    async def close(self) -> None:
        """Release the log. Idempotent; a fenced writer's close does not affect the newer one."""
        self.close_sync()

    def close_sync(self) -> None:
        """`close` for callers outside the event loop."""
        if self._closed:
            return
        self._closed = True
        self._backend._release(self)

    def _check_usable(self) -> None:
        if self._closed:
            raise UnavailableError(f"log {self._log_name!r}: the writer is closed")
        if self._fenced:
            raise LogFencedError(
                f"log {self._log_name!r}: fenced, another writer opened (or deleted) the log"
            )
        if self._broken is not None:
            raise UnavailableError(
                f"log {self._log_name!r}: the writer is unusable after an earlier failure "
                f"({self._broken}); reopen the log"
            )


class MemoryLogBackend:
    """Named in-memory logs. Thread-safe; `read` iterates over a snapshot taken at its first
    `next()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, _MemoryLog] = {}

    def open_writer(
        self,
        log_name: str,
        *,
        min_last_sequence: int = 0,
        on_record: Callable[[LogRecord], object] | None = None,
    ) -> MemoryLogWriter:
        """Open `log_name` (creating it), fencing its earlier writer. `min_last_sequence` raises
        the numbering as in `LogBackend`; held records stay (an open reads none: `on_record` is
        never called)."""
        if min_last_sequence < 0:
            raise ValueError(f"min_last_sequence must be >= 0, got {min_last_sequence}")
        with self._lock:
            log = self._logs.setdefault(log_name, _MemoryLog())
            if log.writer is not None:
                log.writer._fenced = True
            log.last_sequence = max(log.last_sequence, min_last_sequence)
            log.writer = MemoryLogWriter(self, log_name, log.last_sequence)
            return log.writer

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        """Yield the records with sequence >= `from_sequence` (see `LogBackend.read`)."""
        return self._read(log_name, from_sequence)

    def _read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        with self._lock:
            log = self._logs.get(log_name)
            if log is None:
                return
            start = bisect.bisect_left(log.records, from_sequence, key=_sequence_of)
            snapshot = log.records[start:]
        yield from snapshot

    def follow(self, log_name: str, from_sequence: int) -> LogFollower:
        """See `LogBackend.follow`: each poll reads again from the next record due."""
        return RereadingFollower(self, log_name, from_sequence)

    def truncate(self, log_name: str, before_sequence: int) -> None:
        """Drop the records below `before_sequence`, keeping at least the last record."""
        with self._lock:
            log = self._logs.get(log_name)
            if log is None or not log.records:
                return
            cut = bisect.bisect_left(log.records, before_sequence, key=_sequence_of)
            del log.records[: min(cut, len(log.records) - 1)]

    def mark_recovery_start(self, log_name: str, from_sequence: int) -> None:
        """Nothing to do: an open reads no records."""

    def size_bytes(self, log_name: str) -> int:
        with self._lock:
            log = self._logs.get(log_name)
            return sum(len(r.payload) for r in log.records) if log else 0

    def delete(self, log_name: str) -> None:
        """Remove the log and fence its writer. A no-op if the log does not exist."""
        with self._lock:
            log = self._logs.pop(log_name, None)
            if log is not None and log.writer is not None:
                log.writer._fenced = True

    def fail_next_append(self, log_name: str, *, persist: bool = False) -> None:
        """Make the next append to `log_name` raise `UnavailableError` (the writer then refuses
        further appends, as after a real I/O error). With `persist=True` its records are stored
        anyway, the "may or may not be durable" case a reopened writer must cope with."""
        with self._lock:
            log = self._logs.setdefault(log_name, _MemoryLog())
            log.fail_next = True
            log.fail_persists = persist

    def _store(self, writer: MemoryLogWriter, payloads: Sequence[bytes]) -> int:
        with self._lock:
            log = self._logs.get(writer.log_name)
            if log is None or log.writer is not writer:
                writer._fenced = True
                writer._check_usable()
                raise AssertionError("unreachable")
            first = log.last_sequence + 1
            failing, log.fail_next = log.fail_next, False
            if not failing or log.fail_persists:
                log.records.extend(
                    LogRecord(sequence, bytes(payload))
                    for sequence, payload in enumerate(payloads, start=first)
                )
                log.last_sequence = first + len(payloads) - 1
            if failing:
                writer._broken = "injected append failure"
                raise UnavailableError(
                    f"log {writer.log_name!r}: injected failure appending sequences "
                    f"{first}..{first + len(payloads) - 1}"
                )
            return log.last_sequence

    def _release(self, writer: MemoryLogWriter) -> None:
        with self._lock:
            log = self._logs.get(writer.log_name)
            if log is not None and log.writer is writer:
                log.writer = None


def _sequence_of(record: LogRecord) -> int:
    return record.sequence


if TYPE_CHECKING:

    def _implements_the_interface(
        backend: MemoryLogBackend, writer: MemoryLogWriter
    ) -> tuple[LogBackend, LogWriter]:
        return backend, writer
