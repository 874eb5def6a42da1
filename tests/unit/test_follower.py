"""Followers over real ranges (RocksDB stores, a checkpoint directory, an in-memory log shared as
Pulsar's is by servers): what a follower read sees at each staleness bound, the log cut under
a follower, a split's seal reaching it, and a new owner taking its store over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.checkpoint.directory import DirectoryCheckpointStore
from tablekeeper_server.container.followers import Followers
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import RangeMovedError
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.range.checkpoint import RangeCheckpointer
from tablekeeper_server.range.follower import Follower
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.storage.rocksdb import RocksKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit

NAME = RangeName(1, 1024, 2048)
NEVER = 3600.0  # a follower that polls only when a read asks it to


@dataclass
class Env:
    root: Path
    log: MemoryLogBackend
    checkpoints: DirectoryCheckpointStore
    clock: ManualClock

    def checkpointer(self, path: Path) -> RangeCheckpointer:
        return RangeCheckpointer(
            NAME.log_name, path, RocksKvStore, self.checkpoints, self.log, self.clock
        )

    def range(self, path: Path) -> Range:
        return Range(
            NAME,
            self.log,
            lambda: RocksKvStore(path),
            self.clock,
            checkpointer=self.checkpointer(path),
            appliers=APPLIERS,
        )

    def follower(self, name: str = "follower", idle_poll_s: float = NEVER) -> Follower:
        path = self.root / name
        return Follower(
            NAME,
            path,
            log_backend=self.log,
            store_factory=RocksKvStore,
            checkpointer=self.checkpointer(path),
            clock=self.clock,
            idle_poll_s=idle_poll_s,
            appliers=APPLIERS,
        )


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(
        tmp_path, MemoryLogBackend(), DirectoryCheckpointStore(tmp_path / "cp"), ManualClock()
    )


@pytest.fixture
async def owner(env: Env) -> AsyncIterator[Range]:
    range_ = env.range(env.root / "owner")
    await range_.open()
    yield range_
    await range_.close()


async def put(range_: Range, lkey: bytes, value: bytes) -> None:
    request = kv_rpc_pb2.PutRequest(key=lkey, value=value)
    request.header.r_key = b"p"
    await range_.execute(wal_pb2.WalCommand(put=request))


def get(lkey: bytes) -> kv_rpc_pb2.RangeRequest:
    return kv_rpc_pb2.RangeRequest(key=lkey, header=kv_rpc_pb2.RoutingHeader(r_key=b"p"))


def value(response: kv_rpc_pb2.RangeResponse) -> bytes | None:
    return response.kvs[0].value if response.kvs else None


async def test_restores_the_checkpoint_and_applies_the_log_after_it(env: Env, owner: Range) -> None:
    for i in range(50):
        await put(owner, f"k{i}".encode(), b"before")
    await owner.checkpoint()
    for i in range(25, 75):
        await put(owner, f"k{i}".encode(), b"after")
    follower = env.follower()
    await follower.open()
    try:
        assert follower.restores == 1
        assert follower.applied_sequence == owner.applied_sequence  # caught up before serving
        got = await follower.read(get(b"k10"), max_staleness_s=NEVER)
        assert value(got.response) == b"before"
        got = await follower.read(get(b"k60"), max_staleness_s=NEVER)
        assert value(got.response) == b"after"
        assert got.applied == owner.applied_sequence
    finally:
        await follower.close()


async def test_each_staleness_bound(env: Env, owner: Range) -> None:
    await put(owner, b"k", b"v1")
    follower = env.follower()
    await follower.open()
    try:
        await put(owner, b"k", b"v2")  # acknowledged; the follower has not asked the log since
        stale = await follower.read(get(b"k"), max_staleness_s=NEVER)
        assert value(stale.response) == b"v1"
        assert stale.applied == owner.applied_sequence - 1
        assert stale.staleness_s >= 0
        # Linearizable: catches up with everything acknowledged before the read began.
        fresh = await follower.read(get(b"k"), max_staleness_s=0)
        assert value(fresh.response) == b"v2"
        assert fresh.applied == owner.applied_sequence
        # A position another server showed this client: the follower waits until it has it.
        await put(owner, b"k", b"v3")
        seen = await follower.read(
            get(b"k"), max_staleness_s=NEVER, min_applied=owner.applied_sequence
        )
        assert value(seen.response) == b"v3"
    finally:
        await follower.close()


async def test_follower_polling_by_itself_stays_within_its_idle_interval(
    env: Env, owner: Range
) -> None:
    follower = env.follower(idle_poll_s=0.01)
    await follower.open()
    try:
        await put(owner, b"k", b"v")
        # Nothing pokes it: it reaches the write by its own polling, each poll one idle
        # interval after the last on the server's clock (moved here, a step at a time).
        applied = asyncio.ensure_future(
            follower._applied_at_least(owner.applied_sequence, poke=False)
        )
        await asyncio.wait({applied}, timeout=0.05)
        assert not applied.done()  # its clock has not moved: no poll since the write
        while not applied.done():
            env.clock.advance(0.01)
            await asyncio.wait({applied}, timeout=0.05)  # (lets the poll's thread run)
        await applied
        got = await follower.read(get(b"k"), max_staleness_s=NEVER)
        assert value(got.response) == b"v"
    finally:
        await follower.close()


async def test_log_cut_past_the_follower_restores_the_newest_checkpoint(
    env: Env, owner: Range
) -> None:
    await put(owner, b"k", b"v1")
    follower = env.follower()
    await follower.open()
    try:
        for i in range(20):
            await put(owner, f"x{i}".encode(), b"x")
        await put(owner, b"k", b"v2")
        await owner.checkpoint()
        await put(owner, b"y", b"y")
        await owner.checkpoint()  # the log now starts after what the follower applied
        assert min(r.sequence for r in env.log.read(NAME.log_name, 0)) > (
            follower.applied_sequence + 1
        )
        got = await follower.read(get(b"k"), max_staleness_s=0)
        assert value(got.response) == b"v2"
        assert follower.restores == 2
        assert got.applied == owner.applied_sequence
    finally:
        await follower.close()


async def test_a_split_seal_reaches_the_follower(env: Env, owner: Range) -> None:
    await put(owner, b"k", b"v")
    follower = env.follower()
    await follower.open()
    try:
        await owner.seal((4000, 4001))
        with pytest.raises(RangeMovedError):
            await follower.read(get(b"k"), max_staleness_s=0)
    finally:
        await follower.close()


async def test_new_owner_takes_the_followers_store(env: Env) -> None:
    old_owner = env.range(env.root / "owner")
    await old_owner.open()
    for i in range(30):
        await put(old_owner, f"k{i}".encode(), f"v{i}".encode())
    await old_owner.checkpoint()
    followers = Followers(
        env.root / "followers",
        log_backend=env.log,
        store_factory=RocksKvStore,
        checkpoint_store=env.checkpoints,
        clock=env.clock,
        appliers=APPLIERS,
    )
    followers.start()
    try:
        follower = await followers.get(NAME, 0)
        for i in range(30, 40):
            await put(old_owner, f"k{i}".encode(), f"v{i}".encode())
        await follower.read(get(b"k0"), max_staleness_s=0)
        await put(old_owner, b"k40", b"v40")  # acknowledged; the follower has not seen it
        # The owner dies (not closed: nothing flushed); this server takes the range over.
        new_path = env.root / "new-owner"
        assert await followers.hand_over(NAME.log_name, new_path)
        assert followers.open_count == 0
        new_owner = env.range(new_path)
        new_owner.checkpointer.files_unknown = True  # type: ignore[union-attr]
        await new_owner.open()  # fences the old writer, replays the one record it lacked
        try:
            for i in range(41):
                response = new_owner.read(get(f"k{i}".encode()))
                assert value(response) == f"v{i}".encode()
            # Its first checkpoint hashes the adopted files instead of trusting their names:
            # a store restored from it holds the same keys.
            await put(new_owner, b"k41", b"v41")
            await new_owner.checkpoint(force=True)
            assert not new_owner.checkpointer.files_unknown  # type: ignore[union-attr]
            check = env.checkpointer(env.root / "check")
            check.restore()
            store = RocksKvStore(env.root / "check")
            try:
                sm = RangeStateMachine(store, APPLIERS)
                for i in range(42):
                    assert value(sm.read(get(f"k{i}".encode()), 0)) == f"v{i}".encode()
            finally:
                store.close()
        finally:
            await new_owner.close()
    finally:
        await followers.stop()
        await old_owner.close()
