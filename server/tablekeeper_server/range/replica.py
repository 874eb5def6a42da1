"""A serving range: validated commands go through the log, then into the state machine.

Write path (one writer task per range, so commands are totally ordered):

    execute() -> queue -> writer task: take everything queued (up to a bound)
                       -> one log append for the whole group (one fsync)
                       -> apply the group to the store in one write batch
                       -> resolve every caller's future

Many concurrent requests thus share one durable append: that is group commit, and it is what
makes a range fast. A caller hears back only after its command is durable in the log and applied.
Reads are served from the store, which holds exactly the acknowledged state.

Recovery (`open`): the log backend fences earlier writers and cuts a torn tail; the store's
applied position says where to resume; the log is replayed from there.

A damaged store (a block failing its checksum, `StoreCorruptionError`): the call that found it
gets the error (UNEXPECTED), the range stops serving (`failed`; its container reopens it on the
next request), and closing it sets the local store aside. Reopening then rebuilds the store from
the newest checkpoint plus the log, which together hold every acknowledged write (the log is
truncated only up to a kept checkpoint). Recovery itself does the same when it meets the damage.

Watches: the state machine writes every change into the range's bounded event history (same
store batch, see `range.events`; except the changes of an applier that keeps none,
`Applier.keeps_history`) and reports the changes of each applied batch; the writer task
hands them to `self.watch` (`range.watch.WatchHub`) right after apply, before answering callers.
Closing or failing the range ends its watchers (they resume elsewhere from their last revision).

Sessions: `self.sessions` (`range.sessions.SessionManager`) times the range's sessions on this
event loop; it starts when the range opens (every stored session gets a fresh TTL) and stops
when it closes. Only session create and end (close/expiry) go through `execute`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.manifest import Manifest
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import (
    CorruptionError,
    IllegalOpError,
    IndeterminateError,
    LogFencedError,
    RangeMovedError,
    StorageUnavailableError,
    StoreCorruptionError,
    TableKeeperError,
    UnavailableError,
)
from tablekeeper_server.log.api import LogBackend, LogRecord, LogWriter
from tablekeeper_server.range.apply import Appliers, Command, Response, applied_sequence
from tablekeeper_server.range.bookkeeper_reads import RESPONSE_BYTES_MAX_DEFAULT, ReadBudget
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.sessions import SessionManager
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.range.watch import WatchHub
from tablekeeper_server.storage.api import KvStore

log = logging.getLogger(__name__)

GROUP_RECORDS_MAX = 1024
QUEUE_DEPTH_MAX = 16 * 1024
REPLAY_BATCH = 1024
READ_AHEAD_BYTES_MAX = 16 * 1024 * 1024
"""At a takeover, records the log's open reads are applied while it goes on up to this many
payload bytes (held meanwhile); the replay after the open reads the rest again."""


class LogGapError(CorruptionError):
    """The log does not continue where the store stopped (records were truncated)."""


class RangeMetrics(Protocol):
    def wal_appended(self, seconds: float, records: int, payload_bytes: int) -> None: ...


class NullMetrics:
    def wal_appended(self, seconds: float, records: int, payload_bytes: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RangeName:
    """Identifies a range: (container, stream, range) as in BookKeeper."""

    container_id: int
    stream_id: int
    range_id: int
    log_name: str = field(init=False, repr=False, compare=False)
    """The range's log (and its checkpoints') name; also how logs and metrics name it."""

    def __post_init__(self) -> None:
        name = f"{self.container_id:05d}-{self.stream_id:012d}-{self.range_id:012d}"
        object.__setattr__(self, "log_name", name)


@dataclass(slots=True)
class _Pending:
    payload: bytes
    command: Command
    future: asyncio.Future[Response]


Outcome = Response | TableKeeperError
"""One command's outcome in `Range.submit_many`: its response, or the error it is refused with."""


@dataclass(slots=True)
class _PendingMany:
    """Several commands queued as one entry (`Range.submit_many`): one future for all of them."""

    payloads: list[bytes]
    commands: list[Command]
    future: asyncio.Future[list[Outcome]]
    refused: dict[int, TableKeeperError]
    """Positions (among the commands submitted) refused before queueing, with their errors."""

    def outcomes(self, answers: list[Outcome]) -> list[Outcome]:
        """The submitted commands' outcomes in order: `answers` (one per queued command) with
        the refused ones put back in their places."""
        if not self.refused:
            return answers
        queued = iter(answers)
        total = len(answers) + len(self.refused)
        return [self.refused[i] if i in self.refused else next(queued) for i in range(total)]


class Range:
    """One range of a table (or the root / a meta range). Lives on one event loop."""

    def __init__(
        self,
        name: RangeName,
        log_backend: LogBackend,
        store_factory: Callable[[], KvStore],
        clock: Clock,
        *,
        appliers: Appliers,
        ttl_seconds: int = 0,
        metrics: RangeMetrics | None = None,
        checkpointer: RangeCheckpointer | None = None,
        queue_depth_max: int = QUEUE_DEPTH_MAX,
        response_bytes_max: int = RESPONSE_BYTES_MAX_DEFAULT,
    ) -> None:
        self.name = name
        self._response_bytes_max = response_bytes_max
        self._checkpointer = checkpointer
        self._checkpoint_lock = asyncio.Lock()
        self._log_backend = log_backend
        self._store_factory = store_factory
        self._clock = clock
        self._ttl_seconds = ttl_seconds
        self._appliers = appliers
        self._metrics = metrics or NullMetrics()
        self._queue: asyncio.Queue[_Pending | _PendingMany | None]
        self._queue = asyncio.Queue(maxsize=queue_depth_max)
        self._writer: LogWriter | None = None
        self._store: KvStore | None = None
        self._sm: RangeStateMachine | None = None
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._writer_exited = False
        self._failure: str | None = None
        self._damaged = False
        """The store was found damaged: closing sets it aside, to be rebuilt on reopen."""
        self._fenced = False
        self._in_flight = 0
        self._opened_at = 0
        """Where the store stood when the range opened (before its replay)."""
        self.watch = WatchHub(name.log_name)
        self.sessions = SessionManager(name.log_name, self.execute, clock)

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Recover and start serving. Blocking work runs in a worker thread."""
        try:
            await asyncio.to_thread(self._recover)
        except CorruptionError as exc:
            # Table ranges open on first use, long after startup: say it in the server log too.
            log.error("range %s: refusing to serve: %s", self.name.log_name, exc.message)
            raise
        assert self._sm is not None
        self.watch.attach(self._sm.history, self._sm.applied_sequence)
        if self._sm.sealed is not None:
            self.watch.close(self._moved().message)
        self.sessions.start(self._sm.session_ttls(), self._sm.session_roles())
        self._accepting = True
        self._task = asyncio.create_task(self._write_loop(), name=f"range-{self.name.log_name}")

    def _recover(self) -> None:
        """Get a store (restoring a checkpoint if the local one is missing, unusable or older
        than the log), open the log as its only writer, replay, and keep all three."""
        checkpointer = self._checkpointer
        restored = False
        writer: LogWriter | None = None
        store: KvStore | None = None
        if checkpointer is not None and checkpointer.needs_restore():
            writer, store = self._restore_while_opening_log(checkpointer)
            restored = True
        if store is None:
            store = self._open_store(restored)
        try:
            try:
                applied = self._applied_of(store)
            except StoreCorruptionError as exc:
                if checkpointer is None or restored:
                    raise
                store = self._rebuild_store(store, checkpointer, exc.message)
                restored = True
                applied = self._applied_of(store)
            if not restored:
                self._opened_at = applied
            if writer is not None and writer.last_sequence < applied:
                # The log holds less than the checkpoint (e.g. it was lost and the checkpoint
                # kept): open it again numbering on from the checkpoint.
                writer.close_sync()
                writer = None
            if writer is None:
                writer = self._log_backend.open_writer(
                    self.name.log_name, min_last_sequence=applied
                )
            try:
                sm = self._replay(store, writer)
            except StoreCorruptionError as exc:
                # Checkpoint plus log hold everything (without a checkpoint the log was never
                # truncated and the rebuilt store replays all of it).
                if checkpointer is None or restored:
                    raise
                store = self._rebuild_store(store, checkpointer, exc.message)
                sm = self._replay(store, writer)
            except LogGapError as gap:
                if checkpointer is None or restored or not checkpointer.has_checkpoints():
                    raise
                # The local store is older than what the log still holds (a stale data
                # directory): a checkpoint covers the gap.
                store = self._rebuild_store(store, checkpointer, gap.message)
                sm = self._replay(store, writer)
        except BaseException:
            # Release the store (RocksDB's LOCK) so the next open attempt reports the real
            # problem again instead of "lock held" from this half-opened range.
            with contextlib.suppress(Exception):
                store.close()
            raise
        self._store, self._sm, self._writer = store, sm, writer

    def _restore_while_opening_log(
        self, checkpointer: RangeCheckpointer
    ) -> tuple[LogWriter, KvStore | None]:
        """Restore the newest checkpoint and, at the same time, open the log as its writer
        (fencing the previous one): at a takeover both wait on the network (the checkpoint
        store and the log backend), so one need not wait for the other. The records the open
        reads on its way to the log's end are handed over as it reads them; once the restore
        is done they are applied to the restored store while the open goes on. Returns the
        writer and that store (None if it did not open: the caller's open reports why)."""
        started = time.monotonic()
        read_ahead: queue.SimpleQueue[LogRecord | None] = queue.SimpleQueue()
        budget = READ_AHEAD_BYTES_MAX

        def on_record(record: LogRecord) -> None:
            nonlocal budget
            if budget >= 0:  # past it, the caller's replay reads the rest from the log
                budget -= len(record.payload)
                read_ahead.put(record)

        def open_writer() -> tuple[LogWriter, float]:
            try:
                writer = self._log_backend.open_writer(self.name.log_name, on_record=on_record)
                return writer, time.monotonic() - started
            finally:
                read_ahead.put(None)

        store: KvStore | None = None
        with ThreadPoolExecutor(1, thread_name_prefix=f"open-{self.name.log_name}") as pool:
            opening = pool.submit(open_writer)
            try:
                self._opened_at = checkpointer.restore() or 0
                restored_in = time.monotonic() - started
                store, applied = self._apply_read_ahead(read_ahead)
                writer, opened_in = opening.result()
            except BaseException:
                with contextlib.suppress(Exception):
                    opening.result()[0].close_sync()
                if store is not None:
                    with contextlib.suppress(Exception):
                        store.close()
                raise
        log.info(
            "range %s: restored in %.3fs while opening the log (opened at %d in %.3fs); "
            "%d records applied meanwhile",
            self.name.log_name,
            restored_in,
            writer.last_sequence,
            opened_in,
            applied,
        )
        return writer, store

    def _apply_read_ahead(
        self, read_ahead: queue.SimpleQueue[LogRecord | None]
    ) -> tuple[KvStore | None, int]:
        """Open the restored store and apply the records the log's open hands over, in
        sequence order from the store's position, until the open ends (None). Stops applying
        at anything else (a gap, a record that is no command, a store error) and leaves it to
        the replay after the open, which reports it. Returns the store (None if it would not
        open: the caller's open reports why) and how many records it applied."""
        store: KvStore | None = None
        applied = 0
        record: LogRecord | None = None
        try:
            store = self._store_factory()
            sm = self._state_machine(store)
            expected = sm.applied_sequence + 1
            batch: list[tuple[int, wal_pb2.WalCommand]] = []
            while (record := read_ahead.get()) is not None:
                if record.sequence < expected:
                    continue
                if record.sequence != expected:
                    break
                command = wal_pb2.WalCommand()
                command.ParseFromString(record.payload)
                batch.append((record.sequence, command))
                expected += 1
                if len(batch) >= REPLAY_BATCH or read_ahead.empty():
                    sm.apply_batch(batch)
                    applied += len(batch)
                    batch = []
            if batch:
                sm.apply_batch(batch)
                applied += len(batch)
        except Exception as exc:
            log.debug("range %s: applying ahead stopped: %r", self.name.log_name, exc)
        while record is not None:  # stopped early: the rest is the replay's, after the open
            record = read_ahead.get()
        return store, applied

    def _rebuild_store(
        self, store: KvStore, checkpointer: RangeCheckpointer, reason: str
    ) -> KvStore:
        """Close `store`, set it aside and open one restored from the newest checkpoint (an
        empty one if there is none yet: then the log still holds everything)."""
        with contextlib.suppress(Exception):
            store.close()
        checkpointer.set_aside_local_store(reason)
        self._opened_at = checkpointer.restore() or 0
        return self._open_store(True)

    def _open_store(self, restored: bool) -> KvStore:
        try:
            return self._store_factory()
        except CorruptionError as exc:
            checkpointer = self._checkpointer
            if checkpointer is None or restored or not checkpointer.has_checkpoints():
                raise
            checkpointer.set_aside_local_store(exc.message)
            checkpointer.restore()
            return self._store_factory()

    def _applied_of(self, store: KvStore) -> int:
        return applied_sequence(store)

    def _state_machine(self, store: KvStore) -> RangeStateMachine:
        return RangeStateMachine(
            store,
            self._appliers,
            ttl_seconds=self._ttl_seconds,
            history=EventHistory(store),
            response_bytes_max=self._response_bytes_max,
        )

    def _replay(self, store: KvStore, writer: LogWriter) -> RangeStateMachine:
        sm = self._state_machine(store)
        if sm.applied_sequence > writer.last_sequence:
            raise CorruptionError(
                f"log {self.name.log_name} ends at {writer.last_sequence} but the store has "
                f"applied up to {sm.applied_sequence}: the log lost acknowledged records"
            )
        started = time.monotonic()
        replayed = 0
        batch: list[tuple[int, wal_pb2.WalCommand]] = []
        expected = sm.applied_sequence + 1
        for record in self._log_backend.read(self.name.log_name, expected):
            if replayed == 0 and not batch and record.sequence != expected:
                raise LogGapError(
                    f"log {self.name.log_name} starts at {record.sequence} but the store needs "
                    f"{expected} next (records {expected}..{record.sequence - 1} were truncated "
                    "after a checkpoint that this store does not include)"
                )
            command = wal_pb2.WalCommand()
            try:
                command.ParseFromString(record.payload)
            except Exception as exc:
                raise CorruptionError(
                    f"log {self.name.log_name}: record {record.sequence} is not a command: {exc}"
                ) from exc
            batch.append((record.sequence, command))
            if len(batch) >= REPLAY_BATCH:
                sm.apply_batch(batch)
                replayed += len(batch)
                batch = []
        if batch:
            sm.apply_batch(batch)
            replayed += len(batch)
        if sm.applied_sequence < writer.last_sequence:
            raise LogGapError(
                f"log {self.name.log_name} ends at {writer.last_sequence} but replay stopped at "
                f"{sm.applied_sequence}: records are missing"
            )
        if replayed:
            log.info(
                "range %s: replayed %d commands up to %d in %.3fs",
                self.name.log_name,
                replayed,
                sm.applied_sequence,
                time.monotonic() - started,
            )
        return sm

    async def checkpoint(self, *, force: bool = False) -> Manifest | None:
        """Checkpoint the range now (if anything changed since the last one, or `force`) and
        truncate its log. None if the range has no checkpointer or nothing to do."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            return None
        async with self._checkpoint_lock:
            if self._store is None or self._sm is None or self.failed:
                return None
            stats = checkpointer.stats
            if not force and stats.count and stats.applied_sequence == self._sm.applied_sequence:
                return None
            return await _to_thread_to_the_end(checkpointer.checkpoint, self._store)

    @property
    def checkpointer(self) -> RangeCheckpointer | None:
        return self._checkpointer

    async def compact_store(self) -> bool:
        """Rewrite the range's store files without deleted and overwritten data (etcd's
        Defragment), in a thread, while the range serves; under the checkpoint lock, so a close
        waits for it. False if the store is not open."""
        async with self._checkpoint_lock:
            if self._store is None or self.failed:
                return False
            await _to_thread_to_the_end(self._store.compact)
            return True

    def wal_bytes(self) -> int:
        return self._log_backend.size_bytes(self.name.log_name)

    async def close(self) -> None:
        """Stop accepting, finish what is queued, then close the log and the store."""
        self._accepting = False
        self.watch.close(f"range {self.name.log_name} closed")
        await self.sessions.stop()
        if self._task is not None:
            await self._queue.put(None)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        async with self._checkpoint_lock:  # let a running checkpoint finish first
            pass
        if self._writer is not None:
            await self._writer.close()
            self._writer = None
        if self._store is not None:
            store = self._store
            self._store = None
            damage = store.damage
            if damage is None and not self._damaged:
                await asyncio.to_thread(_flush_and_close, store)
                return
            # Nothing of a damaged store is worth a flush: set it aside, so that reopening
            # rebuilds it from the checkpoint and the log.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(store.close)
            if self._checkpointer is not None:
                reason = damage or self._failure or "damaged"
                await asyncio.to_thread(self._checkpointer.set_aside_local_store, reason)

    @property
    def applied_sequence(self) -> int:
        return self._sm.applied_sequence if self._sm else 0

    @property
    def checkpointed_sequence(self) -> int:
        """The position of the range's newest checkpoint as far as this server knows: its own
        last checkpoint of the range, else where the store stood when the range opened (the
        restored checkpoint's position, or the local store's). `applied_sequence` minus this
        is about what a takeover would replay."""
        checkpointer = self._checkpointer
        if checkpointer is not None and checkpointer.stats.count:
            return checkpointer.stats.applied_sequence
        return self._opened_at

    def estimate_num_keys(self) -> int:
        return self._store.estimate_num_keys() if self._store else 0

    # ------------------------------------------------------------------ serving

    async def execute(self, command: Command) -> Response:
        """Append `command` durably, apply it, and return its response.

        Raises `UnavailableError` if the range is not accepting (closing or failed): nothing was
        appended, so retrying elsewhere is safe. Raises `ResourceLimitError` if its previous
        values (prev_kv) would not fit in one response (nothing appended; see
        `RangeStateMachine.check`). Raises `IndeterminateError` if the log failed
        during the append that carried this command.
        """
        future = self._prepare(command)
        await self._queue.put(_Pending(command.SerializeToString(), command, future))
        return await self._queued(future)

    def submit_many(self, commands: Sequence[Command]) -> asyncio.Future[list[Outcome]] | None:
        """Queue `commands` now, in order, as one entry of the write queue (they join one group
        commit, or consecutive ones) without waiting, and return the future of their outcomes
        in order: each command's response, or the error `execute` would raise for it alone (its
        prev_kvs over the bound: not queued; a rejection by the apply). None when the queue is
        full (nothing queued: `execute` each, which waits for room). Raises what `execute`
        raises for the range itself (not serving, split) before queueing anything; a failure
        of the log fails the future (every command's outcome unknown, as for `execute`)."""
        if self._queue.full():
            return None
        self._check_serving()
        now = self._clock.now_ms()
        sm = self._sm
        queued: list[Command] = []
        refused: dict[int, TableKeeperError] = {}
        for position, command in enumerate(commands):
            command.timestamp_ms = now
            if sm is not None:
                try:
                    sm.check(command)
                except TableKeeperError as exc:
                    refused[position] = exc
                    continue
            queued.append(command)
        future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        pending = _PendingMany(
            [command.SerializeToString() for command in queued], queued, future, refused
        )
        if not queued:
            future.set_result(pending.outcomes([]))
            return future
        self._queue.put_nowait(pending)
        self._queued(future)
        return future

    def _check_serving(self) -> None:
        self._notice_damage()
        if not self._accepting:
            raise UnavailableError(self._failure or f"range {self.name.log_name} is not serving")
        if self._sm is not None and self._sm.sealed is not None:
            raise self._moved()

    def _prepare(self, command: Command) -> asyncio.Future[Response]:
        self._check_serving()
        command.timestamp_ms = self._clock.now_ms()
        if self._sm is not None:
            self._sm.check(command)  # ResourceLimitError before anything is logged
        return asyncio.get_running_loop().create_future()

    def _queued(self, future: asyncio.Future[_T]) -> asyncio.Future[_T]:
        self._in_flight += 1
        future.add_done_callback(self._answered)
        if self._writer_exited:
            # We waited for room in the queue while the writer stopped (the range failed or
            # closed): nobody will take this command. It was never appended.
            self._refuse_queued()
        return future

    def read(
        self, request: kv_rpc_pb2.RangeRequest, budget: ReadBudget | None = None
    ) -> kv_rpc_pb2.RangeResponse:
        """Serve a Range request from the applied state; `budget`: see `ReadBudget`."""
        sm = self.applied_state()
        try:
            return sm.read(request, self._clock.now_ms(), budget)
        except StoreCorruptionError:
            self._notice_damage()
            raise

    def applied_state(self) -> RangeStateMachine:
        """The applied state, for front-ends that read it their own way (the etcd API). Read it
        synchronously on the range's loop: what it holds is exactly `applied_sequence`. (A
        read that finds the store damaged raises `StoreCorruptionError`; the range notices.)"""
        self._notice_damage()
        if self._sm is None or not self._accepting:
            raise UnavailableError(self._failure or f"range {self.name.log_name} is not serving")
        if self._sm.sealed is not None:
            raise self._moved()
        return self._sm

    # ------------------------------------------------------------------ split

    @property
    def sealed(self) -> tuple[int, ...] | None:
        """The children of this range once a split sealed it (it refuses every request from
        then on), else None."""
        return None if self._sm is None else self._sm.sealed

    def _moved(self) -> RangeMovedError:
        children = self.sealed or ()
        return RangeMovedError(
            f"range {self.name.log_name} was split: its keys moved to ranges "
            + ", ".join(map(str, children)),
            children,
        )

    async def seal(self, children: tuple[int, ...], start_hashes: tuple[int, ...] = ()) -> int:
        """Seal the range for a split into `children` (a command in its log, so it stays
        sealed across restarts; sealing again with the same children is a no-op) and return
        its applied position. `start_hashes`: the first routing hash of each child (without
        them a range holding sessions refuses). Its watchers end (they resume on the
        children); every later request is refused with `RangeMovedError`. Raises
        `IllegalOpError` if the range holds what a split cannot divide (etcd or Oxia
        bookkeeping, a session whose keys the split divides), or was sealed for other
        children."""
        if self.sealed is None:
            seal = wal_pb2.RangeSeal(children=children, start_hashes=start_hashes)
            command = wal_pb2.WalCommand(seal=seal)
            await self.execute(command)
        if self.sealed != children:
            raise IllegalOpError(
                f"range {self.name.log_name} is sealed for ranges {self.sealed}, not {children}"
            )
        self.watch.close(self._moved().message)
        return self.applied_sequence

    async def _write_loop(self) -> None:
        try:
            await self._write_groups()
        finally:
            # Whatever is still queued (behind close's sentinel, or queued after a failure)
            # was never appended: answer it, and every caller that enqueues from now on.
            self._writer_exited = True
            self._refuse_queued()

    def _refuse_queued(self) -> None:
        reason = self._failure or f"range {self.name.log_name} closed"
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None and not item.future.done():
                item.future.set_exception(UnavailableError(reason))

    async def _write_groups(self) -> None:
        assert self._writer is not None and self._sm is not None
        writer, sm = self._writer, self._sm
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            group = [first]
            payloads: list[bytes] = []
            commands: list[Command] = []
            _add_records(first, payloads, commands)
            while len(payloads) < GROUP_RECORDS_MAX and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stopping = True
                    break
                group.append(item)
                _add_records(item, payloads, commands)
            started = time.perf_counter()
            try:
                last = await writer.append(payloads)
            except LogFencedError as exc:
                # A newer owner has the log: no later group can be appended. This one may have
                # reached the log before the fence if it was already sent.
                self._fenced = True
                self._fail(
                    group,
                    f"log fenced by a newer writer: {exc}",
                    indeterminate=exc.maybe_persisted,
                )
                return
            except StorageUnavailableError as exc:
                # Out of disk space, descriptors, ...: the log knows whether the group may have
                # reached the disk; if not, its callers may retry (once the range reopens).
                self._fail(group, f"log append failed: {exc}", indeterminate=exc.maybe_persisted)
                return
            except Exception as exc:
                self._fail(group, f"log append failed: {exc}", indeterminate=True)
                return
            self._metrics.wal_appended(
                time.perf_counter() - started, len(payloads), sum(map(len, payloads))
            )
            first_sequence = last - len(payloads) + 1
            if first_sequence != sm.applied_sequence + 1:
                # The log numbered this group so that it does not continue what was applied:
                # applying it would answer SUCCESS for commands at the wrong positions.
                self._fail(
                    group,
                    f"log placed records {first_sequence}..{last} after applied position "
                    f"{sm.applied_sequence}",
                    indeterminate=True,
                )
                return
            try:
                responses = sm.apply_batch(
                    [(first_sequence + i, command) for i, command in enumerate(commands)]
                )
            except StoreCorruptionError as exc:
                # The group is in the log: rebuilding the store (on reopen) applies it.
                self._damaged = True
                self._fail(group, f"apply found the store damaged: {exc}", indeterminate=True)
                return
            except Exception as exc:
                log.exception("range %s: apply failed", self.name.log_name)
                self._fail(group, f"apply failed: {exc}", indeterminate=True)
                return
            self.watch.publish(sm.last_events, sm.applied_sequence)
            rejected = sm.last_rejections  # commands that changed nothing, answered with an error
            index = 0
            for pending in group:
                if isinstance(pending, _Pending):
                    if not pending.future.done():
                        if index in rejected:
                            pending.future.set_exception(rejected[index])
                        else:
                            pending.future.set_result(responses[index])
                    index += 1
                    continue
                end = index + len(pending.commands)
                answers: list[Outcome] = list(responses[index:end])
                if rejected:
                    for at in range(index, end):
                        if at in rejected:
                            answers[at - index] = rejected[at]
                if not pending.future.done():
                    pending.future.set_result(pending.outcomes(answers))
                index = end

    def _fail(
        self, group: list[_Pending | _PendingMany], reason: str, *, indeterminate: bool
    ) -> None:
        """Stop the range: answer the in-flight group and everything queued behind it."""
        self._accepting = False
        self._failure = f"range {self.name.log_name} failed: {reason}"
        log.error(self._failure)
        self.watch.close(self._failure)
        for pending in group:
            if not pending.future.done():
                error: TableKeeperError = (
                    IndeterminateError(self._failure)
                    if indeterminate
                    else UnavailableError(self._failure)
                )
                pending.future.set_exception(error)
        self._refuse_queued()

    def _answered(self, _: asyncio.Future[Any]) -> None:
        self._in_flight -= 1

    @property
    def idle(self) -> bool:
        """Nothing would be cut off by closing the range now: no command queued or unanswered,
        no checkpoint running, no watcher, no live session (the server closes idle ranges to
        bound its open files; they reopen on their next request)."""
        return (
            self._in_flight == 0
            and self._queue.empty()
            and not self._checkpoint_lock.locked()
            and self.watch.watchers == 0
            and len(self.sessions) == 0
        )

    def _notice_damage(self) -> None:
        """Stop serving once any reader found the store damaged (see module doc)."""
        store = self._store
        if self._damaged or store is None or store.damage is None:
            return
        self._damaged = True
        self._accepting = False
        self._failure = (
            f"range {self.name.log_name} failed: its store is damaged ({store.damage}); it is "
            "rebuilt from its checkpoint and log when the range reopens"
        )
        log.error(self._failure)
        self.watch.close(self._failure)
        # The writer stops at close's sentinel; what is queued meanwhile is answered then.

    @property
    def failed(self) -> bool:
        self._notice_damage()
        return self._failure is not None

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def fenced(self) -> bool:
        """Another writer (another server, with a shared log) took the range's log over."""
        return self._fenced


_T = TypeVar("_T")


async def _to_thread_to_the_end(fn: Callable[..., _T], *args: Any) -> _T:
    """`asyncio.to_thread`, except that a cancelled caller still waits for the thread to end
    (a thread cannot be stopped): the checkpoint lock held around a checkpoint or a compaction
    is then released only once nothing uses the store any more, so a close that follows a
    cancelled checkpoint (a shutdown cancels the checkpoint policy) never closes the store
    under it."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait({work})
        if not work.cancelled() and (exc := work.exception()) is not None:
            log.warning("%s failed after its caller was cancelled: %r", fn.__qualname__, exc)
        raise


def _flush_and_close(store: KvStore) -> None:
    try:
        store.flush()
    finally:
        store.close()  # a failed flush (full disk) must not keep the store and its lock open


def _add_records(
    item: _Pending | _PendingMany, payloads: list[bytes], commands: list[Command]
) -> None:
    """Add a queue entry's payloads and commands to its group's."""
    if isinstance(item, _Pending):
        payloads.append(item.payload)
        commands.append(item.command)
    else:
        payloads.extend(item.payloads)
        commands.extend(item.commands)
