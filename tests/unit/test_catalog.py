"""Root and meta catalogs over real ranges (in-memory log and store): ids, errors, placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_server.container.container import ContainerEnv
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import (
    InvalidNamespaceNameError,
    InvalidStreamNameError,
    NamespaceExistsError,
    NamespaceNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
)
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.storage.api import KvStore
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit


def conf(ranges: int = 4) -> stream_pb2.StreamConfiguration:
    return stream_pb2.StreamConfiguration(initial_num_ranges=ranges, storage_type=stream_pb2.TABLE)


async def make_registry(
    log: MemoryLogBackend, stores: dict[Path, MemoryKvStore], containers: int = 4
) -> ContainerRegistry:
    def open_store(path: Path, *, read_only: bool = False) -> KvStore:
        return stores.setdefault(path, MemoryKvStore())

    env = ContainerEnv(
        num_containers=containers,
        log_backend=log,
        store_factory=open_store,
        db_dir=Path("/nonexistent"),
        clock=ManualClock(),
        appliers=APPLIERS,
    )
    registry = ContainerRegistry(env, list(range(containers)))
    await registry.start()
    return registry


async def test_namespace_and_table_ids_follow_bookkeeper() -> None:
    registry = await make_registry(MemoryLogBackend(), {})
    root = registry.root
    ns = stream_pb2.NamespaceConfiguration(default_stream_conf=conf())
    assert (await root.create_namespace("a", ns)).namespace_id == 0
    assert (await root.create_namespace("b", ns)).namespace_id == 1
    t1 = await root.create_stream("a", "t", conf())
    t2 = await root.create_stream("b", "t", conf(1))
    assert (t1.stream_id, t2.stream_id) == (1024, 1025)  # global, from 1024
    assert t2.stream_conf == conf(1)  # stored verbatim
    assert root.get_stream("b", "t") == t2 == root.get_stream_by_id(1025)
    assert root.get_namespace("a").default_stream_conf == conf()
    await registry.stop()


async def test_catalog_errors() -> None:
    registry = await make_registry(MemoryLogBackend(), {})
    root = registry.root
    ns = stream_pb2.NamespaceConfiguration()
    await root.create_namespace("a", ns)
    with pytest.raises(NamespaceExistsError):
        await root.create_namespace("a", ns)
    with pytest.raises(InvalidNamespaceNameError):
        await root.create_namespace("a b", ns)
    with pytest.raises(NamespaceNotFoundError):
        root.get_namespace("zz")
    with pytest.raises(NamespaceNotFoundError):
        await root.create_stream("zz", "t", conf())
    await root.create_stream("a", "t", conf())
    with pytest.raises(StreamExistsError):
        await root.create_stream("a", "t", conf())
    with pytest.raises(InvalidStreamNameError):
        await root.create_stream("a", "", conf())
    with pytest.raises(StreamNotFoundError):
        root.get_stream("a", "nope")
    with pytest.raises(StreamNotFoundError):
        root.get_stream_by_id(5000)
    await registry.stop()


async def test_deleting_a_namespace_deletes_its_tables() -> None:
    registry = await make_registry(MemoryLogBackend(), {})
    root = registry.root
    await root.create_namespace("a", stream_pb2.NamespaceConfiguration())
    t = await root.create_stream("a", "t", conf())
    deleted = await root.delete_namespace("a")
    assert [s.stream_id for s in deleted] == [t.stream_id]
    with pytest.raises(StreamNotFoundError):
        root.get_stream_by_id(t.stream_id)
    await root.create_namespace("a", stream_pb2.NamespaceConfiguration())
    assert (await root.create_stream("a", "t", conf())).stream_id == t.stream_id + 1
    await registry.stop()


async def test_ranges_are_created_once_and_spread_over_containers() -> None:
    log, stores = MemoryLogBackend(), dict[Path, MemoryKvStore]()
    registry = await make_registry(log, stores)
    await registry.root.create_namespace("a", stream_pb2.NamespaceConfiguration())
    t = await registry.root.create_stream("a", "t", conf(4))
    ranges = await registry.active_ranges(t.stream_id)
    assert [r.range_id for r in ranges] == [1024, 1025, 1026, 1027]
    assert sorted(r.storage_container_id for r in ranges) == [0, 1, 2, 3]
    assert await registry.active_ranges(t.stream_id) == ranges
    await registry.stop()
    # After a restart on the same logs (stores lost), the same ranges come back.
    restarted = await make_registry(log, {})
    assert await restarted.active_ranges(t.stream_id) == ranges
    await restarted.stop()


@pytest.mark.parametrize(
    ("namespace", "asked", "exact_flag_sent", "got"),
    [
        ("oxia", 1, False, 1),  # an Oxia namespace with one shard, as Oxia runs them
        ("oxia", 3, False, 3),
        ("oxia", 4, False, 4),
        ("oxia", 0, False, 1),
        ("a", 1, False, 2),  # BookKeeper's split: at least 2, even
        ("a", 3, False, 4),
        ("a", 1, True, 2),  # the flag is the server's, never a client's
    ],
)
async def test_tables_of_namespace_oxia_get_exactly_the_ranges_asked_for(
    namespace: str, asked: int, exact_flag_sent: bool, got: int
) -> None:
    registry = await make_registry(MemoryLogBackend(), {})
    await registry.root.create_namespace(namespace, stream_pb2.NamespaceConfiguration())
    sent = conf(asked)
    sent.exact_num_ranges = exact_flag_sent
    t = await registry.root.create_stream(namespace, "t", sent)
    assert t.stream_conf.exact_num_ranges == (namespace == "oxia")
    assert t.stream_conf.initial_num_ranges == asked
    ranges = await registry.active_ranges(t.stream_id)
    assert len(ranges) == got
    assert ranges[0].start_hash_key == -(2**63) and ranges[-1].end_hash_key == 2**63 - 1
    assert all(a.end_hash_key == b.start_hash_key for a, b in zip(ranges, ranges[1:], strict=False))
    await registry.stop()


def test_the_exact_ranges_namespace_is_the_oxia_front_ends() -> None:
    from tablekeeper_server.catalog.root import EXACT_RANGES_NAMESPACES
    from tablekeeper_server.oxia.namespaces import TABLE_NAMESPACE

    assert {TABLE_NAMESPACE} == EXACT_RANGES_NAMESPACES
