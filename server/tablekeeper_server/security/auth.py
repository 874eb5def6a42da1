"""Who is calling: every RPC is authenticated before its servicer runs.

The role of a call is, in this order:
1. the subject of the bearer token in its `authorization: Bearer <JWT>` metadata (a token that
   does not verify is refused, even if a certificate or the anonymous role could have served);
2. the common name of its verified client certificate (mTLS);
3. the anonymous role (`--anonymous-role`), for clients that cannot send tokens (the BookKeeper
   clients); its permissions are granted like any role's.
Otherwise the call fails with UNAUTHENTICATED. Health checks need no credentials.

Servicers read the role of the call they serve from `current_role()`.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tablekeeper_server.security.tokens import TokenError, TokenVerifier

log = logging.getLogger(__name__)

AUTHORIZATION_KEY = "authorization"
UNAUTHENTICATED_METHODS_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_ROLE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tablekeeper_role", default=None)


def current_role() -> str | None:
    """The authenticated role of the call being served (None when authentication is off)."""
    return _ROLE.get()


class AuthenticationError(Exception):
    """Why a call is refused; `reason` is a short label for metrics."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Authenticator:
    verifier: TokenVerifier | None
    certificate_roles: bool
    """mTLS is on: a verified client certificate's common name is a role."""
    anonymous_role: str | None = None

    def role_of(self, metadata: dict[str, Any], auth_context: dict[str, list[bytes]]) -> str:
        header = metadata.get(AUTHORIZATION_KEY)
        if header is not None:
            if isinstance(header, bytes):
                header = header.decode("ascii", "replace")
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationError(
                    "the authorization metadata must be 'Bearer <token>'", "malformed"
                )
            if self.verifier is None:
                raise AuthenticationError(
                    "this server does not accept tokens (no --auth-secret-key or "
                    "--auth-public-key); use a client certificate",
                    "tokens_off",
                )
            try:
                return self.verifier.role_of(token.strip())
            except TokenError as exc:
                reason = "expired" if "expired" in str(exc) else "invalid_token"
                raise AuthenticationError(str(exc), reason) from None
        if self.certificate_roles:
            names = auth_context.get("x509_common_name") or []
            if names:
                return names[0].decode("utf-8", "replace")
        if self.anonymous_role is not None:
            return self.anonymous_role
        raise AuthenticationError(
            "no credentials: send 'authorization: Bearer <token>' metadata"
            + (" or a client certificate" if self.certificate_roles else ""),
            "anonymous",
        )


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call (but health checks) before its handler runs."""

    def __init__(
        self, authenticator: Authenticator, on_failure: Callable[[str], None] = lambda r: None
    ) -> None:
        self._authenticator = authenticator
        self._on_failure = on_failure

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(UNAUTHENTICATED_METHODS_PREFIXES):
            return handler
        return _wrap(handler, method, self._authenticate)

    async def _authenticate(self, method: str, context: Any) -> str:
        metadata = dict(context.invocation_metadata() or ())
        try:
            return self._authenticator.role_of(metadata, context.auth_context() or {})
        except AuthenticationError as exc:
            self._on_failure(exc.reason)
            log.warning("refused %s from %s: %s", method, context.peer(), exc)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise AssertionError("unreachable: abort raises") from None


Authenticate = Callable[[str, Any], Awaitable[str]]


def _wrap(handler: grpc.RpcMethodHandler, method: str, authenticate: Authenticate) -> Any:
    """The same handler, with `authenticate` run first and its role set for the servicer."""
    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            token = _ROLE.set(await authenticate(method, context))
            try:
                return await inner_uu(request, context)
            finally:
                _ROLE.reset(token)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **serializers)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            _ROLE.set(await authenticate(method, context))  # the stream's own context
            async for response in inner_us(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **serializers)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            _ROLE.set(await authenticate(method, context))
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **serializers)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        _ROLE.set(await authenticate(method, context))
        async for response in inner_ss(requests, context):
            yield response

    return grpc.stream_stream_rpc_method_handler(stream_stream, **serializers)
