"""Blocking twins of the recipes, for code that uses the synchronous `Client`:

    from tablekeeper import Client
    from tablekeeper.recipes import sync

    with Client(service) as client:
        table = client.table("app", "meta")
        with sync.MetadataStore(table) as store:
            coordination = sync.CoordinationService(store)
            with coordination.lock("/locks/job", "worker-1") as held:
                ...  # held.fencing_token

Each wraps the asyncio recipe of the same name (`async_store`, `async_service`, ...) and runs
it on the client's event-loop thread, as `Table` does for `AsyncTable`. Iterators
(`notifications`, `listen`, `scan`) yield as the async ones do; leaving a `for` loop early
closes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, TypeVar

from tablekeeper._loop import LoopThread
from tablekeeper.client import Table
from tablekeeper.recipes import coordination, groups, metadata_store
from tablekeeper.recipes.coordination import Lock
from tablekeeper.recipes.metadata_store import Notification, SessionEvent, Stat
from tablekeeper.types import Key, KeyValue

T = TypeVar("T")


def _iterate(runner: LoopThread, iterable: AsyncIterator[T]) -> Generator[T, None, None]:
    """Yield the items of an async iterator, each fetched on the loop thread; closing this
    generator closes the async one there."""
    iterator = iterable.__aiter__()

    async def next_item() -> tuple[bool, T | None]:
        try:
            return True, await iterator.__anext__()
        except StopAsyncIteration:
            return False, None

    try:
        while True:
            more, item = runner.run(next_item())
            if not more:
                return
            yield item  # type: ignore[misc]  # an item of T when `more`
    finally:
        aclose: Callable[[], Coroutine[Any, Any, None]] | None = getattr(iterator, "aclose", None)
        if aclose is not None:
            # RuntimeError: still inside a step an interrupted caller left; it ends with the client.
            with contextlib.suppress(RuntimeError):
                runner.run(aclose())


class MetadataStore:
    """Blocking twin of `tablekeeper.recipes.MetadataStore` (same methods)."""

    def __init__(self, table: Table, *, session_ttl_s: float = 10.0) -> None:
        self._runner: LoopThread = table._runner
        self.table = table
        self.async_store = metadata_store.MetadataStore(
            table.async_table, session_ttl_s=session_ttl_s
        )

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def register_session_listener(self, listener: Callable[[SessionEvent, str], object]) -> None:
        """`listener(event, parent_path)` on session loss / re-establishment (it runs on the
        client's loop thread: keep it short)."""
        self.async_store.register_session_listener(listener)

    def get(self, path: str) -> tuple[bytes, Stat] | None:
        """(value, Stat) of the node, or None."""
        return self._run(self.async_store.get(path))

    def exists(self, path: str) -> bool:
        """Whether the node exists."""
        return self._run(self.async_store.exists(path))

    def get_children(self, path: str) -> list[str]:
        """The names of `path`'s children, sorted."""
        return self._run(self.async_store.get_children(path))

    def put(
        self,
        path: str,
        value: bytes | str,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
        sequential: bool = False,
    ) -> Stat:
        """Create or update a node; returns its Stat (see the async `put`)."""
        return self._run(
            self.async_store.put(
                path, value, expected_version, ephemeral=ephemeral, sequential=sequential
            )
        )

    def create(self, path: str, value: bytes | str, **options: bool) -> Stat:
        """Create-only put (`KeyExistsError` if the node exists)."""
        return self._run(self.async_store.create(path, value, **options))

    def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete a node (`KeyNotFoundError` if missing, `BadVersionError` on a mismatch)."""
        self._run(self.async_store.delete(path, expected_version))

    def notifications(
        self, path: str, *, start_revision: int = 0
    ) -> Generator[Notification, None, None]:
        """Created / modified / deleted events of `path` and children-changed events."""
        return _iterate(
            self._runner, self.async_store.notifications(path, start_revision=start_revision)
        )

    def close(self) -> None:
        """Close the store's sessions (its ephemeral nodes are deleted)."""
        self._run(self.async_store.close())

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class DistributedLock:
    """Blocking twin of `tablekeeper.recipes.DistributedLock`: `with service.lock(path):`."""

    def __init__(self, runner: LoopThread, lock: coordination.DistributedLock) -> None:
        self._runner = runner
        self.async_lock = lock

    @property
    def held(self) -> Lock | None:
        """The held lock (its fencing token), or None."""
        return self.async_lock.held

    @property
    def locked(self) -> bool:
        """Whether this handle holds the lock (and its session has not expired)."""
        return self.async_lock.locked

    def acquire(self, timeout: float | None = None) -> Lock:
        """Wait (up to `timeout` seconds: `TimeoutError`) until held; returns the held `Lock`."""
        return self._runner.run(self.async_lock.acquire(timeout))

    def release(self) -> None:
        """Release the lock (`SessionExpiredError` if it was lost to an expired session)."""
        self._runner.run(self.async_lock.release())

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class CoordinationService:
    """Blocking twin of `tablekeeper.recipes.CoordinationService`."""

    def __init__(self, store: MetadataStore) -> None:
        self._runner = store._runner
        self.store = store
        self.async_service = coordination.CoordinationService(store.async_store)

    def next_counter_value(self, path: str) -> int:
        """A value unique per `path` (1, 2, 3, ... across all clients)."""
        return self._runner.run(self.async_service.next_counter_value(path))

    def lock(self, path: str, value: bytes | str = b"") -> DistributedLock:
        """A lock at `path` (not acquired yet): `with service.lock(path) as held:`."""
        return DistributedLock(self._runner, self.async_service.lock(path, value))

    def acquire_lock(
        self, path: str, value: bytes | str = b"", *, timeout_s: float | None = None
    ) -> Lock:
        """Wait until this process holds the lock at `path` (`TimeoutError` after
        `timeout_s`); returns it with its fencing token."""
        return self._runner.run(self.async_service.acquire_lock(path, value, timeout_s=timeout_s))

    def release_lock(self, lock: Lock) -> None:
        """Release a held lock (`SessionExpiredError` if it was lost meanwhile)."""
        self._runner.run(self.async_service.release_lock(lock))


class LeaderElection:
    """Blocking twin of `tablekeeper.recipes.LeaderElection`."""

    def __init__(self, store: MetadataStore, path: str) -> None:
        self._runner = store._runner
        self.async_election = groups.LeaderElection(store.async_store, path)

    @property
    def lock(self) -> Lock | None:
        """The leadership (its fencing token) while this process leads, else None."""
        return self.async_election.lock

    def campaign(self, value: bytes | str = b"", *, timeout_s: float | None = None) -> Lock:
        """Wait (up to `timeout_s`: `TimeoutError`) until elected; returns the leadership."""
        election = self.async_election
        if timeout_s is None:
            return self._runner.run(election.campaign(value))
        held = self._runner.run(
            election.coordination.acquire_lock(election.path, value, timeout_s=timeout_s)
        )
        election.lock = held
        return held

    def resign(self) -> None:
        """Give up leadership (a no-op if not leading)."""
        self._runner.run(self.async_election.resign())

    def leader(self) -> tuple[str, bytes] | None:
        """(leader node path, its value), or None when nobody leads."""
        return self._runner.run(self.async_election.leader())

    def listen(self) -> Generator[tuple[str, bytes] | None, None, None]:
        """The current leader, then every change of leader."""
        return _iterate(self._runner, self.async_election.listen())


class GroupMembership:
    """Blocking twin of `tablekeeper.recipes.GroupMembership`."""

    def __init__(self, store: MetadataStore, group_path: str) -> None:
        self._runner = store._runner
        self.async_group = groups.GroupMembership(store.async_store, group_path)

    def join(self, member_id: str, metadata: bytes | str = b"") -> None:
        """Join as `member_id` (ephemeral). `KeyExistsError` if that id is taken."""
        self._runner.run(self.async_group.join(member_id, metadata))

    def leave(self, member_id: str) -> None:
        """Leave the group (a no-op if not a member)."""
        self._runner.run(self.async_group.leave(member_id))

    def members(self) -> list[str]:
        """The member ids, sorted."""
        return self._runner.run(self.async_group.members())

    def listen(self) -> Generator[list[str], None, None]:
        """The member list now, then again after every change."""
        return _iterate(self._runner, self.async_group.listen())


class DistributedCounter:
    """Blocking twin of `tablekeeper.recipes.DistributedCounter`."""

    def __init__(
        self,
        table: Table,
        pkey: Key,
        lkey: Key,
        *,
        batch_size: int = 100,
        flush_interval_s: float = 0.1,
    ) -> None:
        self._runner: LoopThread = table._runner
        self.async_counter = groups.DistributedCounter(
            table.async_table, pkey, lkey, batch_size=batch_size, flush_interval_s=flush_interval_s
        )

    def add(self, amount: int = 1) -> None:
        """Add `amount` (sent with others in a batch; see the async class)."""
        self._runner.run(self.async_counter.add(amount))

    def flush(self) -> None:
        """Send the pending increments now."""
        self._runner.run(self.async_counter.flush())

    def value(self) -> int:
        """The stored total (pending increments not included)."""
        return self._runner.run(self.async_counter.value())

    def close(self) -> None:
        """Flush and stop the flush timer."""
        self._runner.run(self.async_counter.close())


class SharedMap:
    """Blocking twin of `tablekeeper.recipes.SharedMap`."""

    def __init__(self, table: Table, name: Key) -> None:
        self._runner: LoopThread = table._runner
        self.async_map = groups.SharedMap(table.async_table, name)

    def get(self, key: Key) -> bytes | None:
        """The value at `key`, or None."""
        return self._runner.run(self.async_map.get(key))

    def put(self, key: Key, value: Key) -> None:
        """Store `value` at `key`."""
        self._runner.run(self.async_map.put(key, value))

    def put_if_absent(self, key: Key, value: Key) -> bytes | None:
        """Store `value` unless the key exists; returns the existing value (None if stored)."""
        return self._runner.run(self.async_map.put_if_absent(key, value))

    def replace(self, key: Key, expected: Key, value: Key) -> bool:
        """Set `value` only if the key currently holds `expected`."""
        return self._runner.run(self.async_map.replace(key, expected, value))

    def update(self, key: Key, fn: Callable[[bytes | None], bytes | None]) -> bytes | None:
        """Read-modify-write with `fn(old) -> new` (None deletes), retried on conflicts."""
        return self._runner.run(self.async_map.update(key, fn))

    def scan(self) -> Generator[KeyValue, None, None]:
        """The map's entries in key order."""
        return _iterate(self._runner, self.async_map.scan())


__all__ = [
    "CoordinationService",
    "DistributedCounter",
    "DistributedLock",
    "GroupMembership",
    "LeaderElection",
    "Lock",
    "MetadataStore",
    "SharedMap",
]
