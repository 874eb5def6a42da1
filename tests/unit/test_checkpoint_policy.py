"""The checkpoint policy: a range is checkpointed after `records` commands or, changed, after
`interval_s`; on real ranges (RocksDB, a directory checkpoint store, the memory log)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, stream_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.checkpoint.manifest import Manifest
from tablekeeper_server.container.checkpoint_policy import (
    RETRY_S,
    CheckpointPolicy,
    CheckpointTriggers,
)
from tablekeeper_server.container.container import ContainerEnv
from tablekeeper_server.container.registry import ContainerRegistry
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.core.failpoints import Failpoints
from tablekeeper_server.errors import UnavailableError
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.range.replica import Range
from tablekeeper_server.storage.api import KvStore
from tablekeeper_server.storage.rocksdb import RocksKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

PKEY = b"hot"


class Server:
    """One server's registry (two containers) with a table of one range."""

    def __init__(self, root: Path, log: MemoryLogBackend | None = None) -> None:
        self.clock = ManualClock()
        self.log = log or MemoryLogBackend()
        self.registry = ContainerRegistry(
            ContainerEnv(
                num_containers=2,
                log_backend=self.log,
                store_factory=RocksKvStore,
                db_dir=root / "db",
                clock=self.clock,
                checkpoint_store=DirectoryCheckpointStore(root / "checkpoints"),
                failpoints=Failpoints(),
                appliers=APPLIERS,
            ),
            [0, 1],
        )
        self.stream = 0
        self.asked: list[str] = []

    async def start(self) -> Range:
        await self.registry.start()
        await self.registry.root.create_namespace("ns", stream_pb2.NamespaceConfiguration())
        conf = stream_pb2.StreamConfiguration(initial_num_ranges=1, storage_type=stream_pb2.TABLE)
        self.stream = (await self.registry.root.create_stream("ns", "t", conf)).stream_id
        return await self.registry.table_range(self.stream, PKEY)

    async def put(self, count: int) -> None:
        range_ = await self.registry.table_range(self.stream, PKEY)
        for i in range(count):
            request = kv_rpc_pb2.PutRequest(key=b"k%d" % (i % 7), value=b"v%d" % i)
            request.header.r_key = PKEY
            await range_.execute(wal_pb2.WalCommand(put=request))

    def policy(self, **triggers: float) -> CheckpointPolicy:
        async def checkpoint(range_: Range) -> None:
            self.asked.append(range_.name.log_name)
            await self.registry.checkpoint_range(range_)

        return CheckpointPolicy(
            self.registry.all_ranges,
            checkpoint,
            CheckpointTriggers(**triggers),  # type: ignore[arg-type]
            self.clock,
        )


async def test_a_range_is_checkpointed_once_it_applied_the_records(tmp_path: Path) -> None:
    server = Server(tmp_path)
    table = await server.start()
    policy = server.policy(interval_s=0, records=50)
    await server.policy(interval_s=0, records=1).check()  # everything written so far
    server.asked.clear()
    base = table.checkpointed_sequence
    assert base == table.applied_sequence

    await server.put(49)
    await policy.check()
    assert policy.checkpoints == 0 and server.asked == []
    assert table.checkpointed_sequence == base  # 49 behind: not yet

    await server.put(1)
    await policy.check()
    assert policy.checkpoints == 1 and server.asked[-1] == table.name.log_name
    assert table.checkpointed_sequence == table.applied_sequence == base + 50
    assert table.checkpointer is not None
    assert table.checkpointer.stats.applied_sequence == base + 50

    await policy.check()  # nothing new: nothing asked
    assert policy.checkpoints == 1
    await server.registry.stop()


async def test_a_changed_range_is_checkpointed_after_the_interval(tmp_path: Path) -> None:
    server = Server(tmp_path)
    table = await server.start()
    policy = server.policy(interval_s=60, records=0)
    await policy.check()  # first look: every range's interval starts now
    assert policy.checkpoints == 0
    await server.put(3)
    server.clock.advance(59)
    await policy.check()
    assert policy.checkpoints == 0
    server.clock.advance(1)
    await policy.check()
    checkpointed = set(server.asked)
    assert table.name.log_name in checkpointed
    assert table.checkpointed_sequence == table.applied_sequence

    server.asked.clear()
    server.clock.advance(120)  # unchanged since: not checkpointed again
    await policy.check()
    assert table.name.log_name not in server.asked
    await server.registry.stop()


async def test_the_range_furthest_behind_goes_first(tmp_path: Path) -> None:
    server = Server(tmp_path)
    table = await server.start()
    await server.put(20)
    policy = server.policy(interval_s=0, records=1)
    await policy.check()
    assert server.asked[0] == table.name.log_name  # 20 behind; the root and meta ranges less
    assert all(r.checkpointed_sequence == r.applied_sequence for r in server.registry.all_ranges())
    await server.registry.stop()


async def test_a_failed_checkpoint_is_retried_after_a_pause(tmp_path: Path) -> None:
    server = Server(tmp_path)
    table = await server.start()
    await server.put(10)
    failing = True
    tried: list[str] = []

    async def checkpoint(range_: Range) -> None:
        tried.append(range_.name.log_name)
        if failing:
            raise UnavailableError("the checkpoint store is unreachable")
        await server.registry.checkpoint_range(range_)

    policy = CheckpointPolicy(
        lambda: [table], checkpoint, CheckpointTriggers(interval_s=0, records=5), server.clock
    )
    await policy.check()
    assert tried == [table.name.log_name] and policy.checkpoints == 0
    failing = False
    server.clock.advance(RETRY_S - 1)
    await policy.check()
    assert len(tried) == 1  # still pausing
    server.clock.advance(1)
    await policy.check()
    assert len(tried) == 2 and policy.checkpoints == 1
    assert table.checkpointed_sequence == table.applied_sequence
    await server.registry.stop()


async def test_a_reopened_range_counts_from_where_it_opened(tmp_path: Path) -> None:
    """Before this server checkpointed a range, what it applied since the open is what counts
    (a restored checkpoint's position, or the local store's)."""
    server = Server(tmp_path)
    table = await server.start()
    await server.put(30)
    applied = table.applied_sequence
    await server.registry.stop()

    again = Server(tmp_path, server.log)
    await again.registry.start()
    again.stream = server.stream
    reopened = await again.registry.table_range(server.stream, PKEY)
    assert reopened.applied_sequence == applied
    assert reopened.checkpointed_sequence == applied  # the local store stood there
    policy = again.policy(interval_s=0, records=10)
    await policy.check()
    assert reopened.name.log_name not in again.asked
    await again.put(10)
    await policy.check()
    assert reopened.name.log_name in again.asked
    assert reopened.checkpointed_sequence == applied + 10
    await again.registry.stop()


def test_triggers_are_off_only_when_both_are_zero() -> None:
    assert CheckpointTriggers(interval_s=0, records=1).enabled
    assert CheckpointTriggers(interval_s=1, records=0).enabled
    assert not CheckpointTriggers(interval_s=0, records=0).enabled


async def test_a_close_after_a_cancelled_checkpoint_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown cancels the policy mid-checkpoint and then closes the ranges: the checkpoint's
    thread cannot be stopped, so the close must wait for it instead of closing the store under
    it."""
    server = Server(tmp_path)
    table = await server.start()
    await server.put(10)
    checkpointer = table.checkpointer
    assert checkpointer is not None
    started, release = threading.Event(), threading.Event()
    outcome: list[object] = []
    real = checkpointer.checkpoint

    def held_checkpoint(store: KvStore, **kwargs: bool) -> Manifest:
        started.set()
        release.wait(30)
        try:
            manifest = real(store, **kwargs)
        except BaseException as exc:
            outcome.append(exc)
            raise
        outcome.append(manifest)
        return manifest

    monkeypatch.setattr(checkpointer, "checkpoint", held_checkpoint)
    policy = server.policy(interval_s=0, records=5)
    checking = asyncio.create_task(policy.check())
    assert await asyncio.to_thread(started.wait, 30)
    checking.cancel()
    closing = asyncio.create_task(table.close())
    done, _ = await asyncio.wait({closing}, timeout=0.5)
    assert not done  # still waiting for the checkpoint's thread
    release.set()
    await closing
    with pytest.raises(asyncio.CancelledError):
        await checking
    assert len(outcome) == 1 and isinstance(outcome[0], Manifest), outcome
    await server.registry.stop()
