"""Request metrics for every front-end: each unary call of a front-end's port is counted and
timed in the server's `tablekeeper_requests` and `tablekeeper_request_seconds`, as the
BookKeeper services' calls are (`rpc.status.serve`).

A front-end's method is labelled by its full gRPC name (`etcdserverpb.KV/Put`,
`io.streamnative.oxia.proto.OxiaClient/Write`), so it never mixes with the BookKeeper
services' short names; its code label is 0 for an answered call and minus the gRPC status
number for one that ended with an error status (-3 INVALID_ARGUMENT, -14 UNAVAILABLE, ...).
Streaming calls are not counted here (the BookKeeper path does not count them either).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from tablekeeper_server.core.clock import Clock


class RequestObserver(Protocol):
    def observe_request(self, method: str, code: int, seconds: float) -> None: ...


class RequestMetrics(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A gRPC server interceptor (grpc.aio's and `rpc.asgi`'s) that records each unary call of
    the port it is on. Put it last, so that it times the servicer only, as on the BookKeeper
    path."""

    def __init__(self, metrics: RequestObserver, clock: Clock) -> None:
        self._metrics = metrics
        self._clock = clock
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method: str = handler_call_details.method
        cached = self._wrapped.get(method)  # wrapped once per method, not per call
        if cached is None or cached[0] is not handler:
            cached = (handler, self._wrap(handler, method.lstrip("/")))
            self._wrapped[method] = cached
        return cached[1]

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary
        observe, clock = self._metrics.observe_request, self._clock

        async def unary_unary(request: Any, context: Any) -> Any:
            started = clock.monotonic_s()
            code = 0
            try:
                return await inner(request, context)
            except BaseException:
                code = call_code(context, failed=True)
                raise
            finally:
                observe(method, code, clock.monotonic_s() - started)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def call_code(context: Any, *, failed: bool) -> int:
    """The metrics' code of a call that ended: minus its gRPC status number (the status the
    servicer aborted with; UNKNOWN for an exception without one), 0 if it was answered."""
    status = getattr(context, "code", None)  # grpc.aio: a method; rpc.asgi: an attribute
    if callable(status):
        status = status()
    if not isinstance(status, grpc.StatusCode) or status == grpc.StatusCode.OK:
        status = grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK
    number: int = status.value[0]
    return -number
