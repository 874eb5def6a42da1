"""Reads served by a follower: how the SDK asks for one and what it keeps between them.

A follower read goes to the server the client was given (its service URI), not to the range's
owner: like an etcd member answering a serializable read, that server answers from its own
follower of the range (or from the range itself when it owns it). The request says how stale
the answer may be and the highest log position this client has seen of each of the table's
ranges, so its reads never go backwards even when they reach another server; the answer's
trailing metadata says who served it, and how fresh it is (`ReadInfo`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tablekeeper._context import ClientContext
from tablekeeper.types import ReadInfo
from tablekeeper_proto.bookkeeper import kv_rpc_pb2, kv_rpc_pb2_grpc

READ_FROM_KEY = "tk-read-from"
MAX_STALENESS_KEY = "tk-max-staleness-ms"
MIN_APPLIED_KEY = "tk-min-applied"
REPLICA_KEY = "tk-read-replica"
RANGE_KEY = "tk-read-range"
APPLIED_KEY = "tk-read-applied"
STALENESS_KEY = "tk-read-staleness-ms"
DEFAULT_MAX_STALENESS_S = 5.0
READ_FROM = ("leader", "follower")


def check_read_from(read_from: str, max_staleness_s: float | None) -> None:
    if read_from not in READ_FROM:
        raise ValueError(f"read_from must be one of {READ_FROM}, not {read_from!r}")
    if max_staleness_s is not None:
        if read_from != "follower":
            raise ValueError("max_staleness_s applies to read_from='follower' only")
        if not (max_staleness_s >= 0 and math.isfinite(max_staleness_s)):
            raise ValueError("max_staleness_s must be a finite number >= 0 (0: linearizable)")


async def follower_range(
    context: ClientContext,
    table_id: int,
    request: kv_rpc_pb2.RangeRequest,
    routing: Sequence[tuple[str, bytes | str]],
    max_staleness_s: float | None,
) -> tuple[kv_rpc_pb2.RangeResponse, ReadInfo]:
    """One Range call answered by a follower (see the module docstring), retried as reads are."""
    staleness = DEFAULT_MAX_STALENESS_S if max_staleness_s is None else max_staleness_s
    seen = context.read_positions.setdefault(table_id, {})
    metadata: list[tuple[str, bytes | str]] = [
        *routing,
        (READ_FROM_KEY, "follower"),
        (MAX_STALENESS_KEY, str(round(staleness * 1000))),
    ]
    if seen:
        metadata.append((MIN_APPLIED_KEY, ",".join(f"{r}:{p}" for r, p in seen.items())))
    stub = context.stub("table", kv_rpc_pb2_grpc.TableServiceStub)
    last: list[Any] = []

    def method(req: Any, *, metadata: Any, timeout: float) -> Any:
        rpc = stub.Range(req, metadata=metadata, timeout=timeout)
        last[:] = [rpc]
        return rpc

    response: kv_rpc_pb2.RangeResponse = await context.call(
        method, request, idempotent=True, status_of=lambda r: r.header.code, metadata=metadata
    )
    trailers = {key: value for key, value in await last[0].trailing_metadata() or ()}
    info = _info(trailers)
    if info.range_id:
        seen[info.range_id] = max(seen.get(info.range_id, 0), info.applied)
    return response, info


def _info(trailers: dict[str, Any]) -> ReadInfo:
    """What the trailers say; a server that forwarded the read to the owner (it keeps no
    followers) says nothing: the owner answered."""
    if REPLICA_KEY not in trailers:
        return ReadInfo(replica="leader", range_id=0, applied=0, staleness_s=0.0)
    return ReadInfo(
        replica=str(trailers[REPLICA_KEY]),
        range_id=int(trailers.get(RANGE_KEY, 0)),
        applied=int(trailers.get(APPLIED_KEY, 0)),
        staleness_s=int(trailers.get(STALENESS_KEY, 0)) / 1000,
    )
