"""The followers a server keeps: read-only copies of ranges that other servers own.

A follower (`range.follower`) is opened on the first follower read of its range that reaches this
server, and closed after `IDLE_CLOSE_S` without one, or beyond `max_open` (the least recently
read first). Their stores live under `<data dir>/followers`, which is emptied when the server
starts: a follower restores afresh, it keeps nothing worth trusting across restarts.

Followers need a log that other servers can read while its owner writes (Pulsar) and the
checkpoints in a store they share; `main` builds this only then.

When this server becomes the owner of a range it follows (a failover, or a container moving
here), the container's opening of that range takes the follower's store (`hand_over`): the range
then opens almost up to date, instead of restoring the checkpoint and replaying the log since.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path

from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.range.apply import Appliers
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.follower import Follower
from tablekeeper_server.range.replica import RangeName
from tablekeeper_server.storage.api import StoreOpener

log = logging.getLogger(__name__)

IDLE_CLOSE_S = 300.0
"""A follower nobody read from for this long is closed."""
MAX_OPEN = 64
"""Followers open at once at most, by default."""
SWEEP_S = 10.0


class Followers:
    def __init__(
        self,
        root: Path,
        *,
        log_backend: LogBackend,
        store_factory: StoreOpener,
        checkpoint_store: CheckpointStore | None,
        clock: Clock,
        appliers: Appliers,
        max_open: int = MAX_OPEN,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        self.root = root
        self._log = log_backend
        self._store_factory = store_factory
        self._checkpoints = checkpoint_store
        self._clock = clock
        self._appliers = appliers
        self._max_open = max_open
        self._idle_close_s = idle_close_s
        self._open: dict[str, Follower] = {}
        self._opening: dict[str, asyncio.Task[Follower]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.handed_over = 0
        """Followers whose store a range of this server took over (failovers sped up)."""

    def start(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._sweeper = asyncio.create_task(self._sweep(), name="followers-sweep")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for task in list(self._opening.values()):
            task.cancel()
        for follower in list(self._open.values()):
            await self._drop(follower)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def staleness_max_s(self) -> float:
        """The stalest open follower's staleness (time since it last caught up); 0 with none."""
        now = self._clock.monotonic_s()
        return max((now - f.caught_up_at for f in self._open.values()), default=0.0)

    async def get(self, name: RangeName, ttl_seconds: int) -> Follower:
        """The follower of range `name` here, opened (and caught up) if it was not."""
        key = name.log_name
        follower = self._open.get(key)
        if follower is not None and follower.serving:
            follower.last_used = self._clock.monotonic_s()
            return follower
        if follower is not None:  # it stopped (see its failure): start over
            await self._drop(follower)
        task = self._opening.get(key)
        if task is None:
            task = asyncio.create_task(self._new(name, ttl_seconds))
            self._opening[key] = task
            task.add_done_callback(lambda _: self._opening.pop(key, None))
        return await asyncio.shield(task)

    async def _new(self, name: RangeName, ttl_seconds: int) -> Follower:
        while len(self._open) >= self._max_open:
            oldest = min(self._open.values(), key=lambda f: f.last_used)
            await self._drop(oldest)
        path = self.root / name.log_name
        checkpointer = None
        if self._checkpoints is not None:
            checkpointer = RangeCheckpointer(
                name.log_name, path, self._store_factory, self._checkpoints, self._log, self._clock
            )
        follower = Follower(
            name,
            path,
            log_backend=self._log,
            store_factory=self._store_factory,
            checkpointer=checkpointer,
            clock=self._clock,
            appliers=self._appliers,
            ttl_seconds=ttl_seconds,
        )
        started = self._clock.monotonic_s()
        await follower.open()
        self._open[name.log_name] = follower
        log.info(
            "following range %s (at %d, ready in %.3fs)",
            name.log_name,
            follower.applied_sequence,
            self._clock.monotonic_s() - started,
        )
        return follower

    async def hand_over(self, log_name: str, path: Path) -> bool:
        """If a follower of `log_name` is open here, move its store to `path` (the range this
        server now owns is about to open there) and forget it; whether it did."""
        task = self._opening.get(log_name)
        if task is not None:  # opening now: let it finish, then hand it over
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)
        follower = self._open.pop(log_name, None)
        if follower is None or not follower.serving:
            if follower is not None:
                await self._drop(follower)
            return False
        try:
            applied = await follower.hand_over(path)
        except Exception as exc:
            log.warning("range %s: could not take the follower's store: %s", log_name, exc)
            await asyncio.to_thread(follower.discard)
            return False
        self.handed_over += 1
        log.info("range %s: taking over its follower's store (at %d)", log_name, applied)
        return True

    async def _drop(self, follower: Follower) -> None:
        if self._open.get(follower.name.log_name) is follower:
            del self._open[follower.name.log_name]
        await follower.close()
        await asyncio.to_thread(follower.discard)

    async def _sweep(self) -> None:
        while True:
            await self._clock.sleep(SWEEP_S)
            now = self._clock.monotonic_s()
            for follower in list(self._open.values()):
                if now - follower.last_used > self._idle_close_s or not follower.serving:
                    log.info("closing the follower of range %s (idle)", follower.name.log_name)
                    await self._drop(follower)
