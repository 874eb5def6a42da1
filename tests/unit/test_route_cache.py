"""The SDK's route cache (`tablekeeper._routes`) and the ops built on it, over fake stubs:
lookups are shared and cached, wrong-location answers make the retry find the new owner,
whatever is unknown goes to the bootstrap endpoint, and the coalescer batches per owner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tablekeeper._coalesce import Coalescer
from tablekeeper._routes import BOOTSTRAP, RouteCache, RoutedMethod, Target
from tablekeeper._transport import RetryPolicy, call
from tablekeeper.routing import RangeInfo, RangeRouter
from tablekeeper_proto.bookkeeper import kv_rpc_pb2, storage_pb2
from tablekeeper_proto.v1 import tablekeeper_pb2

pytestmark = pytest.mark.unit

TABLE = 1024
STREAM_NOT_FOUND = 2102
UNASSIGNED = 500
POLICY = RetryPolicy(deadline_s=5.0, initial_backoff_s=0.001, max_backoff_s=0.01)
# Four ranges, one per container 0..3, splitting the signed 64-bit hash space evenly.
RANGES = [
    RangeInfo(
        range_id=100 + i, start_hash=start, end_hash=min(start + 2**62, 2**63 - 1), container_id=i
    )
    for i, start in enumerate(range(-(2**63), 2**63, 2**62))
]


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class FakeCall:
    """Awaitable like a grpc.aio unary call."""

    def __init__(self, result: Any, delay_s: float = 0.0) -> None:
        self._result = result
        self._delay_s = delay_s

    def __await__(self) -> Any:
        return self._run().__await__()

    async def _run(self) -> Any:
        await asyncio.sleep(self._delay_s)
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    async def trailing_metadata(self) -> Any:
        return ()


class FakeMeta:
    def __init__(self, ranges: list[RangeInfo] | None = RANGES, delay_s: float = 0.0) -> None:
        self.ranges = ranges  # None: the table does not exist
        self.delay_s = delay_s
        self.calls = 0

    def GetActiveRanges(self, request: Any, *, metadata: Any, timeout: float) -> FakeCall:  # noqa: N802
        self.calls += 1
        if self.ranges is None:
            return FakeCall(storage_pb2.GetActiveRangesResponse(code=STREAM_NOT_FOUND))  # type: ignore[arg-type]
        response = storage_pb2.GetActiveRangesResponse()
        for r in self.ranges:
            props = response.ranges.add().props
            props.range_id, props.storage_container_id = r.range_id, r.container_id
            props.start_hash_key, props.end_hash_key = r.start_hash, r.end_hash
        return FakeCall(response, self.delay_s)


class FakeContainers:
    def __init__(self, owners: dict[int, str | None], delay_s: float = 0.0) -> None:
        self.owners = owners  # container: "host:port", or None = unassigned
        self.delay_s = delay_s
        self.error: grpc.aio.AioRpcError | None = None
        self.requests: list[list[int]] = []

    def GetStorageContainerEndpoint(  # noqa: N802
        self, request: Any, *, metadata: Any, timeout: float
    ) -> FakeCall:
        self.requests.append([one.storage_container for one in request.requests])
        if self.error is not None:
            return FakeCall(self.error)
        response = storage_pb2.GetStorageContainerEndpointResponse()
        for one in request.requests:
            answer = response.responses.add()
            owner = self.owners.get(one.storage_container)
            if owner is None:
                answer.status_code = UNASSIGNED  # type: ignore[assignment]
                continue
            host, port = owner.rsplit(":", 1)
            answer.endpoint.storage_container_id = one.storage_container
            answer.endpoint.rw_endpoint.hostname = host
            answer.endpoint.rw_endpoint.port = int(port)
        return FakeCall(response, self.delay_s)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_cache(
    meta: FakeMeta, containers: FakeContainers, *, enabled: bool = True, clock: Clock | None = None
) -> RouteCache:
    return RouteCache(
        lambda: meta,  # type: ignore[arg-type,return-value]
        lambda: containers,  # type: ignore[arg-type,return-value]
        POLICY,
        enabled=enabled,
        clock=clock or Clock(),
    )


def pkey_on(container: int) -> bytes:
    router = RangeRouter(RANGES)
    return next(
        p
        for p in (f"pkey-{i}".encode() for i in range(10_000))
        if router.route(p).container_id == container
    )


TWO_SERVERS = {0: "a:1", 1: "a:1", 2: "b:2", 3: "b:2"}


async def test_routes_each_pkey_to_its_containers_owner_with_one_lookup_each() -> None:
    meta, containers = FakeMeta(), FakeContainers(dict(TWO_SERVERS))
    cache = make_cache(meta, containers)
    router = RangeRouter(RANGES)
    for i in range(200):
        pkey = f"k{i}".encode()
        target = await cache.locate(TABLE, pkey)
        assert target.container_id == router.route(pkey).container_id
        assert target.endpoint == TWO_SERVERS[target.container_id]
    assert await cache.locate(TABLE, range_id=102) == Target(2, "b:2")
    assert await cache.locate(TABLE, range_id=999) == BOOTSTRAP  # unknown: the server says
    assert meta.calls == 1
    assert containers.requests == [[0, 1, 2, 3]]  # every container of the table at once
    assert cache.stats.range_fetches == 1 and cache.stats.endpoint_fetches == 1


async def test_concurrent_lookups_share_one_rpc() -> None:
    meta, containers = FakeMeta(delay_s=0.02), FakeContainers(dict(TWO_SERVERS), delay_s=0.02)
    cache = make_cache(meta, containers)
    pkeys = [f"k{i}".encode() for i in range(50)]
    targets = await asyncio.gather(*(cache.endpoint_for(TABLE, p) for p in pkeys))
    assert set(targets) == {"a:1", "b:2"}
    assert meta.calls == 1 and len(containers.requests) == 1


async def test_a_cancelled_waiter_does_not_cancel_the_shared_lookup() -> None:
    meta, containers = FakeMeta(delay_s=0.05), FakeContainers(dict(TWO_SERVERS))
    cache = make_cache(meta, containers)
    first = asyncio.ensure_future(cache.locate(TABLE, b"x"))
    second = asyncio.ensure_future(cache.locate(TABLE, b"x"))
    while meta.calls == 0:  # until the shared lookup is under way, both waiting on it
        await asyncio.sleep(0)
    first.cancel()
    assert (await second).endpoint is not None
    assert meta.calls == 1


async def test_wrong_location_forgets_the_container_and_finds_the_new_owner() -> None:
    meta, containers = FakeMeta(), FakeContainers(dict(TWO_SERVERS))
    cache = make_cache(meta, containers)
    pkey = pkey_on(0)
    target = await cache.locate(TABLE, pkey)
    assert target == Target(0, "a:1")

    cache.failed(target, rpc_error(grpc.StatusCode.INVALID_ARGUMENT))  # not about location
    cache.failed(Target(0, "old:9"), rpc_error(grpc.StatusCode.NOT_FOUND))  # a stale attempt
    assert await cache.locate(TABLE, pkey) == target
    assert cache.stats.invalidations == 0 and len(containers.requests) == 1

    containers.owners[0] = "b:2"  # the container moved
    cache.failed(target, rpc_error(grpc.StatusCode.NOT_FOUND, "not served here"))
    assert cache.stats.invalidations == 1
    assert await cache.locate(TABLE, pkey) == Target(0, "b:2")
    assert await cache.endpoint_for(TABLE, pkey_on(2)) == "b:2"  # others stay cached
    # The ranges are fetched again too: a split may have replaced the range.
    assert len(containers.requests) == 2 and meta.calls == 2


async def test_unknown_owners_go_to_the_bootstrap_endpoint_until_asked_again() -> None:
    meta, containers = FakeMeta(), FakeContainers({0: None, 1: "a:1", 2: "a:1", 3: "a:1"})
    clock = Clock()
    cache = make_cache(meta, containers, clock=clock)
    assert await cache.endpoint_for(TABLE, pkey_on(0)) is None  # unassigned right now
    assert await cache.endpoint_for(TABLE, pkey_on(1)) == "a:1"
    assert await cache.endpoint_for(TABLE, pkey_on(0)) is None
    assert len(containers.requests) == 1  # "unassigned" is remembered for a moment

    clock.now += RouteCache.UNKNOWN_S
    containers.owners[0] = "a:1"
    assert await cache.endpoint_for(TABLE, pkey_on(0)) == "a:1"

    containers.error = rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect")
    cache.failed(Target(0, "a:1"), rpc_error(grpc.StatusCode.NOT_FOUND))
    assert await cache.endpoint_for(TABLE, pkey_on(0)) is None  # the lookup failed: bootstrap


async def test_an_unreachable_endpoint_is_avoided_even_if_the_lookup_names_it() -> None:
    meta, containers = FakeMeta(), FakeContainers(dict(TWO_SERVERS))
    clock = Clock()
    cache = make_cache(meta, containers, clock=clock)
    target = await cache.locate(TABLE, pkey_on(0))
    refused = rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    cache.failed(target, refused)
    assert await cache.endpoint_for(TABLE, pkey_on(0)) is None  # the lookup still says a:1
    assert await cache.endpoint_for(TABLE, pkey_on(1)) is None  # same server
    assert await cache.endpoint_for(TABLE, pkey_on(2)) == "b:2"

    clock.now += RouteCache.UNKNOWN_S  # asked again soon; the new owner is used at once
    containers.owners[0] = "b:2"
    assert await cache.endpoint_for(TABLE, pkey_on(0)) == "b:2"
    assert await cache.endpoint_for(TABLE, pkey_on(1)) is None

    clock.now += RouteCache.UNREACHABLE_S  # a:1 is tried again after a while
    assert await cache.endpoint_for(TABLE, pkey_on(1)) == "a:1"


async def test_a_missing_table_goes_to_the_bootstrap_endpoint_and_is_asked_again() -> None:
    meta, containers = FakeMeta(ranges=None), FakeContainers(dict(TWO_SERVERS))
    clock = Clock()
    cache = make_cache(meta, containers, clock=clock)
    assert await cache.locate(TABLE, b"x") == BOOTSTRAP
    assert await cache.locate(TABLE, b"x") == BOOTSTRAP
    assert meta.calls == 1 and containers.requests == []
    clock.now += RouteCache.UNKNOWN_S
    assert await cache.locate(TABLE, b"x") == BOOTSTRAP
    assert meta.calls == 2

    meta.ranges = RANGES
    cache.forget_table(TABLE)  # what an op that met STREAM_NOT_FOUND does
    assert (await cache.locate(TABLE, b"x")).endpoint is not None
    cache.forget_table(TABLE)  # deleted through the client
    await cache.locate(TABLE, b"x")
    assert meta.calls == 4


async def test_disabled_routing_never_calls_the_server() -> None:
    meta, containers = FakeMeta(), FakeContainers(dict(TWO_SERVERS))
    cache = make_cache(meta, containers, enabled=False)
    assert await cache.locate(TABLE, b"x") == BOOTSTRAP
    cache.failed(BOOTSTRAP, rpc_error(grpc.StatusCode.NOT_FOUND))
    assert meta.calls == 0 and containers.requests == []


class FakeTableStubs:
    """TableService and TableKeeper stubs per endpoint: records where every op went; an
    endpoint in `not_here` answers "not served here" (unary NOT_FOUND / batch retryable)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str | None, str, list[bytes]]] = []  # endpoint, method, pkeys
        self.not_here: set[str | None] = set()

    def for_endpoint(self, endpoint: str | None) -> Any:
        fake = self

        class Stub:
            def Put(self, request: Any, *, metadata: Any, timeout: float) -> FakeCall:  # noqa: N802
                fake.sent.append((endpoint, "Put", [request.header.r_key]))
                if endpoint in fake.not_here:
                    return FakeCall(rpc_error(grpc.StatusCode.NOT_FOUND, "not served here"))
                return FakeCall(kv_rpc_pb2.PutResponse())

            def Batch(self, request: Any, *, timeout: float) -> FakeCall:  # noqa: N802
                fake.sent.append((endpoint, "Batch", [op.put.header.r_key for op in request.ops]))
                response = tablekeeper_pb2.BatchResponse()
                for _ in request.ops:
                    result = response.results.add()
                    result.put.SetInParent()
                    if endpoint in fake.not_here:
                        result.put.header.code = UNASSIGNED  # type: ignore[assignment]
                        result.retryable = True
                return FakeCall(response, 0.001)

        return Stub()


def put(pkey: bytes) -> kv_rpc_pb2.PutRequest:
    request = kv_rpc_pb2.PutRequest(key=b"k", value=b"v")
    request.header.stream_id, request.header.r_key = TABLE, pkey
    return request


async def test_a_routed_call_retries_at_the_new_owner() -> None:
    meta, containers = FakeMeta(), FakeContainers(dict(TWO_SERVERS))
    cache = make_cache(meta, containers)
    stubs = FakeTableStubs()
    stubs.not_here.add("a:1")
    pkey = pkey_on(0)
    await cache.locate(TABLE, pkey)
    containers.owners[0] = "b:2"  # moved; the cache still says a:1
    method = RoutedMethod(cache, stubs.for_endpoint, "Put", TABLE, pkey)
    response = await call(
        method, put(pkey), metadata=(), idempotent=False, policy=POLICY, status_of=lambda r: 0
    )
    assert response == kv_rpc_pb2.PutResponse()
    assert [(e, m) for e, m, _ in stubs.sent] == [("a:1", "Put"), ("b:2", "Put")]
    assert cache.stats.invalidations == 1


async def test_the_coalescer_batches_per_owner_and_follows_a_moved_container() -> None:
    meta, containers = FakeMeta(), FakeContainers(dict(TWO_SERVERS))
    cache = make_cache(meta, containers)
    stubs = FakeTableStubs()
    both: Callable[[str | None], tuple[Any, Any]] = lambda e: (  # noqa: E731
        stubs.for_endpoint(e),
        stubs.for_endpoint(e),
    )
    coalescer = Coalescer(both, cache, POLICY)
    router = RangeRouter(RANGES)
    pkeys = [f"p{i}".encode() for i in range(60)]

    async def put_all() -> None:
        await asyncio.gather(*(coalescer.call("put", put(p), (), idempotent=False) for p in pkeys))

    await put_all()
    for endpoint, _, sent in stubs.sent:
        assert {TWO_SERVERS[router.route(p).container_id] for p in sent} == {endpoint}
    assert sorted(p for _, _, sent in stubs.sent for p in sent) == sorted(pkeys)

    # Containers 0 and 1 move from a:1 to b:2; a:1 answers "not served here".
    stubs.sent.clear()
    stubs.not_here.add("a:1")
    containers.owners.update({0: "b:2", 1: "b:2"})
    await put_all()
    delivered = [p for endpoint, _, sent in stubs.sent if endpoint == "b:2" for p in sent]
    assert sorted(delivered) == sorted(pkeys)  # every op applied once, at the owner
    assert cache.stats.invalidations == 2  # containers 0 and 1, once each
    await coalescer.close()
