"""The etcd v3 API's own gRPC server, on `--etcd-port` (etcd's clients expect its services at
the root of an endpoint of their own). With authentication on, it takes the server's credentials
plus tokens from its own `Authenticate` (`etcd.auth`), and checks the caller's permissions on
namespace `etcd` (`security.access`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tablekeeper_proto.etcd import rpc_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.etcd.auth import AuthServicer
from tablekeeper_server.etcd.errors import ERRORS
from tablekeeper_server.etcd.keyspace import Keyspace
from tablekeeper_server.etcd.servicers import (
    PROGRESS_INTERVAL_S,
    ClusterServicer,
    KVServicer,
    LeaseServicer,
    MaintenanceServicer,
    WatchServicer,
)
from tablekeeper_server.rpc.listen import listen
from tablekeeper_server.security.frontend import secure_front_end
from tablekeeper_server.security.tls import ServerTls


class EtcdServer:
    def __init__(
        self,
        registry: ContainerRegistry,
        *,
        bind_host: str,
        port: int,
        advertised_host: str,
        value_bytes_max: int,
        tls: ServerTls | None = None,
        interceptors: Sequence[Any] = (),
        progress_interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.keyspace = Keyspace(registry)
        # etcd's clients send their token as `token` metadata and re-authenticate only when
        # told exactly etcd's "invalid auth token"; permissions are checked on namespace etcd.
        self.security = secure_front_end(
            interceptors,
            lambda role, namespace: registry.root.role_permissions_on(namespace, role),
            raw_token_key="token",
            invalid_token_message=ERRORS["invalid_auth_token"][1],
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
        client_url = f"http://{advertised_host}:{self.port}"
        rpc_pb2_grpc.add_KVServicer_to_server(
            KVServicer(self.keyspace, value_bytes_max), self._server
        )
        self._watch = WatchServicer(self.keyspace, progress_interval_s=progress_interval_s)
        rpc_pb2_grpc.add_WatchServicer_to_server(self._watch, self._server)
        self._lease = LeaseServicer(self.keyspace)
        rpc_pb2_grpc.add_LeaseServicer_to_server(self._lease, self._server)
        rpc_pb2_grpc.add_ClusterServicer_to_server(ClusterServicer(client_url), self._server)
        rpc_pb2_grpc.add_MaintenanceServicer_to_server(
            MaintenanceServicer(self.keyspace), self._server
        )
        rpc_pb2_grpc.add_AuthServicer_to_server(
            AuthServicer(self.keyspace, self.security), self._server
        )
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)

    async def start(self) -> None:
        """Open the keyspace (the registry must be serving), then accept calls."""
        await self.keyspace.open()
        await self._server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self._watch.streams.shutdown()
        self._lease.streams.shutdown()
        await self._server.stop(grace_s)
