"""A storage container: the unit of placement. It owns its meta range, the root range (container
0 only), and the table ranges placed on it, opened lazily on first use.

Open table ranges are bounded per server (`OpenRangeLimit`, `--max-open-ranges`): each holds
about eight file descriptors (its RocksDB files, its log's segment and lock). Opening one more
first closes the least recently used *idle* table ranges of any container (`Range.idle`: nothing
in flight, no watcher, no session); a closed range reopens on its next request, replaying its
log from what its store flushed at close. Root and meta ranges are never counted or closed.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import shutil
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tablekeeper_server.catalog.meta import (
    CONTAINER_META_RANGE_ID,
    CONTAINER_META_STREAM_ID,
    MetaCatalog,
)
from tablekeeper_server.catalog.root import RootCatalog
from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.container.followers import Followers
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.errors import StorageUnavailableError, UnavailableError
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.range.apply import Appliers
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.replica import Range, RangeMetrics, RangeName
from tablekeeper_server.range.watch import HistoryBudget, WatchHub
from tablekeeper_server.storage.api import StoreOpener

log = logging.getLogger(__name__)

ROOT_CONTAINER_ID = 0
ROOT_STREAM_ID = 0
ROOT_RANGE_ID = 0


REMOTE_ROUTE_TTL_S = 10.0
"""How long a route read from another server is trusted: a table deleted there stops being
served here, and a split there is seen here, within this time (deletes and splits on this
server drop the route at once, and a request that meets a split range re-reads it)."""

RangeKey = tuple[int, int, int]
"""(container id, stream id, range id)"""

_EVICTION_LOG_INTERVAL_S = 10.0


class OpenRangeLimit:
    """At most `max_open` table ranges open in this server at once (0: no bound), shared by
    all its containers. Least recently used first; only idle ranges are closed, so the bound
    is exceeded (and said so) while every open range is busy."""

    def __init__(self, max_open: int = 0, clock: Clock | None = None) -> None:
        self.max_open = max_open
        self._clock = clock
        """Only paces the eviction log lines (None: each is logged; `main` passes its clock)."""
        self.evictions = 0
        """Table ranges closed to stay within the bound, since start."""
        self._open: OrderedDict[RangeKey, tuple[StorageContainer, Range]] = OrderedDict()
        self._reserved = 0
        self._logged_at = 0.0
        self._logged_evictions = 0
        self._over_logged = False

    @property
    def open_count(self) -> int:
        """Open table ranges (including ones being opened now)."""
        return len(self._open) + self._reserved

    def touch(self, key: RangeKey) -> None:
        if key in self._open:
            self._open.move_to_end(key)

    def forget(self, key: RangeKey, range_: Range | None = None) -> None:
        entry = self._open.get(key)
        if entry is not None and (range_ is None or entry[1] is range_):
            del self._open[key]

    async def reserve(self, key: RangeKey) -> None:
        """Make room for opening `key` (closing idle ranges), then count it as open; the caller
        must call `opened` or `release` once the open ends."""
        while self.max_open and self.open_count >= self.max_open:
            victim = next(
                (k for k, (_, r) in self._open.items() if k != key and r.idle and not r.fenced),
                None,
            )
            if victim is None:
                if not self._over_logged:
                    self._over_logged = True
                    log.warning(
                        "%d table ranges open, over --max-open-ranges %d: none of them is idle "
                        "(in-flight writes, watches or sessions)",
                        self.open_count + 1,
                        self.max_open,
                    )
                break
            container, range_ = self._open.pop(victim)
            self.evictions += 1
            self._log_eviction(range_)
            await container.close_idle_range(victim[1:], range_)
        else:
            self._over_logged = False
        self._reserved += 1

    def opened(self, key: RangeKey, container: StorageContainer, range_: Range) -> None:
        self._reserved -= 1
        self._open[key] = (container, range_)

    def release(self) -> None:
        self._reserved -= 1

    def _log_eviction(self, range_: Range) -> None:
        log.debug(
            "closing idle range %s (--max-open-ranges %d)", range_.name.log_name, self.max_open
        )
        now = self._clock.monotonic_s() if self._clock is not None else None
        if now is None or now - self._logged_at >= _EVICTION_LOG_INTERVAL_S:
            log.info(
                "closed %d idle table ranges to stay within --max-open-ranges %d (%d since "
                "start); they reopen on their next request",
                self.evictions - self._logged_evictions,
                self.max_open,
                self.evictions,
            )
            self._logged_at = now or 0.0
            self._logged_evictions = self.evictions


@dataclass
class ContainerCount:
    """The cluster's number of storage containers. Fixed standalone; in cluster mode it grows
    when `tablekeeper cluster add-containers` raises it (the member follows ZooKeeper), and new
    tables are placed over all of them."""

    value: int


@dataclass(frozen=True)
class ContainerEnv:
    """What every container of a server shares. Built once, in `main`."""

    num_containers: int
    """The number of storage containers at start (`containers()` is the current one)."""
    log_backend: LogBackend
    store_factory: StoreOpener
    db_dir: Path
    clock: Clock
    appliers: Appliers
    """Every applier of the server (`appliers.server_appliers`): each range applies its log
    with them."""
    limits: Limits = field(default_factory=Limits)
    metrics: RangeMetrics | None = None
    checkpoint_store: CheckpointStore | None = None
    """Where range checkpoints go; None disables checkpoints (and restore)."""
    checkpoints_kept: int = 2
    failpoints: Failpoints = NO_FAILPOINTS
    open_hosted_ranges_on_start: bool = False
    """Open every data range known to live on a container when the container starts (cluster
    mode: a container that moved serves its first request sooner); else on first use."""
    range_limit: OpenRangeLimit = field(default_factory=OpenRangeLimit)
    """The server-wide bound on open table ranges (one object shared by every container)."""
    history_budget: HistoryBudget | None = None
    """The server-wide bound on the bytes of change events ranges keep in memory for watches
    (one object shared by every range; `ContainerRegistry` makes it from `limits`)."""
    on_table_range_opened: Callable[[int], None] | None = None
    """Told (on the event loop) the table (stream) id of each table range opened here; the
    metrics learn the table's name from it. It must not block."""
    container_count: ContainerCount = field(default_factory=lambda: ContainerCount(0))
    """The current number of containers (starts at `num_containers`)."""
    followers: Followers | None = None
    """The followers this server keeps of ranges other servers own (shared logs only)."""

    def __post_init__(self) -> None:
        if not self.container_count.value:
            self.container_count.value = self.num_containers

    def containers(self) -> int:
        """The cluster's number of storage containers now."""
        return self.container_count.value


class ContainerState(enum.Enum):
    STOPPED = "stopped"
    RECOVERING = "recovering"
    SERVING = "serving"
    CLOSING = "closing"


class StorageContainer:
    def __init__(self, container_id: int, env: ContainerEnv, *, epoch: int = 0) -> None:
        self.id = container_id
        self.env = env
        self.epoch = epoch
        """The ownership epoch this server holds the container with (cluster mode; 0 alone)."""
        self.state = ContainerState.STOPPED
        self.root: RootCatalog | None = None
        self.meta: MetaCatalog | None = None
        self._ranges: dict[tuple[int, int], Range] = {}
        self._opening: dict[tuple[int, int], asyncio.Task[Range]] = {}
        self._closing: dict[tuple[int, int], asyncio.Task[None]] = {}
        """Idle table ranges being closed for the open-range bound (reopened after)."""
        self._healing: asyncio.Task[None] | None = None

    @property
    def local_dir(self) -> Path:
        """Where this container's range stores live on this server."""
        return self.env.db_dir / f"{self.id:05d}"

    def needs_reopen(self) -> str | None:
        """Why the container must be closed and opened again, or None: another writer took one
        of its logs over (cluster mode), or its meta or root range failed (data ranges reopen by
        themselves on their next request; the catalog ranges do not)."""
        for range_ in self._ranges.values():
            if range_.fenced:
                return f"range {range_.name.log_name} was fenced by another writer"
        for catalog in (self.meta, self.root):
            if catalog is not None and catalog.range.failed:
                return catalog.range.failure
        return None

    @property
    def serving(self) -> bool:
        return self.state is ContainerState.SERVING

    def _range_dir(self, name: RangeName) -> Path:
        return self.local_dir / f"{name.stream_id}-{name.range_id}"

    def _new_range(
        self, stream_id: int, range_id: int, ttl_seconds: int, *, adopted: bool = False
    ) -> Range:
        """`adopted`: its store was a follower's (see `Followers.hand_over`)."""
        env = self.env
        name = RangeName(self.id, stream_id, range_id)
        path = self._range_dir(name)
        checkpointer = None
        if env.checkpoint_store is not None:
            checkpointer = RangeCheckpointer(
                name.log_name,
                path,
                env.store_factory,
                env.checkpoint_store,
                env.log_backend,
                env.clock,
                keep=env.checkpoints_kept,
                failpoints=env.failpoints,
            )
            checkpointer.files_unknown = adopted
        range_ = Range(
            name,
            env.log_backend,
            lambda: env.store_factory(path),
            env.clock,
            appliers=env.appliers,
            ttl_seconds=ttl_seconds,
            metrics=env.metrics,
            checkpointer=checkpointer,
            response_bytes_max=env.limits.response_bytes_max,
        )
        # Its watch hub, bounded by this server's limits and sharing the server's budget.
        range_.watch = WatchHub(name.log_name, limits=env.limits, budget=env.history_budget)
        return range_

    async def start(self) -> None:
        self.state = ContainerState.RECOVERING
        opening = [self._open_range(CONTAINER_META_STREAM_ID, CONTAINER_META_RANGE_ID, 0)]
        if self.id == ROOT_CONTAINER_ID:
            opening.append(self._open_range(ROOT_STREAM_ID, ROOT_RANGE_ID, 0))
        opened = await asyncio.gather(*opening)
        self.meta = MetaCatalog(opened[0], self.env.containers, self.env.clock.now_ms)
        if self.id == ROOT_CONTAINER_ID:
            self.root = RootCatalog(opened[1], self.env.containers, self.env.limits)
        self.state = ContainerState.SERVING
        if self.env.open_hosted_ranges_on_start:
            for stream_id, range_id, ttl_seconds in self.meta.hosted_ranges():
                self._start_opening(stream_id, range_id, ttl_seconds, None)

    def heal_catalogs(self) -> asyncio.Task[None] | None:
        """Start reopening a failed meta or root range in place (standalone: e.g. it ran out of
        disk space; cluster mode reopens the whole container instead, see `needs_reopen`).
        Once at a time; requests meanwhile get a retryable error from the failed range.
        Returns the reopening under way, if any."""
        if self._healing is not None or self.state is not ContainerState.SERVING:
            return self._healing
        if not any(
            c is not None and c.range.failed and not c.range.fenced for c in (self.meta, self.root)
        ):
            return None
        task = asyncio.create_task(self._reopen_catalogs())
        self._healing = task

        def done(_: asyncio.Task[None]) -> None:
            self._healing = None
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.warning("container %d: cannot reopen its catalog range yet: %s", self.id, exc)

        task.add_done_callback(done)
        return task

    async def _reopen_catalogs(self) -> None:
        if self.meta is not None and self.meta.range.failed and not self.meta.range.fenced:
            range_ = await self._reopen_catalog_range(self.meta.range)
            self.meta = MetaCatalog(range_, self.env.containers, self.env.clock.now_ms)
        if self.root is not None and self.root.range.failed and not self.root.range.fenced:
            range_ = await self._reopen_catalog_range(self.root.range)
            self.root = RootCatalog(range_, self.env.containers, self.env.limits)

    async def _reopen_catalog_range(self, failed: Range) -> Range:
        try:
            await failed.close()
        except Exception as exc:  # e.g. its final flush on a full disk; the log has it all
            log.warning("range %s: closing the failed range: %s", failed.name.log_name, exc)
        key = (failed.name.stream_id, failed.name.range_id)
        if self._ranges.get(key) is failed:
            del self._ranges[key]
        range_ = await self._open_range(*key, 0)
        log.info("range %s reopened after: %s", range_.name.log_name, failed.failure)
        return range_

    async def _open_range(self, stream_id: int, range_id: int, ttl_seconds: int) -> Range:
        adopted = False
        followers = self.env.followers
        if followers is not None:
            name = RangeName(self.id, stream_id, range_id)
            adopted = await followers.hand_over(name.log_name, self._range_dir(name))
        range_ = self._new_range(stream_id, range_id, ttl_seconds, adopted=adopted)
        await range_.open()
        self._ranges[(stream_id, range_id)] = range_
        return range_

    def open_data_range(self, stream_id: int, range_id: int) -> Range | None:
        """`data_range` when it needs no waiting: the range if this container serves and has it
        open and healthy, else None (then `data_range` opens it or says why not)."""
        if self.state is not ContainerState.SERVING:
            return None
        key = (stream_id, range_id)
        range_ = self._ranges.get(key)
        if range_ is None or range_.failed:
            return None
        self.env.range_limit.touch((self.id, *key))
        return range_

    async def data_range(self, stream_id: int, range_id: int, ttl_seconds: int) -> Range:
        """The open range (stream_id, range_id), opening (recovering) it on first use."""
        if self.state is not ContainerState.SERVING:
            raise UnavailableError(f"container {self.id} is {self.state.value}")
        key = (stream_id, range_id)
        range_ = self._ranges.get(key)
        if range_ is not None and not range_.failed:
            self.env.range_limit.touch((self.id, *key))
            return range_
        if range_ is not None and range_.fenced:
            # Another server owns the range's (shared) log now; reopening would fence it back.
            raise UnavailableError(range_.failure or f"range {range_.name.log_name} is fenced")
        task = self._opening.get(key)
        if task is None:
            if range_ is not None:  # failed: close it and recover from the log
                self._ranges.pop(key, None)
                self.env.range_limit.forget((self.id, *key), range_)
            task = self._start_opening(stream_id, range_id, ttl_seconds, range_)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                # The container closed (it moved away) while the range was opening: nothing
                # was applied, so the request may go to the next owner.
                raise UnavailableError(
                    f"container {self.id} closed while range {stream_id}/{range_id} was opening"
                ) from None
            raise

    def _start_opening(
        self, stream_id: int, range_id: int, ttl_seconds: int, failed: Range | None
    ) -> asyncio.Task[Range]:
        # Registered before anything is awaited, so concurrent callers wait for this one
        # (re)open instead of opening the store while a failed range still holds it.
        key = (stream_id, range_id)
        task = asyncio.create_task(self._reopen_range(failed, stream_id, range_id, ttl_seconds))
        self._opening[key] = task
        task.add_done_callback(lambda _: self._opening.pop(key, None))
        task.add_done_callback(_log_open_failure)
        return task

    async def _reopen_range(
        self, failed: Range | None, stream_id: int, range_id: int, ttl_seconds: int
    ) -> Range:
        if failed is not None:
            try:
                await failed.close()
            except Exception as exc:  # e.g. its final flush on a full disk; the log has it all
                log.warning("range %s: closing the failed range: %s", failed.name.log_name, exc)
        closing = self._closing.get((stream_id, range_id))
        if closing is not None:  # closed for the bound a moment ago: let it release its files
            await asyncio.shield(closing)
        limit = self.env.range_limit
        key = (self.id, stream_id, range_id)
        await limit.reserve(key)
        try:
            range_ = await self._open_range(stream_id, range_id, ttl_seconds)
        except BaseException:
            limit.release()
            raise
        limit.opened(key, self, range_)
        if self.env.on_table_range_opened is not None:
            self.env.on_table_range_opened(stream_id)
        if self.meta is not None and self.env.open_hosted_ranges_on_start:
            try:
                await self.meta.record_hosted(stream_id, range_id, ttl_seconds)
            except Exception as exc:  # only an optimisation for the next owner: serve anyway
                log.warning("could not record range %s as hosted: %s", range_.name.log_name, exc)
        return range_

    async def close_idle_range(self, key: tuple[int, int], range_: Range) -> None:
        """Close an idle table range to bound open files (`OpenRangeLimit`). Its next request
        opens it again (after this close has released its files)."""
        if self._ranges.get(key) is range_:
            del self._ranges[key]
        task = asyncio.create_task(self._close_quietly(range_))
        self._closing[key] = task
        task.add_done_callback(
            lambda _: self._closing.pop(key, None) if self._closing.get(key) is task else None
        )
        await asyncio.shield(task)

    async def _close_quietly(self, range_: Range) -> None:
        try:
            await range_.close()
        except Exception as exc:  # released all the same; its log keeps everything
            log.warning("range %s: closing idle range: %s", range_.name.log_name, exc)

    async def drop_range(self, stream_id: int, range_id: int) -> None:
        """Close a range that is gone (its table was deleted, or a split retired it) and remove
        its log, store and checkpoints."""
        self.env.range_limit.forget((self.id, stream_id, range_id))
        range_ = self._ranges.pop((stream_id, range_id), None)
        if range_ is not None:
            await range_.close()
        if self.meta is not None and self.env.open_hosted_ranges_on_start:
            await self.meta.forget_hosted(stream_id, range_id)
        name = RangeName(self.id, stream_id, range_id)
        await asyncio.to_thread(self.env.log_backend.delete, name.log_name)
        await asyncio.to_thread(shutil.rmtree, self._range_dir(name), True)
        if self.env.checkpoint_store is not None:
            checkpointer = RangeCheckpointer(
                name.log_name,
                self._range_dir(name),
                self.env.store_factory,
                self.env.checkpoint_store,
                self.env.log_backend,
                self.env.clock,
            )
            await asyncio.to_thread(checkpointer.delete_all)

    @property
    def ranges(self) -> dict[tuple[int, int], Range]:
        return dict(self._ranges)

    async def stop(self) -> None:
        self.state = ContainerState.CLOSING
        for task in list(self._opening.values()):
            task.cancel()
        if self._healing is not None:
            self._healing.cancel()
        ranges = list(self._ranges.values())
        for stream_id, range_id in self._ranges:
            self.env.range_limit.forget((self.id, stream_id, range_id))
        self._ranges.clear()
        await asyncio.gather(*(r.close() for r in ranges), return_exceptions=True)
        self.state = ContainerState.STOPPED


def _log_open_failure(task: asyncio.Task[Range]) -> None:
    """Retrieve a background open's failure (corruption was logged by the range; the next
    request for the range tries again)."""
    if not task.cancelled():
        exc = task.exception()
        if isinstance(exc, StorageUnavailableError):
            log.warning("cannot open a range now (retried on its next request): %s", exc.message)
