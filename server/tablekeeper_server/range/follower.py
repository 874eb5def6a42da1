"""A follower: a read-only copy of a range on a server that does not own it.

It restores the range's newest checkpoint into a directory of its own, then applies the range's
log as the owner appends to it (`LogBackend.follow`), with the same state machine, so its store
passes through exactly the states the owner's did, in the same order. It never writes the log,
so it never fences the owner. Reads are served from what it has applied:

- **Staleness.** `caught_up_at` is when the follower last asked the log for more and found
  nothing it had not applied (the instant the question was asked, not answered). Every write
  acknowledged before that instant is durable in the log by then, so it is applied here: a
  read's staleness is the time since, an upper bound on how much older its answer is than the
  log. Once it has reached the end, a follower asks again after `IDLE_POLL_S`, or at once
  for a read that needs a fresher answer.
- **Bounded-staleness reads** (`max_staleness_s` > 0) first wait for a newer catch-up when the
  last one is older than the bound.
- **Linearizable reads** (`max_staleness_s` = 0) wait for a catch-up that began after the read
  did: a write acknowledged before the read began was in the log before that question, so the
  read sees it, as a read from the owner would (etcd's ReadIndex, with the log in the leader's
  place). "After" is decided by numbering the questions, not by the time: each poll of the log
  gets the next number when it begins, and the read waits for one numbered above the last that
  had begun when it arrived (so it holds on any clock, a simulated one included).
- **Monotonic reads across servers**: `min_applied` (the highest position a client has seen
  for this range, from any server) makes the read wait until the follower has applied that far.

What the log holds is committed even before its writer hears so (the next owner replays it
too), so a follower never shows a write that could be lost; it may show one whose writer has
not been answered yet, as a read from the owner started a moment later would.

A follower opens by catching up to the log's end before its first read, so a follower reopened
later (from an older checkpoint) never answers older than one that served before. When the log
was truncated past what it applied (the owner checkpointed meanwhile), it restores the newest
checkpoint again, which is at least as new. Sessions and TTLs: the owner logs every session's
end, so the follower only applies; keys that expired by TTL are hidden at read time, as on the
owner. A split's seal reaches the follower through the log: from then it answers "range moved".

`hand_over` gives the follower's store to this server's own range of the same name when this
server becomes the range's owner (a failover): the range then opens with the store almost up to
date instead of restoring a checkpoint and replaying the log since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import (
    CorruptionError,
    RangeMovedError,
    TableKeeperError,
    UnavailableError,
)
from tablekeeper_server.log.api import LogBackend, LogFollower, LogRecord
from tablekeeper_server.range.apply import Appliers
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.events import EventHistory
from tablekeeper_server.range.replica import RangeName
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.api import KvStore

log = logging.getLogger(__name__)

FOLLOW_BATCH = 1024
"""Records applied per poll of the log at most (one store write batch)."""
IDLE_POLL_S = 0.2
"""How long a follower that reached the log's end waits before asking again (unless a read
needs it sooner): the staleness of a follower nobody asks for fresher answers."""
CATCH_UP_TIMEOUT_S = 5.0
"""How long a read waits for the follower to catch up before it gives up (UNAVAILABLE)."""


@dataclass(frozen=True, slots=True)
class FollowerRead:
    response: kv_rpc_pb2.RangeResponse
    applied: int
    """The range's log position the answer reflects."""
    staleness_s: float
    """Every write acknowledged this long before the read is in the answer (see module doc)."""


class Follower:
    """The follower of one range (see the module docstring). Lives on one event loop."""

    def __init__(
        self,
        name: RangeName,
        store_path: Path,
        *,
        log_backend: LogBackend,
        store_factory: Callable[[Path], KvStore],
        checkpointer: RangeCheckpointer | None,
        clock: Clock,
        appliers: Appliers,
        ttl_seconds: int = 0,
        idle_poll_s: float = IDLE_POLL_S,
    ) -> None:
        self.name = name
        self.store_path = store_path
        self._log = log_backend
        self._store_factory = store_factory
        self._checkpointer = checkpointer
        self._clock = clock
        self._ttl_seconds = ttl_seconds
        self._appliers = appliers
        self._idle_poll_s = idle_poll_s
        self._store: KvStore | None = None
        self._sm: RangeStateMachine | None = None
        self._tail: LogFollower | None = None
        self._task: asyncio.Task[None] | None = None
        self._progress = asyncio.Condition()
        self._poke = asyncio.Event()
        self._polls = 0
        """Polls of the log begun so far; each poll's number is the count when it began."""
        self._asking: int | None = None
        """The number of the poll of the log under way (None between polls)."""
        self._caught_up_poll = 0
        """The number of the last poll that found nothing unapplied (0: none yet)."""
        self._closing = False
        self._restoring = False
        self.failure: str | None = None
        """Why the follower stopped following (it then refuses reads), or None."""
        self.caught_up_at = -math.inf
        """`clock.monotonic_s()` when a check of the log last found nothing unapplied (when
        it began)."""
        self.last_used = clock.monotonic_s()
        self.restores = 0
        """How many times it restored a checkpoint (1 at open; more after the log was cut)."""

    # ------------------------------------------------------------------ lifecycle

    async def open(self, timeout_s: float = CATCH_UP_TIMEOUT_S * 6) -> None:
        """Restore, start following and return once caught up with the log's end."""
        await asyncio.to_thread(self._restore)
        self._task = asyncio.create_task(self._follow(), name=f"follow-{self.name.log_name}")
        opened = self._next_poll()
        try:
            await asyncio.wait_for(self._caught_up_since(opened), timeout_s)
        except BaseException:
            await self.close()
            raise

    def _restore(self) -> None:
        """(Re)build the store from the newest checkpoint (empty without one) and start reading
        the log after its position. Blocking."""
        self._close_files()
        shutil.rmtree(self.store_path, ignore_errors=True)
        self.store_path.parent.mkdir(parents=True, exist_ok=True)
        if self._checkpointer is not None:
            self._checkpointer.restore()
        self._store = self._store_factory(self.store_path)
        self._sm = RangeStateMachine(
            self._store,
            self._appliers,
            ttl_seconds=self._ttl_seconds,
            history=EventHistory(self._store),
        )
        self._tail = self._log.follow(self.name.log_name, self._sm.applied_sequence + 1)
        self.restores += 1
        log.info(
            "follower of range %s: restored at %d",
            self.name.log_name,
            self._sm.applied_sequence,
        )

    async def close(self) -> None:
        """Stop following and close the store (its directory is left for `discard`)."""
        self._closing = True
        self._poke.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await asyncio.to_thread(self._close_files)
        async with self._progress:
            self._progress.notify_all()

    def _close_files(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def discard(self) -> None:
        """Delete the follower's directory (after `close`). Blocking."""
        shutil.rmtree(self.store_path, ignore_errors=True)

    async def hand_over(self, path: Path) -> int:
        """Close and move the store to `path` (the range's own store, whose owner this server
        has just become), replacing whatever is there; return the position it holds."""
        await self.close()
        applied = self.applied_sequence

        def move() -> None:
            if path.exists():
                shutil.rmtree(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.store_path, path)

        await asyncio.to_thread(move)
        return applied

    # ------------------------------------------------------------------ following

    @property
    def applied_sequence(self) -> int:
        return self._sm.applied_sequence if self._sm is not None else 0

    @property
    def serving(self) -> bool:
        return self.failure is None and not self._closing

    async def _follow(self) -> None:
        while not self._closing:
            self._poke.clear()  # this poll answers every read that asked before it began
            self._polls += 1
            poll = self._asking = self._polls
            asked_at = self._clock.monotonic_s()
            try:
                assert self._tail is not None
                try:
                    polled = await asyncio.to_thread(self._tail.poll, FOLLOW_BATCH)
                finally:
                    self._asking = None
                if polled.records and polled.records[0].sequence != self.applied_sequence + 1:
                    await self._log_was_cut(polled.records[0].sequence)
                    continue
                self._apply(polled.records)
            except UnavailableError as exc:
                log.warning("follower of range %s: %s", self.name.log_name, exc.message)
                await self._idle()
                continue
            except Exception as exc:
                message = exc.message if isinstance(exc, TableKeeperError) else repr(exc)
                log.error("follower of range %s stopped: %s", self.name.log_name, message)
                self.failure = f"the follower of range {self.name.log_name} stopped: {message}"
                async with self._progress:
                    self._progress.notify_all()
                return
            async with self._progress:
                if polled.at_end:
                    self.caught_up_at = asked_at
                    self._caught_up_poll = poll
                self._progress.notify_all()
            if polled.at_end:  # (else more is there already: read on)
                await self._idle()

    async def _idle(self) -> None:
        await self._clock.wait(self._poke, self._idle_poll_s)

    async def _log_was_cut(self, found: int) -> None:
        before = self.applied_sequence
        log.info(
            "follower of range %s: the log continues at %d, not %d (truncated after a "
            "checkpoint): restoring the newest checkpoint",
            self.name.log_name,
            found,
            before + 1,
        )
        self._restoring = True  # (reads wait: the store is replaced in a thread)
        try:
            await asyncio.to_thread(self._restore)
        finally:
            self._restoring = False
        if self.applied_sequence < before:
            raise CorruptionError(
                f"the newest checkpoint of range {self.name.log_name} is at "
                f"{self.applied_sequence}, before the {before} this follower applied"
            )

    def _apply(self, records: list[LogRecord]) -> None:
        if not records:
            return
        assert self._sm is not None
        batch = []
        for record in records:
            command = wal_pb2.WalCommand()
            command.ParseFromString(record.payload)
            batch.append((record.sequence, command))
        self._sm.apply_batch(batch)

    # ------------------------------------------------------------------ reads

    def _next_poll(self) -> int:
        """The number the next poll of the log will have: a poll numbered so or higher begins
        after this call."""
        return self._polls + 1

    async def _caught_up_since(self, poll: int) -> None:
        """Wait for a check of the log numbered `poll` or higher (one that began after
        `_next_poll()` gave `poll`) that found nothing unapplied, and for no restore to be
        under way."""
        async with self._progress:
            while self._caught_up_poll < poll or self._restoring:
                self._check_serving()
                if self._asking is None or self._asking < poll:
                    self._poke.set()  # (a poll that began since will do: no need for another)
                await self._progress.wait()

    async def _applied_at_least(self, position: int, *, poke: bool = True) -> None:
        """Wait until the follower has applied `position` (`poke`: asking the log at once
        rather than at its next idle poll)."""
        async with self._progress:
            while self.applied_sequence < position or self._restoring:
                self._check_serving()
                if poke:
                    self._poke.set()
                await self._progress.wait()

    def _check_serving(self) -> None:
        if self.failure is not None:
            raise UnavailableError(self.failure)
        if self._closing:
            raise UnavailableError(f"the follower of range {self.name.log_name} closed")

    async def read(
        self,
        request: kv_rpc_pb2.RangeRequest,
        *,
        max_staleness_s: float,
        min_applied: int = 0,
        timeout_s: float = CATCH_UP_TIMEOUT_S,
    ) -> FollowerRead:
        """Serve a Range request once the follower is no staler than `max_staleness_s` (0: a
        linearizable read) and has applied `min_applied`. Raises `UnavailableError` if it
        cannot get there within `timeout_s`, `RangeMovedError` once a split sealed the range."""
        self.last_used = began = self._clock.monotonic_s()
        after = self._next_poll()
        self._check_serving()
        try:
            # Linearizable (0): always a poll begun after the read, whatever the clock says.
            stale = max_staleness_s <= 0 or began - self.caught_up_at > max_staleness_s
            if stale or self._restoring:
                await asyncio.wait_for(self._caught_up_since(after), timeout_s)
            if self.applied_sequence < min_applied:
                await asyncio.wait_for(self._applied_at_least(min_applied), timeout_s)
        except TimeoutError:
            raise UnavailableError(
                f"the follower of range {self.name.log_name} did not catch up with the log "
                f"within {timeout_s:g}s (it has applied {self.applied_sequence})"
            ) from None
        self._check_serving()
        sm = self._sm
        assert sm is not None
        if sm.sealed is not None:
            raise RangeMovedError(
                f"range {self.name.stream_id}/{self.name.range_id} was split", sm.sealed
            )
        response = sm.read(request, self._clock.now_ms())
        staleness = max(0.0, self._clock.monotonic_s() - self.caught_up_at)
        return FollowerRead(response, sm.applied_sequence, staleness)
