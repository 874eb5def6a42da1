"""Who is calling: every RPC is authenticated before its servicer runs.

The role of a call is, in this order:
1. the subject of the bearer token in its `authorization: Bearer <JWT>` metadata (a token that
   does not verify is refused, even if a certificate or the anonymous role could have served);
   on the etcd port also a bare JWT in `token` metadata, where etcd's clients put the token
   its `Authenticate` gave them;
2. the common name of its verified client certificate (mTLS);
3. the anonymous role (`--anonymous-role`), for clients that cannot send tokens (the BookKeeper
   clients); its permissions are granted like any role's.
Otherwise the call fails with UNAUTHENTICATED. Health checks need no credentials, nor does
etcd's `Authenticate` (it is how a client gets credentials).

Then, with permissions on (`security.access`), the call's permissions are checked against the
one table of what each RPC needs. Servicers read the call's role from `current_role()`.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tablekeeper_server.errors import (
    NamespaceNotFoundError,
    RouteNotFoundError,
    StreamNotFoundError,
    UnavailableError,
)
from tablekeeper_server.security.access import AccessControl, PermissionDeniedError
from tablekeeper_server.security.tokens import SERVER_ROLE, TokenError, TokenVerifier

log = logging.getLogger(__name__)

AUTHORIZATION_KEY = "authorization"
UNAUTHENTICATED_METHODS_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
UNAUTHENTICATED_METHODS = frozenset({"/etcdserverpb.Auth/Authenticate"})
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
    superuser_roles: tuple[str, ...] = ()
    """Roles allowed everything (`--superuser-roles`; a server's own role is one too)."""
    raw_token_key: str | None = None
    """Metadata key that may carry a bare token (etcd's clients send `token: <JWT>`)."""
    invalid_token_message: str | None = None
    """What to answer for a token that does not verify, instead of why (etcd's clients fetch a
    new token only when told exactly `etcdserver: invalid auth token`); the reason is logged."""

    def is_superuser(self, role: str | None) -> bool:
        return role == SERVER_ROLE or role in self.superuser_roles

    def role_of(self, metadata: dict[str, Any], auth_context: dict[str, list[bytes]]) -> str:
        header = metadata.get(AUTHORIZATION_KEY)
        if header is None and self.raw_token_key is not None:
            raw = metadata.get(self.raw_token_key)
            if raw is not None:
                return self._verified_role(
                    raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
                )
        if header is not None:
            if isinstance(header, bytes):
                header = header.decode("ascii", "replace")
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise AuthenticationError(
                    "the authorization metadata must be 'Bearer <token>'", "malformed"
                )
            return self._verified_role(token)
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

    def _verified_role(self, token: str) -> str:
        if self.verifier is None:
            raise AuthenticationError(
                self.invalid_token_message
                or "this server does not accept tokens (no --auth-secret-key or "
                "--auth-public-key); use a client certificate",
                "tokens_off",
            )
        try:
            return self.verifier.role_of(token.strip())
        except TokenError as exc:
            reason = "expired" if "expired" in str(exc) else "invalid_token"
            if self.invalid_token_message is not None:
                log.info("token refused (%s): %s", reason, exc)
                raise AuthenticationError(self.invalid_token_message, reason) from None
            raise AuthenticationError(str(exc), reason) from None


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call (but health checks) before its handler runs, and with `access`
    checks its permissions (PERMISSION_DENIED naming what is missing)."""

    def __init__(
        self,
        authenticator: Authenticator,
        on_failure: Callable[[str], None] = lambda r: None,
        access: AccessControl | None = None,
        *,
        unavailable_code: grpc.StatusCode = grpc.StatusCode.NOT_FOUND,
    ) -> None:
        """`unavailable_code`: the answer when permissions cannot be checked right now (the
        root range is not open); NOT_FOUND is what BookKeeper clients retry."""
        self._authenticator = authenticator
        self._on_failure = on_failure
        self._access = access
        self._unavailable_code = unavailable_code
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, Any]] = {}

    @property
    def authenticator(self) -> Authenticator:
        return self._authenticator

    def with_access(
        self,
        authenticator: Authenticator,
        access: AccessControl,
        *,
        unavailable_code: grpc.StatusCode = grpc.StatusCode.NOT_FOUND,
    ) -> AuthInterceptor:
        """The same interceptor (failures counted alike), authenticating with `authenticator`
        and checking permissions with `access`: how a front-end adapts the one it is given."""
        return AuthInterceptor(
            authenticator, self._on_failure, access, unavailable_code=unavailable_code
        )

    def count_failure(self, reason: str) -> None:
        """Count a refused authentication that happened outside the interceptor (a wrong
        password in etcd's Authenticate)."""
        self._on_failure(reason)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: Any,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if (
            handler is None
            or method in UNAUTHENTICATED_METHODS
            or method.startswith(UNAUTHENTICATED_METHODS_PREFIXES)
        ):
            return handler
        cached = self._wrapped.get(method)  # wrapped once per method, not per call
        if cached is None or cached[0] is not handler:
            cached = (handler, _wrap(handler, method, self._authenticate, self._authorize))
            self._wrapped[method] = cached
        return cached[1]

    async def _authenticate(self, method: str, context: Any) -> str:
        metadata = dict(context.invocation_metadata() or ())
        try:
            return self._authenticator.role_of(metadata, context.auth_context() or {})
        except AuthenticationError as exc:
            self._on_failure(exc.reason)
            log.warning("refused %s from %s: %s", method, context.peer(), exc)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise AssertionError("unreachable: abort raises") from None

    async def _authorize(self, role: str, method: str, request: Any, context: Any) -> None:
        if self._access is None:
            return
        try:
            await self._access.check(role, method, request)
        except PermissionDeniedError as exc:
            log.info("denied %s to %s: %s", method, role, exc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except (NamespaceNotFoundError, StreamNotFoundError):
            pass  # the servicer answers "not found" as it always does
        except (RouteNotFoundError, UnavailableError) as exc:
            # The root range is not reachable right now: retryable, as BookKeeper clients expect.
            await context.abort(self._unavailable_code, f"cannot check permissions: {exc}")


Authenticate = Callable[[str, Any], Awaitable[str]]
Authorize = Callable[[str, str, Any, Any], Awaitable[None]]


def _wrap(
    handler: grpc.RpcMethodHandler, method: str, authenticate: Authenticate, authorize: Authorize
) -> Any:
    """The same handler, with `authenticate` and `authorize` run first and the role set for the
    servicer. A streaming request is authorized message by message."""

    async def _authorized(requests: Any, role: str, context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            await authorize(role, method, request, context)
            yield request

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            role = await authenticate(method, context)
            await authorize(role, method, request, context)
            token = _ROLE.set(role)
            try:
                return await inner_uu(request, context)
            finally:
                _ROLE.reset(token)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **serializers)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            role = await authenticate(method, context)
            await authorize(role, method, request, context)
            _ROLE.set(role)  # the stream's own context
            async for response in inner_us(request, context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream, **serializers)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            role = await authenticate(method, context)
            _ROLE.set(role)
            return await inner_su(_authorized(requests, role, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **serializers)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        role = await authenticate(method, context)
        _ROLE.set(role)
        async for response in inner_ss(_authorized(requests, role, context), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(stream_stream, **serializers)
