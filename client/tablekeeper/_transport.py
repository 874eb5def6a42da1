"""Channels, the error-wrapping call helper, and the retry loop.

Retry rules (`errors.should_resend`, by the error tables): a call is retried only when that is
safe. Reads may be retried after any transient failure. A write is retried only when it
certainly was not applied: the server answered gRPC NOT_FOUND ("this range is not served here /
not ready / shutting down", sent before anything is appended), or the connection could not be
established at all.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from tablekeeper.errors import (
    ERROR_METADATA_KEY,
    DeadlineExceededError,
    TableKeeperError,
    WriteTimeoutError,
    error_for_code,
    error_for_rpc_error,
    should_resend,
)

T = TypeVar("T")
DEFAULT_PORT = 4181


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    deadline_s: float = 30.0
    """Give up retrying after this long (the call's own timeout is `call_timeout_s`)."""
    initial_backoff_s: float = 0.02
    max_backoff_s: float = 1.0
    call_timeout_s: float = 30.0


def parse_service_uri(uri: str) -> str:
    """`bk://host:port[,host:port…]` (or plain `host:port`) to a gRPC target.

    One host is passed to gRPC as it is (its DNS resolver handles names). Several hosts become a
    static address list, which gRPC accepts only as IP addresses (`ipv4:`/`ipv6:`), so host
    names are resolved here, once; an IPv4 address is preferred where a name has both.
    """
    target = uri.split("://", 1)[1] if "://" in uri else uri
    if "://" in uri and not uri.startswith("bk://"):
        raise ValueError(f"service URI must start with bk:// (got {uri!r})")
    hosts = [
        _split_host_port(part.strip(), uri) for part in target.strip("/").split(",") if part.strip()
    ]
    if not hosts:
        raise ValueError(f"service URI has no host: {uri!r}")
    if len(hosts) == 1:
        host, port = hosts[0]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    addresses = [(_resolve(host, port), port) for host, port in hosts]
    if all(":" not in address for address, _ in addresses):
        return "ipv4:" + ",".join(f"{address}:{port}" for address, port in addresses)
    # Some host is IPv6 only: list every address as IPv6 (IPv4 ones mapped).
    return "ipv6:" + ",".join(
        f"[{address if ':' in address else '::ffff:' + address}]:{port}"
        for address, port in addresses
    )


def _split_host_port(part: str, uri: str) -> tuple[str, int]:
    if part.startswith("["):  # [v6-address]:port or [v6-address]
        host, bracket, rest = part[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"bad [address]:port {part!r} in service URI {uri!r}")
        port_text = rest.removeprefix(":") or str(DEFAULT_PORT)
    elif part.count(":") == 1:
        host, _, port_text = part.partition(":")
    elif ":" in part:  # a bare IPv6 address
        host, port_text = part, str(DEFAULT_PORT)
    else:
        host, port_text = part, str(DEFAULT_PORT)
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad host:port {part!r} in service URI {uri!r}")
    return host, int(port_text)


def _resolve(host: str, port: int) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ValueError(f"cannot resolve host {host!r} of the service URI: {exc}") from exc
    for family in (socket.AF_INET, socket.AF_INET6):
        for info in infos:
            if info[0] == family:
                return str(info[4][0])
    raise ValueError(f"host {host!r} of the service URI has no IP address")


def new_channel(
    target: str,
    max_message_bytes: int,
    extra_options: Sequence[tuple[str, Any]] = (),
    *,
    credentials: grpc.ChannelCredentials | None = None,
    interceptors: Sequence[Any] = (),
) -> grpc.aio.Channel:
    """A channel to `target`: TLS with `credentials`, plaintext without."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # BookKeeper clients send the whole key as routing metadata; keys go up to 64 KiB.
        ("grpc.max_metadata_size", 256 * 1024),
        ("grpc.lb_policy_name", "round_robin"),
        *extra_options,
    ]
    if credentials is not None:
        return grpc.aio.secure_channel(
            target, credentials, options=options, interceptors=list(interceptors) or None
        )
    return grpc.aio.insecure_channel(
        target, options=options, interceptors=list(interceptors) or None
    )


def retryable_rpc_error(error: grpc.aio.AioRpcError, idempotent: bool) -> bool:
    """Whether a failed call may be sent again: NOT_FOUND means "not served here, nothing
    applied"; a failure to connect means it never left; other transient errors only for reads."""
    return should_resend(error_for_rpc_error(error, idempotent=idempotent), idempotent)


async def call(
    method: Callable[..., Any],
    request: Any,
    *,
    metadata: Sequence[tuple[str, bytes | str]] | None,
    idempotent: bool,
    policy: RetryPolicy,
    status_of: Callable[[Any], int],
) -> Any:
    """Call a unary method; raise the mapped exception for a non-zero body status.

    Retries as the module docstring says, with jittered exponential backoff, until
    `policy.deadline_s` has passed.
    """
    deadline = time.monotonic() + policy.deadline_s
    backoff = policy.initial_backoff_s
    while True:
        try:
            rpc = method(request, metadata=metadata, timeout=policy.call_timeout_s)
            response = await rpc
        except grpc.aio.AioRpcError as error:
            failed = error_for_rpc_error(error, idempotent=idempotent)
            if not should_resend(failed, idempotent) or time.monotonic() >= deadline:
                raise failed from error
        else:
            code = status_of(response)
            if code == 0:
                return response
            exc = error_for_code(code, await trailer_message(rpc))
            if not should_resend(exc, idempotent) or time.monotonic() >= deadline:
                raise exc
        await asyncio.sleep(random.uniform(0, backoff))
        backoff = min(policy.max_backoff_s, backoff * 2)


def check_timeout(timeout: float | None) -> None:
    """Refuse a `timeout=` that is not None or a positive number of seconds."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None (got {timeout!r})")


async def within(awaitable: Awaitable[T], timeout: float | None, *, what: str, write: bool) -> T:
    """Await `awaitable` (a whole call: its retries, route lookups and backoff included) for at
    most `timeout` seconds (None: no bound beyond the retry policy's). When it passes, the call
    is cancelled and `DeadlineExceededError` raised, or for a `write` `WriteTimeoutError`
    (it may have been applied)."""
    if timeout is None:
        return await awaitable
    try:
        check_timeout(timeout)
    except ValueError:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started: no "never awaited" warning
        raise
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await awaitable
    except TimeoutError as exc:
        if not scope.expired():
            raise  # a TimeoutError of the call's own
        if write:
            raise WriteTimeoutError(
                f"{what}: timeout={timeout:g}s passed before the server answered; the write "
                "may or may not have been applied"
            ) from exc
        raise DeadlineExceededError(
            f"{what}: timeout={timeout:g}s passed before the call succeeded"
        ) from exc


async def trailer_message(rpc: Any) -> str:
    """The server's `tk-error` reason for a failed call, or "" ."""
    try:
        trailers = await rpc.trailing_metadata()
    except Exception:
        return ""
    for key, value in trailers or ():
        if key == ERROR_METADATA_KEY:
            return str(value)
    return ""


__all__ = [
    "RetryPolicy",
    "TableKeeperError",
    "call",
    "check_timeout",
    "new_channel",
    "parse_service_uri",
    "within",
]
