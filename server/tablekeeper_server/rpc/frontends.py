"""What a protocol front-end (etcd, Oxia) needs in cluster mode: its table made through the root
range wherever that is, the other servers' front-end addresses, and a pass-through of whole
calls to the server that owns the range a call needs.

The pass-through is a server interceptor placed before the front-end's authentication: a call
that must be answered elsewhere is relayed unchanged (request bytes, the caller's metadata, so
its token is checked by the owner) to the owner's front-end port, and the owner's answer or
status comes back unchanged, as etcd's followers forward to their leader. Relayed calls carry
`tk-forwarded` and are never relayed a second time. When there is no owner to relay to, or the
owner goes away mid-call, the caller hears the front-end's own "unavailable" status (its clients
retry on it); never an exception of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from tablekeeper_proto.bookkeeper import storage_pb2, stream_pb2
from tablekeeper_server.container.container import ROOT_CONTAINER_ID
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.errors import (
    NamespaceExistsError,
    NamespaceNotFoundError,
    NotServedHereError,
    StreamExistsError,
    StreamNotFoundError,
    UnavailableError,
)
from tablekeeper_server.rpc.proxy import FORWARDED_METADATA_KEY, ROOT_SERVICE, Forwarder

log = logging.getLogger(__name__)
R = TypeVar("R")

_HOP_HEADERS = frozenset({"user-agent", "content-type", "te", FORWARDED_METADATA_KEY})
_CONNECT_FAILURE_HINTS = ("failed to connect", "connection refused", "connections to all backends")


# --------------------------------------------------------------------------- the table


async def ensure_table(
    registry: ContainerRegistry,
    forwarder: Forwarder | None,
    namespace: str,
    table: str,
    conf: stream_pb2.StreamConfiguration,
) -> stream_pb2.StreamProperties:
    """The table's properties, creating the namespace and the table if missing: in the root
    range here, or (cluster mode) through the root range's owner. Raises the catalog's errors
    (retryable ones while the root range has no owner)."""
    try:
        root = registry.root
    except NotServedHereError:
        if forwarder is None:
            raise
        return await _ensure_table_remote(forwarder, namespace, table, conf)
    try:
        return root.get_stream(namespace, table)
    except (NamespaceNotFoundError, StreamNotFoundError):
        pass
    with contextlib.suppress(NamespaceExistsError):
        await root.create_namespace(namespace, stream_pb2.NamespaceConfiguration())
    try:
        return await root.create_stream(namespace, table, conf)
    except StreamExistsError:
        return root.get_stream(namespace, table)


async def find_table(
    registry: ContainerRegistry, forwarder: Forwarder | None, namespace: str, table: str
) -> stream_pb2.StreamProperties | None:
    """The table's properties (None: no such namespace or table), from the root range here or
    (cluster mode) on its owner. Raises the catalog's retryable errors while it has no owner."""
    try:
        root = registry.root
    except NotServedHereError:
        if forwarder is None:
            raise
        return await _find_table_remote(forwarder, namespace, table)
    try:
        return root.get_stream(namespace, table)
    except (NamespaceNotFoundError, StreamNotFoundError):
        return None


async def _find_table_remote(
    forwarder: Forwarder, namespace: str, table: str
) -> stream_pb2.StreamProperties | None:
    found = await _call_root(
        forwarder,
        "GetStream",
        storage_pb2.GetStreamRequest(
            stream_name=stream_pb2.StreamName(namespace_name=namespace, stream_name=table)
        ),
        storage_pb2.GetStreamResponse,
    )
    if found.code in (storage_pb2.NAMESPACE_NOT_FOUND, storage_pb2.STREAM_NOT_FOUND):
        return None
    if found.code != storage_pb2.SUCCESS:
        raise UnavailableError(f"cannot read table {namespace}/{table}: code {found.code}")
    return found.stream_props


async def _call_root(
    forwarder: Forwarder, method: str, request: Any, response_type: Callable[..., R]
) -> R:
    """One call to the root range's owner; its answer whatever its code."""
    return await forwarder.forward(
        ROOT_CONTAINER_ID,
        ROOT_SERVICE + method,
        request,
        response_type,
        lambda r: int(r.code),  # type: ignore[attr-defined]
        idempotent=True,  # each is a read or a create that says "exists" when repeated
        passthrough_codes=lambda code: True,
    )


async def _ensure_table_remote(
    forwarder: Forwarder, namespace: str, table: str, conf: stream_pb2.StreamConfiguration
) -> stream_pb2.StreamProperties:
    async def call(method: str, request: Any, response_type: Callable[..., R]) -> R:
        return await _call_root(forwarder, method, request, response_type)

    name = stream_pb2.StreamName(namespace_name=namespace, stream_name=table)
    found = await call(
        "GetStream", storage_pb2.GetStreamRequest(stream_name=name), storage_pb2.GetStreamResponse
    )
    if found.code == storage_pb2.SUCCESS:
        return found.stream_props
    made_namespace = await call(
        "CreateNamespace",
        storage_pb2.CreateNamespaceRequest(
            name=namespace, ns_conf=stream_pb2.NamespaceConfiguration()
        ),
        storage_pb2.CreateNamespaceResponse,
    )
    if made_namespace.code not in (storage_pb2.SUCCESS, storage_pb2.NAMESPACE_EXISTS):
        raise UnavailableError(f"cannot create namespace {namespace}: code {made_namespace.code}")
    made = await call(
        "CreateStream",
        storage_pb2.CreateStreamRequest(ns_name=namespace, name=table, stream_conf=conf),
        storage_pb2.CreateStreamResponse,
    )
    if made.code == storage_pb2.SUCCESS:
        return made.stream_props
    found = await call(
        "GetStream", storage_pb2.GetStreamRequest(stream_name=name), storage_pb2.GetStreamResponse
    )
    if found.code != storage_pb2.SUCCESS:
        raise UnavailableError(f"cannot create table {namespace}/{table}: code {made.code}")
    return found.stream_props


# --------------------------------------------------------------------------- the peers


class FrontEndPeers:
    """Where the cluster's servers serve front-end `name`, from their ZooKeeper registrations
    (`ZkCoordinator.server_frontends`), and who owns a container (the assignment). The blocking
    ZooKeeper reads run in threads; addresses are cached until a relay to one fails."""

    def __init__(
        self,
        name: str,
        self_endpoint: str,
        owner_of: Callable[[int], str | None],
        frontends_of: Callable[[str], Mapping[str, str] | None],
        live_servers: Callable[[], list[str]],
    ) -> None:
        self.name = name
        self.self_endpoint = self_endpoint
        self._owner_of = owner_of
        self._frontends_of = frontends_of
        self._live_servers = live_servers
        self._addresses: dict[str, str] = {}

    def owner_of(self, container_id: int) -> str | None:
        """The server assigned the container (None: nobody right now)."""
        return self._owner_of(container_id)

    async def address(self, endpoint: str) -> str | None:
        """Server `endpoint`'s address of the front-end (None: not live, or not serving it)."""
        address = self._addresses.get(endpoint)
        if address is None:
            frontends = await asyncio.to_thread(self._frontends_of, endpoint)
            address = (frontends or {}).get(self.name)
            if address is not None:
                self._addresses[endpoint] = address
        return address

    def forget(self, address: str) -> None:
        """A relay to `address` failed to connect: read the registration again next time."""
        for endpoint, known in list(self._addresses.items()):
            if known == address:
                del self._addresses[endpoint]

    async def members(self) -> list[tuple[str, str]]:
        """(endpoint, front-end address) of every live server that serves the front-end."""
        found = []
        for endpoint in await asyncio.to_thread(self._live_servers):
            address = await self.address(endpoint)
            if address is not None:
                found.append((endpoint, address))
        return found


# --------------------------------------------------------------------------- the pass-through


class NoOwnerError(Exception):
    """There is nobody to relay the call to right now (the caller should retry)."""


@dataclass(frozen=True)
class Unavailable:
    """How a front-end says "retry": the status for no owner (nothing was sent anywhere), and
    for an owner lost mid-call (it may have applied the call)."""

    no_owner: tuple[grpc.StatusCode, str]
    owner_lost: tuple[grpc.StatusCode, str]
    own_prefix: str
    """The front-end's own UNAVAILABLE answers start with this (relayed as they are); any other
    UNAVAILABLE came from the connection to the owner."""


Locate = Callable[[str, bool], Awaitable[str | None]]
"""`locate(method, forwarded)`: None to answer the call here, else the front-end address to
relay it to; raises `NoOwnerError`. `method`: the gRPC method path; `forwarded`: the call was
relayed to us (never relay it again)."""


def method_kinds(services: Iterable[ServiceDescriptor]) -> dict[str, tuple[bool, bool]]:
    """gRPC method path -> (client streaming, server streaming), for the methods to relay."""
    return {
        f"/{service.full_name}/{method.name}": (method.client_streaming, method.server_streaming)
        for service in services
        for method in service.methods
    }


class PassThrough(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        methods: Mapping[str, tuple[bool, bool]],
        locate: Locate,
        unavailable: Unavailable,
        *,
        forget: Callable[[str], None] = lambda address: None,
        credentials: grpc.ChannelCredentials | None = None,
        message_bytes_max: int = -1,
    ) -> None:
        self._methods = methods
        self._locate = locate
        self._unavailable = unavailable
        self._forget = forget
        self._credentials = credentials
        self._options = [
            ("grpc.max_receive_message_length", message_bytes_max),
            ("grpc.max_send_message_length", -1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        kind = self._methods.get(details.method)
        if kind is None:
            return await continuation(details)
        metadata = tuple(details.invocation_metadata or ())
        forwarded = any(key == FORWARDED_METADATA_KEY for key, _ in metadata)
        try:
            address = await self._locate(details.method, forwarded)
        except NoOwnerError as exc:
            log.debug("%s: no owner to pass the call to: %s", details.method, exc)
            return _refusal(kind, self._unavailable.no_owner)
        if address is None:
            return await continuation(details)
        return self._relay(address, details.method, kind, metadata)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = (
                grpc.aio.secure_channel(address, self._credentials, options=self._options)
                if self._credentials is not None
                else grpc.aio.insecure_channel(address, options=self._options)
            )
            self._channels[address] = channel
        return channel

    def _relay(
        self,
        address: str,
        path: str,
        kind: tuple[bool, bool],
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> Any:
        outgoing = (
            *(
                (key, value)
                for key, value in metadata
                if not key.startswith((":", "grpc-")) and key not in _HOP_HEADERS
            ),
            (FORWARDED_METADATA_KEY, "1"),
        )
        channel = self._channel(address)

        def timeout(context: Any) -> float | None:
            remaining = context.time_remaining()
            return None if remaining is None else max(remaining, 0.001)

        client_streaming, server_streaming = kind
        if not client_streaming and not server_streaming:

            async def unary(request: bytes, context: Any) -> bytes:
                call = channel.unary_unary(path)(
                    request, metadata=outgoing, timeout=timeout(context)
                )
                try:
                    response: bytes = await call
                    return response
                except grpc.aio.AioRpcError as error:
                    await self._fail(context, error, address)
                raise AssertionError("unreachable")  # context.abort raises

            return grpc.unary_unary_rpc_method_handler(unary)

        async def relay_stream(
            call: Any, context: Any, pump: asyncio.Task[None] | None
        ) -> AsyncIterator[bytes]:
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as error:
                await self._fail(context, error, address)
            finally:
                call.cancel()
                if pump is not None:
                    pump.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await pump

        if not client_streaming:

            async def server_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
                call = channel.unary_stream(path)(
                    request, metadata=outgoing, timeout=timeout(context)
                )
                async for response in relay_stream(call, context, None):
                    yield response

            return grpc.unary_stream_rpc_method_handler(server_stream)

        async def bidi(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            call = channel.stream_stream(path)(metadata=outgoing, timeout=timeout(context))

            async def pump() -> None:
                async for request in requests:
                    await call.write(request)
                await call.done_writing()

            pumping = asyncio.create_task(pump())
            async for response in relay_stream(call, context, pumping):
                yield response

        if server_streaming:
            return grpc.stream_stream_rpc_method_handler(bidi)

        async def client_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
            call = channel.stream_unary(path)(metadata=outgoing, timeout=timeout(context))
            try:
                async for request in requests:
                    await call.write(request)
                await call.done_writing()
                response: bytes = await call
                return response
            except grpc.aio.AioRpcError as error:
                await self._fail(context, error, address)
            raise AssertionError("unreachable")

        return grpc.stream_unary_rpc_method_handler(client_stream)

    async def _fail(self, context: Any, error: grpc.aio.AioRpcError, address: str) -> None:
        """End the call as the owner ended it; if the connection to it failed instead, with the
        front-end's "unavailable"."""
        code, details = error.code(), error.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and not details.startswith(
            self._unavailable.own_prefix
        ):
            never_sent = any(hint in details.lower() for hint in _CONNECT_FAILURE_HINTS)
            if never_sent:
                self._forget(address)
            log.info("passing a call to %s failed: %s", address, details)
            code, details = (
                self._unavailable.no_owner if never_sent else self._unavailable.owner_lost
            )
        await context.abort(code, details)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def _refusal(kind: tuple[bool, bool], status: tuple[grpc.StatusCode, str]) -> Any:
    code, message = status

    async def refuse(request: Any, context: Any) -> Any:
        await context.abort(code, message)

    async def refuse_stream(request: Any, context: Any) -> AsyncIterator[bytes]:
        await context.abort(code, message)
        yield b""  # never reached: makes this an async generator

    client_streaming, server_streaming = kind
    if client_streaming and server_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    if server_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    if client_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
