"""The gRPC server: registers the services, health checking, and drains on shutdown."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc, storage_pb2_grpc
from tablekeeper_proto.v1 import (
    admin_pb2_grpc,
    session_pb2_grpc,
    tablekeeper_pb2_grpc,
)
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.edge.limits import request_bytes_max
from tablekeeper_server.edge.streams import OpenStreams
from tablekeeper_server.metrics import ServerMetrics
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.rpc.listen import GrpcPort
from tablekeeper_server.rpc.malformed import MalformedRequestInterceptor
from tablekeeper_server.rpc.proxy import Forwarder
from tablekeeper_server.rpc.servicers import (
    MetaRangeServicer,
    RootRangeServicer,
    StorageContainerServicer,
    TableKeeperServicer,
    TableServicer,
)
from tablekeeper_server.rpc.sessions import SessionsServicer
from tablekeeper_server.rpc.table_ops import TableOps
from tablekeeper_server.rpc.watch import WatchServicer, add_watch_service
from tablekeeper_server.security.access import AccessControl
from tablekeeper_server.security.auth import Authenticator, AuthInterceptor
from tablekeeper_server.security.tls import ServerTls

# Calls that reached the server but that the Python server has not picked up yet. gRPC core keeps
# them in a backlog whose default cap (random early drops from 1,000, all from 3,000) is sized for
# servers that post many call requests ahead; grpc.aio posts one at a time, so every call in flight
# beyond what the event loop has started waits there, and a client with 2,000 calls in flight (the
# BookKeeper Java client's async API) had some CANCELLED by gRPC before the server ever saw them.
# BookKeeper's server (grpc-java) queues them without a cap. Here: a waiting call costs a few KiB
# (its bytes in flight are bounded by HTTP/2 flow control), 50,000 of them are ~12 s of work for one
# process; only beyond that, or after 30 s unstarted (gRPC's default), does gRPC shed a call.
PENDING_CALLS_MAX = 50_000

SERVICE_NAMES = (
    "bookkeeper.proto.storage.RootRangeService",
    "bookkeeper.proto.storage.MetaRangeService",
    "bookkeeper.proto.storage.StorageContainerService",
    "bookkeeper.proto.kv.rpc.TableService",
    "tablekeeper.v1.TableKeeper",
    "tablekeeper.v1.Watch",
    "tablekeeper.v1.Sessions",
)


class GrpcServer:
    def __init__(
        self,
        registry: ContainerRegistry,
        *,
        bind_host: str,
        port: int,
        advertised_host: str,
        limits: Limits,
        metrics: ServerMetrics | None,
        admin: admin_pb2_grpc.AdminServicer | None = None,
        owner_of: Callable[[int], str | None] | None = None,
        tls: ServerTls | None = None,
        authenticator: Authenticator | None = None,
        server_token: str | None = None,
        access: AccessControl | None = None,
        runtime: str = "grpc-aio",
        streams: OpenStreams | None = None,
    ) -> None:
        """`owner_of(container)` is the cluster's assignment ("host:port", None: unassigned);
        without it (standalone) every container is served here. Requests for containers owned
        elsewhere are forwarded to their owner.

        `tls`: serve TLS (and call other servers over TLS). `authenticator`: authenticate every
        call; forwarded calls carry the caller's token, the server's own calls `server_token`.
        `access`: check every authenticated call's permissions.

        `runtime`: see `GrpcPort` (with `envoy`, Envoy listens on `port`; `rpc.envoy`).
        """
        # BookKeeper's clients expect gRPC's own cut-off for a request over the shared bound.
        message_max = request_bytes_max(limits)
        # The BookKeeper client sends the whole key as `bk-rt-key-bin` metadata: gRPC's default
        # metadata limits (8 KiB soft, 16 KiB hard) would reject keys the server accepts.
        metadata_max = 2 * limits.key_bytes_max + 16 * 1024
        # First: a request that is not valid protobuf is INVALID_ARGUMENT before anything else.
        interceptors: list[grpc.aio.ServerInterceptor] = [MalformedRequestInterceptor()]
        if authenticator is not None:
            on_failure = metrics.auth_failed if metrics is not None else lambda reason: None
            interceptors.append(AuthInterceptor(authenticator, on_failure, access))
        self.grpc = GrpcPort(
            bind_host,
            port,
            tls,
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", message_max),
                ("grpc.max_metadata_size", metadata_max),
                ("grpc.absolute_max_metadata_size", metadata_max),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
                ("grpc.server.max_pending_requests", PENDING_CALLS_MAX),
                ("grpc.server.max_pending_requests_hard_limit", PENDING_CALLS_MAX),
            ],
            message_max=message_max,
            runtime=runtime,
        )
        self.port = self.grpc.port
        self.endpoint = f"{advertised_host}:{self.port}"
        self.forwarder: Forwarder | None = None
        if owner_of is None:
            endpoint = self.endpoint
            owner_of = lambda container_id: endpoint  # noqa: E731
        else:
            self.forwarder = Forwarder(
                owner_of,
                self.endpoint,
                message_bytes_max=message_max,
                metadata_bytes_max=metadata_max,
                credentials=tls.channel_credentials() if tls is not None else None,
                server_token=server_token,
            )
            if metrics is not None:
                self.forwarder.on_forward = metrics.observe_forward
        forwarder = self.forwarder
        ops = TableOps(registry, limits, forwarder)
        services = self.grpc.services
        storage_pb2_grpc.add_RootRangeServiceServicer_to_server(
            RootRangeServicer(registry, metrics, forwarder), services
        )
        storage_pb2_grpc.add_MetaRangeServiceServicer_to_server(
            MetaRangeServicer(registry, metrics, forwarder), services
        )
        storage_pb2_grpc.add_StorageContainerServiceServicer_to_server(
            StorageContainerServicer(owner_of), services
        )
        kv_rpc_pb2_grpc.add_TableServiceServicer_to_server(TableServicer(ops, metrics), services)
        tablekeeper_pb2_grpc.add_TableKeeperServicer_to_server(
            TableKeeperServicer(ops, registry, metrics), services
        )
        self._watch = WatchServicer(registry, limits, forwarder, streams)
        add_watch_service(self._watch, services)
        self._sessions = SessionsServicer(registry, metrics, forwarder)
        if access is not None:
            self._sessions.is_superuser = access.is_superuser
        session_pb2_grpc.add_SessionsServicer_to_server(self._sessions, services)
        if admin is not None:
            admin_pb2_grpc.add_AdminServicer_to_server(admin, services)
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, services)

    async def start(self, *, serving: bool = True) -> None:
        """Accept calls. With `serving=False` health reports NOT_SERVING until `set_serving()`:
        calls are accepted meanwhile and get NOT_FOUND from whatever is not open yet."""
        await self.grpc.start()
        serving_status = health_pb2.HealthCheckResponse.ServingStatus
        status = serving_status.SERVING if serving else serving_status.NOT_SERVING
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, status)

    async def set_not_serving(self) -> None:
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def set_serving(self) -> None:
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting new calls and wait up to `grace_s` for in-flight ones."""
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        # Watch and keep-alive streams never finish on their own: end them first.
        self._watch.shutdown()
        self._sessions.shutdown()
        await self.grpc.stop(grace_s)
        if self.forwarder is not None:
            await self.forwarder.close()
