"""etcd's errors, with the gRPC codes and messages etcd's clients recognise (they match on the
message text to rebuild typed errors), in one table."""

from __future__ import annotations

import grpc

from tablekeeper_server.errors import TableKeeperError, class_rule

# name -> (gRPC code, message). The names travel in `ApplyResult.error` (see etcd.apply).
ERRORS: dict[str, tuple[grpc.StatusCode, str]] = {
    "empty_key": (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided"),
    "key_not_found": (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key not found"),
    "value_provided": (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: value is provided"),
    "lease_provided": (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: lease is provided"),
    "too_many_ops": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: too many operations in txn request",
    ),
    "duplicate_key": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: duplicate key given in txn request",
    ),
    "compacted": (
        grpc.StatusCode.OUT_OF_RANGE,
        "etcdserver: mvcc: required revision has been compacted",
    ),
    "future_rev": (
        grpc.StatusCode.OUT_OF_RANGE,
        "etcdserver: mvcc: required revision is a future revision",
    ),
    "lease_not_found": (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found"),
    "lease_exists": (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: lease already exists"),
    "lease_ttl_too_large": (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: too large lease TTL"),
    "request_too_large": (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large"),
    "stopped": (grpc.StatusCode.UNAVAILABLE, "etcdserver: server stopped"),
    # Cluster mode: no server to pass the call to (nothing was sent), or it went away mid-call.
    "no_leader": (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader"),
    "leader_changed": (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed"),
    "timeout": (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out"),
    "user_empty": (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty"),
    "user_exists": (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name already exists"),
    "user_not_found": (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name not found"),
    "auth_failed": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "etcdserver: authentication failed, invalid user ID or password",
    ),
    "auth_not_enabled": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "etcdserver: authentication is not enabled",
    ),
    "invalid_auth_token": (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token"),
}

# etcd's watch cancel reason for a start revision older than the history.
COMPACTED_REASON = "mvcc: required revision has been compacted"


class EtcdError(Exception):
    """An error etcd itself would answer; `name` is a key of `ERRORS` (or a custom message with
    `code`)."""

    def __init__(
        self, name: str, *, code: grpc.StatusCode | None = None, message: str = ""
    ) -> None:
        known = ERRORS.get(name)
        self.name = name
        self.code = code or (known[0] if known else grpc.StatusCode.UNKNOWN)
        self.message = message or (known[1] if known else name)
        super().__init__(self.message)


def from_tablekeeper(exc: TableKeeperError) -> EtcdError:
    """TableKeeper's errors in etcd's terms: the etcd column of the one error table
    (`errors.ERROR_TABLE`, `WireRule.etcd`), by the error's class."""
    answer = class_rule(type(exc)).etcd
    return EtcdError(answer.name, code=grpc.StatusCode[answer.grpc], message=answer.text(exc))
