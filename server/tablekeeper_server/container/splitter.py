"""Online range split: one table range becomes two, while the table serves.

Run by the owner of the table's meta range (`tablekeeper table split`, forwarded there):

  1. `MetaCatalog.begin_split` records the split (parent RANGE_FENCING, two children halving its
     hash interval, ids reserved; the second child on the container with the fewest of the
     table's ranges).
  2. Seal the parent, on its container's owner (`seal_here`, here or over the Admin service):
     a `seal` command in its log, after which it refuses every request with "range moved"
     (retryable: nothing applied), then a checkpoint of its final state.   [split.after_seal]
  3. Build the children from that checkpoint (`range.split.build_children`): one checkpoint
     each, published under the child's name. Whoever owns a child's container opens it from
     there, its log numbering on from the parent's.          [split.during_copy / _publish]
  4. `MetaCatalog.finish_split`: one txn makes the children current and the parent RANGE_FENCED.
     The requests refused meanwhile are routed to the children when retried. [split.before_switch]
  5. Delete the parent's log, store and checkpoints (`drop_here`, on its owner), then forget it.

Every step is idempotent and recorded before the next, so a crash anywhere leaves either the
parent serving (before 2), or a sealed parent that the next owner of the meta range's container
finishes splitting as soon as it takes the container over (`resume`), or a finished split whose
parent is deleted then. The parent refuses requests from step 2 to step 4: that is the write
pause, the time to checkpoint the parent and copy it into the children.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.meta import MetaCatalog, SplitPlan
from tablekeeper_server.container.container import StorageContainer
from tablekeeper_server.errors import (
    IllegalOpError,
    NotServedHereError,
    RouteNotFoundError,
    UnavailableError,
)
from tablekeeper_server.range.replica import RangeName
from tablekeeper_server.range.split import ChildSpec, build_children

if TYPE_CHECKING:
    from tablekeeper_server.container.registry import ContainerRegistry

log = logging.getLogger(__name__)

RESUME_RETRY_S = (0.5, 1.0, 2.0, 5.0)
"""Pauses between attempts to finish a split resumed at container start (then the last, until
it succeeds or the container moves away)."""


@dataclass(frozen=True, slots=True)
class SplitOutcome:
    plan: SplitPlan
    sealed_sequence: int
    keys_copied: int
    paused_seconds: float


class Splitter:
    """The splits of the tables whose meta range is hosted here, and the seal and drop of the
    ranges hosted here that a split (run anywhere) asks for."""

    def __init__(self, registry: ContainerRegistry) -> None:
        self._registry = registry
        self._running: dict[tuple[int, int], asyncio.Task[SplitOutcome]] = {}
        self._resuming: set[asyncio.Task[None]] = set()

    async def split(self, stream_id: int, range_id: int = 0) -> SplitOutcome:
        """Split range `range_id` of table `stream_id` (0: its widest range, the first of
        them) and wait until the children serve. Raises `NotServedHereError` when the table's
        meta range is on another server (the RPC layer forwards there)."""
        registry = self._registry
        if registry.env.checkpoint_store is None:
            raise IllegalOpError("splitting a range needs checkpoints (--checkpoint-store)")
        props = await registry.stream_props(stream_id)
        meta = self._meta(props.storage_container_id)
        ranges = await meta.active_ranges(stream_id, registry.stream_props)
        if range_id == 0:
            range_id = widest_range(ranges)
        plan = await meta.begin_split(stream_id, range_id)
        log.info(
            "table %d: splitting range %d into %s",
            stream_id,
            range_id,
            ", ".join(f"{c.range_id} (container {c.storage_container_id})" for c in plan.children),
        )
        return await self._complete(meta, plan)

    def _meta(self, container_id: int) -> MetaCatalog:
        container = self._registry.container(container_id)  # NotServedHereError: forwarded
        if container.meta is None:
            raise RouteNotFoundError(f"container {container_id} is not open yet")
        return container.meta

    async def _complete(self, meta: MetaCatalog, plan: SplitPlan) -> SplitOutcome:
        """Steps 2-5 of a recorded split, once however many callers ask at the same time."""
        key = (plan.stream_id, plan.parent.range_id)
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self._run(meta, plan))
            self._running[key] = task
            task.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.shield(task)

    async def _run(self, meta: MetaCatalog, plan: SplitPlan) -> SplitOutcome:
        registry = self._registry
        env = registry.env
        assert env.checkpoint_store is not None
        children = tuple(c.range_id for c in plan.children)
        parent = plan.parent
        started = time.monotonic()
        sealed = await self._seal(
            parent.storage_container_id, plan.stream_id, parent.range_id, children
        )
        await env.failpoints.hit_async("split.after_seal")
        specs = [
            ChildSpec(
                RangeName(c.storage_container_id, plan.stream_id, c.range_id).log_name,
                c.start_hash_key,
            )
            for c in plan.children
        ]
        parent_name = RangeName(parent.storage_container_id, plan.stream_id, parent.range_id)
        build = await asyncio.to_thread(
            build_children,
            parent_name.log_name,
            specs,
            store_opener=env.store_factory,
            checkpoint_store=env.checkpoint_store,
            log_backend=env.log_backend,
            clock=env.clock,
            work_dir=env.db_dir,
            failpoints=env.failpoints,
        )
        await env.failpoints.hit_async("split.before_switch")
        await meta.finish_split(plan)
        registry.forget_route(plan.stream_id)
        paused = time.monotonic() - started
        log.info(
            "table %d: range %d split into %s at position %d: %d keys copied in %.3fs; requests "
            "paused %.3fs",
            plan.stream_id,
            parent.range_id,
            ", ".join(map(str, children)),
            build.applied_sequence,
            build.keys_copied,
            build.seconds,
            paused,
        )
        try:
            await self._retire(meta, plan)
        except Exception as exc:  # the data of a retired range only costs space: retried later
            log.warning(
                "table %d: could not delete retired range %d yet: %s",
                plan.stream_id,
                parent.range_id,
                exc,
            )
        return SplitOutcome(plan, sealed, build.keys_copied, paused)

    async def _seal(
        self, container_id: int, stream_id: int, range_id: int, children: tuple[int, ...]
    ) -> int:
        try:
            return await self.seal_here(container_id, stream_id, range_id, children)
        except NotServedHereError:
            remote = self._registry.remote
            if remote is None:
                raise
            return await remote.seal_range(container_id, stream_id, range_id, children, False)

    async def _retire(self, meta: MetaCatalog, plan: SplitPlan) -> None:
        parent = plan.parent
        try:
            await self.drop_here(parent.storage_container_id, plan.stream_id, parent.range_id)
        except NotServedHereError:
            remote = self._registry.remote
            if remote is None:
                raise
            await remote.seal_range(
                parent.storage_container_id, plan.stream_id, parent.range_id, (), True
            )
        await meta.forget_retired(plan)

    async def seal_here(
        self, container_id: int, stream_id: int, range_id: int, children: tuple[int, ...]
    ) -> int:
        """Seal a range hosted here for a split into `children` and checkpoint it; return the
        position it was sealed at. Raises `NotServedHereError` if its container is elsewhere."""
        registry = self._registry
        container = registry.container(container_id)
        props = await registry.stream_props(stream_id)
        range_ = await container.data_range(stream_id, range_id, props.stream_conf.ttl_seconds)
        sealed = await range_.seal(children)
        await registry.checkpoint_range(range_, force=True)
        return sealed

    async def drop_here(self, container_id: int, stream_id: int, range_id: int) -> None:
        """Delete a range hosted here that a split retired: its log, store and checkpoints."""
        container = self._registry.container(container_id)
        await container.drop_range(stream_id, range_id, checkpoints=True)

    def resume(self, container: StorageContainer) -> None:
        """Finish, in the background, the splits this container's meta range records as under
        way, and delete the parents of finished ones (after a crash or a move)."""
        if container.meta is None:
            return
        pending, retired = container.meta.splits()
        if not pending and not retired:
            return
        task = asyncio.create_task(self._resume(container, pending, retired))
        self._resuming.add(task)
        task.add_done_callback(self._resuming.discard)

    async def _resume(
        self, container: StorageContainer, pending: list[SplitPlan], retired: list[SplitPlan]
    ) -> None:
        for plan in pending:
            log.info(
                "table %d: resuming the split of range %d", plan.stream_id, plan.parent.range_id
            )
        work = [(plan, True) for plan in pending] + [(plan, False) for plan in retired]
        for plan, unfinished in work:
            attempt = 0
            while self._registry.containers.get(container.id) is container:
                meta = container.meta
                if meta is None or not container.serving:
                    return
                try:
                    if unfinished:
                        await self._complete(meta, plan)
                    else:
                        await self._retire(meta, plan)
                    break
                except (RouteNotFoundError, UnavailableError) as exc:
                    pause = RESUME_RETRY_S[min(attempt, len(RESUME_RETRY_S) - 1)]
                    attempt += 1
                    log.info(
                        "table %d: split of range %d not finished yet (%s); again in %.1fs",
                        plan.stream_id,
                        plan.parent.range_id,
                        exc.message,
                        pause,
                    )
                    await asyncio.sleep(pause)
                except Exception:
                    log.exception(
                        "table %d: cannot finish the split of range %d",
                        plan.stream_id,
                        plan.parent.range_id,
                    )
                    break

    async def resumed(self) -> None:
        """Wait until the splits resumed so far are finished (or given up on)."""
        while self._resuming:
            await asyncio.gather(*self._resuming, return_exceptions=True)

    async def stop(self) -> None:
        for task in list(self._resuming):
            task.cancel()
        await asyncio.gather(*self._resuming, return_exceptions=True)


def widest_range(ranges: list[stream_pb2.RangeProperties]) -> int:
    """The id of the first of the widest ranges (what `split` splits when given no range)."""
    widest = max(r.end_hash_key - r.start_hash_key for r in ranges)
    return next(r.range_id for r in ranges if r.end_hash_key - r.start_hash_key == widest)
