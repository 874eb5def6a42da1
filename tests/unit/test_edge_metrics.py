"""Every front-end's calls are counted and timed (`edge.metrics.RequestMetrics`): an answered
call as 0, one that ended with an error status as minus its number, under the method's full
gRPC name."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.edge.metrics import RequestMetrics

pytestmark = pytest.mark.unit


class Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float]] = []

    def observe_request(self, method: str, code: int, seconds: float) -> None:
        self.calls.append((method, code, seconds))


class Details:
    method = "/etcdserverpb.KV/Put"


class AbortError(Exception):
    pass


class AsgiLikeContext:
    """As `rpc.asgi.Context`: `code` is an attribute that `abort` sets."""

    code = grpc.StatusCode.OK

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise AbortError(details)


class AioLikeContext:
    """As grpc.aio's context: `code()` is a method."""

    def __init__(self) -> None:
        self._code: grpc.StatusCode | None = None

    def code(self) -> grpc.StatusCode | None:
        return self._code

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        raise AbortError(details)


async def _intercepted(metrics: Recorded, clock: ManualClock, behave: Any) -> grpc.RpcMethodHandler:
    async def put(request: bytes, context: Any) -> bytes:
        clock.advance(0.25)  # the servicer's own time
        answer: bytes = await behave(request, context)
        return answer

    handler = grpc.unary_unary_rpc_method_handler(put)

    async def continuation(details: Any) -> grpc.RpcMethodHandler:
        return handler

    wrapped = await RequestMetrics(metrics, clock).intercept_service(continuation, Details())
    assert wrapped is not None
    return wrapped


@pytest.mark.parametrize("context_type", [AsgiLikeContext, AioLikeContext])
async def test_answered_and_refused_calls_are_recorded(context_type: Any) -> None:
    metrics, clock = Recorded(), ManualClock()

    async def ok(request: bytes, context: Any) -> bytes:
        return request

    async def refused(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no")
        return b""

    async def broken(request: bytes, context: Any) -> bytes:
        raise RuntimeError("a defect")

    answered = await _intercepted(metrics, clock, ok)
    assert await answered.unary_unary(b"x", context_type()) == b"x"
    with pytest.raises(AbortError):
        await (await _intercepted(metrics, clock, refused)).unary_unary(b"x", context_type())
    with pytest.raises(RuntimeError):
        await (await _intercepted(metrics, clock, broken)).unary_unary(b"x", context_type())
    assert metrics.calls == [
        ("etcdserverpb.KV/Put", 0, 0.25),
        ("etcdserverpb.KV/Put", -3, 0.25),  # INVALID_ARGUMENT
        ("etcdserverpb.KV/Put", -2, 0.25),  # UNKNOWN: no status was set
    ]


async def test_streaming_calls_pass_untouched() -> None:
    async def stream(request: bytes, context: Any) -> Any:
        yield request

    handler = grpc.unary_stream_rpc_method_handler(stream)

    async def continuation(details: Any) -> grpc.RpcMethodHandler:
        return handler

    interceptor = RequestMetrics(Recorded(), ManualClock())
    assert await interceptor.intercept_service(continuation, Details()) is handler
