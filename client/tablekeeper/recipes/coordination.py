"""Coordination on a `MetadataStore`: unique counters and locks with fencing tokens.

Lock recipe (ZooKeeper's): each contender creates an ephemeral sequential child `lock-NNN…` of the
lock path; the lowest holds the lock; the others watch their predecessor and re-check when it
goes. A holder's fencing token is the create revision of its node: it grows with every new
holder of the lock.

Caveat (as with every lease-based lock): a holder that pauses or is partitioned for longer than
its session TTL loses the lock while it may still believe it holds it, and another process then
holds it too. Pass the fencing token to whatever the lock protects and have it reject requests
carrying a token older than one it has seen.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tablekeeper.errors import KeyNotFoundError, TableKeeperError
from tablekeeper.recipes.metadata_store import MetadataStore, split_path

log = logging.getLogger(__name__)

_LOCK_PREFIX = "lock-"


@dataclass(frozen=True, slots=True)
class Lock:
    path: str
    node: str
    """The contender node that holds the lock (its full path)."""
    fencing_token: int
    """The node's create revision: strictly greater for every later holder."""


class CoordinationService:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def next_counter_value(self, path: str) -> int:
        """A value unique per `path` (1, 2, 3, … across all clients)."""
        parent, name = split_path(path)
        total = await self.store.table.increment(parent, name, 1, get_total=True)
        assert total is not None
        return total

    async def acquire_lock(
        self, path: str, value: bytes | str = b"", *, timeout_s: float | None = None
    ) -> Lock:
        """Wait until this process holds the lock at `path`; returns it with its fencing token.
        The lock is released by `release_lock` or when the store's session ends.

        Giving up (`timeout_s` passing: `TimeoutError`; the caller cancelling; an error) removes
        this contender's node before the exception goes on, so it never blocks later holders.
        """
        split_path(path)
        stat = await self.store.put(
            f"{path}/{_LOCK_PREFIX}", value, ephemeral=True, sequential=True
        )
        try:
            async with asyncio.timeout(timeout_s):
                await self._wait_for_turn(path, stat.path, stat.create_revision)
        except BaseException:
            # Shielded: a cancelled caller must still not leave its node behind.
            cleanup = asyncio.ensure_future(self._withdraw(stat.path))
            await asyncio.shield(cleanup)
            raise
        return Lock(path, stat.path, stat.create_revision)

    async def _wait_for_turn(self, path: str, node: str, create_revision: int) -> None:
        mine = node.rsplit("/", 1)[1]
        while True:
            contenders = sorted(
                name
                for name in await self.store.get_children(path)
                if name.startswith(_LOCK_PREFIX)
            )
            if mine not in contenders:
                raise RuntimeError(f"lost the lock node {node} (session expired)")
            index = contenders.index(mine)
            if index == 0:
                return
            predecessor = contenders[index - 1]
            # Any change of the predecessor since our node was created wakes us.
            async with self.store.table.watch(
                path, predecessor, start_revision=create_revision + 1
            ) as watch:
                async for event in watch:
                    if event.type == "delete":
                        break

    async def _withdraw(self, node: str) -> None:
        try:
            await self.store.delete(node)
        except KeyNotFoundError:
            pass  # already gone (the session ended)
        except TableKeeperError as exc:
            # The node stays until the store's session ends; say so rather than hide it.
            log.warning("could not remove lock contender %s: %s", node, exc)

    async def release_lock(self, lock: Lock) -> None:
        await self.store.delete(lock.node)
