"""Running out of a resource (disk space, a held lock) is retryable, never corruption, and a
range recovers by itself once the resource is back: real RocksDB, real local log files, disk
full injected through the log's `sync` function."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.bookkeeper import stream_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.container.container import (
    ContainerEnv,
    OpenRangeLimit,
    StorageContainer,
)
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import (
    IndeterminateError,
    NamespaceNotFoundError,
    StorageUnavailableError,
    UnavailableError,
)
from tablekeeper_server.log.local import LocalLogBackend
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.storage.rocksdb import RocksKvStore, RocksMemory
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit
NAME = RangeName(0, 1024, 1)
HEADER = kv.RoutingHeader(r_key=b"p")


def put(key: bytes, value: bytes) -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(put=kv.PutRequest(key=key, value=value, header=HEADER))


def checkpointed_range(root: Path, backend: LocalLogBackend) -> Range:
    """The range NAME with its store under `root`/db/range, its log in `backend` and its
    checkpoints under `root`/checkpoints."""
    path = root / "db" / "range"
    clock = ManualClock()
    checkpointer = RangeCheckpointer(
        NAME.log_name,
        path,
        RocksKvStore,
        DirectoryCheckpointStore(root / "checkpoints"),
        backend,
        clock,
    )
    return Range(
        NAME,
        backend,
        lambda: RocksKvStore(path),
        clock,
        checkpointer=checkpointer,
        appliers=APPLIERS,
    )


def value_of(range_: Range, key: bytes) -> bytes | None:
    response = range_.read(kv.RangeRequest(key=key, header=HEADER))
    return response.kvs[0].value if response.kvs else None


class DiskFullSync:
    """The log's sync function: once `full` is set, the next sync fails with ENOSPC (the log's
    sync of its cut-back then succeeds, as freeing the group's blocks does on a real disk)."""

    def __init__(self) -> None:
        self.full = False
        self.failures = 0

    def __call__(self, fd: int) -> None:
        if self.full and self.failures == 0:
            self.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fdatasync(fd)


def test_close_releases_the_lock_while_a_scan_is_unfinished(tmp_path: Path) -> None:
    store = RocksKvStore(tmp_path / "db")
    batch = store.new_batch()
    for i in range(3):
        batch.put(b"k%d" % i, b"v")
    store.write(batch)
    scan = store.scan(b"", b"\xff")
    assert next(scan) == (b"k0", b"v")
    store.close()  # the unfinished scan's iterator must not keep RocksDB (and its LOCK) alive
    again = RocksKvStore(tmp_path / "db")
    with pytest.raises(UnavailableError, match="closed during a scan"):
        next(scan)
    again.close()
    store.close()  # idempotent


def test_stores_share_one_bounded_rocksdb_memory(tmp_path: Path) -> None:
    """Many ranges' stores, one memory budget: their memtables together are brought back under
    half of it by flushes, and blocks and memtables fit in the whole. Each store alone would
    keep all it was given in its memtable (12 MiB each, under RocksDB's per-database 16 MiB
    write buffer): 48 MiB."""
    memory = RocksMemory(16 * 1024 * 1024)
    stores = [RocksKvStore(tmp_path / f"db{i}", memory=memory) for i in range(4)]
    value = os.urandom(1024)
    for round_ in range(12):  # 4 stores x 12 x 1,000 KiB: 48 MiB written, 3x the budget
        for store in stores:
            batch = store.new_batch()
            for j in range(1000):
                batch.put(b"k%02d-%04d" % (round_, j), value)
            store.write(batch)
    # The limit is soft (a burst overshoots while flushes run in the background; writers are
    # not stalled): every write over it schedules a flush, and the memtables come back under.
    deadline = time.monotonic() + 30  # a hang guard
    while memory.memtables.get_usage() > 8 * 1024 * 1024:
        assert time.monotonic() < deadline, memory.memtables.get_usage()
        for store in stores:
            batch = store.new_batch()
            batch.put(b"z", b"")
            store.write(batch)
        time.sleep(0.05)
    assert 0 < memory.usage() <= 16 * 1024 * 1024
    for store in stores:
        assert store.get(b"k00-0000") == value and store.get(b"k11-0999") == value
        store.close()


def test_a_held_lock_is_storage_unavailable_not_corruption(tmp_path: Path) -> None:
    holder = RocksKvStore(tmp_path / "db")
    with pytest.raises(StorageUnavailableError, match="lock"):
        RocksKvStore(tmp_path / "db")
    holder.close()
    RocksKvStore(tmp_path / "db").close()


class FlushFails(RocksKvStore):
    def flush(self) -> None:
        raise StorageUnavailableError(f"RocksDB at {self.path}: flush failed: disk full")


async def test_a_range_whose_final_flush_fails_still_releases_its_store(tmp_path: Path) -> None:
    backend = LocalLogBackend(tmp_path / "wal")
    path = tmp_path / "db"
    range_ = Range(NAME, backend, lambda: FlushFails(path), ManualClock(), appliers=APPLIERS)
    await range_.open()
    await range_.execute(put(b"k", b"v"))
    with pytest.raises(StorageUnavailableError):
        await range_.close()
    # Reopening in the same process works (used to fail with "LOCK: No locks available").
    again = Range(NAME, backend, lambda: RocksKvStore(path), ManualClock(), appliers=APPLIERS)
    await again.open()
    assert value_of(again, b"k") == b"v"
    await again.close()


async def test_a_held_store_lock_does_not_set_the_store_aside(tmp_path: Path) -> None:
    """A store that cannot open for a reason that is not damage stays where it is: no restore
    from a checkpoint, which would lose nothing here but could lose what the checkpoint
    misses elsewhere, and would hide the real problem."""
    backend = LocalLogBackend(tmp_path / "wal")
    path = tmp_path / "db" / "range"

    def new_range() -> Range:
        return checkpointed_range(tmp_path, backend)

    range_ = new_range()
    await range_.open()
    await range_.execute(put(b"a", b"1"))
    assert await range_.checkpoint(force=True) is not None
    await range_.execute(put(b"b", b"2"))
    await range_.close()

    holder = RocksKvStore(path)  # e.g. a handle that was never released
    with pytest.raises(StorageUnavailableError):
        await new_range().open()
    assert sorted(p.name for p in path.parent.iterdir()) == ["range"]  # nothing set aside
    holder.close()

    range_ = new_range()
    await range_.open()
    assert (value_of(range_, b"a"), value_of(range_, b"b")) == (b"1", b"2")
    assert range_.checkpointer is not None
    assert range_.checkpointer.stats.restored_from == ""
    await range_.close()


async def test_disk_full_on_append_is_retryable_and_the_range_reopens_by_itself(
    tmp_path: Path,
) -> None:
    sync = DiskFullSync()
    env = ContainerEnv(
        num_containers=1,
        log_backend=LocalLogBackend(tmp_path / "wal", sync=sync),
        store_factory=RocksKvStore,
        db_dir=tmp_path / "db",
        clock=ManualClock(),
        appliers=APPLIERS,
    )
    container = StorageContainer(1, env)
    await container.start()
    try:
        range_ = await container.data_range(1024, 1, 0)
        for i in range(10):
            await range_.execute(put(b"k%d" % i, b"v%d" % i))

        sync.full = True
        with pytest.raises(UnavailableError) as refused:
            await range_.execute(put(b"lost", b"x"))
        assert not isinstance(refused.value, IndeterminateError)
        assert refused.value.retryable
        assert "No space left on device" in refused.value.message
        assert range_.failed

        # The next request reopens the range: no restart, nothing acknowledged missing, and
        # the refused write is not there (it was cut back out of the log).
        sync.full = False
        reopened = await container.data_range(1024, 1, 0)
        assert reopened is not range_ and not reopened.failed
        await reopened.execute(put(b"after", b"ok"))
        for i in range(10):
            assert value_of(reopened, b"k%d" % i) == b"v%d" % i
        assert value_of(reopened, b"after") == b"ok"
        assert value_of(reopened, b"lost") is None
    finally:
        await container.stop()


async def test_open_table_ranges_are_bounded_and_only_idle_ones_are_closed(
    tmp_path: Path,
) -> None:
    limit = OpenRangeLimit(2)
    env = ContainerEnv(
        num_containers=2,
        log_backend=LocalLogBackend(tmp_path / "wal"),
        store_factory=RocksKvStore,
        db_dir=tmp_path / "db",
        clock=ManualClock(),
        range_limit=limit,
        appliers=APPLIERS,
    )
    first, second = StorageContainer(0, env), StorageContainer(1, env)  # 0 has the root too
    await first.start()
    await second.start()
    try:
        r1 = await first.data_range(1024, 1, 0)
        await r1.execute(put(b"k", b"1"))
        r2 = await second.data_range(1024, 2, 0)
        await r2.execute(put(b"k", b"2"))
        assert await first.data_range(1024, 1, 0) is r1  # used again: r2 is the oldest now
        r3 = await first.data_range(1024, 3, 0)
        assert (limit.open_count, limit.evictions) == (2, 1)
        assert set(first.ranges) == {(0, 0), (1, 0), (1024, 1), (1024, 3)}  # root, meta, data
        assert set(second.ranges) == {(1, 0)}
        with pytest.raises(UnavailableError, match="not serving"):
            value_of(r2, b"k")  # closed

        await r1.sessions.create(60_000)  # a live session keeps r1 open
        assert not r1.idle
        again = await second.data_range(1024, 2, 0)  # reopens r2, closing r3 (not r1)
        assert again is not r2 and value_of(again, b"k") == b"2"
        assert (1024, 3) not in first.ranges and first.ranges[(1024, 1)] is r1
        assert (limit.open_count, limit.evictions) == (2, 2)
        with pytest.raises(UnavailableError, match="not serving"):
            value_of(r3, b"k")
    finally:
        await first.stop()
        await second.stop()
    assert limit.open_count == 0


async def test_a_failed_root_range_reopens_by_itself(tmp_path: Path) -> None:
    """Standalone: the root range (namespaces, tables) runs out of disk space during a create;
    the next request starts reopening it and, once it is back, creates work again."""
    sync = DiskFullSync()
    env = ContainerEnv(
        num_containers=1,
        log_backend=LocalLogBackend(tmp_path / "wal", sync=sync),
        store_factory=RocksKvStore,
        db_dir=tmp_path / "db",
        clock=ManualClock(),
        appliers=APPLIERS,
    )
    registry = ContainerRegistry(env, [0])
    await registry.start()
    try:
        conf = stream_pb2.NamespaceConfiguration()
        await registry.root.create_namespace("before", conf)
        sync.full = True
        with pytest.raises(UnavailableError, match="No space left on device") as refused:
            await registry.root.create_namespace("refused", conf)
        assert not isinstance(refused.value, IndeterminateError)
        failed = registry.root  # this request starts the reopening
        assert failed.range.failed
        healing = registry.container(0).heal_catalogs()
        assert healing is not None
        await healing
        root = registry.root
        assert root is not failed and not root.range.failed
        await root.create_namespace("after", conf)
        assert root.get_namespace("before").namespace_name == "before"
        assert root.get_namespace("after").namespace_name == "after"
        with pytest.raises(NamespaceNotFoundError):
            root.get_namespace("refused")
    finally:
        await registry.stop()


@pytest.mark.parametrize("log_kept", [True, False], ids=["log-kept", "log-lost"])
async def test_a_range_restored_while_its_log_opens_numbers_on_from_both(
    tmp_path: Path, log_kept: bool
) -> None:
    """The local store gone (a takeover, a lost disk): the range restores its checkpoint while
    it opens its log. With the log kept, the tail after the checkpoint is replayed; with the
    log lost too, the range reopens it numbering on from the checkpoint (revisions never go
    back)."""
    path = tmp_path / "db" / "range"

    def new_range() -> Range:
        return checkpointed_range(tmp_path, LocalLogBackend(tmp_path / "wal"))

    range_ = new_range()
    await range_.open()
    for i in range(10):
        await range_.execute(put(b"k%d" % i, b"1"))
    assert await range_.checkpoint(force=True) is not None
    checkpointed = range_.applied_sequence
    await range_.execute(put(b"tail", b"2"))
    await range_.close()
    shutil.rmtree(path)
    if not log_kept:
        shutil.rmtree(tmp_path / "wal")

    range_ = new_range()
    await range_.open()
    assert range_.checkpointer is not None
    assert range_.checkpointer.stats.restored_from != ""
    assert value_of(range_, b"k9") == b"1"
    assert value_of(range_, b"tail") == (b"2" if log_kept else None)
    expected = checkpointed + 1 if log_kept else checkpointed
    assert range_.applied_sequence == expected
    response = await range_.execute(put(b"after", b"3"))
    assert isinstance(response, kv.PutResponse)
    assert range_.applied_sequence == expected + 1
    await range_.close()
