"""The Sessions servicer (`tablekeeper.v1.Sessions`): thin; the domain work is in
`range.sessions` and the state machine; errors map to statuses in `rpc.status`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.bookkeeper.storage_pb2 import StatusCode
from tablekeeper_proto.v1 import session_pb2, session_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import (
    BadRequestError,
    PermissionDeniedError,
    UnavailableError,
)
from tablekeeper_server.metrics import ServerMetrics
from tablekeeper_server.range.replica import Range
from tablekeeper_server.rpc.proxy import SESSIONS_SERVICE, Forwarder, local_or_forward
from tablekeeper_server.rpc.status import serve, stream_errors
from tablekeeper_server.security.auth import current_role

Context: TypeAlias = Any  # grpc.aio.ServicerContext


def _error(code: StatusCode.ValueType) -> session_pb2.SessionResponse:
    return session_pb2.SessionResponse(header=kv_rpc_pb2.ResponseHeader(code=code))


def _code(response: session_pb2.SessionResponse) -> int:
    return int(response.header.code)


class SessionsServicer(session_pb2_grpc.SessionsServicer):
    """Create and Close are forwarded to the range's owner in cluster mode; KeepAlive streams
    are not (a server that does not own the range answers UNAVAILABLE; the SDK keeps sessions
    alive on the owner)."""

    def __init__(
        self,
        registry: ContainerRegistry,
        metrics: ServerMetrics | None,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._forwarder = forwarder
        self._shutdown = asyncio.Event()
        self.is_superuser: Callable[[str | None], bool] = lambda role: False
        """Superusers may use any session (set when permissions are on)."""

    async def _routed(
        self,
        method: str,
        request: Any,
        context: Context,
        local: Callable[[], Awaitable[session_pb2.SessionResponse]],
    ) -> session_pb2.SessionResponse:
        return await local_or_forward(
            self._forwarder,
            context,
            local,
            SESSIONS_SERVICE + method,
            request,
            session_pb2.SessionResponse,
            _code,
            idempotent=False,
        )

    async def _range(self, stream_id: int, pkey: bytes) -> Range:
        if not stream_id:
            raise BadRequestError("a session request needs a table (stream) id")
        return await self._registry.table_range(stream_id, pkey)

    async def Create(  # noqa: N802
        self, request: session_pb2.CreateSessionRequest, context: Context
    ) -> session_pb2.SessionResponse:
        async def handle() -> session_pb2.SessionResponse:
            range_ = await self._range(request.stream_id, request.pkey)
            return await range_.sessions.create(request.ttl_ms, current_role(), pkey=request.pkey)

        async def routed() -> session_pb2.SessionResponse:
            return await self._routed("Create", request, context, handle)

        return await serve("CreateSession", context, self._metrics, routed, _error, _code)

    async def Close(  # noqa: N802
        self, request: session_pb2.CloseSessionRequest, context: Context
    ) -> session_pb2.SessionResponse:
        async def handle() -> session_pb2.SessionResponse:
            range_ = await self._range(request.stream_id, request.pkey)
            self._check_owner(range_, request.session_id)
            return await range_.sessions.close(request.session_id, "closed")

        async def routed() -> session_pb2.SessionResponse:
            return await self._routed("Close", request, context, handle)

        return await serve("CloseSession", context, self._metrics, routed, _error, _code)

    def _check_owner(self, range_: Range, session_id: int) -> None:
        """A session created by an authenticated role is kept alive or closed only by that
        role (or a superuser): its id alone is no credential."""
        owner = range_.sessions.role_of(session_id)
        role = current_role()
        if owner is None or role is None or role == owner or self.is_superuser(role):
            return
        raise PermissionDeniedError(
            f"session {session_id} belongs to role {owner!r}; role {role!r} may not use it"
        )

    def shutdown(self) -> None:
        """End every keep-alive stream (the server is stopping; clients reconnect)."""
        self._shutdown.set()

    async def KeepAlive(  # noqa: N802
        self, request_iterator: AsyncIterator[session_pb2.KeepAliveRequest], context: Context
    ) -> AsyncIterator[session_pb2.SessionResponse]:
        async with stream_errors("KeepAlive", context):
            requests = request_iterator.__aiter__()
            stop = asyncio.ensure_future(self._shutdown.wait())
            nxt: asyncio.Future[session_pb2.KeepAliveRequest] | None = None
            try:
                while True:
                    nxt = asyncio.ensure_future(requests.__anext__())
                    await asyncio.wait((nxt, stop), return_when=asyncio.FIRST_COMPLETED)
                    if not nxt.done():
                        nxt.cancel()
                        raise UnavailableError("server shutting down; keep alive elsewhere")
                    try:
                        request = nxt.result()
                    except StopAsyncIteration:
                        return
                    range_ = await self._range(request.stream_id, request.pkey)
                    self._check_owner(range_, request.session_id)
                    ttl_ms = range_.sessions.keep_alive(request.session_id)
                    yield session_pb2.SessionResponse(session_id=request.session_id, ttl_ms=ttl_ms)
            finally:
                stop.cancel()
                # The client ended the call while we waited: its last read ends (or already
                # ended, with StopAsyncIteration) with nobody awaiting it. Collect it, or asyncio
                # logs "Task exception was never retrieved" for a normal close.
                if nxt is not None:
                    nxt.cancel()
                    if nxt.done() and not nxt.cancelled():
                        nxt.exception()
