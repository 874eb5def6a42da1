"""The client context: what one `AsyncClient` shares with its tables, watches, sessions and bulk
access, so none of them reaches into the client.

It owns the channels (one per endpoint: the service URI and each range owner), the stubs on
them, the route cache (`_routes`), the coalescer (`_coalesce`) and the retry policy; it makes
the calls (`_transport.call`) with that policy. Layers, bottom up:

    errors, types  <-  _transport  <-  _routes  <-  _coalesce, _watch_mux  <-  _context
                   <-  session, watch, bulk  <-  table  <-  client

Nothing imports upwards (`tests/unit/test_client_layers.py` checks it): `table.batch_put` sends
through `bulk`, and `bulk` needs no table code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from tablekeeper._coalesce import Coalescer
from tablekeeper._routes import RouteCache, RoutedMethod
from tablekeeper._transport import RetryPolicy, call, new_channel, within
from tablekeeper._watch_mux import WatchStreams
from tablekeeper_proto.bookkeeper import kv_rpc_pb2_grpc, storage_pb2_grpc
from tablekeeper_proto.v1 import tablekeeper_pb2_grpc, watch_pb2_grpc

MESSAGE_BYTES_MAX = 64 * 1024 * 1024
ROOT_METADATA = (("bk-rt-sc-id-bin", b"\x00" * 8),)
"""BookKeeper's routing metadata for the root range (storage container 0)."""


class ClientContext:
    """Channels, stubs, routes, the coalescer and the retry policy of one client.

    `target`: the service URI as a gRPC target (the bootstrap endpoint). Not thread-safe: used
    on the client's event loop only."""

    def __init__(
        self,
        target: str,
        retry: RetryPolicy,
        *,
        coalesce: bool = True,
        direct_routing: bool = True,
        channel_options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[Any] = (),
    ) -> None:
        self.target = target
        self.retry = retry
        self.coalesce = coalesce
        self._channel_options = list(channel_options)
        self._credentials = credentials
        self._interceptors = list(interceptors)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[str, str], Any] = {}
        self._coalescer: Coalescer | None = None
        self.routes = RouteCache(
            lambda: self.stub("meta", storage_pb2_grpc.MetaRangeServiceStub),
            lambda: self.stub("containers", storage_pb2_grpc.StorageContainerServiceStub),
            retry,
            enabled=direct_routing,
        )
        self.watch_streams = WatchStreams(
            lambda endpoint: self.stub("watch", watch_pb2_grpc.WatchStub, endpoint)
        )
        """The watch streams shared by this client's watches (one per server and table)."""
        self.read_positions: dict[int, dict[int, int]] = {}
        """Table id -> range id -> the highest log position a follower read of this client
        saw (sent with the next ones, so its reads never go backwards)."""
        self.watch_streams_unsupported = False
        """Set once a server answered that it has no shared watch streams (an older server):
        each watch then has a stream of its own."""

    def stub(
        self, name: str, factory: Callable[[grpc.aio.Channel], Any], endpoint: str | None = None
    ) -> Any:
        """The `factory` stub on the channel to `endpoint` (`host:port`; None = the service)."""
        target = endpoint or self.target
        stub = self._stubs.get((name, target))
        if stub is None:
            channel = self._channels.get(target)
            if channel is None:
                channel = self._channels[target] = new_channel(
                    target,
                    MESSAGE_BYTES_MAX,
                    self._channel_options,
                    credentials=self._credentials,
                    interceptors=self._interceptors,
                )
            stub = self._stubs[(name, target)] = factory(channel)
        return stub

    def routed(
        self,
        name: str,
        factory: Callable[[grpc.aio.Channel], Any],
        method: str,
        stream_id: int,
        pkey: bytes | None = None,
        *,
        range_id: int | None = None,
    ) -> RoutedMethod:
        """A unary method for `call` that goes to the owner of the pkey (or range)."""
        return RoutedMethod(
            self.routes,
            lambda endpoint: self.stub(name, factory, endpoint),
            method,
            stream_id,
            pkey,
            range_id=range_id,
        )

    def coalescer(self) -> Coalescer | None:
        """The coalescer of single-key table ops; None when coalescing is off."""
        if not self.coalesce:
            return None
        if self._coalescer is None:
            self._coalescer = Coalescer(
                lambda endpoint: (
                    self.stub("table", kv_rpc_pb2_grpc.TableServiceStub, endpoint),
                    self.stub("tk", tablekeeper_pb2_grpc.TableKeeperStub, endpoint),
                ),
                self.routes,
                self.retry,
            )
        return self._coalescer

    async def call(
        self,
        method: Callable[..., Any],
        request: Any,
        *,
        idempotent: bool,
        status_of: Callable[[Any], int],
        metadata: Sequence[tuple[str, bytes | str]] | None = None,
    ) -> Any:
        """`_transport.call` with this client's retry policy."""
        return await call(
            method,
            request,
            metadata=metadata,
            idempotent=idempotent,
            policy=self.retry,
            status_of=status_of,
        )

    async def root(
        self, method: str, request: Any, *, idempotent: bool, timeout: float | None = None
    ) -> Any:
        """Call a root range method (namespaces, tables) through the service URI, the whole
        call (retries included) bounded by `timeout` (see `_transport.within`)."""
        stub = self.stub("root", storage_pb2_grpc.RootRangeServiceStub)
        return await within(
            self.call(
                getattr(stub, method),
                request,
                metadata=ROOT_METADATA,
                idempotent=idempotent,
                status_of=lambda r: r.code,
            ),
            timeout,
            what=method,
            write=not idempotent,
        )

    async def close(self) -> None:
        self.watch_streams.close()
        if self._coalescer is not None:
            await self._coalescer.close()
            self._coalescer = None
        await self.routes.close()
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close()


class HasContext(Protocol):
    """A client (or anything else) that holds a `ClientContext`."""

    @property
    def _context(self) -> ClientContext: ...


ContextSource = ClientContext | HasContext
"""What tables and bulk functions accept: a context, or an `AsyncClient` (which has one)."""


def context_of(source: ContextSource) -> ClientContext:
    """The context of `source` (an `AsyncClient`, or a context itself)."""
    return source if isinstance(source, ClientContext) else source._context


__all__ = ["ClientContext", "ContextSource", "HasContext", "context_of"]
