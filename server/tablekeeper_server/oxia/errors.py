"""Oxia's errors as its clients expect them: a gRPC status code and Oxia's message.

The Java client 0.6.x recognises a missing namespace by gRPC UNKNOWN with the description
"oxia: namespace not found" (what Oxia servers of that time sent) and fails fast; everything
else it treats by the status code (UNAVAILABLE and friends are retried by reconnecting).
TableKeeper's own errors map here, once, for the whole front-end.
"""

from __future__ import annotations

import grpc

from tablekeeper_server.errors import (
    BadRequestError,
    CompactedError,
    CorruptionError,
    IndeterminateError,
    InvalidKeyError,
    NotServedHereError,
    ResourceLimitError,
    TableKeeperError,
    UnavailableError,
)


class OxiaError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @classmethod
    def namespace_not_found(cls) -> OxiaError:
        return cls(grpc.StatusCode.UNKNOWN, "oxia: namespace not found")

    @classmethod
    def shard_not_found(cls, shard_id: int) -> OxiaError:
        return cls(grpc.StatusCode.NOT_FOUND, f"oxia: shard not found ({shard_id})")

    @classmethod
    def session_not_found(cls) -> OxiaError:
        return cls(grpc.StatusCode.NOT_FOUND, "oxia: session not found")

    @classmethod
    def invalid_session_timeout(cls) -> OxiaError:
        return cls(grpc.StatusCode.INVALID_ARGUMENT, "oxia: invalid session timeout")

    @classmethod
    def unavailable(cls, why: str) -> OxiaError:
        return cls(grpc.StatusCode.UNAVAILABLE, f"oxia: resource unavailable: {why}")

    @classmethod
    def invalid(cls, why: str) -> OxiaError:
        return cls(grpc.StatusCode.INVALID_ARGUMENT, f"oxia: {why}")


def from_tablekeeper(exc: TableKeeperError) -> OxiaError:
    """The Oxia status of a TableKeeper error."""
    if isinstance(exc, NotServedHereError):
        return OxiaError(grpc.StatusCode.ABORTED, "oxia: node is not leader")
    if isinstance(exc, UnavailableError):
        return OxiaError(grpc.StatusCode.UNAVAILABLE, f"oxia: resource unavailable: {exc}")
    if isinstance(exc, (BadRequestError, InvalidKeyError)):
        return OxiaError(grpc.StatusCode.INVALID_ARGUMENT, f"oxia: {exc}")
    if isinstance(exc, ResourceLimitError):
        return OxiaError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"oxia: {exc}")
    if isinstance(exc, CompactedError):
        return OxiaError(grpc.StatusCode.OUT_OF_RANGE, f"oxia: {exc}")
    if isinstance(exc, (CorruptionError, IndeterminateError)):
        return OxiaError(grpc.StatusCode.INTERNAL, f"oxia: {exc}")
    return OxiaError(grpc.StatusCode.UNKNOWN, f"oxia: {exc}")
