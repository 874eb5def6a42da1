"""A metadata store in the shape of Pulsar's PIP-45 `MetadataStore`, on one TableKeeper table.

A path `/admin/clusters/c1/brokers/b1` is stored as pkey = its parent (`/admin/clusters/c1/brokers`)
and lkey = its last segment (`b1`). So all children of a node share one pkey: they live on one
range, `get_children` is one ordered scan of that pkey, a children watch is one watch of that pkey,
and a node's ephemeral children can use one session (sessions live on a range). The node itself
is found under its own parent's pkey.

Versions follow PIP-45: `put(path, value, expected_version)` with None = unconditional, -1 = must
not exist, N = must be at version N (`BadVersionError` otherwise). Ephemeral nodes belong to a
session the store keeps per parent path (one keep-alive stream each); sequential nodes get a
20-digit suffix unique under their parent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from tablekeeper.errors import BadVersionError, KeyExistsError, KeyNotFoundError
from tablekeeper.session import AsyncSession
from tablekeeper.table import AsyncTable

T = TypeVar("T")
SessionEvent = Literal["session-lost", "session-reestablished"]


def split_path(path: str) -> tuple[str, str]:
    """`/a/b/c` -> (`/a/b`, `c`); `/a` -> (`/`, `a`). Raises ValueError for `/` or a bad path."""
    if not path.startswith("/") or path == "/" or path.endswith("/") or "//" in path:
        raise ValueError(f"not a node path: {path!r}")
    parent, _, name = path.rpartition("/")
    return parent or "/", name


def _join(parent: str, name: str) -> str:
    return f"/{name}" if parent == "/" else f"{parent}/{name}"


@dataclass(frozen=True, slots=True)
class Stat:
    """A node's path, version and revisions (created, last modified)."""

    path: str
    version: int
    create_revision: int
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Notification:
    """A change of a node or of its children (`MetadataStore.notifications`)."""

    type: Literal["created", "modified", "deleted", "children-changed"]
    path: str
    revision: int


class MetadataStore:
    """PIP-45 operations over an `AsyncTable`. Use `async with` (closes its sessions)."""

    def __init__(self, table: AsyncTable, *, session_ttl_s: float = 10.0) -> None:
        self.table = table
        self.session_ttl_s = session_ttl_s
        self._sessions: dict[str, AsyncSession] = {}
        self._lost: set[str] = set()
        self._session_lock = asyncio.Lock()
        self._session_listeners: list[Callable[[SessionEvent, str], object]] = []

    def register_session_listener(self, listener: Callable[[SessionEvent, str], object]) -> None:
        """`listener(event, parent_path)`: "session-lost" when the session holding the ephemeral
        children of `parent_path` expired (they are gone), "session-reestablished" when a new
        one replaced it."""
        self._session_listeners.append(listener)

    def _session_event(self, event: SessionEvent, parent: str) -> None:
        for listener in self._session_listeners:
            listener(event, parent)

    async def get(self, path: str) -> tuple[bytes, Stat] | None:
        """(value, Stat) of the node at `path`, or None if it does not exist."""
        parent, name = split_path(path)
        kv = await self.table.get(parent, name)
        if kv is None:
            return None
        return kv.value, Stat(path, kv.version, kv.create_revision, kv.mod_revision)

    async def exists(self, path: str) -> bool:
        """Whether the node at `path` exists."""
        return await self.get(path) is not None

    async def get_children(self, path: str) -> list[str]:
        """The names of `path`'s children, sorted."""
        if path != "/":
            split_path(path)
        return [kv.lkey.decode() async for kv in self.table.scan(path, keys_only=True)]

    async def session_for(self, parent: str) -> AsyncSession:
        """The store's session on the range of `parent` (created on first use)."""
        async with self._session_lock:
            session = self._sessions.get(parent)
            if session is None or session.expired.is_set():
                session = self.table.session(parent, self.session_ttl_s)

                def lost(_: AsyncSession, parent: str = parent) -> None:
                    self._lost.add(parent)
                    self._session_event("session-lost", parent)

                session.on_expired(lost)
                await session.start()
                self._sessions[parent] = session
                if parent in self._lost:
                    self._lost.discard(parent)
                    self._session_event("session-reestablished", parent)
            return session

    async def put(
        self,
        path: str,
        value: bytes | str,
        expected_version: int | None = None,
        *,
        ephemeral: bool = False,
        sequential: bool = False,
    ) -> Stat:
        """Create or update a node; returns its Stat (the created path for a sequential one).
        Raises `KeyExistsError` (-1 but it exists), `BadVersionError`, `KeyNotFoundError`."""
        parent, name = split_path(path)
        session = await self.session_for(parent) if ephemeral else None
        if sequential:
            lkey = await self.table.put_sequential(parent, name, value, session=session)
            kv = await self.table.get(parent, lkey)
            if kv is None:  # deleted in between
                raise KeyNotFoundError(f"{_join(parent, lkey.decode())} vanished")
            return Stat(
                _join(parent, lkey.decode()), kv.version, kv.create_revision, kv.mod_revision
            )
        await self.table.put(
            parent, name, value, expected_version=expected_version, session=session
        )
        kv = await self.table.get(parent, name)
        if kv is None:
            raise KeyNotFoundError(f"{path} vanished")
        return Stat(path, kv.version, kv.create_revision, kv.mod_revision)

    async def create(self, path: str, value: bytes | str, **options: bool) -> Stat:
        """Create-only put (`KeyExistsError` if the node exists)."""
        return await self.put(path, value, -1, **options)

    async def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete a node (`KeyNotFoundError` if missing; `BadVersionError` on a version
        mismatch)."""
        parent, name = split_path(path)
        if expected_version is None:
            if not await self.table.delete(parent, name):
                raise KeyNotFoundError(f"{path} does not exist")
        else:
            await self.table.delete(parent, name, expected_version=expected_version)

    async def notifications(
        self, path: str, *, start_revision: int = 0
    ) -> AsyncIterator[Notification]:
        """Created / modified / deleted events of the node `path`, and children-changed events
        of `path` (a child created or deleted), until the caller stops. Each of the two kinds
        comes in revision order (they are two watches: node and children)."""
        parent, name = split_path(path)
        queue: asyncio.Queue[Notification | BaseException] = asyncio.Queue()

        async def node() -> None:
            async with self.table.watch(parent, name, start_revision=start_revision) as w:
                async for e in w:
                    if e.type == "delete":
                        kind: Literal["created", "modified", "deleted"] = "deleted"
                    else:
                        kind = "created" if e.kv is not None and e.kv.version == 0 else "modified"
                    await queue.put(Notification(kind, path, e.revision))

        async def children() -> None:
            async with self.table.watch(path, start=b"", start_revision=start_revision) as w:
                async for e in w:
                    if e.type == "delete" or (e.kv is not None and e.kv.version == 0):
                        await queue.put(Notification("children-changed", path, e.revision))

        async def run(coro: object) -> None:
            try:
                await coro  # type: ignore[misc]
            except BaseException as exc:  # noqa: BLE001 (handed to the consumer)
                await queue.put(exc)

        tasks = [asyncio.create_task(run(node())), asyncio.create_task(run(children()))]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    def cache(
        self, serialize: Callable[[T], bytes], deserialize: Callable[[bytes], T]
    ) -> MetadataCache[T]:
        """A typed view with read-modify-update (PIP-45's `MetadataCache<T>`)."""
        return MetadataCache(self, serialize, deserialize)

    async def close(self) -> None:
        """Close the store's sessions (its ephemeral nodes are deleted)."""
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class MetadataCache(Generic[T]):
    """Typed values at paths, cached with their version. A cached value is used only for the
    first attempt of a `read_modify_update`; a version conflict drops it and re-reads, so the
    cache can be stale but never makes an update lose another writer's change. `get` reads
    through (fresh) and refreshes the cache."""

    def __init__(
        self,
        store: MetadataStore,
        serialize: Callable[[T], bytes],
        deserialize: Callable[[bytes], T],
    ) -> None:
        self.store = store
        self._serialize = serialize
        self._deserialize = deserialize
        self._cached: dict[str, tuple[T, int]] = {}

    async def get(self, path: str) -> T | None:
        """The value at `path` read from the store (refreshing the cache), or None."""
        got = await self.store.get(path)
        if got is None:
            self._cached.pop(path, None)
            return None
        value = self._deserialize(got[0])
        self._cached[path] = (value, got[1].version)
        return value

    async def create(self, path: str, value: T) -> None:
        """Create the node with `value` (`KeyExistsError` if it exists)."""
        stat = await self.store.create(path, self._serialize(value))
        self._cached[path] = (value, stat.version)

    async def delete(self, path: str) -> None:
        """Delete the node (`KeyNotFoundError` if it is missing)."""
        self._cached.pop(path, None)
        await self.store.delete(path)

    async def read_modify_update(
        self, path: str, modify: Callable[[T | None], T], *, attempts: int = 100
    ) -> T:
        """Apply `modify(current)` (None if absent) and store the result with a version check,
        retrying on conflicts (`BadVersionError`, `KeyExistsError`, `KeyNotFoundError`)."""
        cached = self._cached.get(path)
        for _ in range(attempts):
            if cached is None:
                got = await self.store.get(path)
                current = (self._deserialize(got[0]), got[1].version) if got else None
            else:
                current, cached = cached, None
            new = modify(current[0] if current else None)
            try:
                stat = await self.store.put(
                    path, self._serialize(new), current[1] if current else -1
                )
            except (BadVersionError, KeyExistsError, KeyNotFoundError):
                self._cached.pop(path, None)
                continue
            self._cached[path] = (new, stat.version)
            return new
        raise BadVersionError(f"{path}: read-modify-update conflicted {attempts} times")


__all__ = [
    "KeyExistsError",
    "MetadataCache",
    "MetadataStore",
    "Notification",
    "SessionEvent",
    "Stat",
    "split_path",
]
