"""The write-ahead log interface every backend implements (`local`, `memory`, `pulsar`).

A log is a named, append-only sequence of records. Each record has a *sequence number*: sequence
numbers start at 1 in a new log, grow by exactly one per record, and are never reused, even after
truncation. A range uses the sequence number of a command's record as that command's revision, so
the numbering must be the same on every replay.

Only one writer may own a log at a time. Opening a writer fences any earlier writer of the same log
(the local backend holds an exclusive file lock; a shared-log backend uses exclusive producers and
an epoch). A fenced writer raises `LogFencedError` on every later append.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record as read back from a log."""

    sequence: int
    """The record's position in the log: 1 for the first record ever written."""
    payload: bytes
    """The bytes given to `LogWriter.append`, unchanged."""


@dataclass(frozen=True, slots=True)
class FollowedRecords:
    """What one `LogFollower.poll` read."""

    records: list[LogRecord]
    """The next records, in order, continuing the previous poll's."""
    at_end: bool
    """The log held nothing after these records when the poll last checked, a check made after
    the poll began: every record durable before the poll began is in `records` or earlier."""


class LogFollower(Protocol):
    """Reads a log as its writer (in this process or another) appends to it: a follower's tail.
    One thread at a time; every method blocks."""

    def poll(self, max_records: int) -> FollowedRecords:
        """The next records (at most `max_records`), without waiting for new ones. After a gap
        (records truncated before they were read) the first record is past the one due: the
        caller notices from its sequence. Raises `UnavailableError` when the backend cannot be
        read now (the log deleted, the backend unreachable): poll again later, or give up."""
        ...

    def close(self) -> None: ...


class LogWriter(Protocol):
    """The single writer of one log. Owned by one range; only that range's writer task calls it."""

    @property
    def last_sequence(self) -> int:
        """The sequence number of the last durable record; 0 if the log has never had one."""
        ...

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append `payloads` as consecutive records and return the sequence of the last one.

        Returns only once every record is durable (fsynced, or acknowledged by the replicated
        log); that is what lets the caller acknowledge the commands in them. The first record gets
        `last_sequence + 1`. Calls must not overlap: the caller awaits one append before the next.
        The payload bytes are copied or written before return; the caller keeps ownership.

        Raises `LogFencedError` once another writer has opened the log (every later append fails
        too), and `UnavailableError` when the backend cannot persist now; in that case the records
        may or may not have been persisted, and the writer must be reopened before further use.
        """
        ...

    async def close(self) -> None:
        """Release the log. Durable records stay; pending nothing (appends are synchronous)."""
        ...

    def close_sync(self) -> None:
        """`close` for callers outside the event loop (blocking; e.g. a range's recovery)."""
        ...


class LogBackend(Protocol):
    """Opens, reads and truncates named logs. Chosen once, in `main`, from configuration."""

    def open_writer(
        self,
        log_name: str,
        *,
        min_last_sequence: int = 0,
        on_record: Callable[[LogRecord], object] | None = None,
    ) -> LogWriter:
        """Open `log_name` (creating it if absent) for writing, fencing any earlier writer.

        Recovers the log first: a torn record at the very end (a crash during an append) is cut
        off; a damaged record followed by valid ones raises `CorruptionError` with a message that
        names the log and the position, because dropping it would silently lose data.
        `min_last_sequence` raises the starting point when the caller knows of a later sequence
        than the log still holds (after truncation). Blocking: call it from a worker thread.

        `on_record`: called on the opening thread with each record the recovery reads, in
        order, as soon as it knows the record is in the log for good (the earlier writer is
        already fenced), so a caller can apply the tail while the open goes on. Passing it says
        the caller's store was restored from the newest checkpoint: a backend that keeps where
        that checkpoint's records end (`mark_recovery_start`) starts its recovery there. A
        backend whose open reads no remote records may never call it; `read` yields them all
        after the open.
        """
        ...

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        """Yield the durable records with sequence >= `from_sequence`, in order.

        Records before the log's truncation point are gone; the iterator starts at the first one
        still held. Raises `CorruptionError` on a damaged record that is not the torn tail.
        Blocking: call it from a worker thread.
        """
        ...

    def follow(self, log_name: str, from_sequence: int) -> LogFollower:
        """A reader of `log_name` from `from_sequence` on that goes on reading what is appended
        later (by a writer here or in another process). Blocking: call it from a worker thread.
        """
        ...

    def truncate(self, log_name: str, before_sequence: int) -> None:
        """Allow the backend to delete records with sequence < `before_sequence`.

        Deletion may be coarse (whole segments) and lazy; records at or after `before_sequence`
        are always kept, and so is the last record, so `last_sequence` survives a restart.
        """
        ...

    def mark_recovery_start(self, log_name: str, from_sequence: int) -> None:
        """Records before `from_sequence` are in the newest checkpoint: the next writer to open
        the log may begin its recovery read there instead of at the truncation point (which
        stays before the oldest kept checkpoint, for a restore that falls back to it). A hint:
        a backend whose recovery reads little anyway may ignore it. Blocking."""
        ...

    def delete(self, log_name: str) -> None:
        """Remove the whole log. Used when a table is deleted."""
        ...

    def size_bytes(self, log_name: str) -> int:
        """Bytes the log holds now (for metrics and status); 0 if it does not exist."""
        ...
