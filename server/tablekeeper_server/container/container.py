"""A storage container: the unit of placement. It owns its meta range, the root range (container
0 only), and the table ranges placed on it, opened lazily on first use."""

from __future__ import annotations

import asyncio
import enum
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tablekeeper_server.catalog.meta import (
    CONTAINER_META_RANGE_ID,
    CONTAINER_META_STREAM_ID,
    MetaCatalog,
)
from tablekeeper_server.catalog.root import RootCatalog
from tablekeeper_server.checkpoint.api import CheckpointStore
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.failpoints import NO_FAILPOINTS, Failpoints
from tablekeeper_server.errors import StorageUnavailableError, UnavailableError
from tablekeeper_server.log.api import LogBackend
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.replica import Range, RangeMetrics, RangeName
from tablekeeper_server.range.validation import Limits
from tablekeeper_server.storage.api import StoreOpener

log = logging.getLogger(__name__)

ROOT_CONTAINER_ID = 0
ROOT_STREAM_ID = 0
ROOT_RANGE_ID = 0


@dataclass(frozen=True)
class ContainerEnv:
    """What every container of a server shares. Built once, in `main`."""

    num_containers: int
    log_backend: LogBackend
    store_factory: StoreOpener
    db_dir: Path
    clock: Clock
    limits: Limits = field(default_factory=Limits)
    metrics: RangeMetrics | None = None
    checkpoint_store: CheckpointStore | None = None
    """Where range checkpoints go; None disables checkpoints (and restore)."""
    checkpoints_kept: int = 2
    failpoints: Failpoints = NO_FAILPOINTS
    open_hosted_ranges_on_start: bool = False
    """Open every data range known to live on a container when the container starts (cluster
    mode: a container that moved serves its first request sooner); else on first use."""


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

    def _new_range(self, stream_id: int, range_id: int, ttl_seconds: int) -> Range:
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
        return Range(
            name,
            env.log_backend,
            lambda: env.store_factory(path),
            env.clock,
            ttl_seconds=ttl_seconds,
            metrics=env.metrics,
            checkpointer=checkpointer,
        )

    async def start(self) -> None:
        self.state = ContainerState.RECOVERING
        opening = [self._open_range(CONTAINER_META_STREAM_ID, CONTAINER_META_RANGE_ID, 0)]
        if self.id == ROOT_CONTAINER_ID:
            opening.append(self._open_range(ROOT_STREAM_ID, ROOT_RANGE_ID, 0))
        opened = await asyncio.gather(*opening)
        self.meta = MetaCatalog(opened[0], self.env.num_containers, self.env.clock.now_ms)
        if self.id == ROOT_CONTAINER_ID:
            self.root = RootCatalog(opened[1], self.env.num_containers)
        self.state = ContainerState.SERVING
        if self.env.open_hosted_ranges_on_start:
            for stream_id, range_id, ttl_seconds in self.meta.hosted_ranges():
                self._start_opening(stream_id, range_id, ttl_seconds, None)

    async def _open_range(self, stream_id: int, range_id: int, ttl_seconds: int) -> Range:
        range_ = self._new_range(stream_id, range_id, ttl_seconds)
        await range_.open()
        self._ranges[(stream_id, range_id)] = range_
        return range_

    async def data_range(self, stream_id: int, range_id: int, ttl_seconds: int) -> Range:
        """The open range (stream_id, range_id), opening (recovering) it on first use."""
        if self.state is not ContainerState.SERVING:
            raise UnavailableError(f"container {self.id} is {self.state.value}")
        key = (stream_id, range_id)
        range_ = self._ranges.get(key)
        if range_ is not None and not range_.failed:
            return range_
        if range_ is not None and range_.fenced:
            # Another server owns the range's (shared) log now; reopening would fence it back.
            raise UnavailableError(range_.failure or f"range {range_.name.log_name} is fenced")
        task = self._opening.get(key)
        if task is None:
            if range_ is not None:  # failed: close it and recover from the log
                self._ranges.pop(key, None)
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
        range_ = await self._open_range(stream_id, range_id, ttl_seconds)
        if self.meta is not None and self.env.open_hosted_ranges_on_start:
            try:
                await self.meta.record_hosted(stream_id, range_id, ttl_seconds)
            except Exception as exc:  # only an optimisation for the next owner: serve anyway
                log.warning("could not record range %s as hosted: %s", range_.name.log_name, exc)
        return range_

    async def drop_range(self, stream_id: int, range_id: int) -> None:
        """Close a deleted table's range and remove its log and store."""
        range_ = self._ranges.pop((stream_id, range_id), None)
        if range_ is not None:
            await range_.close()
        if self.meta is not None and self.env.open_hosted_ranges_on_start:
            await self.meta.forget_hosted(stream_id, range_id)
        name = RangeName(self.id, stream_id, range_id)
        await asyncio.to_thread(self.env.log_backend.delete, name.log_name)
        await asyncio.to_thread(shutil.rmtree, self._range_dir(name), True)

    @property
    def ranges(self) -> dict[tuple[int, int], Range]:
        return dict(self._ranges)

    async def stop(self) -> None:
        self.state = ContainerState.CLOSING
        for task in list(self._opening.values()):
            task.cancel()
        ranges = list(self._ranges.values())
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
