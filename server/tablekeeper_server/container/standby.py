"""Standby followers (`tablekeeper server --standby`): follow every range of the containers other
servers own, read or not, so that whichever container this server takes over opens on up-to-date
copies (`Followers.hand_over`) instead of restoring checkpoints and replaying logs.

Every `LOOK_S` the server follows, for each container it does not own, the container's meta range
(and on container 0 the root range); from the meta range's follower it reads which data ranges
live on the container (`MetaCatalog.hosted_ranges`: each range opened there is recorded) and
follows each of them. A range no longer recorded (a split retired it, its table was deleted) is
no longer looked at, and its follower is closed once idle like any other. The cost: one follower
(a store, and a reader of its log asking Pulsar for more every 0.2 s) per range of every other
server, so `--max-followers` must be at least the number of ranges followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_server.catalog.meta import (
    CONTAINER_META_RANGE_ID,
    CONTAINER_META_STREAM_ID,
    HOSTED_SPAN,
    decode_hosted,
)
from tablekeeper_server.container.container import (
    ROOT_CONTAINER_ID,
    ROOT_RANGE_ID,
    ROOT_STREAM_ID,
)
from tablekeeper_server.container.followers import Followers
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import TableKeeperError
from tablekeeper_server.range.follower import Follower
from tablekeeper_server.range.replica import RangeName

log = logging.getLogger(__name__)

LOOK_S = 5.0
"""How often the server looks for ranges to follow."""
STALENESS_S = 1.0
"""How stale a meta range's follower may be when read for the ranges to follow."""


async def hosted_ranges(meta: Follower) -> list[tuple[int, int, int]]:
    """`MetaCatalog.hosted_ranges` as a container meta range's follower holds it."""
    first, last = HOSTED_SPAN
    out: list[tuple[int, int, int]] = []
    key = first
    while True:
        request = kv_rpc_pb2.RangeRequest(key=key, range_end=last)
        page = (await meta.read(request, max_staleness_s=STALENESS_S)).response
        out.extend(decode_hosted(kv.key, kv.value) for kv in page.kvs)
        if not page.more or not page.kvs:
            return out
        key = page.kvs[-1].key + b"\x00"


class Standby:
    def __init__(
        self, registry: ContainerRegistry, followers: Followers, *, look_s: float = LOOK_S
    ) -> None:
        self._registry = registry
        self._followers = followers
        self._look_s = look_s
        self._task: asyncio.Task[None] | None = None
        self.following = 0
        """Ranges followed at the last look."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="standby")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                self.following = await self.look()
            except Exception as exc:  # a container moving, Pulsar away: look again later
                message = exc.message if isinstance(exc, TableKeeperError) else repr(exc)
                log.warning("standby: %s", message)
            await self._registry.env.clock.sleep(self._look_s)

    async def look(self) -> int:
        """Follow what the module docstring says; how many ranges that is."""
        followed = 0
        for container in range(self._registry.env.containers()):
            if container in self._registry.containers:
                continue
            names = [RangeName(container, CONTAINER_META_STREAM_ID, CONTAINER_META_RANGE_ID)]
            if container == ROOT_CONTAINER_ID:
                names.append(RangeName(container, ROOT_STREAM_ID, ROOT_RANGE_ID))
            meta = await self._followers.get(names[0], 0)
            for name in names[1:]:
                await self._followers.get(name, 0)
            for stream_id, range_id, ttl_seconds in await hosted_ranges(meta):
                if container in self._registry.containers:
                    break  # taken over meanwhile: its ranges open from these followers
                await self._followers.get(RangeName(container, stream_id, range_id), ttl_seconds)
                followed += 1
            followed += len(names)
        return followed
