"""A container moving between two servers (registries) that share one log: what the next owner
finds, and that it opens the moved data ranges without waiting for their first request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, stream_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.container.container import ContainerEnv
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import NotServedHereError, UnavailableError
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.storage.api import KvStore
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit


def server(log: MemoryLogBackend) -> ContainerRegistry:
    """One server in cluster style: no containers until `add`; its own local stores."""
    stores: dict[Path, MemoryKvStore] = {}

    def open_store(path: Path, *, read_only: bool = False) -> KvStore:
        return stores.setdefault(path, MemoryKvStore())

    env = ContainerEnv(
        num_containers=1,
        log_backend=log,
        store_factory=open_store,
        db_dir=Path("/nonexistent"),
        clock=ManualClock(),
        open_hosted_ranges_on_start=True,
        appliers=APPLIERS,
    )
    return ContainerRegistry(env, [])


async def test_the_next_owner_opens_moved_ranges_at_once_and_has_the_data() -> None:
    log = MemoryLogBackend()
    first, second = server(log), server(log)
    await first.add(0, epoch=1)
    with pytest.raises(NotServedHereError):
        second.container(0)
    ns = stream_pb2.NamespaceConfiguration()
    await first.root.create_namespace("ns", ns)
    conf = stream_pb2.StreamConfiguration(initial_num_ranges=2, storage_type=stream_pb2.TABLE)
    table = await first.root.create_stream("ns", "t", conf)
    for i in range(20):
        range_ = await first.table_range(table.stream_id, f"p{i}".encode())
        put = kv_rpc_pb2.PutRequest(key=b"k", value=f"v{i}".encode())
        put.header.r_key = f"p{i}".encode()
        await range_.execute(wal_pb2.WalCommand(put=put))
    hosted = first.containers[0].meta.hosted_ranges()  # type: ignore[union-attr]
    assert sorted(r[:2] for r in hosted) == [(table.stream_id, 1024), (table.stream_id, 1025)]

    await first.remove(0)
    await second.add(0, epoch=2)
    async with asyncio.timeout(60):  # opened in the background, before any request for them
        while len(second.containers[0].ranges) < 4:  # meta, root and the two data ranges
            await asyncio.sleep(0.01)
    assert {key for key in second.containers[0].ranges} >= {
        (table.stream_id, 1024),
        (table.stream_id, 1025),
    }
    for i in range(20):
        range_ = await second.table_range(table.stream_id, f"p{i}".encode())
        header = kv_rpc_pb2.RoutingHeader(r_key=f"p{i}".encode())
        got = range_.read(kv_rpc_pb2.RangeRequest(key=b"k", header=header))
        assert got.kvs[0].value == f"v{i}".encode()
    await second.stop()


async def test_a_container_whose_log_was_taken_over_asks_to_be_reopened() -> None:
    log = MemoryLogBackend()
    first, second = server(log), server(log)
    await first.add(0, epoch=1)
    ns = stream_pb2.NamespaceConfiguration()
    await first.root.create_namespace("a", ns)
    assert first.containers[0].needs_reopen() is None
    await second.add(0, epoch=2)  # opens (fences) the same logs
    with pytest.raises(UnavailableError):
        await first.root.create_namespace("b", ns)
    reason = first.containers[0].needs_reopen()
    assert reason is not None and "fenced" in reason
    assert second.containers[0].needs_reopen() is None
    assert second.root.get_namespace("a").namespace_id == 0
    await first.stop()
    await second.stop()
