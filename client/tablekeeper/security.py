"""TLS and bearer tokens on the client side.

`TlsConfig(ca=…, cert=…, key=…)` makes every channel a TLS channel (`cert`/`key` when the server
wants a client certificate); `token` is sent as `authorization: Bearer <token>` on every call.
A token may be a callable, asked before each call, so it can be refreshed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

Token = str | Callable[[], str]


@dataclass(frozen=True)
class TlsConfig:
    """TLS for the client: the CA to trust, and a certificate and key for mutual TLS."""

    ca: str | Path | bytes | None = None
    """PEM CA bundle that signed the server's certificate (None: the system's roots)."""
    cert: str | Path | bytes | None = None
    """PEM client certificate chain, for servers that require one (mTLS)."""
    key: str | Path | bytes | None = None
    """PEM private key of `cert`."""

    def credentials(self) -> grpc.ChannelCredentials:
        """These settings as gRPC channel credentials."""
        if (self.cert is None) != (self.key is None):
            raise ValueError("TlsConfig: cert and key go together")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca),
            private_key=_pem(self.key),
            certificate_chain=_pem(self.cert),
        )


def _pem(value: str | Path | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


def token_interceptors(token: Token) -> list[Any]:
    """Client interceptors adding the token to every call (unary and streaming)."""
    get = token if callable(token) else (lambda: token)
    return [
        _TokenUnaryUnary(get),
        _TokenUnaryStream(get),
        _TokenStreamUnary(get),
        _TokenStreamStream(get),
    ]


class _WithToken:
    def __init__(self, token: Callable[[], str]) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        metadata = list(details.metadata or ())
        metadata.append(("authorization", f"Bearer {self._token()}"))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _TokenUnaryUnary(_WithToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _TokenUnaryStream(_WithToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _TokenStreamUnary(_WithToken, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(details), request_iterator)


class _TokenStreamStream(_WithToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(details), request_iterator)
