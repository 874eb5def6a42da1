"""The local write-ahead log: segment files on this machine's disk.

Layout: each log is a directory `root_dir/<log_name>/` holding

* segment files `<first sequence, 20 digits>.wal` (format in `codec.py`), each starting with a
  header and holding consecutive records; the file name is the sequence of the segment's first
  record, so a segment's records are all below the next segment's name;
* `LOCK`, which the single writer holds with `flock(LOCK_EX | LOCK_NB)` (it also holds the
  writer's pid, for error messages only);
* `TAIL`, the tail marker: the first sequence of the newest segment, replaced atomically (write,
  fsync, rename, fsync the directory) each time a segment is created, after the segment is
  durable and before any record goes into it. Only segment creation writes it, so appends pay
  nothing for it. A log whose newest segment file is older than the marker lost its tail: that
  is refused like any other missing segment.

Writers and fencing: within one process, opening a writer fences the earlier writer of the same
log (even one opened through another `LocalLogBackend` on the same directory): the earlier one
finishes an append already in flight, releases the log, and raises `LogFencedError` on every
later append. A log whose `LOCK` is held by *another process* cannot be taken over:
`open_writer` (and `delete`) fail at once with `LogLockedError`, an `UnavailableError`.

Durability: `append` returns after one `write` and one `fdatasync` of the group (the sync
function is injectable). New segment files are synced and their directory is synced before
records are written to them; a deleted segment or log is gone once its directory is synced.

Preallocation: the writer reserves the segment's space ahead of its appends,
`preallocate_bytes` at a time (`posix_fallocate`, which reads back as zeros), and writes each
group into that space. An append then leaves the file's size alone, so its `fdatasync` has no
metadata to commit with the data (on ext4, no journal commit for the size); only the append
that extends the reservation pays for it, once per `preallocate_bytes`. What is acknowledged
is unchanged: the group is synced before `append` returns. The records of a segment therefore
end in a zero tail (see `codec.py`: zeros after the last record are a clean end). A segment is
cut back to its records (and synced) before the next one is created, so only the last segment
has one; and a build that predates preallocation recovers such a log as one with a torn tail
(it cuts the zeros off). A file system that cannot reserve space (`EOPNOTSUPP`) just appends.

Where an append runs: while the log's recent syncs are fast (below the backend's
`inline_below_s`; the server sets `INLINE_BELOW_S` on Envoy, whose own threads do the network
I/O), on the caller's thread — the event loop's: it waits for the sync as it would wait for the
hand-off (the sync releases the GIL, so the runtime's threads go on), and the two thread
hand-offs a group otherwise takes cost more than the sync holds the loop on a disk whose sync
takes a fraction of a millisecond (a group that starts a new segment creates it there too, a
few more syncs once per segment). A log whose
syncs have been slower, and every log of a backend made without `inline_below_s`, appends on
one thread per backend (`_AppendThread`), not the event loop's executor: the groups of all logs
that are waiting when it wakes are written and synced one after the other, and answered with one
call into each waiting loop. A hop to a pool thread and back costs this
machine's server ~100-250 µs of CPU per group (thread and loop wake-ups, GIL hand-offs);
sharing one wake-up among the ranges that append at the same time is what the thread is for.
Syncs of different logs no longer overlap, which costs latency only on disks whose sync is
slow; a log's own group commit is unchanged.

Recovery (`open_writer`): every segment is read and checked, in order. A zero tail of the last
segment is where its records end (the writer appends there); a torn tail of the last
segment (the group of a crashed append) is cut off with `ftruncate` + sync; any other damage,
a missing segment (first, between two others, or the last one, which the tail marker names), or
a damaged non-last segment raises `CorruptionError` naming the log, file and byte offset.

Resource errors (no space, quota, descriptors; see `StorageUnavailableError`) raise
`StorageUnavailableError`. An append that fails that way after writing part of its group cuts
the segment back to where the group began and syncs that; only if that fails too may the group
be durable (`maybe_persisted`). The cost is a read of the whole retained log, so callers
should `truncate` what their checkpoints cover.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import queue
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.errors import (
    CorruptionError,
    LogFencedError,
    StorageUnavailableError,
    UnavailableError,
)
from tablekeeper_server.log.api import LogBackend, LogFollower, LogRecord, LogWriter
from tablekeeper_server.log.codec import (
    SEGMENT_FLAG_GAP,
    SEGMENT_HEADER_SIZE,
    RecordDecoder,
    decode_segment_header,
    encode_batch,
    encode_segment_header,
    is_torn_segment_header,
)
from tablekeeper_server.log.follow import RereadingFollower

_log = logging.getLogger(__name__)

MiB: Final = 1 << 20
DEFAULT_SEGMENT_BYTES_MAX: Final = 64 * MiB
DEFAULT_PREALLOCATE_BYTES: Final = 1 * MiB
"""How far ahead of its appends a segment's space is reserved: an append extends the file (a
metadata commit in its sync) once per this many bytes. Every open log holds up to this much
reserved disk beyond its records."""
_NO_PREALLOCATION_ERRNOS: Final = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL, errno.ENODEV}
)
SEGMENT_SUFFIX: Final = ".wal"
LOCK_FILE_NAME: Final = "LOCK"
TAIL_FILE_NAME: Final = "TAIL"
_TAIL_TEMP_NAME: Final = "TAIL.tmp"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")
_TOMBSTONE_PREFIX: Final = ".deleted-"
_MAX_LOG_NAME_BYTES: Final = 200

SyncFunction = Callable[[int], None]
"""Makes a file's written data durable, given its descriptor; raises `OSError` on failure."""


def _default_sync(fd: int) -> None:
    # fdatasync also persists the file size, which is all an append changes besides data.
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


class LogLockedError(UnavailableError):
    """Another process holds the log's LOCK file, so this process cannot write or delete it.

    Retryable: it succeeds once that process has closed the log or exited."""


def segment_file_name(first_sequence: int) -> str:
    """The file name of the segment whose first record is `first_sequence`."""
    return f"{first_sequence:020d}{SEGMENT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class _Segment:
    first_sequence: int
    path: Path


class _Slot:
    """Per log directory, process-wide: serializes open/delete and knows the current writer."""

    __slots__ = ("lock", "writer")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writer: LocalLogWriter | None = None


_slots_lock = threading.Lock()
_slots: dict[str, _Slot] = {}


def _slot_for(log_dir: Path) -> _Slot:
    key = os.path.realpath(log_dir)
    with _slots_lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _slots[key] = _Slot()
        return slot


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _list_segments(log_dir: Path) -> list[_Segment]:
    """The log's segments ordered by first sequence; [] when the directory does not exist."""
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    segments = []
    for name in names:
        match = _SEGMENT_NAME.match(name)
        if match:
            segments.append(_Segment(int(match.group(1)), log_dir / name))
    segments.sort(key=lambda segment: segment.first_sequence)
    return segments


def _read_tail_marker(log_dir: Path, log_name: str) -> int | None:
    """The first sequence of the newest segment as the tail marker records it; None if the log
    has no marker (new, or written before markers existed)."""
    path = log_dir / TAIL_FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit():
        raise CorruptionError(f"log {log_name!r}: tail marker {path} is damaged ({raw[:40]!r})")
    return int(text)


def _write_tail_marker(log_dir: Path, first_sequence: int) -> None:
    """Durably record that the newest segment starts at `first_sequence` (atomic replace)."""
    temp = log_dir / _TAIL_TEMP_NAME
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        data = f"{first_sequence:020d}\n".encode("ascii")
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, f"short write of {temp}")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, log_dir / TAIL_FILE_NAME)
    _fsync_dir(log_dir)


def _check_tail(log_name: str, log_dir: Path, marker: int | None, segments: list[_Segment]) -> None:
    """Refuse a log whose newest segment is older than its tail marker says."""
    newest = segments[-1].first_sequence if segments else None
    if marker is None or (newest is not None and newest >= marker):
        return
    found = f"the newest segment found is {segments[-1].path.name}" if segments else "none is"
    raise CorruptionError(
        f"log {log_name!r}: segment {log_dir / segment_file_name(marker)} is missing: the tail "
        f"marker {log_dir / TAIL_FILE_NAME} says the newest segment starts at sequence {marker}, "
        f"but {found}; records are missing (the log's tail was lost)"
    )


def _storage_error(what: str, exc: OSError, *, maybe_persisted: bool = False) -> UnavailableError:
    """The retryable error for an `OSError`: `StorageUnavailableError` for resource exhaustion."""
    if StorageUnavailableError.is_resource_error(exc):
        return StorageUnavailableError(f"{what}: {exc}", maybe_persisted=maybe_persisted)
    return UnavailableError(f"{what}: {exc}")


def _lock_log(log_dir: Path, log_name: str) -> int:
    """Take the log's LOCK without blocking; return its descriptor. Raises `LogLockedError`."""
    fd = os.open(log_dir / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError):
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LogLockedError(
                f"log {log_name!r} is locked by another process"
                + (f" (pid {holder})" if holder else "")
                + f": {log_dir / LOCK_FILE_NAME}"
            ) from exc
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except OSError:
        os.close(fd)
        raise
    return fd


_T = TypeVar("_T")
_Outcome = tuple["asyncio.Future[Any]", bool, Any]
"""A job's future, whether it returned, and what it returned or raised."""
INLINE_BELOW_S: Final = 0.001
"""The server's `inline_below_s`: a log appends on the caller's thread while its syncs average
below a millisecond (the longest it then holds the event loop, as a rule)."""
_SYNC_AVERAGE_WEIGHT: Final = 0.125
"""How much one sync moves a log's moving average of sync times."""
_APPEND_THREAD_IDLE_EXIT_S: Final = 30.0
"""An append thread with nothing to do for this long ends (the next append starts another)."""


class _AppendThread:
    """Runs blocking appends for the writers of one backend and answers each in its loop.

    `submit` queues a job and returns at once; the thread takes every queued job when it
    wakes, runs them in order and then, for each event loop that submitted some, makes one
    `call_soon_threadsafe` that resolves their futures. A future whose caller gave up
    (cancelled) is left alone; a loop that has closed meanwhile is skipped.

    The jobs travel through a `queue.SimpleQueue` (its `put` and blocking `get` are C code):
    handing a group over is one `put`, with no Python-level condition variable to notify
    (whose waiter bookkeeping the event loop's thread ran for every group). `_lock` only
    orders a `submit` against the thread's decision to end when idle, so that no job is
    left queued without a thread to run it.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]
        ] = queue.SimpleQueue()
        self._running = False

    def submit(self, job: Callable[[], _T]) -> asyncio.Future[_T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        with self._lock:
            self._jobs.put((job, loop, future))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self._name, daemon=True).start()
        return future

    def _run(self) -> None:
        jobs_queue = self._jobs
        while True:
            try:
                jobs = [jobs_queue.get(timeout=_APPEND_THREAD_IDLE_EXIT_S)]
            except queue.Empty:
                with self._lock:
                    if jobs_queue.empty():  # (a submit puts and checks under the lock)
                        self._running = False
                        return
                continue
            while True:  # and every job queued meanwhile
                try:
                    jobs.append(jobs_queue.get_nowait())
                except queue.Empty:
                    break
            outcomes: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
            for job, loop, future in jobs:
                try:
                    outcome: _Outcome = (future, True, job())
                except BaseException as exc:  # answered to the caller, whatever it is
                    outcome = (future, False, exc)
                outcomes.setdefault(loop, []).append(outcome)
            for loop, answered in outcomes.items():
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                    loop.call_soon_threadsafe(_resolve, answered)


def _resolve(outcomes: list[_Outcome]) -> None:
    for future, ok, value in outcomes:
        if future.done():  # its caller was cancelled
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class LocalLogWriter:
    """The writer of one local log. Create it with `LocalLogBackend.open_writer`.

    `append` must be awaited from one task at a time (the owning range's writer task);
    `last_sequence` may be read from any thread. Internally a lock serializes the write/sync of
    an append with fencing and closing, so fencing never interleaves with a group being written.
    """

    def __init__(
        self,
        *,
        log_name: str,
        log_dir: Path,
        lock_fd: int,
        segment_fd: int,
        segment_first: int,
        segment_size: int,
        segment_records: int,
        last_sequence: int,
        segment_bytes_max: int,
        sync: SyncFunction,
        slot: _Slot,
        appender: _AppendThread,
        inline_below_s: float = 0.0,
        failpoints: Failpoints = NO_FAILPOINTS,
        allocated: int | None = None,
        preallocate_bytes: int = 0,
    ) -> None:
        self._log_name = log_name
        self._dir = log_dir
        self._lock_fd: int | None = lock_fd
        self._fd: int | None = segment_fd
        self._segment_first = segment_first
        self._segment_size = segment_size
        """Bytes of the current segment holding its header and records: where the next group
        goes."""
        self._allocated = segment_size if allocated is None else max(allocated, segment_size)
        """The current segment file's size: its records, then a zero tail up to here."""
        self._preallocate_bytes = preallocate_bytes
        self._segment_records = segment_records
        self._last = last_sequence
        self._segment_bytes_max = segment_bytes_max
        self._sync = sync
        self._slot = slot
        self._appender = appender
        self._inline_below_s = inline_below_s
        self._failpoints = failpoints
        self._sync_s = 0.0
        """A moving average of this writer's append syncs, in seconds."""
        self._io_lock = threading.Lock()
        self._busy = False
        self._closed = False
        self._fenced = False
        self._broken: str | None = None

    @property
    def log_name(self) -> str:
        return self._log_name

    @property
    def last_sequence(self) -> int:
        """The sequence of the last durable record (or the `min_last_sequence` it was opened with
        when that is higher); 0 for a log that never had a record."""
        return self._last

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append `payloads` as one group and return the last one's sequence (see `LogWriter`).

        The group is encoded, written with one `write` and made durable with one sync: on the
        caller's thread while this log's syncs average below the backend's `inline_below_s`,
        else on the backend's append thread, so the event loop keeps running meanwhile. On
        return every record is durable. An empty `payloads` writes nothing and returns
        `last_sequence`.

        Raises `LogFencedError` after another writer opened the log, `UnavailableError` after
        `close`, after any earlier failed or cancelled append (the writer is then unusable and
        must be reopened: a partly written group must not be followed by new records), and for
        an `OSError` while writing or syncing. If the awaiting task is cancelled, the write
        completes or fails in the background and the writer refuses further appends.
        `ValueError` for a payload over 4 GiB - 1 (nothing written; the writer stays usable).
        `RuntimeError` if called while another append is in flight.
        """
        if self._busy:
            raise RuntimeError(f"log {self._log_name!r}: append calls must not overlap")
        self._check_usable()
        if not payloads:
            return self._last
        self._busy = True
        try:
            if self._sync_s < self._inline_below_s:
                return self._append_sync(payloads)
            return await self._appender.submit(lambda: self._append_sync(payloads))
        except asyncio.CancelledError:
            self._broken = "an append was cancelled while in flight"
            raise
        finally:
            self._busy = False

    async def close(self) -> None:
        """Release the log (its LOCK and files). Waits for an in-flight write. Idempotent.

        Durable records stay. A fenced writer's close does not touch the newer writer."""
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """`close` for callers outside the event loop (blocking)."""
        with self._io_lock:
            if self._closed:
                return
            self._closed = True
            self._release()
        with self._slot.lock:
            if self._slot.writer is self:
                self._slot.writer = None

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

    def _append_sync(self, payloads: Sequence[bytes]) -> int:
        with self._io_lock:
            self._check_usable()
            first = self._last + 1
            data = encode_batch(first, payloads)
            last = first + len(payloads) - 1
            fd: int | None = None
            written = 0
            try:
                if (
                    self._segment_records > 0
                    and self._segment_size + len(data) > self._segment_bytes_max
                ):
                    self._roll(first, flags=0)
                fd = self._fd
                assert fd is not None
                offset = self._segment_size
                if offset + len(data) > self._allocated and self._preallocate_bytes:
                    self._reserve(fd, offset + len(data))
                view = memoryview(data)
                while written < len(data):
                    count = os.pwrite(fd, view[written:], offset + written)
                    if count <= 0:
                        raise OSError(errno.EIO, "write returned 0")
                    written += count
                started = time.perf_counter()
                self._failpoints.hit("wal.sync")  # a slow disk, in robustness tests
                self._sync(fd)
                took = time.perf_counter() - started
                self._sync_s += (took - self._sync_s) * _SYNC_AVERAGE_WEIGHT
            except BaseException as exc:
                self._broken = f"append of sequences {first}..{last} failed: {exc!r}"
                if isinstance(exc, OSError):
                    # Out of a resource: cut the group back out, so its callers may retry.
                    # (Other errors leave the file alone: recovery decides what is there.)
                    maybe_persisted = written > 0 and not (
                        fd is not None
                        and StorageUnavailableError.is_resource_error(exc)
                        and self._undo(fd)
                    )
                    outcome = (
                        "they may or may not be durable"
                        if maybe_persisted
                        else "none of them is in the log"
                    )
                    raise _storage_error(
                        f"log {self._log_name!r}: append of sequences {first}..{last} failed; "
                        + outcome,
                        exc,
                        maybe_persisted=maybe_persisted,
                    ) from exc
                raise
            self._segment_size += len(data)
            self._allocated = max(self._allocated, self._segment_size)
            self._segment_records += len(payloads)
            self._last = last
            return last

    def _reserve(self, fd: int, end: int) -> None:
        """Reserve the current segment's space up to at least `end`, `preallocate_bytes` ahead
        (not past `segment_bytes_max` unless `end` is). The sync of the append that follows
        makes the new size durable together with the group."""
        target = max(end, min(end + self._preallocate_bytes, self._segment_bytes_max))
        try:
            os.posix_fallocate(fd, self._allocated, target - self._allocated)
        except OSError as exc:
            if exc.errno not in _NO_PREALLOCATION_ERRNOS:
                raise
            _log.info(
                "log %r: the file system cannot reserve space (%s); appending without",
                self._log_name,
                exc,
            )
            self._preallocate_bytes = 0
            return
        self._allocated = target

    def _undo(self, fd: int) -> bool:
        """Cut the current segment back to its size before the failed append and sync it;
        whether that worked (then none of the group's bytes can be in the log)."""
        try:
            os.ftruncate(fd, self._segment_size)
            self._allocated = self._segment_size
            self._sync(fd)
        except OSError as exc:
            _log.error("log %r: cannot cut back a failed append: %s", self._log_name, exc)
            return False
        return True

    def _roll(self, first_sequence: int, *, flags: int) -> None:
        """Start a new segment at `first_sequence`: cut the current one back to its records
        (synced: only the last segment may end in zeros), create the new one, write its header,
        sync it and the dir, then move the tail marker to it."""
        if self._fd is not None and self._allocated > self._segment_size:
            os.ftruncate(self._fd, self._segment_size)
            self._sync(self._fd)
            self._allocated = self._segment_size
        path = self._dir / segment_file_name(first_sequence)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        header = encode_segment_header(first_sequence, flags=flags)
        try:
            if os.write(fd, header) != len(header):
                raise OSError(errno.EIO, f"short write of the header of {path}")
            self._sync(fd)
            _fsync_dir(self._dir)
        except BaseException:
            os.close(fd)
            # No marker names it yet: remove it, so the writer's next owner finds the log as
            # it was (a leftover would be an empty, or torn, last segment: recovered too).
            with contextlib.suppress(OSError):
                path.unlink()
                _fsync_dir(self._dir)
            raise
        try:
            _write_tail_marker(self._dir, first_sequence)
        except BaseException:
            os.close(fd)  # the empty segment stays: the marker may already name it
            raise
        old = self._fd
        self._fd = fd
        self._segment_first = first_sequence
        self._segment_size = len(header)
        self._allocated = len(header)
        self._segment_records = 0
        if old is not None:
            os.close(old)

    def _fence(self) -> None:
        """Called by the backend when a newer writer takes over (or the log is deleted)."""
        with self._io_lock:
            if self._closed or self._fenced:
                return
            self._fenced = True
            self._release()

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        lock_fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock_fd)  # releases the flock


class LocalLogBackend:
    """Logs stored as directories of segment files under `root_dir`.

    All methods block (call them from a worker thread) and are thread-safe. `read` and
    `truncate` need no lock and may run while a writer appends. Log names must be usable as a
    single directory name: non-empty, at most 200 UTF-8 bytes, no '/' or NUL, not starting with
    '.'; others raise `ValueError`. `OSError`s are reported as `UnavailableError`.
    """

    def __init__(
        self,
        root_dir: Path,
        *,
        segment_bytes_max: int = DEFAULT_SEGMENT_BYTES_MAX,
        sync: SyncFunction | None = None,
        failpoints: Failpoints = NO_FAILPOINTS,
        inline_below_s: float = 0.0,
        preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES,
    ) -> None:
        """`sync` replaces `os.fdatasync` for segment files (tests count or fail syncs with it);
        directories are always synced with `os.fsync`. `failpoints` lets crash tests stop the
        process between two segment deletions (`wal.truncate.after_segment_delete`), and
        robustness tests slow each append's sync down (`wal.sync`).
        `inline_below_s`: a log appends on the caller's thread while its syncs average below
        this many seconds (see the module docstring); 0, always on the append thread.
        `preallocate_bytes`: how far ahead of the appends a segment's space is reserved; 0
        appends without reserving (each append's sync then also commits the new size)."""
        self._failpoints = failpoints
        if segment_bytes_max <= SEGMENT_HEADER_SIZE:
            raise ValueError(f"segment_bytes_max must exceed {SEGMENT_HEADER_SIZE}")
        if preallocate_bytes < 0:
            raise ValueError(f"preallocate_bytes must be >= 0, got {preallocate_bytes}")
        self._preallocate_bytes = preallocate_bytes
        self._root = Path(root_dir)
        self._segment_bytes_max = segment_bytes_max
        self._sync: SyncFunction = sync if sync is not None else _default_sync
        self._inline_below_s = inline_below_s
        self._appender = _AppendThread(f"wal-append-{self._root.name}")
        self._remove_tombstones()

    @property
    def root_dir(self) -> Path:
        return self._root

    def log_dir(self, log_name: str) -> Path:
        """The directory holding `log_name` (it may not exist)."""
        _check_log_name(log_name)
        return self._root / log_name

    # -- open / recover ------------------------------------------------------------------------

    def open_writer(
        self,
        log_name: str,
        *,
        min_last_sequence: int = 0,
        on_record: Callable[[LogRecord], object] | None = None,
    ) -> LocalLogWriter:
        """Open `log_name` for writing (creating it), fencing an earlier writer in this process.
        (`on_record` is never called: the local disk is read after the open as fast.)

        Recovers the log first (see the module docstring) and, when `min_last_sequence` is above
        the last record, durably starts a new segment at `min_last_sequence + 1` (flagged as a
        gap) so the numbering survives a restart. Raises `LogLockedError` when another process
        holds the log, `CorruptionError` for damage that is not a torn tail, `UnavailableError`
        for I/O errors. Blocking.
        """
        if min_last_sequence < 0:
            raise ValueError(f"min_last_sequence must be >= 0, got {min_last_sequence}")
        log_dir = self.log_dir(log_name)
        slot = _slot_for(log_dir)
        with slot.lock:
            if slot.writer is not None:
                slot.writer._fence()
                slot.writer = None
            try:
                writer = self._open_locked(log_name, log_dir, slot, min_last_sequence)
            except OSError as exc:
                raise _storage_error(f"log {log_name!r}: cannot open", exc) from exc
            slot.writer = writer
            return writer

    def _open_locked(
        self, log_name: str, log_dir: Path, slot: _Slot, min_last_sequence: int
    ) -> LocalLogWriter:
        if not log_dir.is_dir():
            self._root.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                log_dir.mkdir()
            _fsync_dir(self._root)
        lock_fd = _lock_log(log_dir, log_name)
        segment_fd: int | None = None
        try:
            marker = _read_tail_marker(log_dir, log_name)
            segments = _list_segments(log_dir)
            _check_tail(log_name, log_dir, marker, segments)
            if not segments:
                first = min_last_sequence + 1
                flags = SEGMENT_FLAG_GAP if min_last_sequence else 0
                segment_fd = self._create_segment(log_dir, first, flags)
                return self._writer(
                    log_name, log_dir, slot, lock_fd, segment_fd, first, SEGMENT_HEADER_SIZE, 0
                )
            last_sequence, last_records, valid_end = self._recover(log_name, segments)
            tail = segments[-1]
            if min_last_sequence > last_sequence:
                first = min_last_sequence + 1
                if last_records:
                    # It stops being the last segment: cut its zero tail off first.
                    _cut_back(tail.path, valid_end, self._sync)
                segment_fd = self._create_segment(log_dir, first, SEGMENT_FLAG_GAP)
                if last_records == 0:
                    # The old last segment holds nothing; the new one carries the numbering.
                    tail.path.unlink()
                    _fsync_dir(log_dir)
                _log.info(
                    "log %r: numbering raised from %d to %d", log_name, last_sequence, first - 1
                )
                return self._writer(
                    log_name, log_dir, slot, lock_fd, segment_fd, first, SEGMENT_HEADER_SIZE, 0
                )
            if marker is None or marker < tail.first_sequence:
                # A log from before tail markers, or a crash between creating a segment and
                # moving the marker to it.
                _write_tail_marker(log_dir, tail.first_sequence)
            segment_fd = os.open(tail.path, os.O_WRONLY | os.O_CLOEXEC)
            size = os.lseek(segment_fd, 0, os.SEEK_END)
            return self._writer(
                log_name,
                log_dir,
                slot,
                lock_fd,
                segment_fd,
                tail.first_sequence,
                valid_end,
                last_records,
                last_sequence=last_sequence,
                allocated=size,
            )
        except BaseException:
            if segment_fd is not None:
                os.close(segment_fd)
            os.close(lock_fd)
            raise

    def _writer(
        self,
        log_name: str,
        log_dir: Path,
        slot: _Slot,
        lock_fd: int,
        segment_fd: int,
        segment_first: int,
        segment_size: int,
        segment_records: int,
        *,
        last_sequence: int | None = None,
        allocated: int | None = None,
    ) -> LocalLogWriter:
        return LocalLogWriter(
            log_name=log_name,
            log_dir=log_dir,
            lock_fd=lock_fd,
            segment_fd=segment_fd,
            segment_first=segment_first,
            segment_size=segment_size,
            segment_records=segment_records,
            last_sequence=segment_first - 1 if last_sequence is None else last_sequence,
            segment_bytes_max=self._segment_bytes_max,
            sync=self._sync,
            slot=slot,
            appender=self._appender,
            inline_below_s=self._inline_below_s,
            failpoints=self._failpoints,
            allocated=allocated,
            preallocate_bytes=self._preallocate_bytes,
        )

    def _create_segment(self, log_dir: Path, first_sequence: int, flags: int) -> int:
        path = log_dir / segment_file_name(first_sequence)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, encode_segment_header(first_sequence, flags=flags))
            self._sync(fd)
            _fsync_dir(log_dir)
            _write_tail_marker(log_dir, first_sequence)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _recover(self, log_name: str, segments: list[_Segment]) -> tuple[int, int, int]:
        """Check every segment, cut a torn tail off the last one.

        Returns (last sequence, number of records in the last segment, the offset where the
        last segment's records end: its size, or where its zero tail starts)."""
        previous_last: int | None = None
        records = 0
        valid_end = SEGMENT_HEADER_SIZE
        for index, segment in enumerate(segments):
            is_last = index == len(segments) - 1
            source = f"log {log_name!r} segment {segment.path}"
            with open(segment.path, "r+b") as file:
                size = os.fstat(file.fileno()).st_size
                head = file.read(SEGMENT_HEADER_SIZE)
                if is_torn_segment_header(head, size):
                    if not is_last:
                        raise CorruptionError(f"{source}: incomplete segment header (byte 0)")
                    gap = previous_last is not None and previous_last + 1 != segment.first_sequence
                    _log.warning(
                        "%s: rewriting the header of a segment cut short by a crash", source
                    )
                    file.seek(0)
                    file.truncate(0)
                    file.write(
                        encode_segment_header(
                            segment.first_sequence, flags=SEGMENT_FLAG_GAP if gap else 0
                        )
                    )
                    file.flush()
                    self._sync(file.fileno())
                    return segment.first_sequence - 1, 0, SEGMENT_HEADER_SIZE
                header = decode_segment_header(head, source=source)
                _check_segment_order(
                    source, segment, header.first_sequence, header.gap, previous_last
                )
                decoder = RecordDecoder(
                    file, source=source, first_sequence=segment.first_sequence, end_offset=size
                )
                records = sum(1 for _ in decoder)
                torn = decoder.torn
                if torn is not None:
                    if not is_last:
                        raise CorruptionError(
                            f"{source}: damaged record at byte offset {torn.offset} "
                            f"({torn.reason}) in a segment that is not the last"
                        )
                    _log.warning(
                        "%s: cutting a torn tail at byte offset %d (%s; %d bytes, %d valid "
                        "records of the same unfinished group discarded); last sequence is %d",
                        source,
                        torn.offset,
                        torn.reason,
                        size - torn.offset,
                        torn.discarded_records,
                        decoder.last_sequence,
                    )
                    file.truncate(torn.offset)
                    file.flush()
                    self._sync(file.fileno())
                previous_last = decoder.last_sequence
                valid_end = decoder.valid_end
        assert previous_last is not None
        return previous_last, records, valid_end

    # -- read / truncate / delete --------------------------------------------------------------

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        """Yield the durable records with sequence >= `from_sequence`, in order (see `LogBackend`).

        Starts at the first record still held when `from_sequence` was truncated. When a writer
        of this log is open in this process, stops at its `last_sequence` as of the first
        `next()`, so records of an append still in flight are never returned; records written
        by another process are returned as found on disk. A torn tail of the last segment ends
        the iteration; other damage raises `CorruptionError`. Segments wholly before
        `from_sequence` are skipped without being read. Blocking (each `next()`).
        """
        log_dir = self.log_dir(log_name)
        return self._read(log_name, log_dir, max(1, from_sequence))

    def _read(self, log_name: str, log_dir: Path, from_sequence: int) -> Iterator[LogRecord]:
        writer = _slot_for(log_dir).writer
        stop_after = writer.last_sequence if writer is not None else None
        try:
            # The marker before the listing: a segment exists before the marker names it.
            marker = _read_tail_marker(log_dir, log_name)
            segments = _list_segments(log_dir)
            if log_dir.is_dir():  # (a log deleted meanwhile just has nothing to read)
                _check_tail(log_name, log_dir, marker, segments)
            start = 0
            for index, segment in enumerate(segments):
                if segment.first_sequence <= from_sequence:
                    start = index
            previous_last: int | None = None
            yielded = False
            for index in range(start, len(segments)):
                segment = segments[index]
                is_last = index == len(segments) - 1
                if stop_after is not None and segment.first_sequence > stop_after:
                    return
                source = f"log {log_name!r} segment {segment.path}"
                try:
                    file = open(segment.path, "rb")  # noqa: SIM115 - closed below
                except FileNotFoundError:
                    if yielded or is_last:
                        raise UnavailableError(
                            f"{source}: deleted while being read (truncated concurrently)"
                        ) from None
                    previous_last = None
                    continue  # truncated since listing; the next segment is still held
                with file:
                    size = os.fstat(file.fileno()).st_size
                    head = file.read(SEGMENT_HEADER_SIZE)
                    if is_torn_segment_header(head, size):
                        if is_last:
                            return
                        raise CorruptionError(f"{source}: incomplete segment header (byte 0)")
                    header = decode_segment_header(head, source=source)
                    _check_segment_order(
                        source, segment, header.first_sequence, header.gap, previous_last
                    )
                    decoder = RecordDecoder(
                        file,
                        source=source,
                        first_sequence=segment.first_sequence,
                        end_offset=size,
                        stop_after=stop_after,
                        # A writer (perhaps of another process) may be appending to the last
                        # segment: its zero tail ends what there is to read now.
                        zero_header_ends=is_last,
                    )
                    for record in decoder:
                        if record.sequence >= from_sequence:
                            yielded = True
                            yield record
                    if decoder.torn is not None:
                        if is_last:
                            return
                        raise CorruptionError(
                            f"{source}: damaged record at byte offset {decoder.torn.offset} "
                            f"({decoder.torn.reason}) in a segment that is not the last"
                        )
                    previous_last = decoder.last_sequence
                    if stop_after is not None and previous_last >= stop_after:
                        return
        except OSError as exc:
            raise _storage_error(f"log {log_name!r}: read failed", exc) from exc

    def follow(self, log_name: str, from_sequence: int) -> LogFollower:
        """See `LogBackend.follow`: each poll reads again from the next record due."""
        return RereadingFollower(self, log_name, from_sequence)

    def mark_recovery_start(self, log_name: str, from_sequence: int) -> None:
        """Nothing to do: an open checks the segments on the local disk, no round trips."""

    def truncate(self, log_name: str, before_sequence: int) -> None:
        """Delete every segment whose records are all < `before_sequence`; never the last one.

        Segments go oldest first, so a crash leaves a contiguous suffix. Safe while a writer
        appends (it only writes to the last segment). Blocking."""
        log_dir = self.log_dir(log_name)
        segments = _list_segments(log_dir)
        deleted = 0
        try:
            for segment, following in zip(segments, segments[1:], strict=False):
                if following.first_sequence > before_sequence:
                    break
                segment.path.unlink(missing_ok=True)
                deleted += 1
                self._failpoints.hit("wal.truncate.after_segment_delete")
            if deleted:
                _fsync_dir(log_dir)
        except OSError as exc:
            raise _storage_error(f"log {log_name!r}: truncate failed", exc) from exc

    def size_bytes(self, log_name: str) -> int:
        """Bytes in the log's segment files now."""
        total = 0
        for segment in _list_segments(self.log_dir(log_name)):
            try:
                total += segment.path.stat().st_size
            except FileNotFoundError:
                continue
        return total

    def delete(self, log_name: str) -> None:
        """Remove the whole log; a no-op if it does not exist.

        Fences this process's writer of the log (its appends raise `LogFencedError`) and raises
        `LogLockedError` if another process holds it. The directory is renamed away atomically
        first, so a crash never leaves a partial log under the name. Blocking."""
        log_dir = self.log_dir(log_name)
        slot = _slot_for(log_dir)
        with slot.lock:
            if slot.writer is not None:
                slot.writer._fence()
                slot.writer = None
            if not log_dir.is_dir():
                return
            try:
                lock_fd = _lock_log(log_dir, log_name)
                try:
                    tombstone = self._root / f"{_TOMBSTONE_PREFIX}{log_name}-{uuid.uuid4().hex}"
                    os.rename(log_dir, tombstone)
                    _fsync_dir(self._root)
                finally:
                    os.close(lock_fd)
                shutil.rmtree(tombstone, ignore_errors=True)
            except OSError as exc:
                raise UnavailableError(f"log {log_name!r}: delete failed: {exc}") from exc

    def _remove_tombstones(self) -> None:
        """Finish deletes that a crash interrupted."""
        try:
            names = os.listdir(self._root)
        except OSError:
            return
        for name in names:
            if name.startswith(_TOMBSTONE_PREFIX):
                shutil.rmtree(self._root / name, ignore_errors=True)


def _cut_back(path: Path, size: int, sync: SyncFunction) -> None:
    """Cut a segment file back to `size` bytes (its records) and sync it, if it is longer."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
            sync(fd)
    finally:
        os.close(fd)


def _check_segment_order(
    source: str, segment: _Segment, header_first: int, gap: bool, previous_last: int | None
) -> None:
    if header_first != segment.first_sequence:
        raise CorruptionError(
            f"{source}: header says first sequence {header_first}, the file name says "
            f"{segment.first_sequence}"
        )
    if previous_last is None:
        return
    if segment.first_sequence <= previous_last or (
        not gap and segment.first_sequence != previous_last + 1
    ):
        raise CorruptionError(
            f"{source}: starts at sequence {segment.first_sequence} but the previous segment "
            f"ends at {previous_last}; records are missing or duplicated"
        )


def _check_log_name(log_name: str) -> None:
    if (
        not log_name
        or log_name.startswith(".")
        or "/" in log_name
        or "\x00" in log_name
        or len(log_name.encode("utf-8", "surrogatepass")) > _MAX_LOG_NAME_BYTES
    ):
        raise ValueError(
            f"invalid log name {log_name!r}: must be a non-empty file name of at most "
            f"{_MAX_LOG_NAME_BYTES} bytes, without '/' or NUL, not starting with '.'"
        )


if TYPE_CHECKING:

    def _implements_the_interface(
        backend: LocalLogBackend, writer: LocalLogWriter
    ) -> tuple[LogBackend, LogWriter]:
        return backend, writer
