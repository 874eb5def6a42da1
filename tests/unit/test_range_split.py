"""Online range split over real ranges (RocksDB stores, a checkpoint directory, an in-memory log
shared by "servers"): the switch, what the children hold, what a sealed range answers, and a
split resumed by the next owner after a crash between its steps."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, stream_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.container.container import ContainerEnv
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.container.split_policy import SplitPolicy, SplitThresholds
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.core.failpoints import FailpointError, Failpoints
from tablekeeper_server.core.keys import store_key
from tablekeeper_server.core.routing import routing_hash
from tablekeeper_server.errors import IllegalOpError, RangeMovedError
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.records import decode_record
from tablekeeper_server.range.replica import RangeName
from tablekeeper_server.range.split import ChildrenBuilder, ChildSpec
from tablekeeper_server.rpc.admin import SPLIT_REFUSED_NAMESPACES
from tablekeeper_server.storage.rocksdb import RocksKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

PARENT = 1024


def make_registry(
    root: Path, log: MemoryLogBackend, name: str, failpoints: Failpoints | None = None
) -> ContainerRegistry:
    env = ContainerEnv(
        num_containers=2,
        log_backend=log,
        store_factory=RocksKvStore,
        db_dir=root / name,
        clock=ManualClock(),
        checkpoint_store=DirectoryCheckpointStore(root / "checkpoints"),
        failpoints=failpoints or Failpoints(),
        appliers=APPLIERS,
    )
    registry = ContainerRegistry(env, [0, 1])
    registry.splitter.retire_after_s = 0.0  # delete a split's parent at once
    return registry


async def new_table(registry: ContainerRegistry) -> int:
    await registry.root.create_namespace("ns", stream_pb2.NamespaceConfiguration())
    conf = stream_pb2.StreamConfiguration(initial_num_ranges=2, storage_type=stream_pb2.TABLE)
    return (await registry.root.create_stream("ns", "t", conf)).stream_id


async def put(
    registry: ContainerRegistry, stream: int, pkey: bytes, value: bytes, **kw: object
) -> kv_rpc_pb2.PutResponse:
    request = kv_rpc_pb2.PutRequest(key=b"k", value=value, **kw)  # type: ignore[arg-type]
    request.header.r_key = pkey
    range_ = await registry.table_range(stream, pkey)
    response = await range_.execute(wal_pb2.WalCommand(put=request))
    assert isinstance(response, kv_rpc_pb2.PutResponse)
    return response


async def get_all(registry: ContainerRegistry, stream: int, pkey: bytes) -> list[bytes]:
    range_ = await registry.table_range(stream, pkey)
    header = kv_rpc_pb2.RoutingHeader(r_key=pkey)
    response = range_.read(kv_rpc_pb2.RangeRequest(key=b"\x00", range_end=b"\xff", header=header))
    return [kv.value for kv in response.kvs]


PKEYS = [f"p{i}".encode() for i in range(60)]


async def fill(registry: ContainerRegistry, stream: int) -> None:
    for pkey in PKEYS:
        await put(registry, stream, pkey, b"v-" + pkey)


async def test_a_split_hands_each_key_to_the_child_holding_its_hash(tmp_path: Path) -> None:
    log = MemoryLogBackend()
    registry = make_registry(tmp_path, log, "a")
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    sequential = await put(registry, stream, b"seq", b"s", sequential=True)
    before = (await registry.table_range(stream, b"seq")).applied_sequence

    outcome = await registry.splitter.split(stream, PARENT)

    parent, (first, second) = outcome.plan.parent, outcome.plan.children
    assert (first.start_hash_key, second.end_hash_key) == (
        parent.start_hash_key,
        parent.end_hash_key,
    )
    assert first.end_hash_key == second.start_hash_key
    assert first.storage_container_id == parent.storage_container_id
    assert second.storage_container_id != parent.storage_container_id  # the emptier container
    ranges = await registry.active_ranges(stream)
    assert [r.range_id for r in ranges] == [first.range_id, second.range_id, PARENT + 1]
    in_parent = [p for p in [*PKEYS, b"seq"] if routing_hash(p) < parent.end_hash_key]
    assert outcome.keys_copied == len(in_parent) >= 10
    for pkey in PKEYS:
        range_ = await registry.table_range(stream, pkey)
        assert await get_all(registry, stream, pkey) == [b"v-" + pkey]
        if pkey in in_parent:
            child = first if routing_hash(pkey) < first.end_hash_key else second
            assert range_.name.range_id == child.range_id
    # Revisions go on from the parent's; the sequential counter moved with its pkey.
    moved = await registry.table_range(stream, in_parent[0])
    await put(registry, stream, in_parent[0], b"again")
    assert moved.applied_sequence > max(before, outcome.sealed_sequence)
    again = await put(registry, stream, b"seq", b"s", sequential=True)
    assert int(again.key[-20:]) == int(sequential.key[-20:]) + 1
    # The parent is gone (right after the switch here; 30 s later by default): its log,
    # checkpoints and store.
    await registry.splitter.resumed()
    parent_name = RangeName(parent.storage_container_id, stream, PARENT).log_name
    assert log.size_bytes(parent_name) == 0 and not list(log.read(parent_name, 0))
    assert not list((tmp_path / "checkpoints").glob(f"{parent_name}/manifests/*"))
    assert registry.containers[0].meta is not None
    assert registry.containers[0].meta.splits() == ([], [])
    await registry.stop()

    # A restart serves the children from their stores and logs.
    again_registry = make_registry(tmp_path, log, "a")
    await again_registry.start()
    for pkey in PKEYS:
        expected = b"again" if pkey == in_parent[0] else b"v-" + pkey
        assert await get_all(again_registry, stream, pkey) == [expected]
    await again_registry.stop()


async def test_a_split_of_a_split(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    first = await registry.splitter.split(stream, PARENT)
    child = first.plan.children[1]
    second = await registry.splitter.split(stream, child.range_id)
    assert [c.range_id for c in second.plan.children] == [child.range_id + 1, child.range_id + 2]
    ranges = await registry.active_ranges(stream)
    assert len(ranges) == 4
    assert [r.start_hash_key for r in ranges] == sorted(r.start_hash_key for r in ranges)
    for pkey in PKEYS:
        assert await get_all(registry, stream, pkey) == [b"v-" + pkey]
    await registry.stop()


async def test_a_sealed_range_refuses_requests_with_range_moved(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    pkey = next(p for p in PKEYS if routing_hash(p) < 0)  # range 1024 holds the negative half
    range_ = await registry.table_range(stream, pkey)
    await range_.seal((2000, 2001))
    await range_.seal((2000, 2001))  # again: a retried split
    with pytest.raises(IllegalOpError):
        await range_.seal((3000, 3001))
    request = kv_rpc_pb2.PutRequest(key=b"k", value=b"x")
    request.header.r_key = pkey
    with pytest.raises(RangeMovedError) as moved:
        await range_.execute(wal_pb2.WalCommand(put=request))
    assert moved.value.retryable and moved.value.children == (2000, 2001)
    with pytest.raises(RangeMovedError):
        range_.read(kv_rpc_pb2.RangeRequest(key=b"k", header=request.header))
    # The route still names it (no split switched it): a retryable "being split".
    with pytest.raises(RangeMovedError):
        await registry.table_range(stream, pkey)
    await registry.stop()


async def test_a_session_without_its_pkey_refuses_the_seal(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    range_ = await registry.table_range(stream, b"p")
    # As the etcd and Oxia front-ends (and servers before sessions recorded it) create them.
    await range_.execute(wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=10_000)))
    with pytest.raises(IllegalOpError, match="where its children begin"):
        await range_.seal((2000, 2001))
    with pytest.raises(IllegalOpError, match="without its pkey"):
        await range_.seal((2000, 2001), (-(2**63), -(2**62)))
    assert range_.sealed is None
    await put(registry, stream, b"p", b"still served")
    await registry.stop()


def pkeys_of_children() -> tuple[bytes, bytes]:
    """A pkey of each half of range 1024 (the negative hashes), as its split divides it."""
    first = next(p for p in PKEYS if routing_hash(p) < -(2**62))
    second = next(p for p in PKEYS if -(2**62) <= routing_hash(p) < 0)
    return first, second


async def new_session(registry: ContainerRegistry, stream: int, pkey: bytes) -> int:
    range_ = await registry.table_range(stream, pkey)
    response = await range_.sessions.create(10_000, pkey=pkey)
    assert response.header.code == 0
    return response.session_id


async def test_sessions_and_ephemeral_keys_move_with_their_pkeys(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    first, second = pkeys_of_children()
    one = await new_session(registry, stream, first)
    two = await new_session(registry, stream, second)
    await put(registry, stream, first, b"ephemeral one", lease=one)
    await put(registry, stream, second, b"ephemeral two", lease=two)

    outcome = await registry.splitter.split(stream, PARENT)

    child_one = await registry.table_range(stream, first)
    child_two = await registry.table_range(stream, second)
    assert (child_one.name.range_id, child_two.name.range_id) == tuple(
        c.range_id for c in outcome.plan.children
    )
    # Each session lives on (with a fresh TTL) where its pkey went, and only there.
    assert child_one.sessions.remaining_s(one) is not None
    assert child_one.sessions.remaining_s(two) is None
    assert child_two.sessions.remaining_s(two) is not None
    assert child_one.sessions.keep_alive(one) == 10_000
    assert await get_all(registry, stream, first) == [b"ephemeral one"]
    # Its keys go with it: closing it on the child deletes them; the other session's stay.
    closed = await child_one.sessions.close(one, "closed")
    assert closed.header.code == 0
    assert await get_all(registry, stream, first) == []
    assert await get_all(registry, stream, second) == [b"ephemeral two"]
    # New ephemeral keys under the moved session, and its end by expiry, work on the child.
    await put(registry, stream, second, b"again", lease=two)
    await child_two.sessions.close(two, "expired")
    assert await get_all(registry, stream, second) == []
    await registry.stop()


async def test_a_session_with_keys_on_both_sides_refuses_the_split(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    first, second = pkeys_of_children()
    session = await new_session(registry, stream, first)
    await put(registry, stream, second, b"on the other side", lease=session)
    with pytest.raises(IllegalOpError, match="divides"):
        await registry.splitter.split(stream, PARENT)
    range_ = await registry.table_range(stream, first)
    assert range_.sealed is None and range_.name.range_id == PARENT
    assert await get_all(registry, stream, second) == [b"on the other side"]
    await registry.stop()


@pytest.mark.parametrize(
    "failpoint", ["split.after_seal", "split.during_copy", "split.before_switch"]
)
async def test_a_split_cut_off_is_finished_by_the_next_owner(
    tmp_path: Path, failpoint: str
) -> None:
    log = MemoryLogBackend()
    registry = make_registry(tmp_path, log, "a", Failpoints({failpoint: "error"}))
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    with pytest.raises(FailpointError):
        await registry.splitter.split(stream, PARENT)
    await registry.stop()  # "crashed": the parent is sealed, the switch not done

    successor = make_registry(tmp_path, log, "b")  # another server's (empty) data directory
    await successor.start()
    meta = successor.containers[0].meta
    assert meta is not None
    await successor.splitter.resumed()  # resumed in the background, at start
    assert meta.splits() == ([], [])
    assert len(await successor.active_ranges(stream)) == 3
    for pkey in PKEYS:
        assert await get_all(successor, stream, pkey) == [b"v-" + pkey]
    await successor.stop()


def test_the_refused_namespaces_are_the_front_ends() -> None:
    from tablekeeper_server.etcd.keyspace import NAMESPACE as ETCD_NAMESPACE
    from tablekeeper_server.oxia.namespaces import TABLE_NAMESPACE as OXIA_NAMESPACE

    assert set(SPLIT_REFUSED_NAMESPACES) == {ETCD_NAMESPACE, OXIA_NAMESPACE}


async def _split_with_writes_before_the_seal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, *, held_at: str, truncate: bool
) -> tuple[ContainerRegistry, int, dict[bytes, list[bytes]]]:
    """Split range 1024 while, after the children copied its checkpoint (the split held at a
    failpoint), the parent takes more writes of every kind; `truncate`: and two checkpoints,
    so that its log no longer holds what followed the copied checkpoint."""
    release = tmp_path / "release"
    registry = make_registry(
        tmp_path, MemoryLogBackend(), "a", Failpoints({held_at: f"wait:{release}"})
    )
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    expected = {pkey: [b"v-" + pkey] for pkey in PKEYS}
    ours = [p for p in PKEYS if routing_hash(p) < 0]
    split = asyncio.create_task(registry.splitter.split(stream, PARENT))
    while f"failpoint {held_at}: waiting" not in caplog.text:
        await asyncio.sleep(0.01)
    for pkey in ours[:5]:
        await put(registry, stream, pkey, b"after-copy-" + pkey)
        expected[pkey] = [b"after-copy-" + pkey]
    gone = ours[5]
    request = kv_rpc_pb2.DeleteRangeRequest(key=b"k")
    request.header.r_key = gone
    await (await registry.table_range(stream, gone)).execute(
        wal_pb2.WalCommand(delete_range=request)
    )
    expected[gone] = []
    # A session created and closed meanwhile (none lives at the seal).
    range_ = await registry.table_range(stream, ours[6])
    created = await range_.execute(
        wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=60_000))
    )
    session_id = created.session_id  # type: ignore[attr-defined]
    await put(registry, stream, ours[6], b"ephemeral", lease=session_id)
    await range_.execute(wal_pb2.WalCommand(session=wal_pb2.SessionCommand(close_id=session_id)))
    expected[ours[6]] = []
    if truncate:
        await range_.checkpoint(force=True)
        await put(registry, stream, ours[7], b"between")
        await range_.checkpoint(force=True)
        expected[ours[7]] = [b"between"]
    release.touch()
    await split
    return registry, stream, expected


@pytest.mark.parametrize(
    ("held_at", "truncate", "way"),
    [
        ("split.after_copy", False, "then 9 commands of its log"),
        ("split.after_copy", True, "copying before the seal failed"),
        ("split.before_seal", True, "copying the sealed range instead"),
    ],
    ids=["tail", "truncated-before-catch-up", "truncated-before-seal"],
)
async def test_writes_between_the_copy_and_the_seal_reach_the_children(
    tmp_path: Path, held_at: str, truncate: bool, way: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    registry, stream, expected = await _split_with_writes_before_the_seal(
        tmp_path, caplog, held_at=held_at, truncate=truncate
    )
    # How the children were finished: the log's commands applied, or (its records truncated by
    # the two checkpoints) a copy of the sealed parent.
    assert way in caplog.text
    assert len(await registry.active_ranges(stream)) == 3
    for pkey, values in expected.items():
        assert await get_all(registry, stream, pkey) == values, pkey
    await registry.stop()


async def test_what_the_log_holds_after_the_seal_is_not_applied_to_the_children(
    tmp_path: Path,
) -> None:
    """A write queued before the seal applied is in the log after it, refused ("range moved",
    so its client sends it again, to a child): the children must not apply it too."""
    log = MemoryLogBackend()
    registry = make_registry(tmp_path, log, "a")
    await registry.start()
    stream = await new_table(registry)
    pkey = next(p for p in PKEYS if routing_hash(p) < 0)
    increment = kv_rpc_pb2.IncrementRequest(key=b"n", amount=1)
    increment.header.r_key = pkey
    parent = await registry.table_range(stream, pkey)
    await parent.execute(wal_pb2.WalCommand(increment=increment))
    await parent.checkpoint(force=True)
    env = registry.env
    assert env.checkpoint_store is not None
    specs = [ChildSpec("child-a", -(2**63)), ChildSpec("child-b", -(2**62))]
    builder = ChildrenBuilder(
        parent.name.log_name,
        specs,
        store_opener=env.store_factory,
        checkpoint_store=env.checkpoint_store,
        log_backend=log,
        clock=env.clock,
        work_dir=tmp_path,
        appliers=APPLIERS,
    )
    builder.copy_checkpoint(sealed=False)
    await parent.execute(wal_pb2.WalCommand(increment=increment))  # the tail: applied
    sealed, refused = await asyncio.gather(
        parent.seal((2000, 2001)),
        parent.execute(wal_pb2.WalCommand(increment=increment)),
        return_exceptions=True,
    )
    assert isinstance(refused, RangeMovedError)
    assert parent.applied_sequence == sealed  # the refused increment is in the log, after it
    builder.apply_tail(parent.applied_sequence)
    builder.publish()
    builder.close()
    child = "child-a" if routing_hash(pkey) < -(2**62) else "child-b"
    restored = RangeCheckpointer(
        child, tmp_path / "restored", env.store_factory, env.checkpoint_store, log, env.clock
    )
    restored.restore()
    store = env.store_factory(tmp_path / "restored", read_only=True)
    try:
        assert decode_record(store.get(store_key(pkey, b"n")) or b"").number == 2
    finally:
        store.close()
    await registry.stop()


# ------------------------------------------------------------------ the automatic split policy


def policy(registry: ContainerRegistry, **thresholds: float) -> SplitPolicy:
    clock = registry.env.clock
    return SplitPolicy(
        registry.all_ranges,
        registry.splitter.split,
        SplitThresholds(**thresholds),  # type: ignore[arg-type]
        clock,
    )


async def test_the_policy_splits_a_range_over_its_key_threshold(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)  # ~30 keys in each of the two ranges
    ranges = {r.name.range_id: r for r in registry.all_ranges() if r.name.stream_id == stream}
    keys = {rid: r.estimate_num_keys() for rid, r in ranges.items()}
    threshold = min(keys.values()) - 1  # both are over it: one split per check
    splitter = policy(registry, max_keys=threshold)
    await splitter.check()
    assert splitter.splits == 1
    assert len(await registry.active_ranges(stream)) == 3
    quiet = policy(registry, max_keys=10 * max(keys.values()))
    await quiet.check()
    assert quiet.splits == 0
    await registry.stop()


async def test_the_policy_splits_a_range_over_its_write_rate(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    clock = registry.env.clock
    assert isinstance(clock, ManualClock)
    splitter = policy(registry, max_writes_per_s=10)
    await splitter.check()  # the first look only measures
    hot = next(p for p in PKEYS if routing_hash(p) >= 0)  # range 1025
    for i in range(30):
        await put(registry, stream, hot, b"%d" % i)
    clock.advance(2.0)  # 30 writes in 2 s: 15/s on range 1025, none on 1024
    await splitter.check()
    assert splitter.splits == 1
    ranges = await registry.active_ranges(stream)
    assert PARENT in [r.range_id for r in ranges] and PARENT + 1 not in [r.range_id for r in ranges]
    await registry.stop()


async def test_the_policy_leaves_a_refused_range_alone(tmp_path: Path) -> None:
    registry = make_registry(tmp_path, MemoryLogBackend(), "a")
    await registry.start()
    stream = await new_table(registry)
    range_ = await registry.table_range(stream, PKEYS[0])
    await range_.execute(wal_pb2.WalCommand(session=wal_pb2.SessionCommand(create_ttl_ms=60_000)))
    await put(registry, stream, PKEYS[0], b"v")
    asked: list[int] = []

    async def split(stream_id: int, range_id: int) -> object:
        asked.append(range_id)
        return await registry.splitter.split(stream_id, range_id)

    splitter = SplitPolicy(lambda: [range_], split, SplitThresholds(max_keys=1), registry.env.clock)
    for _ in range(3):
        await splitter.check()
    # Refused (it holds a session) once, and not asked again.
    assert asked == [range_.name.range_id] and splitter.splits == 0
    assert range_.sealed is None
    await registry.stop()


async def test_deleting_a_table_mid_split_or_in_the_grace_leaves_no_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table deleted while a split's parent waits out its grace, and another split is held
    just before its switch (children published), takes all of them with it."""
    caplog.set_level("INFO")
    release = tmp_path / "release"
    release.touch()  # the first split passes the failpoint
    log = MemoryLogBackend()
    registry = make_registry(
        tmp_path, log, "a", Failpoints({"split.before_switch": f"wait:{release}"})
    )
    registry.splitter.retire_after_s = 3600.0  # its parent waits
    await registry.start()
    stream = await new_table(registry)
    await fill(registry, stream)
    done = await registry.splitter.split(stream, PARENT + 1)
    release.unlink()
    held = asyncio.create_task(registry.splitter.split(stream, PARENT))
    while caplog.text.count("failpoint split.before_switch: waiting") < 2:
        await asyncio.sleep(0.01)
    props = registry.root.get_stream("ns", "t")
    await registry.root.delete_stream("ns", "t")
    await registry.drop_tables([props])
    release.touch()
    under_way = await held
    ranges = [done.plan.parent, *done.plan.children, under_way.plan.parent]
    for r in [*ranges, *under_way.plan.children]:
        name = RangeName(r.storage_container_id, stream, r.range_id).log_name
        assert not list(log.read(name, 0)), name
        assert not list((tmp_path / "checkpoints").glob(f"{name}/*/*")), name
    await registry.stop()
