"""The ZooKeeper keyspace: the one range of table `zookeeper/keyspace`, reached and kept here.

The range is found (or its table made) through the root range, here or (cluster mode) on its
owner, as the etcd keyspace's is. While this server serves it, the keyspace is *attached*: its
first nodes and secret exist (one `INIT` command, a no-op once done), a watcher on the range's
change events feeds `on_events` (the watch dispatcher), and a sweep deletes empty containers and
expired TTL nodes every `sweep_interval_s` (each deletion a logged `SWEEP` command, rechecked
when it applies). When the range stops serving here (closed, moved, failed), `on_lost` is told
and the next `range()` attaches it again (or says where it went).

Sessions are the range's sessions (created and ended through its log, timed by its session
timer on the owner, renewed in memory by keep-alives). A session's password is an HMAC of its
id under the keyspace's secret, which lives in the range: any later owner checks it the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import struct
from collections.abc import Callable

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.keys import prefix_end
from tablekeeper_server.errors import TableKeeperError, UnavailableError
from tablekeeper_server.range.apply import front_end_command
from tablekeeper_server.range.events import ChangeEvent
from tablekeeper_server.range.records import decode_record
from tablekeeper_server.range.replica import Range
from tablekeeper_server.range.watch import KeySpan, Watcher
from tablekeeper_server.rpc.frontends import ensure_table
from tablekeeper_server.rpc.proxy import Forwarder
from tablekeeper_server.zookeeper import commands
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.apply import NAME
from tablekeeper_server.zookeeper.paths import (
    CONTAINERS,
    END,
    KEYSPACE_PKEY,
    PREFIX,
    SECRET_KEY,
    TTLS,
    index_path,
    node_key,
)
from tablekeeper_server.zookeeper.znode import raw_times

log = logging.getLogger(__name__)

NAMESPACE = "zookeeper"
TABLE = "keyspace"
PASSWORD_BYTES = 16
OPEN_RETRY_S_MAX = 2.0
SWEEP_INTERVAL_S = 60.0
"""ZooKeeper's `znode.container.checkIntervalMs` default."""
_SESSION_ID = struct.Struct(">q")


class Keyspace:
    def __init__(
        self,
        registry: ContainerRegistry,
        clock: Clock,
        *,
        forwarder: Forwarder | None = None,
        on_events: Callable[[list[ChangeEvent]], None],
        on_lost: Callable[[str], None],
        sweep_interval_s: float = SWEEP_INTERVAL_S,
        table: str = TABLE,
    ) -> None:
        """`forwarder`: cluster mode (the root range may be on another server). `on_events`:
        the range's changes, in order, as they are applied (before any write of them is
        answered); `on_lost(reason)`: the range stopped serving here."""
        self.registry = registry
        self.table = table
        self.stream_id = 0
        self._clock = clock
        self._forwarder = forwarder
        self._on_events = on_events
        self._on_lost = on_lost
        self._sweep_interval_s = sweep_interval_s
        self._opening: asyncio.Task[None] | None = None
        self._attaching: asyncio.Task[Range] | None = None
        self.serving: Range | None = None
        """The range while it is attached here (the hot path reads it without awaiting)."""
        self._watcher: Watcher | None = None
        self._secret = b""
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ life cycle

    async def open(self) -> None:
        """Find (or create) the table; standalone, also attach the range now, so its sessions
        are timed from the start. Cluster mode does this in the background until the root
        range's owner answers."""
        if self._forwarder is None:
            await self._find_table()
            await self.range()
        else:
            self._opening = asyncio.create_task(self._open_until_done(), name="zk-keyspace")

    async def close(self) -> None:
        self._closed = True
        for task in (self._opening, self._attaching, self._sweeper):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._detach()

    async def _find_table(self) -> None:
        conf = stream_pb2.StreamConfiguration(
            min_num_ranges=1, initial_num_ranges=1, storage_type=stream_pb2.TABLE
        )
        props = await ensure_table(self.registry, self._forwarder, NAMESPACE, self.table, conf)
        self.stream_id = props.stream_id
        log.info("ZooKeeper keyspace: table %s/%s (id %d)", NAMESPACE, self.table, self.stream_id)

    async def _open_until_done(self) -> None:
        pause_s = 0.1
        while True:
            try:
                await self._find_table()
                break
            except Exception as exc:  # the root range has no owner yet, or it is starting
                log.info("ZooKeeper keyspace not reachable yet (%s); retrying", exc)
            await self._clock.sleep(pause_s)
            pause_s = min(pause_s * 2, OPEN_RETRY_S_MAX)
        try:
            await self.range()
        except TableKeeperError as exc:  # another server owns it (or it is not open yet)
            log.info("ZooKeeper keyspace: %s", exc.message)

    # ------------------------------------------------------------------ the range

    async def range(self) -> Range:
        """The keyspace's range, attached. Raises `NotServedHereError` (naming its container)
        when another server owns it, `UnavailableError` while it cannot serve."""
        serving = self.serving
        if serving is not None:
            return serving
        if not self.stream_id:
            raise UnavailableError("the ZooKeeper keyspace's table is not found yet")
        if self._attaching is None or self._attaching.done():
            self._attaching = asyncio.create_task(self._attach(), name="zk-attach")
        return await asyncio.shield(self._attaching)

    async def _attach(self) -> Range:
        range_ = await self.registry.table_range(self.stream_id, KEYSPACE_PKEY)
        sm = range_.applied_state()
        if sm.store.get(node_key(zk.ROOT)) is None or sm.store.get(SECRET_KEY) is None:
            await range_.execute(front_end_command(NAME, commands.init(os.urandom(32))))
            sm = range_.applied_state()
        raw = sm.store.get(SECRET_KEY)
        assert raw is not None
        self._secret = decode_record(raw).value
        watcher, _ = range_.watch.start(KeySpan(PREFIX, END), 0)
        if self._closed:
            range_.watch.stop(watcher)
            raise UnavailableError("the ZooKeeper front-end is stopping")
        watcher.on_ready = lambda: self._events_ready(range_, watcher)
        self._watcher = watcher
        self.serving = range_
        if self._sweep_interval_s > 0:
            self._sweeper = asyncio.create_task(self._sweep_loop(range_), name="zk-sweep")
        log.info("ZooKeeper keyspace attached at zxid 0x%x", range_.applied_sequence)
        return range_

    def _events_ready(self, range_: Range, watcher: Watcher) -> None:
        """The range published changes (synchronously, right after applying them)."""
        hub = range_.watch
        try:
            while watcher.pending:
                self._on_events(hub.take_live(watcher))
            if watcher.error is not None:
                raise watcher.error
        except TableKeeperError as exc:
            if self.serving is range_:
                # The hub ended the watcher itself (and is iterating over its watchers now: it
                # must not be told to stop one).
                self._watcher = None
                self._detach()
                self._on_lost(exc.message)

    def _detach(self) -> None:
        range_, self.serving = self.serving, None
        if range_ is not None and self._watcher is not None:
            range_.watch.stop(self._watcher)
        self._watcher = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def current(self) -> Range:
        """The attached range, still serving; raises `UnavailableError` (after telling
        `on_lost`) once it is not."""
        range_ = self.serving
        if range_ is None:
            raise UnavailableError("the ZooKeeper keyspace is not attached here")
        if range_.failed or range_.sealed is not None:
            self._detach()
            reason = range_.failure or "the keyspace's range stopped serving"
            self._on_lost(reason)
            raise UnavailableError(reason)
        return range_

    # ------------------------------------------------------------------ sessions

    def password(self, session_id: int) -> bytes:
        digest = hmac.new(self._secret, _SESSION_ID.pack(session_id), hashlib.sha256).digest()
        return digest[:PASSWORD_BYTES]

    def password_ok(self, session_id: int, password: bytes | None) -> bool:
        return (
            session_id != 0
            and password is not None
            and hmac.compare_digest(self.password(session_id), password)
        )

    async def create_session(self, range_: Range, timeout_ms: int) -> int:
        """A new session (logged) with this timeout; its id."""
        response = await range_.sessions.create(timeout_ms)
        if response.header.code != 0:
            raise UnavailableError(
                f"the session could not be created (code {response.header.code})"
            )
        return int(response.session_id)

    # ------------------------------------------------------------------ containers and TTLs

    async def _sweep_loop(self, range_: Range) -> None:
        while True:
            await self._clock.sleep(self._sweep_interval_s)
            try:
                await self.sweep(range_)
            except TableKeeperError as exc:
                log.info("ZooKeeper container sweep: %s", exc.message)
                return

    def due(self, range_: Range) -> list[str]:
        """Containers and TTL nodes due for deletion now, as far as the applied state says."""
        store = range_.applied_state().store
        now = self._clock.now_ms()
        out = []
        for prefix in (CONTAINERS, TTLS):
            for key in store.keys(prefix, prefix_end(prefix)):
                path = index_path(prefix, key)
                raw = store.get(node_key(path))
                if raw is None:
                    out.append(path)  # the apply forgets the stale index entry
                    continue
                mtime, owner, cversion, children = raw_times(raw)
                if children:
                    continue
                empty_container = owner == zk.CONTAINER_OWNER and cversion > 0
                expired = zk.is_ttl_owner(owner) and now - mtime > zk.ttl_of(owner)
                if empty_container or expired:
                    out.append(path)
        return out

    async def sweep(self, range_: Range) -> int:
        """Delete what is due (one logged command each); how many were tried."""
        due = self.due(range_)
        for path in due:
            await range_.execute(front_end_command(NAME, commands.sweep(path)))
        return len(due)
