"""The `pulsar` log backend: each log is a persistent Apache Pulsar topic, kept in BookKeeper.

A range's log then lives off the server's disk: a server that lost its disk (or a second server
taking over) opens the same topic and continues. The plumbing it shares with
`checkpoint/pulsar.py` (client, admin REST calls, topic names, sends, message positions) is in
`pulsar_common/`.

Topics and namespace: log `name` is the topic `persistent://<tenant>/<namespace>/<name>`. Names
are 1..200 characters of `[A-Za-z0-9_.-]`, not starting with '.'. On first use the backend
creates the namespace if needed and sets its policies (admin REST API):

* retention 0 minutes / 0 MB: entries that every subscription has acknowledged are deleted when
  their ledger is closed (BookKeeper deletes whole ledgers; Pulsar rolls them over by size, age,
  and on every topic load), so truncation is coarse and lazy, as the interface allows;
* message TTL 0 (never acknowledge on age), no automatic topic creation (a writer fenced by a
  `delete` cannot recreate the topic), inactive topics are never deleted.

Each topic is created explicitly, together with one durable subscription, the *truncation cursor*
(`tablekeeper-truncation`, starting at the earliest entry), before anything is written. The
subscription holds every entry after its mark-delete position: that is what keeps unconsumed
records, since nothing ever reads through it.

Messages: every message starts with a 24-byte header (big-endian)::

    magic b"TK" | version u8 (1) | kind u8 | epoch u64 | sequence u64 | fragment u16 | count u16

* DATA (kind 1): a record, or fragment `fragment` of `count` (payloads over 4 MiB are split,
  Pulsar's message limit being 5 MB); all fragments carry the record's sequence;
* GROUP (kind 4): `count` consecutive records from `sequence` on (fragment 0), each as
  `length u32 | payload`: an append packs its records of up to 64 KiB into groups of up to
  512 KiB, so that a group commit is a few messages rather than one per record (each message
  costs the writer a send and an acknowledgement, and every reader a read);
* FENCE (kind 2): a writer took the log over with epoch `epoch`; the body is a random nonce;
* START (kind 3): the writer of `epoch` numbers its first record `sequence + 1` (the log's last
  sequence when it opened, or the caller's higher `min_last_sequence`).

Writers and fencing (`open_writer`):

1. Create the producer with `ProducerAccessMode.ExclusiveWithFencing`. The broker fences every
   earlier producer of the topic (its sends, including reconnects with the older topic epoch,
   fail with `ProducerFenced`, reported as `LogFencedError`); only this one can write now.
2. Replay the topic from the truncation cursor to its end (rules below); from a later record
   start when one is known: one this backend indexed, else the recovery cursor.
3. Send FENCE with epoch = highest epoch seen + 1. Replay on up to that FENCE: records the old
   writer had in flight and that the broker persisted before the fence ("slipped in") come before
   it and are counted. If another writer's FENCE with an epoch >= ours shows up first (two
   writers opening at once), send a new FENCE with a higher epoch and repeat.
4. Send START with the last sequence (or `min_last_sequence`, if higher).

Replay rules (the same for `read`, recovery and truncation; see `_Replay`). Messages are taken in
topic order with a current epoch and last sequence:

* FENCE with an epoch above the current one makes it current; an older or equal one (a writer
  that lost a race) is ignored;
* START of the current epoch sets the last sequence to its base (never lowering it);
* DATA of the current epoch with sequence last + 1 is the next record (its fragments must follow
  in order). DATA of an *older* epoch after a newer FENCE is skipped: a fenced writer's record
  that slipped in late; it was never acknowledged. DATA with a sequence <= last is a duplicate (the
  client re-sends unacknowledged messages after a reconnect) and is skipped; DATA with a gap
  belongs to an append that failed and was never acknowledged, and is skipped too.
* A GROUP is its records in turn, each taken or skipped by the rules for DATA.
* A read that starts after the truncation point takes its epoch and numbering from the first
  message it reads (truncation only ever cuts in front of a record's first message).
* A message without a valid header raises `CorruptionError`.

Group commit: `append` sends all messages of the group with `send_async` on a producer with
batching enabled, flushes, and returns when the broker has acknowledged every message, i.e. once
BookKeeper has persisted them. Any failure makes the writer unusable (a later group must not
follow a partly persisted one); it must be reopened, and the new writer's replay decides which
records of the failed group exist. An append refused because a newer writer fenced this one
(`LogFencedError`) is settled where it can be: the writer reads on from its last acknowledged
message, and if the newer writer's FENCE comes before any record of the group, none of them can
ever be counted (`maybe_persisted` False: its callers may retry elsewhere); if one comes first,
or the FENCE does not show up within `FENCED_OUTCOME_WAIT_S`, they may be (`maybe_persisted`).

Truncation (`truncate`): the truncation cursor is reset (admin `resetcursor`) to the entry that
starts the last record at or below `before_sequence` that the backend knows of; entries before it
are acknowledged and deleted with their ledgers. It never moves back and never passes the last
record. Positions of record starts come from a sparse in-memory index fed by the writer's
acknowledgements, by replays and by reads of a log whose writer is elsewhere (every
`INDEX_STRIDE` records), or from a replay. Reads start at the indexed record start nearest
before what they ask for.

Recovery cursor (`mark_recovery_start`): a second durable subscription (`tablekeeper-recovery`),
moved the same way to the first record the newest checkpoint does not hold. The truncation point
stays before the oldest kept checkpoint (a restore may fall back to it); a writer opening the
log on a server that knows no record start of it begins its recovery scan at the recovery
cursor instead, reading one checkpoint interval, not two; so does a writer opening to apply the
tail onto a store it restored from the newest checkpoint (`on_record`), whatever it knows. Each
checkpoint moves it past the truncation point, so it holds back no entries the truncation cursor
would let go (if moving it fails, only until the next checkpoint).

Pulsar or its admin API unreachable: `UnavailableError` (retryable; for `append` it means the
group may or may not be persisted).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import functools
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pulsar

from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.errors import CorruptionError, LogFencedError, UnavailableError
from tablekeeper_server.log.api import FollowedRecords, LogBackend, LogRecord, LogWriter
from tablekeeper_server.pulsar_common.admin import PulsarAdmin
from tablekeeper_server.pulsar_common.client import SharedClient
from tablekeeper_server.pulsar_common.positions import Position, entry_message_id, message_position
from tablekeeper_server.pulsar_common.send import PulsarSendError, flush, is_fenced, send_and_wait
from tablekeeper_server.pulsar_common.topics import NamespaceTopics, namespace_policies

_log = logging.getLogger(__name__)

MiB: Final = 1 << 20
MAGIC: Final = b"TK"
FORMAT_VERSION: Final = 1
KIND_DATA: Final = 1
KIND_FENCE: Final = 2
KIND_START: Final = 3
KIND_GROUP: Final = 4
HEADER: Final = struct.Struct(">2sBBQQHH")
FRAGMENT_BYTES: Final = 4 * MiB
"""Largest payload piece per message (Pulsar's default message limit is 5 MB)."""
GROUP_RECORD_BYTES_MAX: Final = 64 * 1024
"""Records up to this size travel in GROUP messages; larger ones in DATA messages of their own."""
GROUP_BYTES_MAX: Final = 512 * 1024
"""Payload bytes per GROUP message, at most (within the producer's 1 MiB batches)."""
_LENGTH = struct.Struct(">I")
TRUNCATION_SUBSCRIPTION: Final = "tablekeeper-truncation"
RECOVERY_SUBSCRIPTION: Final = "tablekeeper-recovery"
"""A second durable cursor, at the start of the first record the newest checkpoint does not
hold (`mark_recovery_start`): where the next writer's recovery scan begins."""
INDEX_STRIDE: Final = 64
"""Record one truncation point per this many records (at most): truncation is that coarse."""

FENCED_OUTCOME_WAIT_S: Final = 3.0
"""How long a fenced writer looks for the new owner's FENCE to tell whether its unacknowledged
group reached the log before it (see `PulsarLogWriter.append`)."""
_FENCED_OUTCOME_POLL_S: Final = 0.05
RECOVERED_TAIL_BYTES_MAX: Final = 16 * MiB
"""A writer's recovery scan keeps the records it read, up to this many payload bytes, for the
first `read` after the open (the caller's replay): the tail is then read from Pulsar once."""
DEFAULT_NAMESPACE: Final = "tablekeeper"
_LOG_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199}$")


# ---------------------------------------------------------------------------------------------
# Message format


def encode_header(kind: int, epoch: int, sequence: int, fragment: int = 0, count: int = 1) -> bytes:
    return HEADER.pack(MAGIC, FORMAT_VERSION, kind, epoch, sequence, fragment, count)


def encode_records(epoch: int, first_sequence: int, payloads: Sequence[bytes]) -> list[bytes]:
    """The messages of an append, in sequence order: runs of small records as GROUP messages
    (a run of one as DATA), each larger record as DATA, split into fragments past 4 MiB."""
    messages: list[bytes] = []
    group: list[bytes] = []  # the payloads of the run being packed
    group_first = first_sequence
    group_bytes = 0

    def close_group() -> None:
        if len(group) == 1:
            messages.append(encode_header(KIND_DATA, epoch, group_first) + group[0])
        elif group:
            header = encode_header(KIND_GROUP, epoch, group_first, 0, len(group))
            pack = _LENGTH.pack
            messages.append(header + b"".join([pack(len(p)) + p for p in group]))
        group.clear()

    for sequence, payload in enumerate(payloads, start=first_sequence):
        size = len(payload)
        if size <= GROUP_RECORD_BYTES_MAX:
            if group and (group_bytes + size > GROUP_BYTES_MAX or len(group) == 0xFFFF):
                close_group()
            if not group:
                group_first, group_bytes = sequence, 0
            group.append(payload)
            group_bytes += size
            continue
        close_group()
        data = bytes(payload)
        count = -(-size // FRAGMENT_BYTES)
        if count > 0xFFFF:
            raise ValueError(f"payload of {size} bytes is too large for the log")
        for fragment in range(count):
            piece = data[fragment * FRAGMENT_BYTES : (fragment + 1) * FRAGMENT_BYTES]
            messages.append(encode_header(KIND_DATA, epoch, sequence, fragment, count) + piece)
    close_group()
    return messages


@dataclass(slots=True)
class _Replay:
    """The replay rules of the module docstring, applied to one pass over a topic."""

    log_name: str
    epoch: int | None = None
    last: int | None = None
    max_epoch: int = 0
    fence: tuple[int, bytes] | None = None
    """(epoch, nonce) of the last FENCE message fed."""
    skipped: int = 0
    _parts: list[bytes] = field(default_factory=list)
    _partial: tuple[int, int, int] | None = None
    _partial_start: Position = (0, 0, 0)

    def feed(self, data: bytes, position: Position) -> list[tuple[LogRecord, Position]]:
        """Take the next message; return the records it completes (each with the position of
        the record's first message), in order: none, one, or a GROUP's."""
        if len(data) < HEADER.size:
            raise self._damaged(position, f"{len(data)} bytes, shorter than a header")
        magic, version, kind, epoch, sequence, fragment, count = HEADER.unpack_from(data)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise self._damaged(position, f"bad magic/version {magic!r}/{version}")
        self.max_epoch = max(self.max_epoch, epoch)
        if kind == KIND_FENCE:
            self.fence = (epoch, data[HEADER.size :])
            if self.epoch is None or epoch > self.epoch:
                self.epoch = epoch
                self._drop_partial()
            return []
        if kind == KIND_START:
            if self.epoch is None:
                self.epoch = epoch
            if epoch != self.epoch:
                self.skipped += 1
                return []
            if self.last is not None and sequence < self.last:
                raise CorruptionError(
                    f"log {self.log_name!r} at {position}: epoch {epoch} starts after sequence "
                    f"{sequence} but the log already holds sequence {self.last}"
                )
            self.last = sequence
            self._drop_partial()
            return []
        if kind == KIND_GROUP:
            return self._feed_group(data, position, epoch, sequence, fragment, count)
        if kind != KIND_DATA:
            raise self._damaged(position, f"unknown message kind {kind}")
        if count < 1 or fragment >= count:
            raise self._damaged(position, f"fragment {fragment} of {count}")
        if not self._current(epoch, sequence, position):
            return []
        if self.last is None:
            if fragment != 0:
                self.skipped += 1
                return []
            self.last = sequence - 1
        if sequence != self.last + 1:
            self.skipped += 1  # a duplicate (<= last) or a record of a failed append (gap)
            return []
        key = (epoch, sequence, count)
        if fragment == 0:
            self._parts = [data[HEADER.size :]]
            self._partial = key
            self._partial_start = position
        elif self._partial == key and fragment == len(self._parts):
            self._parts.append(data[HEADER.size :])
        else:
            self.skipped += 1
            return []
        if len(self._parts) < count:
            return []
        payload = self._parts[0] if count == 1 else b"".join(self._parts)
        start = self._partial_start
        self._drop_partial()
        self.last = sequence
        return [(LogRecord(sequence, payload), start)]

    def _current(self, epoch: int, sequence: int, position: Position) -> bool:
        """Whether a DATA or GROUP message of `epoch` belongs to the current epoch (adopting
        it when none is known yet); False for a fenced writer's message."""
        if self.epoch is None:
            self.epoch = epoch
        if epoch < self.epoch:
            self.skipped += 1  # a fenced writer's record that slipped in after the new FENCE
            return False
        if epoch > self.epoch:
            raise CorruptionError(
                f"log {self.log_name!r} at {position}: record {sequence} of epoch {epoch} "
                f"without that epoch's FENCE (current epoch {self.epoch})"
            )
        return True

    def _feed_group(
        self, data: bytes, position: Position, epoch: int, first: int, fragment: int, count: int
    ) -> list[tuple[LogRecord, Position]]:
        if count < 1 or fragment != 0:
            raise self._damaged(position, f"group fragment {fragment} of {count} records")
        payloads: list[bytes] = []
        offset, end = HEADER.size, len(data)
        view = memoryview(data)
        for _ in range(count):
            if offset + _LENGTH.size > end:
                raise self._damaged(position, f"group of {count} records cut short")
            (size,) = _LENGTH.unpack_from(data, offset)
            offset += _LENGTH.size
            if offset + size > end:
                raise self._damaged(position, f"group of {count} records cut short")
            payloads.append(bytes(view[offset : offset + size]))
            offset += size
        if offset != end:
            raise self._damaged(position, f"{end - offset} bytes after a group's records")
        if not self._current(epoch, first, position):
            self.skipped += count - 1  # (one counted already)
            return []
        if self.last is None:
            self.last = first - 1
        out: list[tuple[LogRecord, Position]] = []
        for sequence, payload in enumerate(payloads, start=first):
            if sequence != self.last + 1:
                self.skipped += 1  # a duplicate (<= last) or past a gap (a failed append)
                continue
            self._drop_partial()  # a large record begun before it was never completed
            self.last = sequence
            out.append((LogRecord(sequence, payload), position))
        return out

    def _drop_partial(self) -> None:
        self._parts = []
        self._partial = None

    def _damaged(self, position: Position, reason: str) -> CorruptionError:
        return CorruptionError(f"log {self.log_name!r}: damaged message at {position}: {reason}")


@dataclass(frozen=True, slots=True)
class _IndexEntry:
    sequence: int
    position: Position


@dataclass(slots=True)
class _LogState:
    """Per log, per backend: the writer open here and the sparse index of record starts."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    writer: PulsarLogWriter | None = None
    index: list[_IndexEntry] = field(default_factory=list)
    recovery_cursor: bool = False
    """The recovery cursor is known to exist (created here)."""

    def add_index(self, sequence: int, position: Position) -> None:
        if position[2] > 0:
            return  # not the first message of its entry: no cursor position starts there
        if self.index and sequence - self.index[-1].sequence < INDEX_STRIDE:
            return
        if self.index and sequence <= self.index[-1].sequence:
            return
        self.index.append(_IndexEntry(sequence, position))

    def best_start(self, sequence: int) -> _IndexEntry | None:
        """The indexed record start with the highest sequence <= `sequence`."""
        at = bisect.bisect_right([e.sequence for e in self.index], sequence)
        return self.index[at - 1] if at else None


# ---------------------------------------------------------------------------------------------
# Writer


class _Tally:
    """Counts the acknowledgements of one append on the client's thread, so that the event loop
    is woken once per append, not once per message."""

    __slots__ = ("_lock", "_remaining", "_settled", "first_id")

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._remaining = count
        self._settled = False
        self.first_id: Any = None

    def record(
        self, index: int, result: Any, message_id: Any
    ) -> tuple[PulsarSendError | None] | None:
        """Take one message's result; return `(None,)` when the last one was acknowledged,
        `(error,)` for the first failure, and None otherwise."""
        with self._lock:
            if self._settled:
                return None
            if result != pulsar.Result.Ok:
                self._settled = True
                return (PulsarSendError(result),)
            if index == 0:
                self.first_id = message_id
            self._remaining -= 1
            if self._remaining == 0:
                self._settled = True
                return (None,)
            return None


class PulsarLogWriter:
    """The writer of one Pulsar log. Create it with `PulsarLogBackend.open_writer`."""

    def __init__(
        self,
        backend: PulsarLogBackend,
        log_name: str,
        producer: Any,
        epoch: int,
        last_sequence: int,
        state: _LogState,
        recovered: list[LogRecord] | None = None,
        recovered_from: int = 0,
    ) -> None:
        self._backend = backend
        self._log_name = log_name
        self._producer = producer
        self._epoch = epoch
        self._last = last_sequence
        self._state = state
        self._busy = False
        self._closed = False
        self._fenced = False
        self._broken: str | None = None
        self._close_lock = threading.Lock()
        self._recovered = recovered
        self._recovered_from = recovered_from
        """The first sequence the recovery scan read (0: from the truncation cursor)."""
        self._opened_at = last_sequence
        self._last_start: Position | None = None
        """The position of the first message of the last acknowledged append."""

    @property
    def log_name(self) -> str:
        return self._log_name

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def last_sequence(self) -> int:
        """The sequence of the last acknowledged record (or the START base); see `LogWriter`."""
        return self._last

    async def append(self, payloads: Sequence[bytes]) -> int:
        """Append `payloads` as one group; return the last one's sequence (see `LogWriter`).

        Every record is sent with `send_async` (batched), the batch is flushed, and the call
        returns once the broker acknowledged all of them. Raises `LogFencedError` once another
        writer opened the log (or it was deleted here), `UnavailableError` for any other failure
        (the writer is then unusable: reopen the log), `RuntimeError` for overlapping calls. If
        the awaiting task is cancelled, the sends complete or fail in the background and the
        writer refuses further appends. An empty `payloads` returns `last_sequence`."""
        if self._busy:
            raise RuntimeError(f"log {self._log_name!r}: append calls must not overlap")
        self._check_usable()
        if not payloads:
            return self._last
        self._busy = True
        try:
            return await self._append(payloads)
        except asyncio.CancelledError:
            self._broken = "an append was cancelled while in flight"
            raise
        finally:
            self._busy = False

    async def _append(self, payloads: Sequence[bytes]) -> int:
        first = self._last + 1
        last = first + len(payloads) - 1
        injected = self._backend._take_injected_failure(self._log_name)
        if injected is not None and not injected:
            self._broken = "injected append failure"
            raise UnavailableError(
                f"log {self._log_name!r}: injected failure appending sequences {first}..{last}"
            )
        messages = encode_records(self._epoch, first, payloads)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        tally = _Tally(len(messages))

        def settle(failure: PulsarSendError | None) -> None:  # on the event loop
            if not done.done():
                if failure is None:
                    done.set_result(None)
                else:
                    done.set_exception(failure)

        def callback(index: int, result: Any, message_id: Any) -> None:  # on a client thread
            outcome = tally.record(index, result, message_id)
            if outcome is not None:  # the last acknowledgement, or the first failure
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(settle, outcome[0])

        try:
            for index, data in enumerate(messages):
                self._producer.send_async(data, functools.partial(callback, index))
            # Send the batch now (from a worker thread: flushing blocks); the callbacks say when
            # every message is acknowledged.
            loop.run_in_executor(self._backend._flusher, flush, self._producer)
            await done
            await self._backend._failpoints.hit_async("wal.append")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            maybe_persisted = True
            if self._fenced or is_fenced(exc):  # fenced here or by another process's writer
                reached = await asyncio.to_thread(
                    self._backend._fenced_group_reached_log,
                    self._log_name,
                    self._epoch,
                    first,
                    last,
                    self._scan_start(),
                )
                maybe_persisted = reached is not False
            self._fail(exc, first, last, maybe_persisted=maybe_persisted)
        if injected:
            self._broken = "injected append failure (after persisting)"
            raise UnavailableError(
                f"log {self._log_name!r}: injected failure after appending {first}..{last}"
            )
        self._last = last
        if tally.first_id is not None:
            self._last_start = message_position(tally.first_id)
            with self._state.lock:
                self._state.add_index(first, self._last_start)
        return last

    def _scan_start(self) -> Position | None:
        """Where a look for this writer's unacknowledged messages may begin: the first message
        of its last acknowledged append (its later messages can only follow), else the last
        record start indexed here; None: from the truncation cursor."""
        if self._last_start is not None:
            return self._last_start
        with self._state.lock:
            return self._state.index[-1].position if self._state.index else None

    def _fail(self, exc: BaseException, first: int, last: int, *, maybe_persisted: bool) -> None:
        if self._fenced or is_fenced(exc):
            self._fenced = True
            outcome = (
                "they may have reached the log before its fence"
                if maybe_persisted
                else "none of them is in the log before its fence"
            )
            raise LogFencedError(
                f"log {self._log_name!r}: fenced, another writer opened the log (epoch "
                f"{self._epoch}, sequences {first}..{last} not acknowledged; {outcome}): {exc}",
                maybe_persisted=maybe_persisted,
            ) from exc
        self._broken = f"append of sequences {first}..{last} failed: {exc!r}"
        raise UnavailableError(
            f"log {self._log_name!r}: append of sequences {first}..{last} failed; they may or "
            f"may not be persisted: {exc}"
        ) from exc

    async def close(self) -> None:
        """Close the producer. Durable records stay. Idempotent; a fenced writer's close does
        not disturb the newer writer."""
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """`close` for callers outside the event loop (blocking)."""
        self._closed = True
        self._release()
        with self._state.lock:
            if self._state.writer is self:
                self._state.writer = None

    def _fence_local(self) -> None:
        """A newer writer of this backend (or `delete`) took the log: refuse further appends."""
        self._fenced = True
        self._release()

    def _take_recovered(self, from_sequence: int) -> list[LogRecord] | None:
        """The records the open's recovery scan read (every record from where it began to
        `last_sequence`), once; None if already taken, too large to keep, not reaching back to
        `from_sequence`, or no longer the whole log (records were appended since)."""
        recovered, self._recovered = self._recovered, None
        if from_sequence < self._recovered_from or self._last != self._opened_at:
            return None
        return recovered

    def _release(self) -> None:
        self._recovered = None
        with self._close_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close()

    def _check_usable(self) -> None:
        if self._fenced:
            raise LogFencedError(
                f"log {self._log_name!r}: fenced, another writer opened (or deleted) the log"
            )
        if self._closed or self._producer is None:
            raise UnavailableError(f"log {self._log_name!r}: the writer is closed")
        if self._broken is not None:
            raise UnavailableError(
                f"log {self._log_name!r}: the writer is unusable after an earlier failure "
                f"({self._broken}); reopen the log"
            )


# ---------------------------------------------------------------------------------------------
# Backend


class _Scan:
    """A reader over one log topic from a start position, feeding a `_Replay`."""

    def __init__(
        self,
        backend: PulsarLogBackend,
        log_name: str,
        start: Position | None,
        skip_through: Position | None,
    ) -> None:
        """Read from the entry of `start` (the earliest entry if None), skipping messages at or
        before `skip_through` and messages before `start` within its entry."""
        self.replay = _Replay(log_name)
        self._ready: collections.deque[tuple[LogRecord, Position]] = collections.deque()
        """Records of the last message read not yet taken (a GROUP's)."""
        self.started_at_hint = False
        """Whether it began at an indexed record start (not at the truncation cursor)."""
        self._backend = backend
        self._log_name = log_name
        self._start = start
        self._skip_through = skip_through
        start_id = (
            pulsar.MessageId.earliest if start is None else entry_message_id(start[0], start[1])
        )
        try:
            self._reader = backend._client().create_reader(
                backend._topic(log_name),
                start_id,
                start_message_id_inclusive=True,
                receiver_queue_size=100,
            )
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"log {log_name!r}: cannot open a reader: {exc}") from exc

    def has_more(self) -> bool:
        if self._ready:
            return True
        try:
            return bool(self._reader.has_message_available())
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"log {self._log_name!r}: read failed: {exc}") from exc

    def next(self) -> tuple[LogRecord, Position] | None:
        """The next record of the last message read, or else read and feed one message and
        return the first record it completes, if any."""
        if self._ready:
            return self._ready.popleft()
        try:
            message = self._reader.read_next(self._backend._timeout_ms)
        except pulsar.PulsarException as exc:
            raise UnavailableError(f"log {self._log_name!r}: read failed: {exc}") from exc
        position = message_position(message.message_id())
        if self._skip_through is not None and _entry(position) <= _entry(self._skip_through):
            return None
        if self._start is not None and position < self._start:
            return None
        records = self.replay.feed(message.data(), position)
        if not records:
            return None
        if len(records) > 1:
            self._ready.extend(records[1:])
        return records[0]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._reader.close()


class PulsarLogFollower:
    """`LogBackend.follow` on Pulsar: one reader kept open on the topic, fed through the same
    replay rules as recovery (so a fenced writer's stray records and torn fragments are
    skipped exactly as the log's next owner skips them). Asking whether more is available
    costs a round trip to the broker only when the reader has nothing buffered."""

    def __init__(self, backend: PulsarLogBackend, log_name: str, from_sequence: int) -> None:
        self._backend = backend
        self._log_name = log_name
        self._next = max(1, from_sequence)
        self._scan: _Scan | None = None

    def _open(self) -> _Scan | None:
        cursor = self._backend._cursor(self._log_name)
        if cursor is None:
            return None  # no such topic (yet, or deleted): nothing to read
        hint = self._backend._state(self._log_name).best_start(self._next)
        return self._backend._new_scan(self._log_name, cursor, hint)

    def poll(self, max_records: int) -> FollowedRecords:
        if self._scan is None:
            self._scan = self._open()
            if self._scan is None:
                return FollowedRecords([], at_end=True)
        out: list[LogRecord] = []
        scan = self._scan
        state = self._backend._state(self._log_name)
        try:
            while len(out) < max_records:
                if not scan.has_more():
                    return FollowedRecords(out, at_end=True)
                got = scan.next()
                if got is not None and got[0].sequence >= self._next:
                    out.append(got[0])
                    self._next = got[0].sequence + 1
                    with state.lock:  # a writer opened here later starts its scan near
                        state.add_index(got[0].sequence, got[1])
        except UnavailableError:
            self.close()  # the next poll opens a new reader from the next record due
            if out:
                return FollowedRecords(out, at_end=False)
            raise
        return FollowedRecords(out, at_end=False)

    def close(self) -> None:
        if self._scan is not None:
            self._scan.close()
            self._scan = None


def _mark_delete_position(cursor: object) -> Position | None:
    """`(ledger, entry, -1)` of a cursor in a topic's internal stats; None if absent."""
    if not isinstance(cursor, dict):
        return None
    ledger, _, entry = str(cursor.get("markDeletePosition", "-1:-1")).partition(":")
    return (int(ledger), int(entry), -1)


def _entry(position: Position) -> tuple[int, int]:
    return position[0], position[1]


class PulsarLogBackend:
    """Logs stored as Pulsar topics (see the module docstring).

    All methods block (call them from a worker thread) and are thread-safe. `service_url` is the
    binary protocol URL (`pulsar://host:6650`), `admin_url` the HTTP one (`http://host:8080`).
    `timeout_s` bounds Pulsar operations and sends: an append waits at most about that long
    for its acknowledgement while Pulsar is unreachable before failing with `UnavailableError`.
    `failpoints`: `wal.append` is hit once a group is acknowledged, before the append returns
    (robustness tests arm it with a delay: a slow journal).
    """

    def __init__(
        self,
        service_url: str,
        admin_url: str,
        *,
        tenant: str = "public",
        namespace: str = DEFAULT_NAMESPACE,
        timeout_s: float = 30.0,
        failpoints: Failpoints = NO_FAILPOINTS,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.service_url = service_url
        self.tenant = tenant
        self.namespace = namespace
        self._timeout_s = timeout_s
        self._timeout_ms = max(1000, round(timeout_s * 1000))
        self._admin = PulsarAdmin(admin_url, timeout_s=timeout_s)
        policies = namespace_policies(retention_minutes=0, retention_mb=0)
        self._topics = NamespaceTopics(self._admin, tenant, namespace, policies)
        self._pulsar = SharedClient(service_url, timeout_s)
        self._lock = threading.Lock()
        self._states: dict[str, _LogState] = {}
        self._injected: dict[str, bool] = {}
        self._flusher = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pulsar-flush")
        self._failpoints = failpoints

    def describe(self) -> str:
        return f"pulsar {self.service_url} namespace {self.tenant}/{self.namespace}"

    def close(self) -> None:
        """Close the Pulsar client (and with it every producer and reader)."""
        self._pulsar.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _client(self) -> Any:
        return self._pulsar.get()

    def _topic(self, log_name: str) -> str:
        return self._topics.topic(log_name)

    def _topic_path(self, log_name: str) -> str:
        return self._topics.path(log_name)

    def _state(self, log_name: str) -> _LogState:
        with self._lock:
            state = self._states.get(log_name)
            if state is None:
                state = self._states[log_name] = _LogState()
            return state

    def _ensure_topic(self, log_name: str) -> None:
        """Create the topic and its truncation cursor (at the earliest entry) if absent."""
        self._topics.create(log_name)
        path = self._topic_path(log_name)
        earliest = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
        self._admin.call(
            "PUT", f"{path}/subscription/{TRUNCATION_SUBSCRIPTION}", earliest, allow=(409,)
        )

    def _cursor(self, log_name: str) -> Position | None:
        """The truncation cursor's mark-delete position, `(ledger, entry, -1)`; None when the
        log does not exist."""
        cursors = self._cursors(log_name)
        return None if cursors is None else cursors[0]

    def _cursors(self, log_name: str) -> tuple[Position, Position | None] | None:
        """The mark-delete positions of the truncation and the recovery cursor (None if the
        log has none yet), in one call; None when the log does not exist."""
        status, stats = self._admin.call(
            "GET", f"{self._topic_path(log_name)}/internalStats", allow=(404,)
        )
        if status == 404 or not isinstance(stats, dict):
            return None
        cursors = stats.get("cursors") or {}
        truncation = _mark_delete_position(cursors.get(TRUNCATION_SUBSCRIPTION))
        if truncation is None:
            _log.warning("log %r: truncation cursor missing; reading from the start", log_name)
            truncation = (-1, -1, -1)
        return truncation, _mark_delete_position(cursors.get(RECOVERY_SUBSCRIPTION))

    def _new_scan(self, log_name: str, cursor: Position, hint: _IndexEntry | None) -> _Scan:
        if hint is not None and _entry(hint.position) > _entry(cursor):
            scan = _Scan(self, log_name, hint.position, cursor)
            scan.started_at_hint = True
            return scan
        start = None if cursor[0] < 0 else (cursor[0], cursor[1], -1)
        return _Scan(self, log_name, start, cursor if cursor[0] >= 0 else None)

    # -- open / recover -------------------------------------------------------------------------

    def open_writer(
        self,
        log_name: str,
        *,
        min_last_sequence: int = 0,
        on_record: Callable[[LogRecord], object] | None = None,
    ) -> PulsarLogWriter:
        """Open `log_name` for writing (creating it), fencing every earlier writer, here or in
        any other process. Follows the protocol of the module docstring. Raises
        `UnavailableError` when Pulsar cannot be reached, `LogFencedError` if yet another writer
        took over meanwhile, `CorruptionError` for a message that is not ours."""
        if min_last_sequence < 0:
            raise ValueError(f"min_last_sequence must be >= 0, got {min_last_sequence}")
        _check_log_name(log_name)
        try:
            self._ensure_topic(log_name)
        except UnavailableError as exc:
            raise UnavailableError(f"log {log_name!r}: cannot open: {exc.message}") from exc
        state = self._state(log_name)
        with state.lock:
            old, state.writer = state.writer, None
        if old is not None:
            old._fence_local()
        try:
            producer = self._client().create_producer(
                self._topic(log_name),
                access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing,
                batching_enabled=True,
                batching_max_messages=1024,
                batching_max_allowed_size_in_bytes=MiB,
                batching_max_publish_delay_ms=1,
                max_pending_messages=8192,
                block_if_queue_full=True,
                send_timeout_millis=self._timeout_ms,
            )
        except pulsar.PulsarException as exc:
            raise _open_error(log_name, exc) from exc
        with state.lock:
            hint = state.index[-1] if state.index else None
        try:
            epoch, last, index, recovered, started = self._recover(
                log_name, producer, min_last_sequence, hint, on_record
            )
        except BaseException:
            with contextlib.suppress(Exception):
                producer.close()
            raise
        writer = PulsarLogWriter(
            self, log_name, producer, epoch, last, state, recovered, recovered_from=started
        )
        with state.lock:
            state.writer = writer
            # (What the scan began after is still indexed from before.)
            state.index = [e for e in state.index if e.sequence < started] + index
        _log.debug("log %r: opened with epoch %d at sequence %d", log_name, epoch, last)
        return writer

    def _recover(
        self,
        log_name: str,
        producer: Any,
        min_last_sequence: int,
        hint: _IndexEntry | None,
        on_record: Callable[[LogRecord], object] | None,
    ) -> tuple[int, int, list[_IndexEntry], list[LogRecord] | None, int]:
        """Fence the log (steps 2-4 of the module docstring). Returns the epoch, the last
        sequence, the record starts seen, the records themselves (None past
        `RECOVERED_TAIL_BYTES_MAX`) and the first sequence it read (0: all from the truncation
        cursor).

        `hint`: the last record start this backend knows of (read by a follower or a previous
        writer here). The scan begins there instead of at the truncation cursor: what comes
        before cannot change what recovery decides, because a record read as valid carries
        the highest epoch of everything before it (an older-epoch record after a newer FENCE is
        not valid, and a newer epoch without its FENCE is refused), and everything after it is
        read. Without a hint, the recovery cursor serves as one when it is past the truncation
        cursor; with `on_record` (the caller restored its store from the newest checkpoint and
        applies what is handed over) it does even when a hint is known: the hint may come from
        an earlier ownership here, while the restored store needs the records from the cursor
        on, so the scan reads them once, neither more (a hint before it) nor less (after it)."""
        cursors = self._cursors(log_name)
        if cursors is None:
            raise UnavailableError(f"log {log_name!r}: the topic vanished while opening")
        cursor, mark = cursors
        started: int | None
        no_hint = hint is None or _entry(hint.position) <= _entry(cursor)
        if (no_hint or on_record is not None) and (
            mark is not None and _entry(mark) > _entry(cursor)
        ):
            # No record start known here: begin where the newest checkpoint's records end (a
            # record start, as a truncation point is). What comes before decides nothing,
            # for the reason given for `hint`; a replay from further back reads Pulsar again.
            scan = self._new_scan(log_name, mark, None)
            started = None  # the sequence of the first record read
        else:
            scan = self._new_scan(log_name, cursor, hint)
            started = hint.sequence if hint is not None and scan.started_at_hint else 0
        index = _LogState()
        kept: list[LogRecord] | None = []
        kept_bytes = 0
        try:

            def step() -> None:
                nonlocal kept, kept_bytes, started
                out = scan.next()
                if out is None:
                    return
                if started is None:
                    started = out[0].sequence
                if on_record is not None:  # valid for good: the producer fenced the old writer
                    on_record(out[0])
                index.add_index(out[0].sequence, out[1])
                if kept is not None:
                    kept_bytes += len(out[0].payload)
                    if kept_bytes > RECOVERED_TAIL_BYTES_MAX:
                        kept = None
                    else:
                        kept.append(out[0])

            while scan.has_more():
                step()
            epoch = scan.replay.max_epoch + 1
            while True:
                nonce = os.urandom(16)
                scan.replay.fence = None
                self._send(log_name, producer, [encode_header(KIND_FENCE, epoch, 0) + nonce])
                conflict = False
                while True:
                    step()
                    fence = scan.replay.fence
                    if fence is None:
                        continue
                    if fence[1] == nonce:
                        break
                    if fence[0] >= epoch:
                        conflict = True
                    scan.replay.fence = None
                if not conflict:
                    break
                epoch = scan.replay.max_epoch + 1
            base = max(scan.replay.last or 0, min_last_sequence)
            self._send(log_name, producer, [encode_header(KIND_START, epoch, base)])
        finally:
            scan.close()
        if started is None:  # nothing after the mark: a replay from past the end takes []
            started = base + 1
        if scan.replay.skipped:
            _log.info(
                "log %r: recovery skipped %d messages (duplicates, fenced or failed appends)",
                log_name,
                scan.replay.skipped,
            )
        return epoch, base, index.index, kept, started

    def _fenced_group_reached_log(
        self,
        log_name: str,
        epoch: int,
        first: int,
        last: int,
        start: Position | None,
        wait_s: float = FENCED_OUTCOME_WAIT_S,
    ) -> bool | None:
        """Whether any record `first..last` of the fenced writer of `epoch` is in the log
        before the FENCE that ended that epoch: True if one is (the new owner's replay counts
        what precedes its FENCE), False if that FENCE comes first (what follows it is never
        counted), None when it cannot tell within `wait_s` (the new owner has not
        written its FENCE yet, the topic is gone or unreadable). Reads from `start` (or the
        truncation cursor) on; a message of the writer's group cannot come before its last
        acknowledged one."""
        deadline = time.monotonic() + min(wait_s, self._timeout_s)
        try:
            if start is None:
                cursor = self._cursor(log_name)
                if cursor is None:
                    return None
                start = (cursor[0], max(cursor[1], 0), -1)
            start_id = pulsar.MessageId.earliest if start[0] < 0 else entry_message_id(*start[:2])
            reader = self._client().create_reader(
                self._topic(log_name),
                start_id,
                start_message_id_inclusive=True,
                receiver_queue_size=100,
            )
        except (UnavailableError, pulsar.PulsarException) as exc:
            _log.info("log %r: cannot look for a fenced group (%s)", log_name, exc)
            return None
        try:
            while time.monotonic() < deadline:
                if not reader.has_message_available():
                    time.sleep(_FENCED_OUTCOME_POLL_S)  # the new owner's FENCE is still coming
                    continue
                data = reader.read_next(self._timeout_ms).data()
                if len(data) < HEADER.size:
                    return None
                magic, version, kind, msg_epoch, sequence, _, count = HEADER.unpack_from(data)
                if magic != MAGIC or version != FORMAT_VERSION:
                    return None
                if kind == KIND_FENCE and msg_epoch > epoch:
                    return False
                if msg_epoch == epoch and kind in (KIND_DATA, KIND_GROUP):
                    end = sequence + count - 1 if kind == KIND_GROUP else sequence
                    if sequence <= last and end >= first:
                        return True
            return None
        except pulsar.PulsarException as exc:
            _log.info("log %r: cannot look for a fenced group (%s)", log_name, exc)
            return None
        finally:
            with contextlib.suppress(Exception):
                reader.close()

    def _send(self, log_name: str, producer: Any, messages: Sequence[bytes]) -> None:
        try:
            send_and_wait(producer, messages, self._timeout_s)
        except (PulsarSendError, pulsar.PulsarException) as exc:
            raise _open_error(log_name, exc) from exc

    # -- read / truncate / delete ---------------------------------------------------------------

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        """Yield the records with sequence >= `from_sequence`, in order (see `LogBackend.read`).

        Starts at the truncation cursor (or at an indexed record start closer to
        `from_sequence`) and stops at the topic's end as of each `next()`; when a writer of the
        log is open in this backend, stops at its `last_sequence` as of the first `next()`. The
        first read after a writer opened takes the records its recovery scan already read (the
        same records a scan from the truncation cursor would yield), without reading again."""
        _check_log_name(log_name)
        return self._read(log_name, max(1, from_sequence))

    def _read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        state = self._state(log_name)
        with state.lock:
            writer = state.writer
            stop_after = writer.last_sequence if writer is not None else None
            hint = state.best_start(from_sequence)
            recovered = writer._take_recovered(from_sequence) if writer is not None else None
        if recovered is not None:
            for record in recovered:
                if record.sequence >= from_sequence:
                    yield record
            return
        cursor = self._cursor(log_name)
        if cursor is None:
            return
        scan = self._new_scan(log_name, cursor, hint)
        try:
            while scan.has_more():
                out = scan.next()
                if out is None:
                    continue
                record = out[0]
                if stop_after is not None and record.sequence > stop_after:
                    return
                if writer is None:  # a later read here (a split catching up) starts nearer
                    with state.lock:
                        state.add_index(record.sequence, out[1])
                if record.sequence >= from_sequence:
                    yield record
        finally:
            scan.close()

    def follow(self, log_name: str, from_sequence: int) -> PulsarLogFollower:
        """See `LogBackend.follow`: a reader kept open on the log's topic."""
        _check_log_name(log_name)
        return PulsarLogFollower(self, log_name, from_sequence)

    def truncate(self, log_name: str, before_sequence: int) -> None:
        """Move the truncation cursor to the start of the last known record at or below
        `before_sequence` (never back, never past the last record). Deletion follows lazily,
        a ledger at a time."""
        _check_log_name(log_name)
        cursor = self._cursor(log_name)
        if cursor is None:
            return
        state = self._state(log_name)
        with state.lock:
            cut = state.best_start(before_sequence)
        if cut is None or _entry(cut.position) <= _entry(cursor):
            cut = self._scan_for_cut(log_name, cursor, before_sequence)
        if cut is None or _entry(cut.position) <= _entry(cursor):
            return
        ledger, entry, _ = cut.position
        self._admin.call(
            "POST",
            f"{self._topic_path(log_name)}/subscription/{TRUNCATION_SUBSCRIPTION}/resetcursor",
            {"ledgerId": ledger, "entryId": entry, "partitionIndex": -1},
        )
        with state.lock:
            state.index = [e for e in state.index if e.sequence >= cut.sequence]

    def mark_recovery_start(self, log_name: str, from_sequence: int) -> None:
        """Move the recovery cursor to the start of the last record at or below `from_sequence`
        that this backend has indexed (the writer here indexes what it appends); without one,
        or with Pulsar unreachable, leave it (a hint: the next open reads more)."""
        _check_log_name(log_name)
        state = self._state(log_name)
        with state.lock:
            start = state.best_start(from_sequence)
            created = state.recovery_cursor
        if start is None:
            return
        path = f"{self._topic_path(log_name)}/subscription/{RECOVERY_SUBSCRIPTION}"
        ledger, entry, _ = start.position
        try:
            if not created:
                earliest = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}
                self._admin.call("PUT", path, earliest, allow=(409,))
                with state.lock:
                    state.recovery_cursor = True
            self._admin.call(
                "POST",
                f"{path}/resetcursor",
                {"ledgerId": ledger, "entryId": entry, "partitionIndex": -1},
            )
        except UnavailableError as exc:
            _log.warning("log %r: recovery cursor not moved: %s", log_name, exc.message)

    def _scan_for_cut(
        self, log_name: str, cursor: Position, before_sequence: int
    ) -> _IndexEntry | None:
        """Replay from the cursor to find the last record start at or below `before_sequence`
        (every record start qualifies here, not only indexed ones)."""
        scan = self._new_scan(log_name, cursor, None)
        best: _IndexEntry | None = None
        try:
            while scan.has_more():
                out = scan.next()
                if out is None:
                    continue
                record, position = out
                if record.sequence > before_sequence:
                    break
                if position[2] <= 0:
                    best = _IndexEntry(record.sequence, position)
        finally:
            scan.close()
        return best

    def size_bytes(self, log_name: str) -> int:
        """The topic's storage size from the broker's stats; 0 if absent or unreachable."""
        _check_log_name(log_name)
        try:
            status, stats = self._admin.call(
                "GET", f"{self._topic_path(log_name)}/stats", allow=(404,), timeout_s=2.0
            )
        except UnavailableError as exc:
            _log.debug("log %r: size unknown: %s", log_name, exc.message)
            return 0
        if status == 404 or not isinstance(stats, dict):
            return 0
        return int(stats.get("storageSize", 0))

    def delete(self, log_name: str) -> None:
        """Delete the topic (with its cursor); fences this backend's writer of it. A no-op if the
        log does not exist. Writers elsewhere fail on their next append (the topic is gone and is
        not created again automatically)."""
        _check_log_name(log_name)
        state = self._state(log_name)
        with state.lock:
            writer, state.writer = state.writer, None
            state.index = []
            state.recovery_cursor = False
        if writer is not None:
            writer._fence_local()
        self._topics.delete(log_name)

    # -- tests ----------------------------------------------------------------------------------

    def fail_next_append(self, log_name: str, *, persist: bool = False) -> None:
        """Make the next append to `log_name` in this backend fail with `UnavailableError`
        (the writer is then unusable). With `persist=True` its records are persisted anyway."""
        with self._lock:
            self._injected[log_name] = persist

    def _take_injected_failure(self, log_name: str) -> bool | None:
        with self._lock:
            return self._injected.pop(log_name, None)


def _open_error(log_name: str, exc: BaseException) -> UnavailableError:
    if is_fenced(exc):
        return LogFencedError(f"log {log_name!r}: another writer took over while opening: {exc}")
    return UnavailableError(f"log {log_name!r}: cannot open for writing: {exc}")


def _check_log_name(log_name: str) -> None:
    if not _LOG_NAME.match(log_name):
        raise ValueError(
            f"invalid log name {log_name!r}: 1..200 characters of [A-Za-z0-9_.-], not "
            "starting with '.'"
        )


if TYPE_CHECKING:

    def _implements_the_interface(
        backend: PulsarLogBackend, writer: PulsarLogWriter
    ) -> tuple[LogBackend, LogWriter]:
        return backend, writer
