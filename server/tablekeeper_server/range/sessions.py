"""Session timers of one range.

A session's state (its id and TTL, and the index of its ephemeral keys) is in the range's store,
written by logged commands (see `range.session_apply`). Its *deadline* is not: it lives
only here, in memory, on the range's event loop. Keep-alives renew it without touching the log;
only the end of a session (close, or expiry found by the timer) goes through the log, as a
command that deletes the session's ephemeral keys, so replay and failover agree.

When a range opens (a restart, or a container's new owner), every session in the store gets a
fresh full TTL from that moment, rather than all expiring at once: clients whose keep-alive
streams reconnect in time keep their sessions.

Caveat: table ranges open lazily (on first request). After a restart, sessions of a range that
nobody touches are not timed until something opens the range.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Awaitable, Callable

from tablekeeper_proto.v1 import session_pb2, wal_pb2
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import BadRequestError, KeyNotFoundError, TableKeeperError
from tablekeeper_server.range.apply import Response

log = logging.getLogger(__name__)

TTL_MS_MIN = 100
TTL_MS_MAX = 24 * 3600 * 1000
_IDLE_S = 1.0


class SessionManager:
    """Deadlines of the live sessions of one range, and the timer that expires them."""

    def __init__(
        self,
        name: str,
        execute: Callable[[wal_pb2.WalCommand], Awaitable[Response]],
        clock: Clock,
    ) -> None:
        self.name = name
        self._execute = execute
        self._clock = clock
        """Deadlines are on its `monotonic_s`; the timer waits on it."""
        self._ttl_s: dict[int, float] = {}
        self._roles: dict[int, str] = {}
        """session id -> the role that created it (sessions created with authentication on)"""
        self._deadline: dict[int, float] = {}
        self._heap: list[tuple[float, int]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._deadline)

    def start(self, sessions: list[tuple[int, int]], roles: dict[int, str] | None = None) -> None:
        """The range opened: give every stored session a fresh TTL and start the timer.
        `roles`: the role that created each session, where one did."""
        self._roles = dict(roles or {})
        now = self._clock.monotonic_s()
        for session_id, ttl_ms in sessions:
            self._track(session_id, ttl_ms / 1000.0, now)
        self._task = asyncio.create_task(self._run(), name=f"sessions-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _track(self, session_id: int, ttl_s: float, now: float) -> None:
        self._ttl_s[session_id] = ttl_s
        deadline = now + ttl_s
        self._deadline[session_id] = deadline
        heapq.heappush(self._heap, (deadline, session_id))
        self._wakeup.set()

    async def create(
        self, ttl_ms: int, role: str | None = None, session_id: int = 0, pkey: bytes = b""
    ) -> session_pb2.SessionResponse:
        """Create a session through the log; its id is `session_id` if given (KEY_EXISTS if
        it is in use), else the revision of that command. `role` (the authenticated caller)
        owns it: see `role_of`. `pkey`: the pkey it was created for (a split moves it to the
        child holding that pkey; without one, a split of the range is refused)."""
        if not TTL_MS_MIN <= ttl_ms <= TTL_MS_MAX:
            raise BadRequestError(f"session TTL must be {TTL_MS_MIN}..{TTL_MS_MAX} ms")
        command = wal_pb2.WalCommand(
            session=wal_pb2.SessionCommand(
                create_ttl_ms=ttl_ms, role=role or "", create_id=session_id, pkey=pkey
            )
        )
        response = await self._execute(command)
        assert isinstance(response, session_pb2.SessionResponse)
        if response.header.code == 0:
            self._track(response.session_id, ttl_ms / 1000.0, self._clock.monotonic_s())
            if role:
                self._roles[response.session_id] = role
        return response

    def role_of(self, session_id: int) -> str | None:
        """The role that created the session (None: created without authentication). Only
        that role, or a superuser, may keep it alive or close it."""
        return self._roles.get(session_id)

    def keep_alive(self, session_id: int) -> int:
        """Renew the session's deadline; returns its TTL in ms. Raises `KeyNotFoundError` if it
        is not live on this range."""
        ttl_s = self._ttl_s.get(session_id)
        if ttl_s is None or session_id not in self._deadline:
            raise KeyNotFoundError(f"session {session_id} does not exist on range {self.name}")
        deadline = self._clock.monotonic_s() + ttl_s
        self._deadline[session_id] = deadline
        # The old heap entry stays; `_run` skips entries older than the deadline.
        heapq.heappush(self._heap, (deadline, session_id))
        return round(ttl_s * 1000)

    def remaining_s(self, session_id: int) -> tuple[float, float] | None:
        """(TTL, seconds until expiry) of a live session of this range; None if there is none."""
        deadline = self._deadline.get(session_id)
        if deadline is None:
            return None
        return self._ttl_s[session_id], max(0.0, deadline - self._clock.monotonic_s())

    def forget(self, session_id: int) -> None:
        self._deadline.pop(session_id, None)
        self._ttl_s.pop(session_id, None)
        self._roles.pop(session_id, None)

    async def close(self, session_id: int, reason: str) -> session_pb2.SessionResponse:
        """End the session through the log (deletes its ephemeral keys). KEY_NOT_FOUND in the
        response if it did not exist."""
        command = wal_pb2.WalCommand(
            session=wal_pb2.SessionCommand(close_id=session_id, reason=reason)
        )
        response = await self._execute(command)
        assert isinstance(response, session_pb2.SessionResponse)
        self.forget(session_id)
        return response

    async def _run(self) -> None:
        while True:
            now = self._clock.monotonic_s()
            expired: list[int] = []
            heap = self._heap
            while heap and heap[0][0] <= now:
                deadline, session_id = heapq.heappop(heap)
                if self._deadline.get(session_id) == deadline:
                    expired.append(session_id)
            if len(heap) > 4 * len(self._deadline) + 1024:  # drop stale keep-alive entries
                self._heap = heap = [(d, s) for s, d in self._deadline.items()]
                heapq.heapify(heap)
            for session_id in expired:
                log.info("range %s: session %d expired", self.name, session_id)
                try:
                    await self.close(session_id, "expired")
                except TableKeeperError as exc:
                    # The range is closing or failed: the next owner times it afresh.
                    log.warning("range %s: expiring session %d: %s", self.name, session_id, exc)
                    return
            self._wakeup.clear()
            if not heap:  # no sessions: sleep until one is created
                await self._wakeup.wait()
                continue
            timeout = max(0.0, heap[0][0] - self._clock.monotonic_s())
            await self._clock.wait(self._wakeup, min(timeout, _IDLE_S))
