"""A serving range over the in-memory log and store: group commit, recovery, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2 as kv
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.errors import (
    IndeterminateError,
    RangeMovedError,
    ResourceLimitError,
    UnavailableError,
)
from tablekeeper_server.log.api import LogRecord, LogWriter
from tablekeeper_server.log.memory import MemoryLogBackend
from tablekeeper_server.range.replica import Range, RangeName
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS

pytestmark = pytest.mark.unit
NAME = RangeName(3, 1024, 1025)


class CountingBackend:
    """The memory backend, counting appends (how many group commits happened)."""

    def __init__(self) -> None:
        self.inner = MemoryLogBackend()
        self.appends: list[int] = []

    def open_writer(self, log_name: str, *, min_last_sequence: int = 0) -> LogWriter:
        writer = self.inner.open_writer(log_name, min_last_sequence=min_last_sequence)
        backend = self

        class Counting:
            @property
            def last_sequence(self) -> int:
                return writer.last_sequence

            async def append(self, payloads: Sequence[bytes]) -> int:
                backend.appends.append(len(payloads))
                return await writer.append(payloads)

            async def close(self) -> None:
                await writer.close()

            def close_sync(self) -> None:
                writer.close_sync()

        return Counting()

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        return self.inner.read(log_name, from_sequence)

    def truncate(self, log_name: str, before_sequence: int) -> None:
        self.inner.truncate(log_name, before_sequence)

    def delete(self, log_name: str) -> None:
        self.inner.delete(log_name)


def put(key: bytes, value: bytes = b"v") -> wal_pb2.WalCommand:
    return wal_pb2.WalCommand(
        put=kv.PutRequest(key=key, value=value, header=kv.RoutingHeader(r_key=b"p"))
    )


def incr(key: bytes) -> wal_pb2.WalCommand:
    header = kv.RoutingHeader(r_key=b"p")
    return wal_pb2.WalCommand(increment=kv.IncrementRequest(key=key, amount=1, header=header))


def read(range_: Range, key: bytes) -> kv.RangeResponse:
    return range_.read(kv.RangeRequest(key=key, header=kv.RoutingHeader(r_key=b"p")))


async def open_range(backend: object, store: MemoryKvStore) -> Range:
    range_ = Range(NAME, backend, lambda: store, ManualClock(), appliers=APPLIERS)  # type: ignore[arg-type]
    await range_.open()
    return range_


async def test_concurrent_writes_share_group_commits() -> None:
    backend = CountingBackend()
    range_ = await open_range(backend, MemoryKvStore())
    responses = await asyncio.gather(*(range_.execute(put(b"k%03d" % i)) for i in range(500)))
    assert all(r.header.code == 0 for r in responses)
    assert sum(backend.appends) == 500
    assert len(backend.appends) < 50, backend.appends  # many commands per fsync
    assert range_.applied_sequence == 500
    await range_.close()


async def test_submit_many_is_one_queue_entry_answered_per_command_in_order() -> None:
    """A Batch's writes on one range go in as one entry: one future with each command's own
    outcome in order (a refusal before queueing, a response, an apply's rejection), and they
    share group commits with the range's single writes."""
    backend = CountingBackend()
    store = MemoryKvStore()
    range_ = Range(
        NAME,
        backend,  # type: ignore[arg-type]
        lambda: store,
        ManualClock(),
        response_bytes_max=600,
        appliers=APPLIERS,
    )
    await range_.open()
    await range_.execute(put(b"big", b"x" * 500))
    await range_.execute(put(b"big2", b"y" * 500))
    span = wal_pb2.WalCommand(
        delete_range=kv.DeleteRangeRequest(
            key=b"big", range_end=b"big3", prev_kv=True, header=kv.RoutingHeader(r_key=b"p")
        )
    )
    single = asyncio.ensure_future(range_.execute(put(b"solo")))
    future = range_.submit_many([put(b"a", b"1"), span, incr(b"n"), put(b"a", b"2")])
    assert future is not None
    outcomes, solo = await future, await single
    assert solo.header.code == 0
    assert isinstance(outcomes[1], ResourceLimitError)  # its prev_kvs: refused, never logged
    first, third, fourth = outcomes[0], outcomes[2], outcomes[3]
    assert not isinstance(first, Exception) and not isinstance(fourth, Exception)
    assert not isinstance(third, Exception)
    assert (first.header.code, third.header.code, fourth.header.code) == (0, 0, 0)
    assert read(range_, b"a").kvs[0].value == b"2"  # applied in the order given
    assert read(range_, b"a").kvs[0].version == 1
    assert read(range_, b"big").count == 1  # the refused delete changed nothing
    assert sum(backend.appends) == range_.applied_sequence == 2 + 1 + 3
    await range_.close()


async def test_a_one_command_entry_is_answered_as_a_list() -> None:
    """Alone in its group or beside single writes, an entry of one command is still an entry:
    its future carries a list."""
    range_ = await open_range(MemoryLogBackend(), MemoryKvStore())
    alone = range_.submit_many([put(b"a")])
    assert alone is not None
    [response] = await alone
    assert not isinstance(response, Exception) and response.header.code == 0
    single = asyncio.ensure_future(range_.execute(put(b"b")))  # queued when it first runs,
    beside = range_.submit_many([put(b"c")])  # after this entry: one group holds both
    assert beside is not None
    assert [type(outcome) for outcome in await beside] == [kv.PutResponse]
    assert (await single).header.code == 0
    await range_.close()


async def test_submit_many_after_a_queued_seal_is_refused_per_command() -> None:
    """Commands queued behind a split's seal reach the log after it: the apply refuses each
    (range moved), and each command of the entry is answered so."""
    range_ = await open_range(MemoryLogBackend(), MemoryKvStore())
    sealing = range_.submit_many([wal_pb2.WalCommand(seal=wal_pb2.RangeSeal(children=[7, 8]))])
    assert sealing is not None  # queued, not applied yet
    future = range_.submit_many([put(b"a"), put(b"b")])
    assert future is not None
    outcomes = await future
    [sealed] = await sealing
    assert not isinstance(sealed, Exception) and sealed.header.code == 0
    assert [type(outcome) for outcome in outcomes] == [RangeMovedError, RangeMovedError]
    with pytest.raises(RangeMovedError):
        range_.submit_many([put(b"c")])  # sealed now: the range refuses before queueing
    await range_.close()


async def test_submit_many_fails_as_a_whole_when_the_log_fails() -> None:
    backend = MemoryLogBackend()
    range_ = await open_range(backend, MemoryKvStore())
    backend.fail_next_append(NAME.log_name, persist=True)
    future = range_.submit_many([put(b"a"), put(b"b")])
    assert future is not None
    with pytest.raises(IndeterminateError):
        await future
    with pytest.raises(UnavailableError):
        range_.submit_many([put(b"c")])
    await range_.close()


async def test_a_lost_store_is_rebuilt_from_the_log() -> None:
    backend = MemoryLogBackend()
    range_ = await open_range(backend, MemoryKvStore())
    await asyncio.gather(*(range_.execute(incr(b"n")) for _ in range(100)))
    await range_.execute(put(b"a", b"1"))
    await range_.close()

    rebuilt = await open_range(backend, MemoryKvStore())  # the store is gone, the log is not
    assert read(rebuilt, b"n").kvs[0].number_value == 100
    assert read(rebuilt, b"a").kvs[0].mod_revision == 101
    await rebuilt.execute(put(b"a", b"2"))
    assert read(rebuilt, b"a").kvs[0].version == 1
    await rebuilt.close()


async def test_restart_with_a_stale_store_replays_only_the_tail() -> None:
    backend = MemoryLogBackend()
    store = MemoryKvStore()
    range_ = await open_range(backend, store)
    for _ in range(10):
        await range_.execute(incr(b"n"))
    await range_.close()
    reopened = await open_range(backend, store)
    assert read(reopened, b"n").kvs[0].number_value == 10  # nothing applied twice
    await reopened.close()


async def test_failed_append_is_indeterminate_and_stops_the_range() -> None:
    backend = MemoryLogBackend()
    range_ = await open_range(backend, MemoryKvStore())
    await range_.execute(put(b"a"))
    backend.fail_next_append(NAME.log_name, persist=True)
    with pytest.raises(IndeterminateError):
        await range_.execute(incr(b"n"))
    assert range_.failed
    with pytest.raises(UnavailableError):
        await range_.execute(put(b"b"))
    with pytest.raises(UnavailableError):
        read(range_, b"a")
    await range_.close()
    # The record did reach the log: a recovered range applies it exactly once.
    recovered = await open_range(backend, MemoryKvStore())
    assert read(recovered, b"n").kvs[0].number_value == 1
    await recovered.close()


async def test_a_fenced_range_refuses_writes_without_applying_them() -> None:
    backend = MemoryLogBackend()
    old = await open_range(backend, MemoryKvStore())
    await old.execute(put(b"a", b"old"))
    new = await open_range(backend, MemoryKvStore())
    with pytest.raises(UnavailableError) as raised:
        await old.execute(put(b"a", b"stale"))
    assert not isinstance(raised.value, IndeterminateError)
    assert read(new, b"a").kvs[0].value == b"old"
    await new.execute(put(b"a", b"new"))
    assert read(new, b"a").kvs[0].version == 1
    await old.close()
    await new.close()


async def test_close_finishes_queued_writes() -> None:
    backend = MemoryLogBackend()
    store = MemoryKvStore()
    range_ = await open_range(backend, store)
    pending = [asyncio.create_task(range_.execute(put(b"k%d" % i))) for i in range(50)]
    await asyncio.sleep(0)
    await range_.close()
    results = await asyncio.gather(*pending, return_exceptions=True)
    done = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, UnavailableError)]
    assert len(done) + len(refused) == 50
    reopened = await open_range(backend, MemoryKvStore())
    assert reopened.applied_sequence == len(done)
    await reopened.close()


class GatedBackend:
    """The memory backend whose appends wait for `gate`, then fail with `error` if it is set, or
    return `sequence_shift` more than the log really assigned (a log that misnumbers)."""

    def __init__(self) -> None:
        self.inner = MemoryLogBackend()
        self.gate = asyncio.Event()
        self.error: Exception | None = None
        self.sequence_shift = 0
        self.appends = 0

    def open_writer(self, log_name: str, *, min_last_sequence: int = 0) -> LogWriter:
        writer = self.inner.open_writer(log_name, min_last_sequence=min_last_sequence)
        backend = self

        class Gated:
            @property
            def last_sequence(self) -> int:
                return writer.last_sequence

            async def append(self, payloads: Sequence[bytes]) -> int:
                backend.appends += 1
                await backend.gate.wait()
                if backend.error is not None:
                    raise backend.error
                return await writer.append(payloads) + backend.sequence_shift

            async def close(self) -> None:
                await writer.close()

            def close_sync(self) -> None:
                writer.close_sync()

        return Gated()

    def read(self, log_name: str, from_sequence: int) -> Iterator[LogRecord]:
        return self.inner.read(log_name, from_sequence)

    def truncate(self, log_name: str, before_sequence: int) -> None:
        self.inner.truncate(log_name, before_sequence)

    def delete(self, log_name: str) -> None:
        self.inner.delete(log_name)


async def until_appending(backend: GatedBackend, appends: int = 1) -> None:
    async with asyncio.timeout(10):
        while backend.appends < appends:
            await asyncio.sleep(0)


async def test_callers_waiting_for_queue_room_are_answered_when_the_range_fails() -> None:
    backend = GatedBackend()
    range_ = Range(
        NAME,
        backend,  # type: ignore[arg-type]
        MemoryKvStore,
        ManualClock(),
        queue_depth_max=2,
        appliers=APPLIERS,
    )
    await range_.open()
    callers = [asyncio.create_task(range_.execute(put(b"k%d" % i))) for i in range(10)]
    await until_appending(backend)  # one group is in the log; 2 queued; the rest wait for room
    backend.error = OSError("disk gone")
    backend.gate.set()
    async with asyncio.timeout(10):  # nobody is stranded
        results = await asyncio.gather(*callers, return_exceptions=True)
    # The group in the log when it failed: outcome unknown; everything queued or waiting for
    # room behind it: refused, never appended.
    assert all(isinstance(r, (IndeterminateError, UnavailableError)) for r in results), results
    indeterminate = [r for r in results if isinstance(r, IndeterminateError)]
    assert 1 <= len(indeterminate) <= 3
    assert backend.appends == 1
    assert range_.failed
    await range_.close()


async def test_callers_behind_close_are_answered_and_never_applied() -> None:
    backend = GatedBackend()
    range_ = Range(
        NAME,
        backend,  # type: ignore[arg-type]
        MemoryKvStore,
        ManualClock(),
        queue_depth_max=2,
        appliers=APPLIERS,
    )
    await range_.open()
    callers = [asyncio.create_task(range_.execute(put(b"k%d" % i))) for i in range(10)]
    await until_appending(backend)
    closing = asyncio.create_task(range_.close())  # its sentinel waits for room, too
    await asyncio.sleep(0)
    backend.gate.set()
    async with asyncio.timeout(10):
        results = await asyncio.gather(*callers, return_exceptions=True)
        await closing
    applied = [r for r in results if not isinstance(r, BaseException)]
    assert all(isinstance(r, UnavailableError) for r in results if isinstance(r, BaseException))
    assert applied and all(r.header.code == 0 for r in applied)
    reopened = await open_range(backend.inner, MemoryKvStore())
    assert reopened.applied_sequence == len(applied)  # exactly the acknowledged ones
    await reopened.close()


async def test_a_group_the_log_misnumbers_is_never_acknowledged() -> None:
    backend = GatedBackend()
    backend.gate.set()
    store = MemoryKvStore()
    range_ = Range(NAME, backend, lambda: store, ManualClock(), appliers=APPLIERS)  # type: ignore[arg-type]
    await range_.open()
    await range_.execute(put(b"a"))
    backend.sequence_shift = 5  # claims records 7.. for what follows 1
    with pytest.raises(IndeterminateError, match="after applied position 1"):
        await range_.execute(put(b"b"))
    assert range_.failed
    await range_.close()
    assert read(await open_range(backend.inner, MemoryKvStore()), b"a").kvs
