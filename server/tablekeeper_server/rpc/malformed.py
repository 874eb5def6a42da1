"""Requests that are not valid protobuf for their method: answered INVALID_ARGUMENT, with one
warning line in the log, before any interceptor or servicer sees them
(`MalformedRequestInterceptor`, the main port's first interceptor)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc

log = logging.getLogger(__name__)
Context: TypeAlias = Any  # grpc.aio.ServicerContext (grpc ships no type stubs)


class _Malformed:
    """What a request that does not parse as its method's message becomes (instead of an
    exception inside gRPC, which answers UNKNOWN and logs a traceback per request)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    parse = deserializer

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as exc:  # DecodeError, or whatever a deserializer raises
            return _Malformed(f"{type(exc).__name__}: {exc}")

    return deserialize


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Answers a request (or a message of a request stream) that is not valid protobuf for its
    method with INVALID_ARGUMENT and one warning line in the log, before any other interceptor
    or the servicer sees it. Must be the first (outermost) interceptor."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method: str = handler_call_details.method
        # Wrapped once per method, not per call: each call's wrapping (and gRPC inspecting the
        # new functions) cost CPU on the per-call path.
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = (handler, _checked_handler(handler, method))
            self._wrapped[method] = cached
        return cached[1]


async def _refuse(method: str, malformed: _Malformed, context: Context) -> None:
    log.warning(
        "refused %s from %s: malformed request (%s)", method, context.peer(), malformed.reason
    )
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"malformed request: not a valid message for {method} ({malformed.reason})"[:1024],
    )


def _checked_handler(handler: grpc.RpcMethodHandler, method: str) -> Any:
    serializers = {
        "request_deserializer": _tolerant(handler.request_deserializer),
        "response_serializer": handler.response_serializer,
    }

    async def checked(requests: Any, context: Context) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, _Malformed):
                await _refuse(method, request, context)
            yield request

    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Context) -> Any:
            if isinstance(request, _Malformed):
                await _refuse(method, request, context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **serializers)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, _Malformed):
                await _refuse(method, request, context)
            async for response in inner_us(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **serializers)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Context) -> Any:
            return await inner_su(checked(requests, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **serializers)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
        async for response in inner_ss(checked(requests, context), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(stream_stream, **serializers)
