"""The etcd v3 API's own gRPC server, on `--etcd-port` (etcd's clients expect its services at
the root of an endpoint of their own). With authentication on, it takes the server's credentials
plus tokens from its own `Authenticate` (`etcd.auth`), and checks the caller's permissions on
namespace `etcd` (`security.access`).

In cluster mode every server may run this port; a server that does not own the keyspace range's
container passes each etcd call through to the owner's etcd port (`rpc.frontends.PassThrough`,
before authentication: the owner checks the caller's token), and answers MemberList itself with
every live server's client URL. The Auth service's calls (users live in the root range) go to
the root range's owner instead; permissions are read from it wherever it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.edge.limits import message_bytes_max
from tablekeeper_server.edge.metrics import RequestMetrics, RequestObserver
from tablekeeper_server.edge.streams import OpenStreams
from tablekeeper_server.errors import NotServedHereError, TableKeeperError
from tablekeeper_server.etcd.auth import AuthServicer
from tablekeeper_server.etcd.errors import ERRORS, EtcdError
from tablekeeper_server.etcd.keyspace import Keyspace
from tablekeeper_server.etcd.names import DEFAULT_KEYSPACE, front_end_name
from tablekeeper_server.etcd.servicers import (
    PROGRESS_INTERVAL_S,
    ClusterServicer,
    KVServicer,
    LeaseServicer,
    MaintenanceServicer,
    WatchServicer,
)
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.rpc.frontends import (
    FrontEndPeers,
    NoOwnerError,
    PassThrough,
    Unavailable,
    method_kinds,
)
from tablekeeper_server.rpc.listen import GrpcPort
from tablekeeper_server.rpc.proxy import Forwarder
from tablekeeper_server.security.frontend import NamespaceBits, secure_front_end
from tablekeeper_server.security.tls import ServerTls

PASSED_THROUGH = method_kinds(
    service
    for service in rpc_pb2.DESCRIPTOR.services_by_name.values()
    if service.name != "Cluster"  # MemberList is answered by every server
)
AUTH_METHODS = f"/{rpc_pb2.DESCRIPTOR.services_by_name['Auth'].full_name}/"
"""The Auth service's methods: answered by the root range's owner (users live there)."""
UNAVAILABLE = Unavailable(
    no_owner=ERRORS["no_leader"], owner_lost=ERRORS["leader_changed"], own_prefix="etcdserver:"
)


class EtcdServer:
    def __init__(
        self,
        registry: ContainerRegistry,
        *,
        bind_host: str,
        port: int,
        advertised_host: str,
        limits: Limits,
        tls: ServerTls | None = None,
        interceptors: Sequence[Any] = (),
        namespace_bits: NamespaceBits,
        access_cache_s: float = 0.0,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
        forwarder: Forwarder | None = None,
        peers: FrontEndPeers | None = None,
        keyspace: str = DEFAULT_KEYSPACE,
        runtime: str = "grpc-aio",
        clock: Clock,
        metrics: RequestObserver | None = None,
        streams: OpenStreams | None = None,
    ) -> None:
        """`keyspace`: the keyspace served (table `etcd/KEYSPACE`). `forwarder` and `peers`:
        cluster mode or a worker (`forwarder` reaches the root range's owner, `peers` the other
        servers' ports of this keyspace). `namespace_bits`: a role's permissions on a namespace
        (the root range's, here or on its owner), decisions cached `access_cache_s`."""
        self.keyspace = Keyspace(registry, forwarder, keyspace, clock=clock)
        self.streams = streams if streams is not None else OpenStreams()
        """The server's open streams (Watch and LeaseKeepAlive here), ended by `stop`."""
        self._peers = peers
        # etcd's clients send their token as `token` metadata and re-authenticate only when
        # told exactly etcd's "invalid auth token"; permissions are checked on namespace etcd.
        self.security = secure_front_end(
            interceptors,
            namespace_bits,
            raw_token_key="token",
            invalid_token_message=ERRORS["invalid_auth_token"][1],
            cache_s=access_cache_s,
        )
        message_max = message_bytes_max(limits)
        interceptors = list(self.security.interceptors)
        self._pass_through: PassThrough | None = None
        if peers is not None:
            self._pass_through = PassThrough(
                PASSED_THROUGH,
                self._locate,
                UNAVAILABLE,
                forget=peers.forget,
                credentials=tls.channel_credentials() if tls is not None else None,
                message_bytes_max=message_max,
            )
            interceptors.insert(0, self._pass_through)
        if metrics is not None:  # last: it times the servicer, as on the BookKeeper path
            interceptors.append(RequestMetrics(metrics, clock))
        self.grpc = GrpcPort(
            bind_host,
            port,
            tls,
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", message_max),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ],
            message_max=message_max,
            runtime=runtime,
        )
        self.port = self.grpc.port
        scheme = "https" if tls is not None else "http"
        client_url = f"{scheme}://{advertised_host}:{self.port}"
        services = self.grpc.services
        rpc_pb2_grpc.add_KVServicer_to_server(KVServicer(self.keyspace, limits), services)
        self._watch = WatchServicer(
            self.keyspace, self.streams, progress_interval_s=progress_interval_s
        )
        rpc_pb2_grpc.add_WatchServicer_to_server(self._watch, services)
        self._lease = LeaseServicer(self.keyspace, self.streams)
        rpc_pb2_grpc.add_LeaseServicer_to_server(self._lease, services)
        rpc_pb2_grpc.add_ClusterServicer_to_server(
            ClusterServicer(client_url, peers.members if peers is not None else None, scheme),
            services,
        )
        self.maintenance = MaintenanceServicer(self.keyspace)
        rpc_pb2_grpc.add_MaintenanceServicer_to_server(self.maintenance, services)
        rpc_pb2_grpc.add_AuthServicer_to_server(
            AuthServicer(self.keyspace, self.security), services
        )
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, services)

    async def start(self) -> None:
        """Open the keyspace (the registry must be serving), then accept calls."""
        await self.keyspace.open()
        await self.grpc.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.streams.close(front_end_name(self.keyspace.name))
        await self.grpc.stop(grace_s)
        await self.keyspace.close()
        if self._pass_through is not None:
            await self._pass_through.close()

    async def _locate(self, method: str, forwarded: bool) -> str | None:
        """Cluster mode: None if the call is served here (or its error is best answered here),
        else the etcd address of the server that owns what it needs: the keyspace range, or
        for the Auth service (users live in the root range) the root range."""
        assert self._peers is not None
        try:
            if method.startswith(AUTH_METHODS):
                container_id = self._root_container()
                if container_id is None:
                    return None
            else:
                await self.keyspace.range()
                return None
        except NotServedHereError as elsewhere:
            container_id = elsewhere.container_id
        except (EtcdError, TableKeeperError):
            return None  # not ready, suspended, root range unreachable: the handler says so
        if forwarded:
            raise NoOwnerError(f"container {container_id} is not served here")
        owner = self._peers.owner_of(container_id)
        if owner is None or owner == self._peers.self_endpoint:
            raise NoOwnerError(f"container {container_id} has no other owner right now")
        address = await self._peers.address(owner)
        if address is None:
            raise NoOwnerError(
                f"{owner} does not serve etcd keyspace {self.keyspace.name} (or is gone)"
            )
        return address

    def _root_container(self) -> int | None:
        """None if the root range is served here, else its container (the Auth service's users
        are kept there); raises the registry's errors while it is not open."""
        try:
            self.keyspace.registry.root  # noqa: B018 (raises if served elsewhere)
        except NotServedHereError as elsewhere:
            return elsewhere.container_id
        return None
