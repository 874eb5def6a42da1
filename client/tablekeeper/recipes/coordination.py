"""Coordination on a `MetadataStore`: unique counters and locks with fencing tokens.

Lock recipe (ZooKeeper's): each contender creates an ephemeral sequential child `lock-NNN…` of the
lock path; the lowest holds the lock; the others watch their predecessor and re-check when it
goes. A holder's fencing token is the create revision of its node: it grows with every new
holder of the lock.

Use a lock as `async with coordination.lock(path) as held:` (`DistributedLock`, which also has
`acquire(timeout=)` and `release()`), or with `acquire_lock` / `release_lock`. When the store's
session behind a lock expires, its node is gone: waiting for it, releasing it and
`Lock.ensure_held()` raise `SessionExpiredError`.

Caveat (as with every lease-based lock): a holder that pauses or is partitioned for longer than
its session TTL loses the lock while it may still believe it holds it, and another process then
holds it too. Pass the fencing token to whatever the lock protects and have it reject requests
carrying a token older than one it has seen.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import TracebackType

from tablekeeper.errors import KeyNotFoundError, SessionExpiredError, TableKeeperError
from tablekeeper.recipes.metadata_store import MetadataStore, Stat, split_path
from tablekeeper.session import AsyncSession

log = logging.getLogger(__name__)

_LOCK_PREFIX = "lock-"


@dataclass(frozen=True, slots=True)
class Lock:
    """A held lock: its path, its contender node and its fencing token."""

    path: str
    node: str
    """The contender node that holds the lock (its full path)."""
    fencing_token: int
    """The node's create revision: strictly greater for every later holder."""
    session: AsyncSession | None = field(default=None, compare=False, repr=False)
    """The store's session the node belongs to (None: not known)."""

    @property
    def expired(self) -> bool:
        """Whether the session behind the lock expired (or was closed): the lock is lost."""
        return self.session is not None and self.session.expired.is_set()

    def ensure_held(self) -> None:
        """Raise `SessionExpiredError` if the lock is known lost (call it before acting under
        the lock; the fencing token remains the real guard)."""
        if self.expired:
            raise SessionExpiredError(f"lock {self.path} lost: its session expired ({self.node})")


class CoordinationService:
    """Unique counters and locks on a `MetadataStore` (see the module docstring)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def lock(self, path: str, value: bytes | str = b"") -> DistributedLock:
        """A lock at `path` (not acquired yet): `async with service.lock(path) as held:`, or
        `await lock.acquire(timeout=...)` and `await lock.release()`. `value` is stored in this
        contender's node (e.g. who holds it)."""
        split_path(path)
        return DistributedLock(self, path, value)

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
        `SessionExpiredError`: the store's session expired while waiting (the node is gone).
        """
        split_path(path)
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout must be > 0 seconds or None (got {timeout_s!r})")
        made = asyncio.ensure_future(
            self.store.put(f"{path}/{_LOCK_PREFIX}", value, ephemeral=True, sequential=True)
        )
        try:
            stat = await asyncio.shield(made)
        except asyncio.CancelledError:
            # Cancelled while the node was being made: the server may have made it already
            # (others can see it) without our having its name yet. Wait for the answer, then
            # remove it, so a cancelled caller never leaves its node behind.
            await asyncio.shield(self._withdraw_once_made(made))
            raise
        try:
            # The session the node was put with (a newer one if that expired meanwhile: then
            # the node is gone, and the wait below says so).
            session = await self.store.session_for(path)
            async with asyncio.timeout(timeout_s):
                await self._wait_for_turn(path, stat.path, stat.create_revision, session)
        except BaseException:
            # Shielded: a cancelled caller must still not leave its node behind.
            cleanup = asyncio.ensure_future(self._withdraw(stat.path))
            await asyncio.shield(cleanup)
            raise
        return Lock(path, stat.path, stat.create_revision, session)

    async def _wait_for_turn(
        self, path: str, node: str, create_revision: int, session: AsyncSession
    ) -> None:
        mine = node.rsplit("/", 1)[1]
        while True:
            contenders = sorted(
                name
                for name in await self.store.get_children(path)
                if name.startswith(_LOCK_PREFIX)
            )
            if mine not in contenders or session.expired.is_set():
                raise SessionExpiredError(f"lost the lock node {node}: its session expired")
            index = contenders.index(mine)
            if index == 0:
                return
            # Wake when the predecessor goes, or when our own session expires (our node is
            # deleted then, and nothing would wake us).
            predecessor = asyncio.ensure_future(
                self._predecessor_gone(path, contenders[index - 1], create_revision)
            )
            expired = asyncio.ensure_future(session.expired.wait())
            try:
                await asyncio.wait((predecessor, expired), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (predecessor, expired):
                    task.cancel()
                await asyncio.gather(predecessor, expired, return_exceptions=True)
            if predecessor.done() and not predecessor.cancelled():
                predecessor.result()  # its error, if the watch failed

    async def _predecessor_gone(self, path: str, predecessor: str, create_revision: int) -> None:
        # Any change of the predecessor since our node was created wakes us.
        async with self.store.table.watch(
            path, predecessor, start_revision=create_revision + 1
        ) as watch:
            async for event in watch:
                if event.type == "delete":
                    return

    async def _withdraw_once_made(self, made: asyncio.Future[Stat]) -> None:
        try:
            stat = await made
        except Exception:
            return  # not made (an error answered; an unknown outcome ends with the session)
        await self._withdraw(stat.path)

    async def _withdraw(self, node: str) -> None:
        try:
            await self.store.delete(node)
        except KeyNotFoundError:
            pass  # already gone (the session ended)
        except TableKeeperError as exc:
            # The node stays until the store's session ends; say so rather than hide it.
            log.warning("could not remove lock contender %s: %s", node, exc)

    async def release_lock(self, lock: Lock) -> None:
        """Release a held lock (delete its node). `SessionExpiredError` if it was lost to an
        expired session meanwhile (another process may have held it since)."""
        try:
            await self.store.delete(lock.node)
        except KeyNotFoundError:
            if lock.expired:
                raise SessionExpiredError(
                    f"lock {lock.path} was lost while held: its session expired ({lock.node})"
                ) from None
            raise


class DistributedLock:
    """A lock at one path, acquired and released through a `CoordinationService`:

    async with coordination.lock("/locks/job") as held:
        ...  # held.fencing_token
    """

    def __init__(self, coordination: CoordinationService, path: str, value: bytes | str) -> None:
        self.coordination = coordination
        self.path = path
        self.value = value
        self.held: Lock | None = None
        """The held lock (its fencing token), or None."""

    async def acquire(self, timeout: float | None = None) -> Lock:
        """Wait (up to `timeout` seconds: `TimeoutError`) until held; returns the held `Lock`.
        Not reentrant: `RuntimeError` if this handle holds it already."""
        if self.held is not None:
            raise RuntimeError(f"lock {self.path} is already held by this handle")
        self.held = await self.coordination.acquire_lock(self.path, self.value, timeout_s=timeout)
        return self.held

    async def release(self) -> None:
        """Release the lock (`RuntimeError` if not held; `SessionExpiredError` if it was lost)."""
        held, self.held = self.held, None
        if held is None:
            raise RuntimeError(f"lock {self.path} is not held")
        await self.coordination.release_lock(held)

    @property
    def locked(self) -> bool:
        """Whether this handle holds the lock (and its session has not expired)."""
        return self.held is not None and not self.held.expired

    async def __aenter__(self) -> Lock:
        return await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
