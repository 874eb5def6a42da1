"""Sessions: a TTL on one range of a table, kept alive by a background task; keys put with a
session are ephemeral (deleted by the server when the session closes or expires).

    async with table.session("app", ttl_s=5) as session:
        await table.put("app", "member-1", "host:port", session=session)

The keep-alive task sends a keep-alive every `ttl_s / 3` on a stream and reconnects after
errors (a restarted server gives every session a fresh TTL); it goes to the owner of the session's
range, located again on every reconnect (see `_routes`). When the server answers that the
session no longer exists, `expired` is set and `on_expired` callbacks run. A session lives on
the range of the pkey it was created for: ephemeral keys must use that pkey (or another pkey on
the same range).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from types import TracebackType
from typing import Any

import grpc

from tablekeeper._context import ClientContext
from tablekeeper._loop import LoopThread
from tablekeeper._routes import RoutedMethod
from tablekeeper.errors import SessionExpiredError, UnavailableError
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import session_pb2, session_pb2_grpc

log = logging.getLogger(__name__)


class AsyncSession:
    """A session on one range of a table, kept alive in the background (see the module)."""

    def __init__(self, context: ClientContext, table_id: int, pkey: bytes, ttl_s: float) -> None:
        """A session on the range of `pkey` in the table; see `AsyncTable.session`."""
        if ttl_s < 0.1:
            raise ValueError("ttl_s must be >= 0.1")
        self._context = context
        self.table_id = table_id
        self.pkey = pkey
        self.ttl_s = ttl_s
        self.id = 0
        """The session id (the revision that created it on its range); 0 until started."""
        self.expired = asyncio.Event()
        self._callbacks: list[Callable[[AsyncSession], Any]] = []
        self._task: asyncio.Task[None] | None = None

    def _method(self, name: str) -> RoutedMethod:
        """A Sessions method sent to the owner of the session's range."""
        return self._context.routed(
            "sessions", session_pb2_grpc.SessionsStub, name, self.table_id, self.pkey
        )

    def on_expired(self, callback: Callable[[AsyncSession], Any]) -> None:
        """Call `callback(session)` (on the client's loop) when the session is found expired."""
        self._callbacks.append(callback)

    async def start(self) -> AsyncSession:
        """Create the session on the server and start keeping it alive."""
        if self.id:
            return self
        await self.create()
        self._task = asyncio.create_task(self._keep_alive(), name=f"tk-session-{self.id}")
        return self

    async def create(self) -> int:
        """Create the session on the server without keeping it alive here (it expires after
        its TTL unless someone sends keep-alives for its id: see `keep_alive_answers`); returns
        its id. `start()` is `create()` plus the background keep-alive."""
        request = session_pb2.CreateSessionRequest(
            stream_id=self.table_id,
            pkey=self.pkey,
            ttl_ms=round(self.ttl_s * 1000),
        )
        response = await self._context.call(
            self._method("Create"),
            request,
            idempotent=False,
            status_of=lambda r: r.header.code,
        )
        self.id = int(response.session_id)
        if response.ttl_ms:
            self.ttl_s = response.ttl_ms / 1000  # what the server granted
        return self.id

    async def keep_alive_answers(self) -> AsyncGenerator[float, None]:
        """Keep the session `id` alive on one stream to its range's owner, yielding the TTL (s)
        the server granted with each answer; the next keep-alive goes a third of that TTL after
        the answer. Raises `SessionExpiredError` when the server no longer knows the session;
        ends when the server ends the stream (it stops, or gave the range away). For a session
        kept alive elsewhere (e.g. created by `create()` in another process and found by its
        id); `start()` keeps alive on its own, reconnecting."""
        if not self.id:
            raise ValueError("the session has no id: create() it or set its id")
        request = session_pb2.KeepAliveRequest(
            stream_id=self.table_id, pkey=self.pkey, session_id=self.id
        )
        interval_s = self.ttl_s / 3
        answered = asyncio.Event()

        async def requests() -> AsyncIterator[session_pb2.KeepAliveRequest]:
            # One keep-alive in flight at a time: the next only once the previous one was
            # answered (a flood racing the server's refusal ends the stream INTERNAL).
            while True:
                yield request
                await answered.wait()
                answered.clear()
                await asyncio.sleep(interval_s)

        target = await self._context.routes.locate(self.table_id, self.pkey)
        stub = self._context.stub("sessions", session_pb2_grpc.SessionsStub, target.endpoint)
        stream = stub.KeepAlive(requests())
        try:
            async for response in stream:
                interval_s = response.ttl_ms / 3000
                answered.set()
                yield response.ttl_ms / 1000
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise SessionExpiredError(
                    f"session {self.id}: {error.details() or 'expired'}"
                ) from error
            raise
        finally:
            stream.cancel()

    async def _requests(self) -> AsyncIterator[session_pb2.KeepAliveRequest]:
        request = session_pb2.KeepAliveRequest(
            stream_id=self.table_id, pkey=self.pkey, session_id=self.id
        )
        while True:
            yield request
            await asyncio.sleep(self.ttl_s / 3)

    async def _keep_alive(self) -> None:
        routes = self._context.routes
        backoff = 0.05
        while not self.expired.is_set():
            target = await routes.locate(self.table_id, self.pkey)
            stub = self._context.stub("sessions", session_pb2_grpc.SessionsStub, target.endpoint)
            stream = stub.KeepAlive(self._requests())
            try:
                async for _ in stream:
                    backoff = 0.05
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("session %d expired: %s", self.id, error.details())
                    self._expire()
                    return
                log.info("session %d keep-alive stream broke: %s", self.id, error.code().name)
                routes.failed(target, error)
            else:  # the server ended the stream: it is stopping or gave the range away
                routes.failed(target)
            finally:
                stream.cancel()
            await asyncio.sleep(random.uniform(0, backoff))
            backoff = min(1.0, backoff * 2, self.ttl_s / 4)

    def _expire(self) -> None:
        self.expired.set()
        for callback in self._callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("session expiry callback failed")

    async def close(self) -> bool:
        """Stop keeping alive and close the session (its ephemeral keys are deleted). Returns
        False when the server did not know the session (already closed or expired) or could not
        be reached, else True."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        closed = False
        if self.id and not self.expired.is_set():
            request = session_pb2.CloseSessionRequest(
                stream_id=self.table_id, pkey=self.pkey, session_id=self.id
            )
            with contextlib.suppress(UnavailableError):
                response = await self._context.call(
                    self._method("Close"),
                    request,
                    idempotent=True,  # closing twice is harmless (KEY_NOT_FOUND, reported)
                    status_of=lambda r: 0,
                )
                closed = response.header.code != StatusCode.KEY_NOT_FOUND
            self.expired.set()
        return closed

    async def __aenter__(self) -> AsyncSession:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Session:
    """Synchronous twin of `AsyncSession` (its keep-alive runs on the client's loop thread)."""

    def __init__(self, runner: LoopThread, session: AsyncSession) -> None:
        self._runner = runner
        self.async_session = session

    @property
    def id(self) -> int:
        """The session id (0 until started)."""
        return self.async_session.id

    @property
    def expired(self) -> bool:
        """Whether the session expired or was closed."""
        return self.async_session.expired.is_set()

    def start(self) -> Session:
        """Create the session on the server and start keeping it alive."""
        self._runner.run(self.async_session.start())
        return self

    def create(self) -> int:
        """Create the session without keeping it alive here; see `AsyncSession.create`."""
        return self._runner.run(self.async_session.create())

    def close(self) -> bool:
        """Stop keeping alive and close the session (its ephemeral keys are deleted); False
        when the server did not know it. See `AsyncSession.close`."""
        return self._runner.run(self.async_session.close())

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["AsyncSession", "Session"]
