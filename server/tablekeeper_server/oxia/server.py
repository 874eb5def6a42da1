"""The Oxia client protocol's own gRPC server, on `--oxia-port` (Oxia's clients expect the
`OxiaClient` service at the root of an endpoint of their own)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from tablekeeper_proto.oxia import client_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock, SystemClock
from tablekeeper_server.oxia.namespaces import DEFAULT_NAMESPACE, Namespaces
from tablekeeper_server.oxia.servicer import OxiaServicer
from tablekeeper_server.rpc.listen import listen
from tablekeeper_server.security.frontend import secure_front_end
from tablekeeper_server.security.tls import ServerTls


class OxiaServer:
    def __init__(
        self,
        registry: ContainerRegistry,
        *,
        bind_host: str,
        port: int,
        advertised_host: str,
        key_bytes_max: int,
        value_bytes_max: int,
        tls: ServerTls | None = None,
        interceptors: Sequence[Any] = (),
        clock: Clock | None = None,
    ) -> None:
        self.namespaces = Namespaces(registry)
        # Permissions are checked on namespace `oxia`, which holds every Oxia namespace's table.
        self.security = secure_front_end(
            interceptors, lambda role, namespace: registry.root.role_permissions_on(namespace, role)
        )
        message_max = value_bytes_max + 2 * 1024 * 1024
        self._server = grpc.aio.server(
            interceptors=self.security.interceptors,
            options=[
                ("grpc.max_receive_message_length", message_max),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.port = listen(self._server, bind_host, port, tls)
        self._servicer = OxiaServicer(
            self.namespaces,
            f"{advertised_host}:{self.port}",
            key_bytes_max,
            clock or SystemClock(),
        )
        client_pb2_grpc.add_OxiaClientServicer_to_server(self._servicer, self._server)

    async def start(self) -> None:
        """Create namespace `default` if missing (the registry must be serving) and open its
        shards, then accept. Opening them starts their session timers: ephemeral records of
        clients that died while the server was down expire one session timeout after the start,
        even if nobody touches their shard."""
        await self.namespaces.create_default()
        for shard in await self.namespaces.shards(DEFAULT_NAMESPACE):
            await self.namespaces.range(shard.shard_id)
        await self._server.start()

    async def stop(self, grace_s: float) -> None:
        self._servicer.shutdown()
        await self._server.stop(grace_s)
