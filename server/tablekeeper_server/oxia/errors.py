"""Oxia's errors as its clients expect them: a gRPC status code and Oxia's message.

The Java client 0.6.x recognises a missing namespace by gRPC UNKNOWN with the description
"oxia: namespace not found" (what Oxia servers of that time sent) and fails fast; everything
else it treats by the status code (UNAVAILABLE and friends are retried by reconnecting).
TableKeeper's own errors map in the Oxia column of the one error table (`errors.ERROR_TABLE`).
"""

from __future__ import annotations

import grpc

from tablekeeper_server.errors import TableKeeperError, class_rule


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
    """The Oxia status of a TableKeeper error: the Oxia column of the one error table
    (`errors.ERROR_TABLE`, `WireRule.oxia`), by the error's class."""
    answer = class_rule(type(exc)).oxia
    return OxiaError(grpc.StatusCode[answer.grpc], answer.text(exc))
