"""The route cache: which server owns the range of a (table, pkey), so ops go straight there.

Any server accepts any request and proxies it to the range's owner, so routing is only an
optimisation and never needed for correctness: whatever the cache does not know (yet) goes to
the bootstrap endpoint (the service URI), which proxies it or answers "not served here"
(NOT_FOUND, nothing applied), which the retry loops handle.

What is cached, fetched through the bootstrap endpoint:
- per table, its ranges (`MetaRangeService.GetActiveRanges`) as a `RangeRouter`. It is dropped
  when the table is deleted through this client or an op finds the table gone, and when an op
  finds its range not there (a split replaced it, or its container moved): fetched again then.
- per storage container, its owner's `host:port` (`StorageContainerService.
  GetStorageContainerEndpoint`, one request for every container of the table). When an owner
  answers "not served here" (or a Batch op says `retryable`), or cannot be reached, that
  container's entry is forgotten and looked up again on the next attempt: that is how a moved
  container is found.

Lookups never fail an op: a lookup is one attempt, and whatever it could not tell (an unassigned
container, an unknown table, a lookup that failed) routes to the bootstrap endpoint for
`UNKNOWN_S` before it is asked again. Concurrent lookups of the same table share one RPC. An
endpoint that refused connections is avoided for `UNREACHABLE_S` even if the lookup names it
again (a server whose advertised address this client cannot reach still works, through the
bootstrap endpoint).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from tablekeeper._transport import RetryPolicy, call
from tablekeeper.errors import TableKeeperError, never_sent
from tablekeeper.routing import RangeRouter
from tablekeeper.types import RangeInfo
from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc

T = TypeVar("T")
_FOREVER = float("inf")


@dataclass(frozen=True, slots=True)
class Target:
    """Where one attempt of an op goes."""

    container_id: int
    """The storage container of the op's range; -1 when routing is off or the range unknown."""
    endpoint: str | None
    """The owner's `host:port`; None = the bootstrap endpoint."""
    stream_id: int = dataclasses.field(default=0, compare=False)
    """The op's table (0: routing is off or the table unknown)."""


BOOTSTRAP = Target(-1, None)


@dataclass(slots=True)
class RouteStats:
    range_fetches: int = 0
    """GetActiveRanges calls (one per table, unless it failed or the table was dropped)."""
    endpoint_fetches: int = 0
    """GetStorageContainerEndpoint calls (one per table and refresh)."""
    invalidations: int = 0
    """Container endpoints forgotten after a wrong-location answer from them."""


def wrong_location(error: grpc.aio.AioRpcError) -> bool:
    """The answer of a server that does not (or no longer) serve the range, or is gone."""
    return error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)


def _connect_failure(error: grpc.aio.AioRpcError) -> bool:
    return never_sent(error.code(), error.details())


def _endpoint_target(endpoint: Any) -> str:
    host = endpoint.hostname
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return f"{host}:{endpoint.port}"


@dataclass(frozen=True, slots=True)
class _Table:
    router: RangeRouter
    container_of_range: dict[int, int]


class RouteCache:
    """Ranges per table and owner endpoints per container; see the module docstring.

    `enabled=False` routes everything to the bootstrap endpoint and never calls the server.
    """

    UNKNOWN_S = 1.0
    UNREACHABLE_S = 10.0

    def __init__(
        self,
        meta_stub: Callable[[], storage_pb2_grpc.MetaRangeServiceStub],
        container_stub: Callable[[], storage_pb2_grpc.StorageContainerServiceStub],
        policy: RetryPolicy,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self._clock = clock
        self.stats = RouteStats()
        self._meta_stub = meta_stub
        self._container_stub = container_stub
        # One attempt per lookup: the op's own retry loop asks again, and until then its
        # attempts go to the bootstrap endpoint.
        self._one_attempt = dataclasses.replace(policy, deadline_s=0.0)
        self._tables: dict[int, _Table] = {}
        self._unknown_tables: dict[int, float] = {}  # stream id: until
        self._endpoints: dict[int, tuple[str | None, float]] = {}  # container: (endpoint, until)
        self._unreachable: dict[str, float] = {}  # endpoint: until
        self._table_fetches: dict[int, asyncio.Task[_Table | None]] = {}
        self._endpoint_fetches: dict[int, asyncio.Task[None]] = {}

    # ---------------------------------------------------------------- lookups

    async def locate(
        self, stream_id: int, pkey: bytes | None = None, *, range_id: int | None = None
    ) -> Target:
        """Where an op on `pkey` (or on the range `range_id`) of the table goes now. Never
        raises (short of cancellation): what is unknown goes to the bootstrap endpoint."""
        if not self.enabled:
            return BOOTSTRAP
        table = await self._table(stream_id)
        if table is None:
            return BOOTSTRAP  # the server there answers for the table (or that it is gone)
        if range_id is None:
            assert pkey is not None
            container = table.router.route(pkey).container_id
        elif range_id in table.container_of_range:
            container = table.container_of_range[range_id]
        else:
            return BOOTSTRAP  # the server will say what is wrong with that range id
        return Target(container, await self._endpoint(stream_id, container), stream_id)

    async def endpoint_for(self, stream_id: int, pkey: bytes) -> str | None:
        """The `host:port` that ops on `pkey` go to now; None = the bootstrap endpoint."""
        return (await self.locate(stream_id, pkey)).endpoint

    # ---------------------------------------------------------------- invalidation

    def failed(self, target: Target, error: grpc.aio.AioRpcError | None = None) -> None:
        """An attempt sent to `target` met `error` (None: a Batch op answered `retryable`, or a
        stream ended): if that says the range is not there, look its container up again, and
        the table's ranges (a split may have replaced the range)."""
        if error is not None:
            if not wrong_location(error):
                return
            if target.endpoint is not None and _connect_failure(error):
                self._unreachable[target.endpoint] = self._clock() + self.UNREACHABLE_S
        if target.stream_id:
            self._tables.pop(target.stream_id, None)
        cached = self._endpoints.get(target.container_id)
        if cached is not None and cached[0] == target.endpoint:
            del self._endpoints[target.container_id]
            self.stats.invalidations += 1

    def forget_table(self, stream_id: int) -> None:
        """The table was deleted (or found missing): drop its ranges."""
        self._tables.pop(stream_id, None)
        self._unknown_tables.pop(stream_id, None)

    async def close(self) -> None:
        tasks = [*self._table_fetches.values(), *self._endpoint_fetches.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------- fetching

    async def _table(self, stream_id: int) -> _Table | None:
        table = self._tables.get(stream_id)
        if table is None and self._unknown_tables.get(stream_id, 0.0) <= self._clock():
            table = await self._shared(
                self._table_fetches, stream_id, lambda: self._fetch_table(stream_id)
            )
        return table

    async def _endpoint(self, stream_id: int, container: int) -> str | None:
        cached = self._endpoints.get(container)
        if cached is None or cached[1] <= self._clock():
            await self._shared(
                self._endpoint_fetches, stream_id, lambda: self._fetch_endpoints(stream_id)
            )
            cached = self._endpoints.get(container)
        endpoint = cached[0] if cached is not None else None
        if endpoint is not None and self._unreachable.get(endpoint, 0.0) > self._clock():
            return None
        return endpoint

    async def _fetch_table(self, stream_id: int) -> _Table | None:
        """The table's ranges; None (for `UNKNOWN_S`) if they cannot be had now or the table
        does not exist: ops then go to the bootstrap endpoint, which answers for itself."""
        self.stats.range_fetches += 1
        try:
            response = await call(
                self._meta_stub().GetActiveRanges,
                storage_pb2.GetActiveRangesRequest(stream_id=stream_id),
                metadata=None,
                idempotent=True,
                policy=self._one_attempt,
                status_of=lambda r: r.code,
            )
        except TableKeeperError:
            response = None
        if response is None or not response.ranges:
            self._unknown_tables[stream_id] = self._clock() + self.UNKNOWN_S
            return None
        ranges = [
            RangeInfo(
                range_id=r.props.range_id,
                start_hash=r.props.start_hash_key,
                end_hash=r.props.end_hash_key,
                container_id=r.props.storage_container_id,
            )
            for r in response.ranges
        ]
        table = _Table(RangeRouter(ranges), {r.range_id: r.container_id for r in ranges})
        self._tables[stream_id] = table
        return table

    async def _fetch_endpoints(self, stream_id: int) -> None:
        """Look up the owners of every container of the table in one request."""
        table = await self._table(stream_id)
        if table is None:
            return
        self.stats.endpoint_fetches += 1
        containers = sorted(set(table.container_of_range.values()))
        request = storage_pb2.GetStorageContainerEndpointRequest(
            requests=[
                storage_pb2.OneStorageContainerEndpointRequest(storage_container=c)
                for c in containers
            ]
        )
        found: dict[int, str] = {}
        try:
            response = await call(
                self._container_stub().GetStorageContainerEndpoint,
                request,
                metadata=None,
                idempotent=True,
                policy=self._one_attempt,
                status_of=lambda r: r.status_code,
            )
        except TableKeeperError:
            pass
        else:
            for one in response.responses:
                if one.status_code == 0 and one.endpoint.HasField("rw_endpoint"):
                    endpoint = one.endpoint
                    found[endpoint.storage_container_id] = _endpoint_target(endpoint.rw_endpoint)
        now = self._clock()
        for container in containers:
            endpoint = found.get(container)
            # An endpoint that refused connections may be replaced soon: ask again then.
            reachable = endpoint is not None and self._unreachable.get(endpoint, 0.0) <= now
            self._endpoints[container] = (endpoint, _FOREVER if reachable else now + self.UNKNOWN_S)

    @staticmethod
    async def _shared(
        tasks: dict[int, asyncio.Task[T]], key: int, fetch: Callable[[], Coroutine[Any, Any, T]]
    ) -> T:
        """Await the fetch for `key` in flight, or start one: concurrent callers share it (and
        one caller's cancellation does not cancel it for the others)."""
        task = tasks.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(fetch())
            tasks[key] = task

            def done(finished: asyncio.Task[T]) -> None:
                if tasks.get(key) is finished:
                    del tasks[key]
                if not finished.cancelled():
                    finished.exception()  # retrieved: no "never retrieved" warning

            task.add_done_callback(done)
        return await asyncio.shield(task)


class RoutedMethod:
    """A unary gRPC method sent to the owner of a (table, pkey) or (table, range), located anew
    on every call, so `_transport.call`'s retry loop (unchanged) follows a moved container;
    a wrong-location failure forgets the endpoint it went to."""

    def __init__(
        self,
        routes: RouteCache,
        stub_for: Callable[[str | None], Any],
        method: str,
        stream_id: int,
        pkey: bytes | None = None,
        *,
        range_id: int | None = None,
    ) -> None:
        self._routes = routes
        self._stub_for = stub_for
        self._method = method
        self._stream_id = stream_id
        self._pkey = pkey
        self._range_id = range_id

    def __call__(self, request: Any, *, metadata: Any, timeout: float) -> _RoutedRpc:
        return _RoutedRpc(self, request, metadata, timeout)

    async def _invoke(self, rpc: _RoutedRpc) -> Any:
        target = await self._routes.locate(self._stream_id, self._pkey, range_id=self._range_id)
        method = getattr(self._stub_for(target.endpoint), self._method)
        rpc.inner = method(rpc.request, metadata=rpc.metadata, timeout=rpc.timeout)
        try:
            return await rpc.inner
        except grpc.aio.AioRpcError as error:
            self._routes.failed(target, error)
            raise


class _RoutedRpc:
    """Awaitable like a grpc.aio unary call, with its `trailing_metadata()`."""

    def __init__(self, method: RoutedMethod, request: Any, metadata: Any, timeout: float) -> None:
        self.request = request
        self.metadata = metadata
        self.timeout = timeout
        self.inner: Any = None
        self._method = method

    def __await__(self) -> Any:
        return self._method._invoke(self).__await__()

    async def trailing_metadata(self) -> Any:
        return await self.inner.trailing_metadata() if self.inner is not None else ()


__all__ = ["BOOTSTRAP", "RouteCache", "RouteStats", "RoutedMethod", "Target", "wrong_location"]
