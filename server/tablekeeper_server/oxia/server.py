"""The Oxia client protocol's own gRPC server, on `--oxia-port` (Oxia's clients expect the
`OxiaClient` service at the root of an endpoint of their own)."""

from __future__ import annotations

import grpc

from tablekeeper_proto.oxia import client_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock, SystemClock
from tablekeeper_server.oxia.namespaces import DEFAULT_NAMESPACE, Namespaces
from tablekeeper_server.oxia.servicer import OxiaServicer


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
        clock: Clock | None = None,
    ) -> None:
        self.namespaces = Namespaces(registry)
        message_max = value_bytes_max + 2 * 1024 * 1024
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", message_max),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        try:
            self.port = self._server.add_insecure_port(f"{bind_host}:{port}")
        except RuntimeError:  # grpc's way of saying the bind failed
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot listen on {bind_host}:{port} (port in use, or no such address)")
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
