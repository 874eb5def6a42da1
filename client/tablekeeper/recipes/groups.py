"""Group membership (Kafka KIP-30's shape), leader election, a batching counter and a shared map,
all on the public SDK (and `MetadataStore` for the path-based ones).

- `GroupMembership`: members are ephemeral children of the group path; `members()` lists them,
  `listen()` yields the new member list whenever it changes.
- `LeaderElection`: the lock recipe; the leader is the lowest contender. Its fencing token grows
  with every new leader. `leader()` reads the current one; `listen()` yields changes.
- `DistributedCounter`: increments batched client-side, flushed when `batch_size` are pending or
  `flush_interval_s` after the first pending one (so a crash loses at most one unflushed batch).
- `SharedMap`: get / put_if_absent / replace (CAS on version) / update with a function (retries on
  version conflicts) / scan, on one pkey of a table.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from tablekeeper.errors import (
    BadVersionError,
    KeyExistsError,
    KeyNotFoundError,
    SessionExpiredError,
)
from tablekeeper.recipes.coordination import CoordinationService, Lock
from tablekeeper.recipes.metadata_store import MetadataStore, split_path
from tablekeeper.table import AsyncTable, Key, KeyValue


class GroupMembership:
    """Members of a group as ephemeral children of `group_path` in a `MetadataStore`."""

    def __init__(self, store: MetadataStore, group_path: str) -> None:
        if group_path != "/":
            split_path(group_path)
        self.store = store
        self.path = group_path

    async def join(self, member_id: str, metadata: bytes | str = b"") -> None:
        """Join as `member_id` (ephemeral: leaving, closing the store or expiry removes it).
        Raises `KeyExistsError` if that member id is taken."""
        await self.store.create(f"{self.path}/{member_id}", metadata, ephemeral=True)

    async def leave(self, member_id: str) -> None:
        """Leave the group (a no-op if not a member)."""
        with contextlib.suppress(KeyNotFoundError):
            await self.store.delete(f"{self.path}/{member_id}")

    async def members(self) -> list[str]:
        """The member ids, sorted."""
        return await self.store.get_children(self.path)

    async def listen(self) -> AsyncIterator[list[str]]:
        """The member list now, then again after every change."""
        table = self.store.table
        async with table.watch(self.path, start=b"") as watch:
            yield await self.members()
            async for event in watch:
                if event.type == "delete" or (event.kv is not None and event.kv.version == 0):
                    yield await self.members()


class LeaderElection:
    """Leader election on the lock recipe: the lowest contender at `path` leads."""

    def __init__(self, store: MetadataStore, path: str) -> None:
        self.coordination = CoordinationService(store)
        self.store = store
        self.path = path
        self.lock: Lock | None = None

    async def campaign(self, value: bytes | str = b"") -> Lock:
        """Wait until elected; returns the leadership (its fencing token)."""
        self.lock = await self.coordination.acquire_lock(self.path, value)
        return self.lock

    async def resign(self) -> None:
        """Give up leadership (a no-op if not leading, or if it was lost already)."""
        if self.lock is not None:
            with contextlib.suppress(KeyNotFoundError, SessionExpiredError):
                await self.coordination.release_lock(self.lock)
            self.lock = None

    async def leader(self) -> tuple[str, bytes] | None:
        """(leader node path, its value), or None when nobody leads."""
        for name in sorted(await self.store.get_children(self.path)):
            got = await self.store.get(f"{self.path}/{name}")
            if got is not None:
                return f"{self.path}/{name}", got[0]
        return None

    async def listen(self) -> AsyncIterator[tuple[str, bytes] | None]:
        """The current leader, then every change of leader."""
        async with self.store.table.watch(self.path, start=b"") as watch:
            current = await self.leader()
            yield current
            async for _ in watch:
                leader = await self.leader()
                if leader != current:
                    current = leader
                    yield leader


class DistributedCounter:
    """A counter at (pkey, lkey) whose increments are batched client-side."""

    def __init__(
        self,
        table: AsyncTable,
        pkey: Key,
        lkey: Key,
        *,
        batch_size: int = 100,
        flush_interval_s: float = 0.1,
    ) -> None:
        self.table, self.pkey, self.lkey = table, pkey, lkey
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self._pending = 0
        self._count = 0
        self._timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def add(self, amount: int = 1) -> None:
        """Add `amount`; sent with other pending increments (see the class)."""
        self._pending += amount
        self._count += 1
        if self._count >= self.batch_size:
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.flush_interval_s)
        self._timer = None
        await self.flush()

    async def flush(self) -> None:
        """Send the pending increments now (one increment of their sum)."""
        async with self._lock:
            amount, self._pending, self._count = self._pending, 0, 0
            if amount:
                await self.table.increment(self.pkey, self.lkey, amount)

    async def value(self) -> int:
        """The stored total (pending increments not included)."""
        kv = await self.table.get(self.pkey, self.lkey)
        return (kv.number or 0) if kv is not None else 0

    async def close(self) -> None:
        """Stop the flush timer and send what is pending."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()


class SharedMap:
    """A map on one pkey of a table (atomic scans; one range)."""

    def __init__(self, table: AsyncTable, name: Key) -> None:
        self.table = table
        self.name = name

    async def get(self, key: Key) -> bytes | None:
        """The value at `key`, or None."""
        kv = await self.table.get(self.name, key)
        return kv.value if kv is not None else None

    async def put(self, key: Key, value: Key) -> None:
        """Store `value` at `key`."""
        await self.table.put(self.name, key, value)

    async def put_if_absent(self, key: Key, value: Key) -> bytes | None:
        """Store `value` unless the key exists; returns the existing value (None if stored)."""
        while True:
            try:
                await self.table.put(self.name, key, value, expected_version=-1)
                return None
            except KeyExistsError:
                existing = await self.get(key)
                if existing is not None:
                    return existing

    async def replace(self, key: Key, expected: Key, value: Key) -> bool:
        """Set `value` only if the key currently holds `expected`."""
        kv = await self.table.get(self.name, key)
        want = expected.encode() if isinstance(expected, str) else bytes(expected)
        if kv is None or kv.value != want:
            return False
        try:
            await self.table.put(self.name, key, value, expected_version=kv.version)
            return True
        except (BadVersionError, KeyNotFoundError):
            return False

    async def update(self, key: Key, fn: Callable[[bytes | None], bytes | None]) -> bytes | None:
        """Read-modify-write with `fn(old) -> new` (None deletes), retried on conflicts."""
        while True:
            kv = await self.table.get(self.name, key)
            new = fn(kv.value if kv is not None else None)
            try:
                if new is None:
                    if kv is not None:
                        await self.table.delete(self.name, key, expected_version=kv.version)
                else:
                    version = kv.version if kv is not None else -1
                    await self.table.put(self.name, key, new, expected_version=version)
                return new
            except (BadVersionError, KeyExistsError, KeyNotFoundError):
                continue

    async def scan(self) -> AsyncIterator[KeyValue]:
        """The map's entries in key order."""
        async for kv in self.table.scan(self.name):
            yield kv
