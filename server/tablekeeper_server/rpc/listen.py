"""Opening a gRPC port, for every front-end alike: plaintext or TLS, and one clear error when the
address cannot be bound; adding services to a server so that a call's cost does not grow with
the number of its methods; and `GrpcPort`, one port's services on either runtime."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import grpc

from tablekeeper_server.rpc.asgi import GrpcAsgi
from tablekeeper_server.security.tls import ServerTls


def listen(server: grpc.aio.Server, bind_host: str, port: int, tls: ServerTls | None) -> int:
    """Add the listening port to `server` (TLS with `tls`); returns the port. `OSError` if the
    address cannot be bound."""
    address = f"{bind_host}:{port}"
    try:
        bound = (
            server.add_secure_port(address, tls.credentials())
            if tls is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpc's way of saying the bind failed
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {address} (port in use, or no such address)")
    return int(bound)


class GenericHandlersOnly:
    """`server` as the generated `add_*Servicer_to_server` functions see it, minus registered
    methods: each service's handlers are added as generic handlers only.

    grpc.aio keeps one request-call future per registered method and waits on all of them for
    every incoming call (an `asyncio.wait` over N futures), so with a dozen or more methods on a
    server that wait costs more than finding the handler among a few generic ones by name.
    Calls, their handlers and interceptors are otherwise the same either way."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self.handlers: list[grpc.GenericRpcHandler] = []
        """Every handler added, in order (another runtime can serve the same methods)."""

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        added = tuple(handlers)
        self.handlers.extend(added)
        self._server.add_generic_rpc_handlers(added)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Left out on purpose (see the class): the generic handler serves these methods."""


class GrpcPort:
    """One port's gRPC services (the main port's, an etcd keyspace's, Oxia's): their handlers and
    interceptors, served by grpc.aio listening on the port (runtime `grpc-aio`), or by Envoy's
    listener on it through `rpc.asgi` (runtime `envoy`: grpc.aio is then built for its handlers
    and never listens; `asgi()` serves them)."""

    def __init__(
        self,
        bind_host: str,
        port: int,
        tls: ServerTls | None,
        *,
        interceptors: Sequence[Any],
        options: Sequence[tuple[str, Any]],
        message_max: int,
        runtime: str = "grpc-aio",
        finite_streams: Collection[str] = (),
    ) -> None:
        """`finite_streams`: see `GrpcAsgi` (Envoy's runtime only)."""
        self._finite_streams = finite_streams
        self._interceptors = list(interceptors)
        self._message_max = message_max
        self._listening = runtime != "envoy"
        self._asgi: GrpcAsgi | None = None
        self.server = grpc.aio.server(interceptors=self._interceptors, options=list(options))
        self.services = GenericHandlersOnly(self.server)
        """Where `add_*Servicer_to_server` adds the port's services."""
        self.port = listen(self.server, bind_host, port, tls) if self._listening else port

    def asgi(self) -> GrpcAsgi:
        """The services as an ASGI application, through the same interceptors (one per port:
        `stop` drains its calls)."""
        if self._asgi is None:
            self._asgi = GrpcAsgi(
                self.services.handlers,
                self._interceptors,
                message_max=self._message_max,
                finite_streams=self._finite_streams,
            )
        return self._asgi

    async def start(self) -> None:
        if self._listening:
            await self.server.start()

    async def stop(self, grace_s: float) -> None:
        """Stop taking calls; wait up to `grace_s` for those in flight."""
        if self._listening:
            await self.server.stop(grace_s)
        if self._asgi is not None:
            await self._asgi.drain(grace_s)
