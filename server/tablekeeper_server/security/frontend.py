"""Security of a protocol front-end's port (etcd, Oxia): the server's authentication, adapted to
the protocol, plus the per-namespace permissions of `security.access`.

A front-end is given the gRPC port's interceptors; `secure_front_end` swaps the authentication
interceptor among them for one that also checks permissions (the RULES of the front-end's
methods) against the root range: here (standalone: a grant or revoke applies to the next call, no
cache) or on its owner (cluster mode: decisions are cached for `cache_s`, like the gRPC port's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tablekeeper_server.security.access import AccessControl
from tablekeeper_server.security.auth import Authenticator, AuthInterceptor

NamespaceBits = Callable[[str, str], Awaitable[int]]
"""(role, namespace name) -> the role's permission bits there (0 if the namespace is missing).
May raise the catalog's 'not open yet' errors, which answer `unavailable_code`."""


@dataclass(frozen=True)
class FrontEndSecurity:
    interceptors: list[Any]
    """What the front-end's gRPC server runs."""
    authenticator: Authenticator | None
    """None: authentication is off on this server."""
    count_failure: Callable[[str], None]
    """Counts a refused authentication (tablekeeper_auth_failures_total{reason})."""
    access: AccessControl | None = None
    """The permission checks (None: authentication is off); `forget()` after a grant."""

    @property
    def auth_on(self) -> bool:
        return self.authenticator is not None

    def is_superuser(self, role: str | None) -> bool:
        return self.authenticator is not None and self.authenticator.is_superuser(role)


def _count_nothing(reason: str) -> None:
    return None


def secure_front_end(
    interceptors: Sequence[Any],
    namespace_bits: NamespaceBits,
    *,
    raw_token_key: str | None = None,
    invalid_token_message: str | None = None,
    unavailable_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
    cache_s: float = 0.0,
) -> FrontEndSecurity:
    """The front-end's interceptors: every `AuthInterceptor` in `interceptors` replaced by one
        that also accepts tokens in `raw_token_key` metadata, answers `invalid_token_message` for a
        token that does not verify, and checks permissions with `namespace_bits` (decisions cached
    for `cache_s`)."""

    async def lookup(role: str, namespace: str, stream_id: int) -> tuple[str, int]:
        return namespace, await namespace_bits(role, namespace)

    adapted: list[Any] = []
    authenticator: Authenticator | None = None
    count_failure: Callable[[str], None] = _count_nothing
    access: AccessControl | None = None
    for interceptor in interceptors:
        if isinstance(interceptor, AuthInterceptor):
            authenticator = dataclasses.replace(
                interceptor.authenticator,
                raw_token_key=raw_token_key,
                invalid_token_message=invalid_token_message,
            )
            access = AccessControl(lookup, authenticator.is_superuser, cache_s=cache_s)
            count_failure = interceptor.count_failure
            interceptor = interceptor.with_access(
                authenticator, access, unavailable_code=unavailable_code
            )
        adapted.append(interceptor)
    return FrontEndSecurity(adapted, authenticator, count_failure, access)
