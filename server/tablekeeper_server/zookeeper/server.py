"""The ZooKeeper client port: jute over TCP, one asyncio protocol per client connection.

A connection's life, as ZooKeeper's `NIOServerCnxn` and `ZooKeeperServer` run it:

1. Its first four bytes may be a four-letter word (`words`): answered, then closed.
2. The first packet is a ConnectRequest. Session id 0 creates a session (a logged command; its
   timeout is the requested one clamped to the server's minimum and maximum); another id
   resumes that session if its password (`Keyspace.password`) matches and it is live, and any
   other connection of it is closed; otherwise the reply says "expired" (timeout 0, id 0) and
   the connection closes. A client that has seen a zxid this server has not is refused.
3. Requests, answered in their order (ZooKeeper's clients check it): reads run on the range's
   applied state as soon as every request before them is answered; writes go to the range's
   log as soon as every read before them has run, so a connection keeps many writes in one
   group commit; a write is answered when it is applied. Watch events are written the moment
   the range applies a change (before any write of that batch is answered), so a client sees
   an event before the reply to any request it sends after the change.
4. Any packet renews the session (in memory); silence for the session's timeout closes the
   connection (and the range's session timer expires the session: its ephemeral nodes go).

Bad input gets ZooKeeper's treatment: a packet length over `packet_bytes_max` (jute.maxbuffer)
or below zero closes the connection; a record that does not decode answers MARSHALLINGERROR; an
unknown operation answers UNIMPLEMENTED and closes. Nothing of it reaches the range.

Cluster mode: a connection to a server that does not own the keyspace's range is relayed, bytes
both ways, to the owner's ZooKeeper port (found like the etcd front-end's pass-through finds
its owner); when the owner changes, the relayed connection closes and the client reconnects,
resuming its session on the new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.core.keys import prefix_end
from tablekeeper_server.errors import NotServedHereError, TableKeeperError, wire_rule
from tablekeeper_server.range.apply import Command, FrontEndCommand
from tablekeeper_server.range.replica import Range
from tablekeeper_server.range.sessions import TTL_MS_MAX, TTL_MS_MIN
from tablekeeper_server.rpc.frontends import FrontEndPeers
from tablekeeper_server.rpc.proxy import Forwarder
from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import jute, reads, words
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.apply import NAME, Applied, decode_multi, prepare
from tablekeeper_server.zookeeper.jute import JuteError
from tablekeeper_server.zookeeper.keyspace import SWEEP_INTERVAL_S, Keyspace
from tablekeeper_server.zookeeper.paths import END, EPHEMERALS, PREFIX, node_key
from tablekeeper_server.zookeeper.watches import Watches
from tablekeeper_server.zookeeper.znode import raw_acl

log = logging.getLogger(__name__)

PACKET_BYTES_MAX = 0xFFFFF
"""ZooKeeper's default jute.maxbuffer."""
OUTSTANDING_MAX = 1000
"""Requests one connection may have unanswered before the server stops reading it (ZooKeeper's
globalOutstandingLimit)."""
UNSENT_BYTES_MAX = 64 * 1024 * 1024
"""Replies and watch events one connection may have waiting for its client to read them; past
it the connection is closed (a client that stops reading cannot make the server hold more)."""
_EXPIRED_PASSWORD = bytes(16)


@dataclass(frozen=True, slots=True)
class ZooKeeperSettings:
    tick_ms: int = 2000
    min_session_timeout_ms: int = 0
    """0: two ticks (ZooKeeper's default)."""
    max_session_timeout_ms: int = 0
    """0: twenty ticks."""
    packet_bytes_max: int = PACKET_BYTES_MAX
    sweep_interval_s: float = SWEEP_INTERVAL_S
    """How often empty containers and expired TTL nodes are looked for (0: never)."""

    @property
    def session_bounds_ms(self) -> tuple[int, int]:
        """(shortest, longest) session timeout, within what a range's session may have."""
        low = max(self.min_session_timeout_ms or 2 * self.tick_ms, TTL_MS_MIN)
        high = min(self.max_session_timeout_ms or 20 * self.tick_ms, TTL_MS_MAX)
        return low, max(low, high)

    def negotiate(self, requested_ms: int) -> int:
        low, high = self.session_bounds_ms
        return min(max(requested_ms, low), high)


_READ = 0
_WRITE = 1
_CLOSE = 2
_UNKNOWN = 3
_NEW, _ROUTING, _CONNECTING, _OPEN, _RELAY, _CLOSED = range(6)


class _Item:
    """One request of a connection, from its arrival to its reply."""

    __slots__ = ("frame", "kind", "op", "reply", "started", "xid")

    def __init__(self, xid: int, op: int, kind: int, frame: bytes, started: float) -> None:
        self.xid = xid
        self.op = op
        self.kind = kind
        self.frame = frame
        self.reply: bytes | None = None
        self.started = started


class ZooKeeperServer:
    """The ZooKeeper port of one server process."""

    def __init__(
        self,
        registry: ContainerRegistry,
        clock: Clock,
        *,
        bind_host: str,
        port: int,
        settings: ZooKeeperSettings | None = None,
        forwarder: Forwarder | None = None,
        peers: FrontEndPeers | None = None,
        metrics: RequestMetrics | None = None,
    ) -> None:
        """`forwarder` and `peers`: cluster mode or a worker (the keyspace's range may be on
        another server: connections are relayed to its owner's port). `metrics`: where each
        reply is counted and timed."""
        self.settings = settings or ZooKeeperSettings()
        self.metrics = metrics
        self.clock = clock
        self.bind_host = bind_host
        self.port = port
        self.peers = peers
        self.watches = Watches(acl_of=self._acl_of)
        self.keyspace = Keyspace(
            registry,
            clock,
            forwarder=forwarder,
            on_events=self.watches.publish,
            on_lost=self._lost,
            sweep_interval_s=self.settings.sweep_interval_s,
        )
        self.connections: set[Connection] = set()
        self.sessions: dict[int, Connection] = {}
        self.received = 0
        self.sent = 0
        self.latency_s = [float("inf"), 0.0, 0.0, 0]  # min, total, max, count
        self._server: asyncio.Server | None = None
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the keyspace (standalone: attach its range), then listen."""
        await self.keyspace.open()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), self.bind_host, self.port, reuse_address=True
        )
        if not self.port:
            self.port = self._server.sockets[0].getsockname()[1]
        self._expiry = asyncio.create_task(self._expire_idle(), name="zk-expiry")

    async def stop(self) -> None:
        """Stop listening and close every connection (their sessions stay: clients resume them
        on the next server, within their timeout)."""
        if self._server is not None:
            self._server.close()
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        for connection in list(self.connections):
            connection.close("server stopping")
        await self.keyspace.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def _acl_of(self, path: str) -> bytes | None:
        """The ACL of the node at `path` in the attached range's applied state (None: no such
        node, or no range attached)."""
        range_ = self.keyspace.serving
        if range_ is None:
            return None
        raw = range_.applied_state().store.get(node_key(path))
        return raw_acl(raw) if raw is not None else None

    def _lost(self, reason: str) -> None:
        """The keyspace's range stopped serving here: every client reconnects (to this server
        once it serves again, or through it to the new owner)."""
        log.info(
            "ZooKeeper keyspace detached (%s): closing %d connections",
            reason,
            len(self.connections),
        )
        for connection in list(self.connections):
            if connection.state != _RELAY:
                connection.close(reason)

    async def _expire_idle(self) -> None:
        """Close connections silent past their session's timeout, and those whose session has
        ended (expired or closed elsewhere)."""
        while True:
            await self.clock.sleep(min(1.0, self.settings.tick_ms / 1000))
            now = self.clock.monotonic_s()
            range_ = self.keyspace.serving
            for connection in list(self.connections):
                if connection.state != _OPEN:
                    continue
                if now - connection.last_seen > connection.timeout_ms / 1000:
                    connection.close("session timeout with no packet")
                elif (
                    range_ is not None
                    and range_.sessions.remaining_s(connection.session_id) is None
                ):
                    connection.close("session ended")

    def record_reply(self, op: int, reply: bytes, started: float) -> None:
        """Count a reply (its operation, its error code) and time it since `started`, for the
        four-letter words and the metrics (`tablekeeper_requests`, method `ZooKeeper/<op>`)."""
        self._record(op, reply, self.clock.monotonic_s() - started)

    def record_replies(self, items: list[_Item]) -> None:
        """`record_reply` for requests answered together (timed up to now). Those of one
        operation, code and arrival (a client's pipelined requests arrive together) took the
        same time: each such set is counted and timed with one update."""
        now = self.clock.monotonic_s()
        if len(items) == 1:
            item = items[0]
            assert item.reply is not None
            self._record(item.op, item.reply, now - item.started)
            return
        sets: dict[tuple[int, int, float], int] = {}
        for item in items:
            assert item.reply is not None
            key = (item.op, _reply_code(item.reply), item.started)
            sets[key] = sets.get(key, 0) + 1
        for (op, code, started), count in sets.items():
            self._count(op, code, now - started, count)

    def _record(self, op: int, reply: bytes, elapsed: float) -> None:
        self._count(op, _reply_code(reply), elapsed, 1)

    def _count(self, op: int, code: int, elapsed: float, count: int) -> None:
        if self.metrics is not None and code != _NO_CODE:
            method = _METHODS.get(op) or f"ZooKeeper/{op}"
            if count == 1:
                self.metrics.observe_request(method, code, elapsed)
            else:
                self.metrics.observe_requests(method, code, elapsed, count)
        stats = self.latency_s
        if elapsed < stats[0]:
            stats[0] = elapsed
        if elapsed > stats[2]:
            stats[2] = elapsed
        stats[1] += elapsed * count
        stats[3] += count

    def stats(self) -> words.Stats:
        range_ = self.keyspace.serving
        nodes = ephemerals = zxid = sessions = 0
        if range_ is not None and not range_.failed:
            store = range_.applied_state().store
            nodes = len(store.keys(PREFIX, END)) + 1  # ZooKeeper counts the root twice
            ephemerals = len(store.keys(EPHEMERALS, prefix_end(EPHEMERALS)))
            zxid = range_.applied_sequence
            sessions = len(range_.sessions)
        low, total, high, count = self.latency_s
        low_ms, high_ms = (low * 1000 if count else 0.0), high * 1000
        low_bound, high_bound = self.settings.session_bounds_ms
        return words.Stats(
            received=self.received,
            sent=self.sent,
            connections=[c.describe() for c in self.connections],
            outstanding=sum(len(c.unanswered) for c in self.connections),
            zxid=zxid,
            nodes=nodes,
            watches=self.watches.count(),
            ephemerals=ephemerals,
            sessions=sessions,
            latency_ms=(low_ms, total * 1000 / count if count else 0.0, high_ms),
            settings={
                "clientPort": str(self.port),
                "clientPortAddress": self.bind_host,
                "tickTime": str(self.settings.tick_ms),
                "minSessionTimeout": str(low_bound),
                "maxSessionTimeout": str(high_bound),
                "jute.maxbuffer": str(self.settings.packet_bytes_max),
                "serverId": "0",
            },
        )

    async def locate(self) -> str | None:
        """Cluster mode: None if the keyspace's range is served here, else the ZooKeeper
        address of the server that owns it. Raises `TableKeeperError` when there is none."""
        try:
            await self.keyspace.range()
            return None
        except NotServedHereError as elsewhere:
            container_id = elsewhere.container_id
        peers = self.peers
        if peers is None:
            raise NotServedHereError(container_id)
        owner = peers.owner_of(container_id)
        if owner is None or owner == peers.self_endpoint:
            raise NotServedHereError(container_id, f"container {container_id} has no owner now")
        address = await peers.address(owner)
        if address is None:
            raise NotServedHereError(container_id, f"{owner} serves no ZooKeeper port")
        return address


class Connection(asyncio.Protocol):
    """One client connection (see the module docstring)."""

    def __init__(self, server: ZooKeeperServer) -> None:
        self.server = server
        self.state = _NEW
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.session_id = 0
        self.timeout_ms = 0
        self.auth: list[acls.AuthId] = []
        self._auth_raw = b""
        self.watched: set[tuple[int, str]] = set()
        self._buffer = bytearray()
        self.unanswered: deque[_Item] = deque()
        self._waiting: deque[_Item] = deque()
        self._batch: list[tuple[_Item, Command]] = []
        self._overflow: deque[list[tuple[_Item, Command]]] = deque()
        self._overflow_task: asyncio.Task[None] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._close_after_flush = False
        self._paused = False
        self._write_paused = False
        self._relay: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_seen = server.clock.monotonic_s()
        self._last_touch = 0.0

    def describe(self) -> str:
        return (
            f"/{self.peer}[1](queued={len(self.unanswered)},sid=0x{self.session_id:x},"
            f"to={self.timeout_ms})"
        )

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if isinstance(peer, tuple):
            self.auth = [(acls.IP, str(peer[0]))]
            self._auth_raw = acls.encode_auth(self.auth)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = _CLOSED
        self.server.connections.discard(self)
        if self.server.sessions.get(self.session_id) is self:
            del self.server.sessions[self.session_id]
        self.server.watches.drop(self)
        for task in (self._task, self._overflow_task):
            if task is not None:
                task.cancel()
        if self._relay is not None:
            self._relay.close()

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._relay is not None:
            self._relay.pause_reading()  # relayed: the owner waits for this client
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._relay is not None:
            self._relay.resume_reading()
        self._resume()

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if (
            self._paused
            and not self._write_paused
            and len(self.unanswered) < OUTSTANDING_MAX // 2
            and self.transport is not None
            and self.state != _CLOSED
        ):
            self._paused = False
            self.transport.resume_reading()

    def close(self, reason: str) -> None:
        """Close the connection now (what is written goes first)."""
        if self.state == _CLOSED:
            return
        log.debug(
            "ZooKeeper connection %s (session 0x%x) closed: %s", self.peer, self.session_id, reason
        )
        self._flush()
        self.state = _CLOSED
        if self.transport is not None:
            self.transport.close()

    def _send(self, packet: bytes) -> None:
        self._out.append(packet)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def send_event(self, packet: bytes) -> None:
        if self.state == _OPEN:
            self._send(packet)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            self.server.sent += len(out)
            transport.writelines(out)
            if self._write_paused and transport.get_write_buffer_size() > UNSENT_BYTES_MAX:
                out.clear()
                self.close("the client does not read its replies and events")
                return
        out.clear()
        if self._close_after_flush:
            self._close_after_flush = False
            self.close("closed after its last reply")

    def data_received(self, data: bytes) -> None:
        if self.state == _RELAY:
            if self._relay is not None:
                self._relay.write(data)
            else:
                self._buffer += data
            return
        self.last_seen = self.server.clock.monotonic_s()
        self._buffer += data
        if (
            self.state == _NEW
            and self.server.peers is not None
            and len(self._buffer) >= 4
            and jute.INT.unpack_from(self._buffer)[0] not in words.WORDS
        ):
            self.state = _ROUTING
            self._task = asyncio.create_task(self._route())
            return
        if self.state in (_NEW, _OPEN):
            self._parse()

    # ------------------------------------------------------------------ framing

    def _parse(self) -> None:
        buffer = self._buffer
        size = len(buffer)
        offset = 0
        limit = self.server.settings.packet_bytes_max
        try:
            while size - offset >= 4:
                (length,) = jute.INT.unpack_from(buffer, offset)
                if self.state == _NEW and offset == 0 and length in words.WORDS:
                    self._four_letter_word(words.WORDS[length])
                    return
                if length < 0 or length > limit:
                    log.info(
                        "ZooKeeper connection %s: packet length %d is over the limit of %d "
                        "(jute.maxbuffer) or malformed: closing",
                        self.peer,
                        length,
                        limit,
                    )
                    self.close("bad packet length")
                    return
                if size - offset - 4 < length:
                    break
                frame = bytes(buffer[offset + 4 : offset + 4 + length])
                offset += 4 + length
                self.server.received += 1
                if self.state == _NEW:
                    self._connect(frame)
                    break  # the rest waits for the session
                self._request(frame)
                if self.state != _OPEN:
                    break
        finally:
            if offset:
                del buffer[:offset]
        self._advance()
        self._submit()
        self._touch()
        self._flush()
        if len(self.unanswered) >= OUTSTANDING_MAX:
            self._pause()

    def _four_letter_word(self, word: str) -> None:
        log.info("ZooKeeper four-letter word %s from %s", word, self.peer)
        self._out.append(words.answer(word, self.server.stats))
        self._close_after_flush = True
        self._flush()

    # ------------------------------------------------------------------ session

    def _connect(self, frame: bytes) -> None:
        try:
            if len(frame) < jute.CONNECT_REQUEST.size:
                raise JuteError("connect request too short")
            _, last_zxid, timeout_ms, session_id = jute.CONNECT_REQUEST.unpack_from(frame)
            password, offset = jute.read_buffer(frame, jute.CONNECT_REQUEST.size)
            read_only = offset < len(frame)
        except JuteError as exc:
            self.close(f"malformed connect request: {exc}")
            return
        self.state = _CONNECTING
        self._task = asyncio.create_task(
            self._establish(last_zxid, timeout_ms, session_id, password, read_only)
        )

    async def _establish(
        self,
        last_zxid: int,
        timeout_ms: int,
        session_id: int,
        password: bytes | None,
        read_only: bool,
    ) -> None:
        server = self.server
        keyspace = server.keyspace
        try:
            range_ = await keyspace.range()
            if last_zxid > range_.applied_sequence:
                self.close(
                    f"the client has seen zxid 0x{last_zxid:x}, this server only "
                    f"0x{range_.applied_sequence:x}: it must try another server"
                )
                return
            timeout_ms = server.settings.negotiate(timeout_ms)
            if session_id == 0:
                session_id = await keyspace.create_session(range_, timeout_ms)
            else:
                # As ZooKeeper does for any connect request naming a session, whatever its
                # password: the connection the session had here closes (its client reconnects).
                previous = server.sessions.get(session_id)
                if previous is not None and previous is not self:
                    previous.close("another connection asked for the session")
                if (
                    not keyspace.password_ok(session_id, password)
                    or range_.sessions.remaining_s(session_id) is None
                ):
                    log.info(
                        "ZooKeeper session 0x%x from %s: expired or invalid",
                        session_id,
                        self.peer,
                    )
                    self._send(self._connect_response(0, 0, _EXPIRED_PASSWORD, read_only))
                    self._close_after_flush = True
                    return
                range_.sessions.keep_alive(session_id)
        except TableKeeperError as exc:
            self.close(f"cannot establish a session: {exc.message}")
            return
        if self.state != _CONNECTING:
            return
        previous = server.sessions.get(session_id)
        if previous is not None and previous is not self:
            previous.close("the session reconnected on another connection")
        server.sessions[session_id] = self
        self.session_id = session_id
        self.timeout_ms = timeout_ms
        self._send(
            self._connect_response(timeout_ms, session_id, keyspace.password(session_id), read_only)
        )
        self.state = _OPEN
        self.last_seen = self._last_touch = server.clock.monotonic_s()
        self._parse()  # what came while the session was being set up

    @staticmethod
    def _connect_response(
        timeout_ms: int, session_id: int, password: bytes, read_only: bool
    ) -> bytes:
        body = jute.INT.pack(len(password)) + password + (b"\x00" if read_only else b"")
        head = jute.CONNECT_RESPONSE.pack(16 + len(body), 0, timeout_ms, session_id)
        return head + body

    def _touch(self) -> None:
        """Renew the session (any packet does; at most every tenth of its timeout)."""
        if self.state != _OPEN:
            return
        now = self.last_seen
        if now - self._last_touch < self.timeout_ms / 10000:
            return
        self._last_touch = now
        range_ = self.server.keyspace.serving
        if range_ is None:
            self.close("the keyspace is not served here now")
            return
        try:
            range_.sessions.keep_alive(self.session_id)
        except TableKeeperError:
            self.close("session expired")

    # ------------------------------------------------------------------ requests

    def _request(self, frame: bytes) -> None:
        if len(frame) < 8:
            self.close("request without a header")
            return
        xid, op = jute.INT_INT.unpack_from(frame)
        kind = _KINDS.get(op, _UNKNOWN)
        started = self.last_seen
        if not self._waiting:
            if kind == _READ and not self.unanswered:
                reply = self._serve(xid, op, frame)
                self._send(reply)
                self.server.record_reply(op, reply, started)
                return
            item = _Item(xid, op, kind, frame, started)
            self.unanswered.append(item)
            if kind == _WRITE:
                self._start(item)
            else:
                self._waiting.append(item)
            return
        item = _Item(xid, op, kind, frame, started)
        self.unanswered.append(item)
        self._waiting.append(item)

    def _start(self, item: _Item) -> None:
        """Queue a write for the log (validated first: a record that does not decode is
        answered MARSHALLINGERROR without reaching the log)."""
        try:
            payload, prepared = prepare(self.session_id, item.op, self._auth_raw, item.frame)
        except JuteError:
            item.reply = self._error_reply(item.xid, zk.MARSHALLING_ERROR)
            return
        self._batch.append((item, FrontEndCommand(NAME, payload, prepared)))

    def _submit(self) -> None:
        """Send the writes started since the last call to the range, as one queue entry."""
        batch = self._batch
        if not batch:
            return
        self._batch = []
        if self._overflow_task is not None:
            self._overflow.append(batch)
            return
        try:
            range_ = self.server.keyspace.current()
            future = range_.submit_many([command for _, command in batch])
        except TableKeeperError as exc:
            self._fail(exc)
            return
        if future is None:  # the range's queue is full: wait for room, in order
            self._overflow.append(batch)
            self._overflow_task = asyncio.create_task(self._drain_overflow(range_))
            return
        future.add_done_callback(partial(self._written, [item for item, _ in batch]))

    async def _drain_overflow(self, range_: Range) -> None:
        try:
            while self._overflow:
                batch = self._overflow.popleft()
                outcomes: list[Any] = []
                for _, command in batch:
                    try:
                        outcomes.append(await range_.execute(command))
                    except TableKeeperError as exc:
                        outcomes.append(exc)
                self._answer([item for item, _ in batch], outcomes)
        finally:
            self._overflow_task = None

    def _written(self, items: list[_Item], future: asyncio.Future[list[Any]]) -> None:
        if self.state == _CLOSED:
            return
        try:
            outcomes = future.result()
        except TableKeeperError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # a defect: the outcome of the writes is unknown
            log.exception("ZooKeeper writes failed")
            self.close(f"writes failed: {exc}")
            return
        self._answer(items, outcomes)

    def _answer(self, items: list[_Item], outcomes: list[Any]) -> None:
        pack = jute.INT_INT.pack
        for item, outcome in zip(items, outcomes, strict=True):
            # An applied write's result is the rest of its reply after the xid (zxid, error
            # code, body); a write the range failed has an `ApplyResult` with the range's code.
            if type(outcome) is Applied:
                result = outcome.result
                item.reply = pack(len(result) + 4, item.xid) + result
            elif isinstance(outcome, TableKeeperError):
                code = wire_rule(outcome).zookeeper
                if code is None:
                    self._fail(outcome)
                    return
                item.reply = self._error_reply(item.xid, code)
            else:  # the apply failed (a defect, logged there): nothing was applied
                item.reply = self._error_reply(item.xid, zk.MARSHALLING_ERROR)
        self._advance()
        self._submit()  # (replies go out with the others of this loop turn: `_send`)

    def _fail(self, exc: TableKeeperError) -> None:
        """An error ZooKeeper's clients learn as a lost connection (see the error table)."""
        log.info(
            "ZooKeeper connection %s (session 0x%x): %s", self.peer, self.session_id, exc.message
        )
        self.close(exc.message)

    def _advance(self) -> None:
        """Reply in order: send what is answered at the head; run the reads (and other
        requests) that reach the head; start the writes queued behind them."""
        unanswered, waiting = self.unanswered, self._waiting
        sent: list[_Item] = []
        while unanswered and self.state == _OPEN:
            head = unanswered[0]
            if head.reply is None:
                if not waiting or waiting[0] is not head:
                    break  # a write being applied
                waiting.popleft()
                if head.kind == _CLOSE:
                    self._close_session(head)
                    break
                if head.kind != _WRITE:
                    head.reply = self._serve(head.xid, head.op, head.frame)
                else:
                    self._start(head)
                while waiting and waiting[0].kind == _WRITE:
                    self._start(waiting.popleft())
                if head.reply is None:
                    break
            self._send(head.reply)
            sent.append(unanswered.popleft())
        if sent:
            self.server.record_replies(sent)
        self._resume()

    def _error_reply(self, xid: int, err: int) -> bytes:
        range_ = self.server.keyspace.serving
        return jute.frame_reply(xid, range_.applied_sequence if range_ is not None else 0, err)

    def _close_session(self, item: _Item) -> None:
        self._task = asyncio.create_task(self._closing(item))

    async def _closing(self, item: _Item) -> None:
        try:
            range_ = self.server.keyspace.current()
            await range_.sessions.close(self.session_id, "closed")
            zxid = range_.applied_sequence
        except TableKeeperError as exc:
            self._fail(exc)
            return
        self.unanswered.clear()
        self._waiting.clear()
        self.server.sessions.pop(self.session_id, None)
        self._send(jute.frame_reply(item.xid, zxid, zk.OK))
        self._close_after_flush = True

    # ------------------------------------------------------------------ reads

    def _serve(self, xid: int, op: int, frame: bytes) -> bytes:
        """The reply to a request that is not logged (it runs now, on the applied state)."""
        try:
            range_ = self.server.keyspace.current()
        except TableKeeperError as exc:
            self._fail(exc)
            return b""
        handler = _HANDLERS.get(op)
        zxid = range_.applied_sequence
        if handler is None:  # an operation ZooKeeper does not serve: it closes the connection
            log.info("ZooKeeper connection %s: unknown operation %d: closing", self.peer, op)
            self._close_after_flush = True
            return jute.frame_reply(xid, zxid, zk.UNIMPLEMENTED)
        try:
            err, body = handler(self, range_, frame)
        except JuteError:
            err, body = zk.MARSHALLING_ERROR, b""
        return jute.FRAMED_REPLY_HEADER.pack(16 + len(body), xid, zxid, err) + body

    def _get_data(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path, watch, _ = jute.read_path_flag(frame, 8)
        if path is None:
            return zk.MARSHALLING_ERROR, b""
        err, body = reads.get_data(range_.applied_state().store, path, self.auth)
        if watch and err == zk.OK:
            self.server.watches.watch_data(path, self)
        return err, body

    def _exists(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path, watch, _ = jute.read_path_flag(frame, 8)
        if path is None:
            return zk.MARSHALLING_ERROR, b""
        if "\0" in path:
            return zk.BAD_ARGUMENTS, b""
        err, body = reads.exists(range_.applied_state().store, path, self.auth)
        if watch and err != zk.NO_AUTH:
            self.server.watches.watch_data(path, self)
        return err, body

    def _get_children(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path, watch, _ = jute.read_path_flag(frame, 8)
        if path is None:
            return zk.MARSHALLING_ERROR, b""
        with_stat = jute.INT.unpack_from(frame, 4)[0] == zk.GET_CHILDREN2
        err, body = reads.get_children(range_.applied_state().store, path, self.auth, with_stat)
        if watch and err == zk.OK:
            self.server.watches.watch_children(path, self)
        return err, body

    def _get_acl(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path = jute.read_string(frame, 8)[0]
        if path is None:
            return zk.MARSHALLING_ERROR, b""
        return reads.get_acl(range_.applied_state().store, path, self.auth)

    def _all_children_number(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path = jute.read_string(frame, 8)[0]
        if path is None:
            return zk.MARSHALLING_ERROR, b""
        return reads.all_children_number(range_.applied_state().store, path, self.auth)

    def _ephemerals(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        prefix = jute.read_string(frame, 8)[0]
        return zk.OK, reads.ephemerals(range_.applied_state().store, self.session_id, prefix)

    def _sync(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path = jute.read_string(frame, 8)[0]
        return zk.OK, jute.write_string(path)

    def _ping(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        return zk.OK, b""

    def _multi_read(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        store = range_.applied_state().store
        parts: list[bytes] = []
        for op, fields in decode_multi(frame[8:], zk.MULTI_READ_OPS):
            path = fields[0]
            if not isinstance(path, str):
                err, body = zk.MARSHALLING_ERROR, b""
            elif op == zk.GET_DATA:
                err, body = reads.get_data(store, path, self.auth)
            else:
                err, body = reads.get_children(store, path, self.auth, False)
            if err:
                parts.append(jute.MULTI_HEADER.pack(zk.ERROR, False, err) + jute.INT.pack(err))
            else:
                parts.append(jute.MULTI_HEADER.pack(op, False, 0) + body)
        parts.append(jute.MULTI_HEADER.pack(-1, True, -1))
        return zk.OK, b"".join(parts)

    def _auth(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        _, offset = jute.read_int(frame, 8)
        scheme, offset = jute.read_string(frame, offset)
        data, offset = jute.read_buffer(frame, offset)
        if scheme == acls.DIGEST and data is not None:
            identity = (acls.DIGEST, acls.digest_id(data.decode("utf-8", "replace")))
            if identity not in self.auth:
                self.auth.append(identity)
                self._auth_raw = acls.encode_auth(self.auth)
            return zk.OK, b""
        if scheme == acls.IP:
            return zk.OK, b""  # the connection is already known by its address
        log.info(
            "ZooKeeper connection %s: authentication scheme %r is not served", self.peer, scheme
        )
        self._close_after_flush = True
        return zk.AUTH_FAILED, b""

    def _sasl(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        log.info("ZooKeeper connection %s: SASL is not served: closing", self.peer)
        self._close_after_flush = True
        return zk.AUTH_FAILED, b""

    def _reconfig(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        return zk.RECONFIG_DISABLED, b""

    def _set_watches(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        """Re-register a reconnecting client's watches, firing at once those whose change it
        missed since `relativeZxid` (ZooKeeper's `DataTree.setWatches`)."""
        relative, offset = jute.read_long(frame, 8)
        data, offset = jute.read_strings(frame, offset)
        exist, offset = jute.read_strings(frame, offset)
        child, offset = jute.read_strings(frame, offset)
        persistent: list[str] = []
        recursive: list[str] = []
        if jute.INT.unpack_from(frame, 4)[0] == zk.SET_WATCHES2:
            persistent, offset = jute.read_strings(frame, offset)
            recursive, offset = jute.read_strings(frame, offset)
        store = range_.applied_state().store
        watches = self.server.watches
        for path in data:
            stamps = reads.node_stamps(store, path)
            if stamps is None:
                self._send(jute.notification(zk.NODE_DELETED, path, -1))
            elif stamps[0] > relative:
                self._send(jute.notification(zk.NODE_DATA_CHANGED, path, -1))
            else:
                watches.watch_data(path, self)
        for path in exist:
            if reads.node_stamps(store, path) is not None:
                self._send(jute.notification(zk.NODE_CREATED, path, -1))
            else:
                watches.watch_data(path, self)
        for path in child:
            stamps = reads.node_stamps(store, path)
            if stamps is None:
                self._send(jute.notification(zk.NODE_DELETED, path, -1))
            elif stamps[1] > relative:
                self._send(jute.notification(zk.NODE_CHILDREN_CHANGED, path, -1))
            else:
                watches.watch_children(path, self)
        for path in persistent:
            watches.add_persistent(path, self, recursive=False)
        for path in recursive:
            watches.add_persistent(path, self, recursive=True)
        return zk.OK, b""

    def _add_watch(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path, mode, _ = jute.read_path_int(frame, 8)
        if path is None:
            return zk.MARSHALLING_ERROR, b""
        if mode not in (zk.ADD_WATCH_PERSISTENT, zk.ADD_WATCH_PERSISTENT_RECURSIVE):
            return zk.MARSHALLING_ERROR, b""
        self.server.watches.add_persistent(
            path, self, recursive=mode == zk.ADD_WATCH_PERSISTENT_RECURSIVE
        )
        return zk.OK, jute.INT.pack(0)

    def _remove_watches(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        path, watcher_type, _ = jute.read_path_int(frame, 8)
        if (
            path is None
            or not zk.WATCHER_CHILDREN <= watcher_type <= zk.WATCHER_PERSISTENT_RECURSIVE
        ):
            return zk.MARSHALLING_ERROR, b""
        dry_run = jute.INT.unpack_from(frame, 4)[0] == zk.CHECK_WATCHES
        found = self.server.watches.remove(path, self, watcher_type, dry_run=dry_run)
        return (zk.OK if found else zk.NO_WATCHER), b""

    def _who_am_i(self, range_: Range, frame: bytes) -> tuple[int, bytes]:
        infos: list[str] = []
        for scheme, identity in self.auth:
            infos += [scheme, identity.split(":", 1)[0] if scheme == acls.DIGEST else identity]
        count = jute.INT.pack(len(infos) // 2)
        return zk.OK, count + b"".join(jute.write_string(s) for s in infos)

    # ------------------------------------------------------------------ cluster mode

    async def _route(self) -> None:
        """Serve here, or relay the connection to the keyspace range's owner."""
        try:
            address = await self.server.locate()
        except TableKeeperError as exc:
            self.close(f"no server owns the ZooKeeper keyspace now: {exc.message}")
            return
        if address is None:
            self.state = _NEW
            self._parse()
            return
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: _Upstream(self), host, int(port))
        except OSError as exc:
            if self.server.peers is not None:
                self.server.peers.forget(address)
            self.close(f"cannot reach the keyspace's owner at {address}: {exc}")
            return
        if self.state == _CLOSED:
            transport.close()
            return
        self.state = _RELAY
        self._relay = transport
        if self._buffer:
            transport.write(bytes(self._buffer))
            self._buffer.clear()


class _Upstream(asyncio.Protocol):
    """The relayed connection's other end (the owner's ZooKeeper port). Each side stops reading
    while the other cannot take more."""

    def __init__(self, downstream: Connection) -> None:
        self.downstream = downstream

    def pause_writing(self) -> None:
        transport = self.downstream.transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def resume_writing(self) -> None:
        transport = self.downstream.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        transport = self.downstream.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.downstream.close("the relayed connection to the owner closed")


_Handler = Callable[[Connection, Range, bytes], tuple[int, bytes]]
_HANDLERS: dict[int, _Handler] = {
    zk.GET_DATA: Connection._get_data,
    zk.EXISTS: Connection._exists,
    zk.GET_CHILDREN: Connection._get_children,
    zk.GET_CHILDREN2: Connection._get_children,
    zk.GET_ACL: Connection._get_acl,
    zk.GET_ALL_CHILDREN_NUMBER: Connection._all_children_number,
    zk.GET_EPHEMERALS: Connection._ephemerals,
    zk.SYNC: Connection._sync,
    zk.PING: Connection._ping,
    zk.MULTI_READ: Connection._multi_read,
    zk.AUTH: Connection._auth,
    zk.SASL: Connection._sasl,
    zk.RECONFIG: Connection._reconfig,
    zk.SET_WATCHES: Connection._set_watches,
    zk.SET_WATCHES2: Connection._set_watches,
    zk.ADD_WATCH: Connection._add_watch,
    zk.CHECK_WATCHES: Connection._remove_watches,
    zk.REMOVE_WATCHES: Connection._remove_watches,
    zk.WHO_AM_I: Connection._who_am_i,
}
_METHODS: dict[int, str] = {
    code: f"ZooKeeper/{name}"
    for code, name in (
        (zk.CREATE, "create"),
        (zk.CREATE2, "create2"),
        (zk.CREATE_CONTAINER, "createContainer"),
        (zk.CREATE_TTL, "createTTL"),
        (zk.DELETE, "delete"),
        (zk.DELETE_CONTAINER, "deleteContainer"),
        (zk.SET_DATA, "setData"),
        (zk.SET_ACL, "setACL"),
        (zk.MULTI, "multi"),
        (zk.MULTI_READ, "multiRead"),
        (zk.GET_DATA, "getData"),
        (zk.EXISTS, "exists"),
        (zk.GET_CHILDREN, "getChildren"),
        (zk.GET_CHILDREN2, "getChildren2"),
        (zk.GET_ACL, "getACL"),
        (zk.GET_ALL_CHILDREN_NUMBER, "getAllChildrenNumber"),
        (zk.GET_EPHEMERALS, "getEphemerals"),
        (zk.SYNC, "sync"),
        (zk.PING, "ping"),
        (zk.AUTH, "auth"),
        (zk.SET_WATCHES, "setWatches"),
        (zk.SET_WATCHES2, "setWatches2"),
        (zk.ADD_WATCH, "addWatch"),
        (zk.CHECK_WATCHES, "checkWatches"),
        (zk.REMOVE_WATCHES, "removeWatches"),
        (zk.WHO_AM_I, "whoAmI"),
        (zk.CLOSE_SESSION, "closeSession"),
    )
}
"""The metrics' method label of each operation (ZooKeeper's own names)."""


class RequestMetrics(Protocol):
    def observe_request(self, method: str, code: int, seconds: float) -> None: ...

    def observe_requests(self, method: str, code: int, seconds: float, count: int) -> None: ...


_NO_CODE = -(2**40)
"""The code of a reply too short to hold one (counted in the four-letter words' figures only)."""


def _reply_code(reply: bytes) -> int:
    """The error code of a framed reply (after its length, xid and zxid), or `_NO_CODE`."""
    return jute.INT.unpack_from(reply, 16)[0] if len(reply) >= 20 else _NO_CODE


_KINDS: dict[int, int] = {
    **{op: _READ for op in _HANDLERS},
    **{op: _WRITE for op in zk.WRITES},
    zk.CLOSE_SESSION: _CLOSE,
}
