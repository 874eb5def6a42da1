"""The Oxia client protocol's own gRPC server, on `--oxia-port` (Oxia's clients expect the
`OxiaClient` service at the root of an endpoint of their own).

In cluster mode every server may run this port. As with Oxia itself, clients ask any server for
the shard assignments and then talk to each shard's leader: here the server that owns the
shard's range's container (`oxia.leaders`); the assignment stream tells them when that changes.
A call that reaches a server not serving its shard is answered "node is not leader"; Oxia's
clients wait for the next assignment (callers retry)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from tablekeeper_proto.oxia import client_pb2_grpc
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.edge.limits import message_bytes_max
from tablekeeper_server.edge.metrics import RequestMetrics, RequestObserver
from tablekeeper_server.edge.startup import retry_until_done
from tablekeeper_server.edge.streams import OpenStreams
from tablekeeper_server.oxia.leaders import ShardLeaders
from tablekeeper_server.oxia.namespaces import DEFAULT_NAMESPACE, Namespaces
from tablekeeper_server.oxia.servicer import OxiaServicer
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.rpc.frontends import FrontEndPeers
from tablekeeper_server.rpc.listen import GrpcPort
from tablekeeper_server.rpc.proxy import Forwarder
from tablekeeper_server.security.frontend import NamespaceBits, secure_front_end
from tablekeeper_server.security.tls import ServerTls

FINITE_STREAMS = tuple(
    f"/io.streamnative.oxia.proto.OxiaClient/{method}" for method in ("Read", "List", "RangeScan")
)
"""The Oxia methods that stream a bounded answer and end (served as unary calls on Envoy)."""
CREATE_RETRY_S_MAX = 2.0
log = logging.getLogger(__name__)


class OxiaServer:
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
        clock: Clock,
        forwarder: Forwarder | None = None,
        peers: FrontEndPeers | None = None,
        runtime: str = "grpc-aio",
        metrics: RequestObserver | None = None,
        streams: OpenStreams | None = None,
    ) -> None:
        """`forwarder` and `peers`: cluster mode (`forwarder` reaches the catalog ranges' owners,
        `peers` the other servers' Oxia ports). `namespace_bits`: a role's permissions on a
        namespace (the root range's, here or on its owner), decisions cached `access_cache_s`."""
        self.namespaces = Namespaces(registry, forwarder)
        self._cluster = forwarder is not None
        self._creating: asyncio.Task[None] | None = None
        # Permissions are checked on namespace `oxia`, which holds every Oxia namespace's table.
        self.security = secure_front_end(interceptors, namespace_bits, cache_s=access_cache_s)
        message_max = message_bytes_max(limits)
        self.grpc = GrpcPort(
            bind_host,
            port,
            tls,
            interceptors=[
                *self.security.interceptors,
                # Last: it times the servicer, as on the BookKeeper path.
                *([RequestMetrics(metrics, clock)] if metrics is not None else []),
            ],
            options=[
                ("grpc.max_receive_message_length", message_max),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ],
            message_max=message_max,
            runtime=runtime,
            finite_streams=FINITE_STREAMS,
        )
        self.port = self.grpc.port
        self.leaders = ShardLeaders(f"{advertised_host}:{self.port}", peers)
        self._clock = clock
        self._servicer = OxiaServicer(self.namespaces, self.leaders, limits, clock, streams)
        client_pb2_grpc.add_OxiaClientServicer_to_server(self._servicer, self.grpc.services)

    async def start(self) -> None:
        """Create namespace `default` if missing (the registry must be serving) and open its
        shards, then accept. Opening them starts their session timers: ephemeral records of
        clients that died while the server was down expire one session timeout after the start,
        even if nobody touches their shard. In cluster mode `default` is made in the background,
        through the root range's owner (each server opens the ranges it hosts itself)."""
        if self._cluster:
            self.namespaces.default_pending = True
            self._creating = asyncio.create_task(self._create_until_done(), name="oxia-default")
        else:
            await self.namespaces.create_default()
            for shard in await self.namespaces.shards(DEFAULT_NAMESPACE):
                await self.namespaces.range(shard.shard_id)
        await self.grpc.start()

    async def _create_until_done(self) -> None:
        async def create() -> None:
            await self.namespaces.create_default()
            self.namespaces.default_pending = False
            log.info("Oxia namespace %s is ready", DEFAULT_NAMESPACE)

        what = f"Oxia namespace {DEFAULT_NAMESPACE}"
        await retry_until_done(what, create, self._clock, pause_s_max=CREATE_RETRY_S_MAX)

    async def stop(self, grace_s: float) -> None:
        self._servicer.shutdown()
        await self.grpc.stop(grace_s)
        if self._creating is not None:
            self._creating.cancel()
            await asyncio.gather(self._creating, return_exceptions=True)
