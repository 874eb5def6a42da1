"""Server-to-server forwarding (cluster mode): any server accepts any request.

A request for a storage container hosted elsewhere raises `NotServedHereError` in the domain
code; the servicer then forwards the same request, unchanged, to the container's owner from the
assignment and returns the owner's answer (as BookKeeper's proxy channels do). A forwarded
request carries `tk-forwarded` metadata and is never forwarded a second time: if the receiving
server does not host the container either (its view of the assignment is older or newer), the
caller hears NOT_FOUND and retries once the views agree.

Whether the owner applied a write is only certain when it answered, or when the call never left
(no connection). An owner's refusal (a gRPC status of the error table's unary column: NOT_FOUND,
RESOURCE_EXHAUSTED, PERMISSION_DENIED) becomes the same domain error here, so the caller hears
what the owner said. Anything else (a deadline, a connection dropped mid-call) becomes
`IndeterminateError` for writes, so a non-idempotent write is not retried blindly; reads are
answered NOT_FOUND (retry).

`RemoteCatalogClient` reads the root and meta ranges another server owns, for the routing done
here (table id and pkey → range → container).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from tablekeeper_proto.bookkeeper import storage_pb2
from tablekeeper_proto.v1 import admin_pb2
from tablekeeper_server.errors import (
    ForwardedError,
    IndeterminateError,
    NotServedHereError,
    RouteNotFoundError,
)
from tablekeeper_server.rpc.status import ERROR_METADATA_KEY, error_for_unary_status
from tablekeeper_server.security.auth import AUTHORIZATION_KEY

log = logging.getLogger(__name__)

FORWARDED_METADATA_KEY = "tk-forwarded"
ROOT_SERVICE = "/bookkeeper.proto.storage.RootRangeService/"
META_SERVICE = "/bookkeeper.proto.storage.MetaRangeService/"
TABLE_SERVICE = "/bookkeeper.proto.kv.rpc.TableService/"
TABLEKEEPER_SERVICE = "/tablekeeper.v1.TableKeeper/"
SESSIONS_SERVICE = "/tablekeeper.v1.Sessions/"
WATCH_SERVICE = "/tablekeeper.v1.Watch/"
ADMIN_SERVICE = "/tablekeeper.v1.Admin/"
FORWARD_TIMEOUT_S = 30.0
_CONNECT_FAILURE_HINTS = ("failed to connect", "connection refused", "connections to all backends")
R = TypeVar("R")


def was_forwarded(context: Any) -> bool:
    """Whether the request being served was forwarded by another server."""
    return any(key == FORWARDED_METADATA_KEY for key, _ in context.invocation_metadata() or ())


def _never_sent(error: grpc.aio.AioRpcError) -> bool:
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (error.details() or "").lower()
    return any(hint in details for hint in _CONNECT_FAILURE_HINTS)


class Forwarder:
    """Forwards requests to the owners of their containers. `owner_of(container)` answers from
    the assignment this server watches (None: unassigned right now)."""

    def __init__(
        self,
        owner_of: Callable[[int], str | None],
        self_endpoint: str,
        *,
        message_bytes_max: int,
        metadata_bytes_max: int,
        credentials: grpc.ChannelCredentials | None = None,
        server_token: str | None = None,
    ) -> None:
        """`credentials`: call the owners over TLS. With authentication on, a forwarded call
        carries its caller's `authorization` metadata (the owner verifies it again), and this
        server's own calls `server_token`."""
        self._owner_of = owner_of
        self._credentials = credentials
        self._own_identity: tuple[tuple[str, str], ...] = (
            ((AUTHORIZATION_KEY, f"Bearer {server_token}"),) if server_token else ()
        )
        self._self = self_endpoint
        self.draining: Callable[[], bool] = lambda: False
        """True while this server shuts down: answer "not served here" (clients find the new
        owner themselves) rather than forward and be cut off mid-call at exit."""
        self._options = [
            ("grpc.max_receive_message_length", message_bytes_max),
            ("grpc.max_send_message_length", message_bytes_max),
            ("grpc.max_metadata_size", metadata_bytes_max),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.on_forward: Callable[[str], None] = lambda method: None
        """Called with the method name of every forwarded call (metrics)."""

    def owner(self, container_id: int) -> str:
        """The endpoint to forward to; `RouteNotFoundError` if that is nobody or this server."""
        if self.draining():
            raise RouteNotFoundError(f"server {self._self} is shutting down")
        endpoint = self._owner_of(container_id)
        if endpoint is None:
            raise RouteNotFoundError(f"storage container {container_id} has no owner right now")
        if endpoint == self._self:
            raise RouteNotFoundError(f"storage container {container_id} is not open here yet")
        return endpoint

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = (
                grpc.aio.secure_channel(endpoint, self._credentials, options=self._options)
                if self._credentials is not None
                else grpc.aio.insecure_channel(endpoint, options=self._options)
            )
            self._channels[endpoint] = channel
        return channel

    async def forward(
        self,
        container_id: int,
        path: str,
        request: Any,
        response_type: Callable[..., R],
        code_of: Callable[[R], int],
        *,
        idempotent: bool,
        context: Any = None,
        metadata: Sequence[tuple[str, str | bytes]] = (),
        passthrough_codes: Callable[[int], bool] = lambda code: False,
    ) -> R:
        """Send `request` to the owner of `container_id` at `path`; return its response.

        A non-zero body status comes back as `ForwardedError` (with the owner's reason), unless
        `passthrough_codes(code)`: then the response itself is returned (a command status such
        as BAD_VERSION, whose response body matters).
        """
        endpoint = self.owner(container_id)
        timeout = FORWARD_TIMEOUT_S
        if context is not None and (remaining := context.time_remaining()) is not None:
            timeout = min(timeout, max(remaining, 0.001))
        method = self._channel(endpoint).unary_unary(
            path,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
        )
        identity = self._identity(context)
        call = method(
            request,
            metadata=(*metadata, *identity, (FORWARDED_METADATA_KEY, "1")),
            timeout=timeout,
        )
        self.on_forward(path.rpartition("/")[2])
        try:
            response: R = await call
        except grpc.aio.AioRpcError as error:
            reason = f"{error.code().name} from {endpoint}: {error.details() or ''}".strip()
            refused = error_for_unary_status(error.code(), error.details() or reason)
            if refused is not None and not isinstance(refused, RouteNotFoundError):
                raise refused from None  # the owner applied nothing and said why
            if refused is not None or idempotent or _never_sent(error):
                raise RouteNotFoundError(f"storage container {container_id}: {reason}") from None
            raise IndeterminateError(
                f"forwarded to {endpoint}, outcome unknown: {reason}"
            ) from None
        code = code_of(response)
        if code and not passthrough_codes(code):
            message = ""
            for key, value in await call.trailing_metadata() or ():
                if key == ERROR_METADATA_KEY:
                    message = str(value)
            raise ForwardedError(code, message)
        return response

    async def relay(
        self, container_id: int, path: str, request: Any, response_type: Any, context: Any
    ) -> AsyncGenerator[Any, None]:
        """Forward a server-streaming call (Watch): yield the owner's messages; end the way the
        owner's stream ended (status, details and `tk-*` trailing metadata passed on)."""
        endpoint = self.owner(container_id)
        try:
            async with contextlib.aclosing(
                self.stream(endpoint, path, request, response_type, context)
            ) as messages:
                async for message in messages:
                    yield message
        except grpc.aio.AioRpcError as error:
            trailers = tuple(
                (key, value)
                for key, value in error.trailing_metadata() or ()
                if key.startswith("tk-")
            )
            if trailers:
                context.set_trailing_metadata(trailers)
            code = error.code()
            if code == grpc.StatusCode.NOT_FOUND or _never_sent(error):
                code = grpc.StatusCode.UNAVAILABLE  # resume elsewhere
            await context.abort(code, f"{error.details() or ''} (via {endpoint})")

    async def stream(
        self, endpoint: str, path: str, request: Any, response_type: Any, context: Any
    ) -> AsyncGenerator[Any, None]:
        """A server-streaming call to `endpoint` on behalf of the caller of `context`: yields
        its messages; its failure is the call's `grpc.aio.AioRpcError`."""
        method = self._channel(endpoint).unary_stream(
            path,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        call = method(request, metadata=(*self._identity(context), (FORWARDED_METADATA_KEY, "1")))
        self.on_forward(path.rpartition("/")[2])
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()

    async def ask(
        self,
        endpoint: str,
        path: str,
        request: Any,
        response_type: Callable[..., R],
        timeout_s: float,
    ) -> R:
        """Call `path` on the server at `endpoint` itself (not on a container's owner), as this
        server: over the channel and credentials forwarding uses, with this server's own
        identity. Errors are the call's `grpc.aio.AioRpcError`."""
        method = self._channel(endpoint).unary_unary(
            path,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_type.FromString,  # type: ignore[attr-defined]
        )
        response: R = await method(request, metadata=self._own_identity, timeout=timeout_s)
        return response

    def _identity(self, context: Any) -> tuple[tuple[str, str], ...]:
        """Who the forwarded call is from: the caller's token if it sent one, else this server
        (which has authenticated the caller itself)."""
        if context is not None:
            for key, value in context.invocation_metadata() or ():
                if key == AUTHORIZATION_KEY:
                    return ((key, value),)
        return self._own_identity

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


class RemoteCatalogClient:
    """The root and meta ranges other servers own, read through their RPCs (`RemoteCatalog`)."""

    def __init__(self, forwarder: Forwarder, root_container_id: int = 0) -> None:
        self._forwarder = forwarder
        self._root = root_container_id

    @property
    def forwarder(self) -> Forwarder:
        """Sends requests to the owner of a container (the Admin listings use it)."""
        return self._forwarder

    async def stream_props(self, stream_id: int) -> Any:
        response = await self._forwarder.forward(
            self._root,
            ROOT_SERVICE + "GetStream",
            storage_pb2.GetStreamRequest(stream_id=stream_id),
            storage_pb2.GetStreamResponse,
            lambda r: int(r.code),
            idempotent=True,
        )
        return response.stream_props

    async def active_ranges(self, stream_id: int, container_id: int) -> list[Any]:
        response = await self._forwarder.forward(
            container_id,
            META_SERVICE + "GetActiveRanges",
            storage_pb2.GetActiveRangesRequest(stream_id=stream_id),
            storage_pb2.GetActiveRangesResponse,
            lambda r: int(r.code),
            idempotent=True,
        )
        return [related.props for related in response.ranges]

    async def ranges_and_lineage(
        self, stream_id: int, container_id: int
    ) -> tuple[list[Any], dict[int, tuple[int, ...]]]:
        response = await self._forwarder.forward(
            container_id,
            META_SERVICE + "GetActiveRanges",
            storage_pb2.GetActiveRangesRequest(stream_id=stream_id),
            storage_pb2.GetActiveRangesResponse,
            lambda r: int(r.code),
            idempotent=True,
        )
        lineage = {
            related.props.range_id: tuple(related.related_ranges)
            for related in response.ranges
            if related.related_ranges
        }
        return [related.props for related in response.ranges], lineage

    async def range_step(
        self,
        container_id: int,
        stream_id: int,
        range_id: int,
        step: str,
        children: tuple[int, ...],
        start_hashes: tuple[int, ...] = (),
    ) -> int:
        response = await self._forwarder.forward(
            container_id,
            ADMIN_SERVICE + "SealRange",
            admin_pb2.SealRangeRequest(
                container_id=container_id,
                stream_id=stream_id,
                range_id=range_id,
                children=children,
                step=step,
                start_hashes=start_hashes,
            ),
            admin_pb2.SealRangeResponse,
            lambda _: 0,
            idempotent=True,  # each step again is a no-op, or the same once more
        )
        return int(response.sequence)


async def local_or_forward(
    forwarder: Forwarder | None,
    context: Any,
    local: Callable[[], Awaitable[R]],
    path: str,
    request: Any,
    response_type: Callable[..., R],
    code_of: Callable[[R], int],
    *,
    idempotent: bool,
    passthrough_codes: Callable[[int], bool] = lambda code: False,
) -> R:
    """Serve the request here, or forward it to the owner of the container it belongs to."""
    try:
        return await local()
    except NotServedHereError as elsewhere:
        if forwarder is None or (context is not None and was_forwarded(context)):
            raise
        return await forwarder.forward(
            elsewhere.container_id,
            path,
            request,
            response_type,
            code_of,
            idempotent=idempotent,
            context=context,
            passthrough_codes=passthrough_codes,
        )
