"""Oxia's client protocol as the tests see it: who leads each shard of a namespace, as any server's
`GetShardAssignments` answers it (standalone: that server; a cluster: the Oxia port of the server
owning the shard's range's container).

    leaders = shard_leaders("127.0.0.1:6648", "default")   # {shard id: "host:port"}
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc


def shard_leaders(address: str, namespace: str, timeout_s: float = 60.0) -> dict[int, str]:
    """The first assignment message `address` sends for `namespace`: shard id -> leader. Retried
    while the server answers UNAVAILABLE (a cluster server makes namespace `default` in the
    background, and answers so until it exists); any other error is raised."""
    deadline = time.monotonic() + timeout_s
    request = client_pb2.ShardAssignmentsRequest(namespace=namespace)
    while True:
        with grpc.insecure_channel(address) as channel:
            stream = client_pb2_grpc.OxiaClientStub(channel).GetShardAssignments(
                request, timeout=timeout_s
            )
            try:
                message: client_pb2.ShardAssignments = next(stream)
                assignments = message.namespaces[namespace].assignments
                return {a.shard: a.leader for a in assignments}
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
            finally:
                stream.cancel()
        time.sleep(0.1)


def wait_leaders(
    address: str,
    namespace: str,
    done: Callable[[dict[int, str]], bool],
    timeout_s: float = 60.0,
) -> dict[int, str]:
    """`shard_leaders` as `address` answers them once `done(leaders)` holds (its view of the
    assignment follows ZooKeeper's a moment later than another server's may); TimeoutError with
    the last answer if it never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = shard_leaders(address, namespace, timeout_s)
        if done(leaders):
            return leaders
        if time.monotonic() > deadline:
            raise TimeoutError(f"{address} still names {leaders} after {timeout_s:g}s")
        time.sleep(0.1)


def children(leaders: dict[int, str], parent: str, timeout_s: float = 30.0) -> dict[int, list[str]]:
    """The keys directly under `parent` (Pulsar's layout: Oxia lists the children of `p` as the
    keys in [p/, p//)), by shard: each shard is asked at its leader (`shard_leaders`)."""
    found: dict[int, list[str]] = {}
    for shard, leader in sorted(leaders.items()):
        with grpc.insecure_channel(leader) as channel:
            stub = client_pb2_grpc.OxiaClientStub(channel)
            request = client_pb2.ListRequest(
                shard=shard, start_inclusive=f"{parent}/", end_exclusive=f"{parent}//"
            )
            keys = [key for page in stub.List(request, timeout=timeout_s) for key in page.keys]
        if keys:
            found[shard] = sorted(keys)
    return found
