"""The request limits every front-end applies, from the server's one `Limits` (`--max-key-bytes`,
`--max-value-bytes`): a key, a value and a whole request are bounded by the same numbers whichever
protocol carries them; each front-end answers an oversized request in its own protocol's terms.

- BookKeeper's table service: a key over `key_bytes_max` is INVALID_KEY, a value over
  `value_bytes_max` BAD_REQUEST (`range.validation`); a message over `request_bytes_max` is cut
  off by gRPC (RESOURCE_EXHAUSTED), as its Java client expects of the service.
- etcd: a put's key or value over its limit, or a request over `request_bytes_max`, is
  INVALID_ARGUMENT "etcdserver: request is too large". etcd has no key limit of its own: its one
  bound is the size of the whole proposal (`--max-request-bytes`, 1.5 MiB by default), checked
  before anything is proposed, with its gRPC receive limit set above it so that the client gets
  that error rather than a transport one; a key here is part of such a request.
- Oxia: a key over `key_bytes_max` is INVALID_ARGUMENT, a value over `value_bytes_max` or a
  request over `request_bytes_max` RESOURCE_EXHAUSTED ("oxia: ..."): Oxia bounds a request only
  by its gRPC frame (RESOURCE_EXHAUSTED), and its clients fail the writes of that request.
- ZooKeeper: its own `jute.maxbuffer` (`--zookeeper-max-packet-bytes`) bounds a packet, the
  protocol's setting; `packet_refusal` says whether it fits under these limits too.

Each check returns the reason to give (the limit and its flag named), or None when it fits, and
raises nothing: the caller picks its protocol's error."""

from __future__ import annotations

from tablekeeper_server.range.limits import Limits

_MIB = 1024 * 1024
REQUEST_OVERHEAD_BYTES = _MIB
"""What a request may carry besides one key, its routing key and one value (a txn's other ops,
compares, headers)."""
GRPC_OVERHEAD_BYTES = 512 * 1024
"""How far a port's gRPC receive limit sits above `request_bytes_max` (etcd's margin), so that a
request just over the limit reaches the front-end and gets its protocol's own answer."""


def request_bytes_max(limits: Limits) -> int:
    """The largest request a front-end takes: one key and its routing key at `key_bytes_max`,
    one value at `value_bytes_max`, and `REQUEST_OVERHEAD_BYTES` for the rest."""
    return limits.value_bytes_max + 2 * limits.key_bytes_max + REQUEST_OVERHEAD_BYTES


def message_bytes_max(limits: Limits) -> int:
    """The gRPC receive limit of a front-end port that checks `request_bytes_max` itself (etcd's,
    Oxia's) and of the calls it passes to other servers."""
    return request_bytes_max(limits) + GRPC_OVERHEAD_BYTES


def key_refusal(key_bytes: int, limits: Limits) -> str | None:
    """Why a key of `key_bytes` bytes is refused, or None."""
    if key_bytes > limits.key_bytes_max:
        return f"key is {key_bytes} bytes; the limit is {limits.key_bytes_max} (--max-key-bytes)"
    return None


def value_refusal(value_bytes: int, limits: Limits) -> str | None:
    """Why a value of `value_bytes` bytes is refused, or None."""
    if value_bytes > limits.value_bytes_max:
        return (
            f"value is {value_bytes} bytes; the limit is {limits.value_bytes_max} "
            "(--max-value-bytes)"
        )
    return None


def request_refusal(request_bytes: int, limits: Limits) -> str | None:
    """Why a request of `request_bytes` bytes (serialized) is refused, or None."""
    bound = request_bytes_max(limits)
    if request_bytes > bound:
        return (
            f"request is {request_bytes} bytes; the limit is {bound} (--max-value-bytes plus "
            "twice --max-key-bytes plus 1 MiB)"
        )
    return None


def packet_refusal(packet_bytes_max: int, limits: Limits) -> str | None:
    """Why a packet bound of `packet_bytes_max` (ZooKeeper's jute.maxbuffer) does not fit under
    `request_bytes_max`, or None. Advisory: the packet bound is the protocol's own setting."""
    bound = request_bytes_max(limits)
    if packet_bytes_max > bound:
        return (
            f"a packet of up to {packet_bytes_max} bytes may carry more than a request of "
            f"the other front-ends ({bound} bytes)"
        )
    return None
