"""Online range split: one table range becomes two, while the table serves.

Run by the owner of the table's meta range (`tablekeeper table split`, forwarded there). The
steps on the parent range are done by its container's owner (`step_here`: here, or asked over
the Admin service's SealRange):

  1. `MetaCatalog.begin_split` records the split (parent RANGE_FENCING, two children halving its
     hash interval, ids reserved; the second child on the container with the fewest of the
     table's ranges).
  2. Copy while the parent serves: checkpoint it ("checkpoint"), copy that checkpoint into the
     children (`range.split.ChildrenBuilder`) and publish them [split.after_copy]; then apply
     the parent's log to its end (again while that was long) and publish.  [split.before_seal]
  3. Seal the parent ("seal"): a command in its log, after which it refuses every request with
     "range moved" (retryable: nothing applied). The pause starts here.    [split.after_seal]
  4. Apply the parent's log from the copied checkpoint to the seal to the children, and publish
     them again (only what changed is uploaded). If the log no longer holds all of that (a
     checkpoint truncated it meanwhile), or step 2 failed, checkpoint the sealed parent ("seal+
     checkpoint") and copy that instead.                  [split.during_copy / during_publish]
  5. `MetaCatalog.finish_split`: one txn makes the children current and the parent RANGE_FENCED;
     the requests refused meanwhile reach the children when retried.  [split.before_switch]
  6. Delete the parent's log, store and checkpoints ("drop"), then forget it.

Every step is idempotent and recorded before the next, so a crash anywhere leaves either the
parent serving (before 3; the recorded split is finished, as below, at the next start or when
split is asked again), or a sealed parent that the next owner of the meta range's container
finishes splitting as soon as it opens the container (`resume`: steps 3-6 by copying the
sealed parent), or a finished split whose parent is deleted then. The pause (3 to 5) is the
time to apply the commands of the copy and publish the children's new files.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.catalog.meta import MetaCatalog, SplitPlan
from tablekeeper_server.container.container import (
    REMOTE_ROUTE_TTL_S,
    ContainerEnv,
    StorageContainer,
)
from tablekeeper_server.errors import (
    IllegalOpError,
    NotServedHereError,
    ResourceLimitError,
    RouteNotFoundError,
    UnavailableError,
)
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.range.split import ChildrenBuilder, ChildSpec, TailGapError

log = logging.getLogger(__name__)

RangeStep = Literal["checkpoint", "seal", "seal+checkpoint", "drop"]
"""What a split asks of the owner of the range it splits (`Splitter.step_here`)."""
RANGE_STEPS: tuple[RangeStep, ...] = ("checkpoint", "seal", "seal+checkpoint", "drop")

RESUME_RETRY_S = (0.5, 1.0, 2.0, 5.0)
"""Pauses between attempts to finish a split resumed at container start (then the last, until
it succeeds or the container moves away)."""
RETIRE_AFTER_S = 3 * REMOTE_ROUTE_TTL_S
"""How long after the switch a split's parent is deleted (see `Splitter._finish`)."""
SWITCH_WAIT_S = 5.0
"""How long a request for a range being split here waits for the switch before it is refused
("range moved", retryable)."""


class RemoteSteps(Protocol):
    """Asks another server's splitter (cluster mode; the RPC layer's `RemoteCatalog`)."""

    async def range_step(
        self,
        container_id: int,
        stream_id: int,
        range_id: int,
        step: RangeStep,
        children: tuple[int, ...],
        start_hashes: tuple[int, ...] = (),
    ) -> int:
        """`Splitter.step_here` on the container's owner."""
        ...


class SplitHost(Protocol):
    """What the splitter needs of the server's containers: the narrow side of
    `container.registry.ContainerRegistry`, which owns the splitter (so the splitter does not
    import the registry)."""

    @property
    def env(self) -> ContainerEnv: ...

    @property
    def containers(self) -> dict[int, StorageContainer]: ...

    @property
    def remote(self) -> RemoteSteps | None: ...

    def container(self, container_id: int) -> StorageContainer:
        """The container if this server serves it; `NotServedHereError` otherwise."""
        ...

    async def stream_props(self, stream_id: int) -> stream_pb2.StreamProperties: ...

    def forget_route(self, stream_id: int) -> None:
        """Read the table's ranges again on its next request."""
        ...

    async def checkpoint_range(self, range_: Range, *, force: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class SplitOutcome:
    plan: SplitPlan
    sealed_sequence: int
    keys_copied: int
    paused_seconds: float


class Splitter:
    """The splits of the tables whose meta range is hosted here, and the seal and drop of the
    ranges hosted here that a split (run anywhere) asks for."""

    def __init__(self, registry: SplitHost) -> None:
        self._registry = registry
        self._running: dict[tuple[int, int], asyncio.Task[SplitOutcome]] = {}
        self._switches: dict[tuple[int, int], asyncio.Event] = {}
        """Set once the split of (stream, range) running here has switched the table."""
        self._resuming: set[asyncio.Task[None]] = set()
        self.retire_after_s = RETIRE_AFTER_S
        """How long after the switch a split's parent is deleted (see `_finish`)."""

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
        if len(ranges) >= registry.env.limits.table_ranges_max:
            raise ResourceLimitError(
                f"table {stream_id} has {len(ranges)} ranges: a split would pass "
                f"--max-table-ranges {registry.env.limits.table_ranges_max}"
            )
        if range_id == 0:
            range_id = widest_range(ranges)
        plan = await meta.begin_split(stream_id, range_id)
        log.info(
            "table %d: splitting range %d into %s",
            stream_id,
            range_id,
            ", ".join(f"{c.range_id} (container {c.storage_container_id})" for c in plan.children),
        )
        return await self._complete(meta, plan, fresh=True)

    def _meta(self, container_id: int) -> MetaCatalog:
        container = self._registry.container(container_id)  # NotServedHereError: forwarded
        if container.meta is None:
            raise RouteNotFoundError(f"container {container_id} is not open yet")
        return container.meta

    async def _complete(self, meta: MetaCatalog, plan: SplitPlan, *, fresh: bool) -> SplitOutcome:
        """Steps 2-6 of a recorded split, once however many callers ask at the same time.
        `fresh`: a split just begun (its parent serving), which copies before the seal."""
        key = (plan.stream_id, plan.parent.range_id)
        task = self._running.get(key)
        if task is None:
            task = asyncio.create_task(self._run(meta, plan, fresh))
            self._running[key] = task
            self._switches[key] = asyncio.Event()

            def done(_: asyncio.Task[SplitOutcome]) -> None:
                self._running.pop(key, None)
                self._switches.pop(key, None)

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def _run(self, meta: MetaCatalog, plan: SplitPlan, fresh: bool) -> SplitOutcome:
        registry = self._registry
        env = registry.env
        assert env.checkpoint_store is not None
        children = tuple(c.range_id for c in plan.children)
        starts = tuple(c.start_hash_key for c in plan.children)
        parent = plan.parent
        props = await registry.stream_props(plan.stream_id)
        builder = ChildrenBuilder(
            RangeName(parent.storage_container_id, plan.stream_id, parent.range_id).log_name,
            [
                ChildSpec(
                    RangeName(c.storage_container_id, plan.stream_id, c.range_id).log_name,
                    c.start_hash_key,
                )
                for c in plan.children
            ],
            store_opener=env.store_factory,
            checkpoint_store=env.checkpoint_store,
            log_backend=env.log_backend,
            clock=env.clock,
            work_dir=env.db_dir,
            appliers=env.appliers,
            ttl_seconds=props.stream_conf.ttl_seconds,
            failpoints=env.failpoints,
        )
        try:
            copied_live = False
            if fresh:  # copy while the parent serves; only its log's tail waits for the seal
                try:
                    await self._step(parent, plan.stream_id, "checkpoint", children)
                    await asyncio.to_thread(builder.copy_checkpoint, sealed=False)
                    await asyncio.to_thread(builder.publish)  # the bulk, uploaded unpaused
                    await env.failpoints.hit_async("split.after_copy")
                    await asyncio.to_thread(builder.catch_up)
                    await asyncio.to_thread(builder.publish)
                    copied_live = True
                except (RouteNotFoundError, UnavailableError, TailGapError) as exc:
                    log.info("table %d: copying before the seal failed (%s)", plan.stream_id, exc)
                    builder.close()
                    builder = builder.again()
            await env.failpoints.hit_async("split.before_seal")
            started = env.clock.monotonic_s()
            step: RangeStep = "seal" if copied_live else "seal+checkpoint"
            sealed = await self._step(parent, plan.stream_id, step, children, starts)
            marks = [("seal", env.clock.monotonic_s())]
            await env.failpoints.hit_async("split.after_seal")
            tail = copied_live and await self._apply_tail(builder, sealed)
            if not tail:
                if copied_live:  # the tail is gone from the log: copy the sealed parent
                    await self._step(parent, plan.stream_id, "seal+checkpoint", children, starts)
                    builder.close()
                    builder = builder.again()
                await asyncio.to_thread(builder.copy_checkpoint, sealed=True)
            marks.append(("tail" if tail else "copy", env.clock.monotonic_s()))
            await asyncio.to_thread(builder.publish)
            marks.append(("publish", env.clock.monotonic_s()))
            await env.failpoints.hit_async("split.before_switch")
            await meta.finish_split(plan)
            registry.forget_route(plan.stream_id)
            if (switch := self._switches.get((plan.stream_id, parent.range_id))) is not None:
                switch.set()
            marks.append(("switch", env.clock.monotonic_s()))
            paused = env.clock.monotonic_s() - started
        finally:
            builder.close()
        steps = ", ".join(
            f"{name} {at - before:.3f}s"
            for (name, at), before in zip(marks, [started] + [m[1] for m in marks], strict=False)
        )
        log.info(
            "table %d: range %d split into %s at position %d: %d keys copied%s; requests "
            "paused %.3fs (%s)",
            plan.stream_id,
            parent.range_id,
            ", ".join(map(str, children)),
            sealed,
            builder.keys_copied,
            f", then {builder.tail_commands} commands of its log" if tail else "",
            paused,
            steps,
        )
        container = registry.containers.get(meta.range.name.container_id)
        if container is not None:
            self._background(self._finish(container, [(plan, False)], self.retire_after_s))
        return SplitOutcome(plan, sealed, builder.keys_copied, paused)

    async def _apply_tail(self, builder: ChildrenBuilder, sealed: int) -> bool:
        """Apply the parent's log from the copied checkpoint to the seal; False if the log no
        longer holds all of it."""
        try:
            await asyncio.to_thread(builder.apply_tail, sealed)
        except TailGapError as exc:
            log.info("range %s: %s; copying the sealed range instead", builder.parent_log_name, exc)
            return False
        return True

    async def _step(
        self,
        range_props: stream_pb2.RangeProperties,
        stream_id: int,
        step: RangeStep,
        children: tuple[int, ...],
        start_hashes: tuple[int, ...] = (),
    ) -> int:
        """`step_here` on the owner of the range's container (here, or asked remotely)."""
        container_id, range_id = range_props.storage_container_id, range_props.range_id
        try:
            return await self.step_here(
                container_id, stream_id, range_id, step, children, start_hashes
            )
        except NotServedHereError:
            remote = self._registry.remote
            if remote is None:
                raise
            return await remote.range_step(
                container_id, stream_id, range_id, step, children, start_hashes
            )

    async def _retire(self, meta: MetaCatalog, plan: SplitPlan) -> None:
        await self._step(plan.parent, plan.stream_id, "drop", ())
        await meta.forget_retired(plan)

    async def step_here(
        self,
        container_id: int,
        stream_id: int,
        range_id: int,
        step: RangeStep,
        children: tuple[int, ...],
        start_hashes: tuple[int, ...] = (),
    ) -> int:
        """One step of a split on a range hosted here (`RangeStep`); returns the range's
        position after it (sealed at, or checkpointed at; 0 for "drop"). `start_hashes`: the
        children's first hashes (for the seal). Raises `NotServedHereError` if the range's
        container is elsewhere."""
        registry = self._registry
        container = registry.container(container_id)
        if step == "drop":
            await container.drop_range(stream_id, range_id)
            return 0
        props = await registry.stream_props(stream_id)
        range_ = await container.data_range(stream_id, range_id, props.stream_conf.ttl_seconds)
        if step == "checkpoint":
            manifest = await range_.checkpoint(force=True)
            if manifest is None:
                raise UnavailableError(f"range {range_.name.log_name} cannot checkpoint now")
            return manifest.applied_sequence
        sealed = await range_.seal(children, start_hashes)
        if step == "seal+checkpoint":
            await registry.checkpoint_range(range_, force=True)
        return sealed

    async def switched(self, stream_id: int, range_id: int) -> None:
        """Wait (at most `SWITCH_WAIT_S`) for the split of a range that this server is running
        to switch the table to the children; return at once if it runs elsewhere."""
        key = (stream_id, range_id)
        task, event = self._running.get(key), self._switches.get(key)
        if task is None or event is None:
            return
        waiting = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait(
                [task, waiting], timeout=SWITCH_WAIT_S, return_when="FIRST_COMPLETED"
            )
        finally:
            waiting.cancel()

    def resume(self, container: StorageContainer) -> None:
        """Finish, in the background, the splits this container's meta range records as under
        way, and delete the parents of finished ones (after a crash or a move)."""
        if container.meta is None:
            return
        pending, retired = container.meta.splits()
        for plan in pending:
            log.info(
                "table %d: resuming the split of range %d", plan.stream_id, plan.parent.range_id
            )
        if pending:
            self._background(self._finish(container, [(plan, True) for plan in pending], 0.0))
        now_ms = self._registry.env.clock.now_ms()
        for plan in retired:
            grace = self.retire_after_s - (now_ms - plan.fenced_at_ms) / 1000
            self._background(self._finish(container, [(plan, False)], max(0.0, grace)))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._resuming.add(task)
        task.add_done_callback(self._resuming.discard)

    async def _finish(
        self, container: StorageContainer, work: list[tuple[SplitPlan, bool]], delay_s: float
    ) -> None:
        """Finish splits (`True`) or delete retired parents (`False`) of `container`'s tables,
        after `delay_s`, retrying while their ranges are unreachable and the container is ours.
        A parent is deleted `retire_after_s` after the switch: until then a request routed by
        ranges read before the switch (another server trusts them for up to
        `REMOTE_ROUTE_TTL_S`) meets the sealed parent and is sent on to a child, instead of
        opening the deleted range anew, empty."""
        if delay_s:
            await self._registry.env.clock.sleep(delay_s)
        for plan, unfinished in work:
            attempt = 0
            while self._registry.containers.get(container.id) is container:
                meta = container.meta
                if meta is None or not container.serving:
                    return
                try:
                    if unfinished:
                        await self._complete(meta, plan, fresh=False)
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
                    await self._registry.env.clock.sleep(pause)
                except Exception:
                    log.exception(
                        "table %d: cannot finish the split of range %d",
                        plan.stream_id,
                        plan.parent.range_id,
                    )
                    break

    async def resumed(self) -> None:
        """Wait until the splits resumed (and the parents to delete) so far are done with."""
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
