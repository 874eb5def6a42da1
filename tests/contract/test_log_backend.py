"""The `LogBackend` contract, run against every backend (`memory`, `local`, `pulsar`).

The `pulsar` runs use the session's real Pulsar (tests/support/pulsar.py) and a fresh Pulsar
namespace per test; "restart" there is a new backend (a new client) on the same namespace.

Fencing contract (the same for all): opening a writer on a log fences the earlier writer of
that log held by the same process; the earlier writer then raises `LogFencedError` on every
append, its `close` does not disturb the new writer, and the new writer continues the numbering
from the last durable record. (The local backend additionally refuses, with `LogLockedError`, a
log whose LOCK another process holds; see tests/unit/test_wal_local.py.)
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tablekeeper_server.errors import LogFencedError, UnavailableError
from tablekeeper_server.log.api import LogBackend, LogRecord
from tablekeeper_server.log.local import LocalLogBackend
from tablekeeper_server.log.memory import MemoryLogBackend
from tests.support.pulsar import PulsarService, unique_namespace

pytestmark = pytest.mark.contract

T = TypeVar("T")
LOG = "range-1"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@dataclass
class Harness:
    """A backend plus the means to restart it and to make the next append fail."""

    kind: str
    make: Callable[[], LogBackend]
    fail_next_append: Callable[[str], None]
    backend: LogBackend = field(init=False)

    def __post_init__(self) -> None:
        self.backend = self.make()

    def restart(self) -> LogBackend:
        """A backend over the same durable state (a process restart, for `local`)."""
        self.backend = self.make()
        return self.backend


class _FailingSync:
    def __init__(self) -> None:
        self.fail_next = False
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            failing, self.fail_next = self.fail_next, False
        if failing:
            raise OSError(errno.EIO, "injected fsync failure")
        os.fdatasync(fd)


@pytest.fixture(params=["memory", "local", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "memory":
        memory = MemoryLogBackend()
        yield Harness("memory", lambda: memory, memory.fail_next_append)
    elif request.param == "pulsar":
        yield from _pulsar_harness(request.getfixturevalue("pulsar_service"))
    else:
        sync = _FailingSync()

        def make() -> LogBackend:
            # Small segments so that rolling and truncation take part in every test.
            return LocalLogBackend(tmp_path / "logs", segment_bytes_max=4096, sync=sync)

        def fail(_log_name: str) -> None:
            sync.fail_next = True

        yield Harness("local", make, fail)


def _pulsar_harness(service: PulsarService) -> Iterator[Harness]:
    from tablekeeper_server.log.pulsar import PulsarLogBackend

    namespace = unique_namespace("contract")
    backends: list[PulsarLogBackend] = []

    def make() -> LogBackend:
        backend = PulsarLogBackend(
            service.service_url, service.admin_url, namespace=namespace, timeout_s=10
        )
        backends.append(backend)
        return backend

    def fail(log_name: str) -> None:
        backends[-1].fail_next_append(log_name)

    yield Harness("pulsar", make, fail)
    for backend in backends:
        backend.close()


def payload(sequence: int) -> bytes:
    return f"command-{sequence}".encode() * 3


def sequences(records: Iterator[LogRecord]) -> list[int]:
    return [record.sequence for record in records]


async def fill(backend: LogBackend, count: int, *, group: int = 1) -> int:
    writer = backend.open_writer(LOG)
    try:
        start = writer.last_sequence + 1
        last = writer.last_sequence
        batch: list[bytes] = []
        for sequence in range(start, start + count):
            batch.append(payload(sequence))
            if len(batch) == group:
                last = await writer.append(batch)
                batch = []
        if batch:
            last = await writer.append(batch)
        return last
    finally:
        await writer.close()


def test_new_log_numbers_from_one_consecutively(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        assert writer.last_sequence == 0
        assert await writer.append([b"a"]) == 1
        assert await writer.append([b"b", b"c", b"d"]) == 4
        assert await writer.append([]) == 4
        assert writer.last_sequence == 4
        assert await writer.append([b"e"]) == 5
        await writer.close()

    run(scenario())
    records = list(harness.backend.read(LOG, 1))
    assert records == [
        LogRecord(1, b"a"),
        LogRecord(2, b"b"),
        LogRecord(3, b"c"),
        LogRecord(4, b"d"),
        LogRecord(5, b"e"),
    ]


def test_numbering_continues_across_reopen_and_restart(harness: Harness) -> None:
    async def scenario() -> None:
        assert await fill(harness.backend, 7, group=3) == 7
        writer = harness.backend.open_writer(LOG)
        assert writer.last_sequence == 7
        assert await writer.append([b"x"]) == 8
        await writer.close()
        backend = harness.restart()
        writer = backend.open_writer(LOG)
        assert writer.last_sequence == 8
        assert await writer.append([b"y", b"z"]) == 10
        await writer.close()

    run(scenario())
    assert sequences(harness.backend.read(LOG, 1)) == list(range(1, 11))
    assert [r.payload for r in harness.backend.read(LOG, 8)] == [b"x", b"y", b"z"]


def test_read_from_any_position(harness: Harness) -> None:
    run(fill(harness.backend, 60, group=7))
    everything = list(harness.backend.read(LOG, 1))
    assert everything == [LogRecord(s, payload(s)) for s in range(1, 61)]
    for start in [-5, 0, 1, 2, 7, 8, 30, 59, 60]:
        expected = [r for r in everything if r.sequence >= start]
        assert list(harness.backend.read(LOG, start)) == expected
    for start in [61, 1000]:
        assert list(harness.backend.read(LOG, start)) == []


def test_read_of_unknown_log_is_empty(harness: Harness) -> None:
    assert list(harness.backend.read("no-such-log", 1)) == []


def test_read_sees_appends_made_while_a_writer_is_open(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        await writer.append([b"one", b"two"])
        assert sequences(harness.backend.read(LOG, 1)) == [1, 2]
        await writer.append([b"three"])
        assert sequences(harness.backend.read(LOG, 2)) == [2, 3]
        await writer.close()

    run(scenario())


def test_first_read_after_a_takeover_yields_the_whole_log(harness: Harness) -> None:
    # A new owner opens the log (the Pulsar backend's recovery scan reads every record to fence
    # it) and then replays from its store's position: that first read must be exact.
    run(fill(harness.backend, 40, group=6))
    harness.backend.truncate(LOG, 10)
    for start in [0, 17, 40, 41]:
        backend = harness.restart()
        writer = backend.open_writer(LOG)
        tail = list(backend.read(LOG, start))
        # Truncation is coarse: below the point, some records may remain.
        first = tail[0].sequence if start < 10 else start
        assert first <= max(start, 10)
        assert tail == [LogRecord(s, payload(s)) for s in range(max(first, 1), 41)]
        # A second read yields the same (from Pulsar again).
        assert list(backend.read(LOG, start)) == tail
        run(writer.close())


def test_first_read_after_reopen_sees_appends_made_before_it(harness: Harness) -> None:
    async def scenario() -> None:
        await fill(harness.backend, 5)
        backend = harness.restart()
        writer = backend.open_writer(LOG)
        assert await writer.append([b"six"]) == 6
        assert sequences(backend.read(LOG, 1)) == [1, 2, 3, 4, 5, 6]
        await writer.close()

    run(scenario())


def test_truncate_keeps_every_record_at_or_after_the_point(harness: Harness) -> None:
    run(fill(harness.backend, 200, group=5))
    harness.backend.truncate(LOG, 150)
    remaining = sequences(harness.backend.read(LOG, 1))
    assert remaining[0] <= 150
    assert remaining == list(range(remaining[0], 201))
    # Reading from a truncated position starts at the first record still held.
    assert sequences(harness.backend.read(LOG, 1))[0] == remaining[0]
    assert sequences(harness.backend.read(LOG, 160)) == list(range(160, 201))
    # Truncating again at the same point, or below it, changes nothing that is required.
    harness.backend.truncate(LOG, 150)
    harness.backend.truncate(LOG, 3)
    assert sequences(harness.backend.read(LOG, 150)) == list(range(150, 201))


def test_truncate_past_the_end_keeps_the_last_sequence(harness: Harness) -> None:
    async def scenario() -> None:
        await fill(harness.backend, 120, group=4)
        harness.backend.truncate(LOG, 10**9)
        remaining = sequences(harness.backend.read(LOG, 1))
        assert remaining[-1] == 120
        assert remaining == list(range(remaining[0], 121))
        backend = harness.restart()
        writer = backend.open_writer(LOG)
        assert writer.last_sequence == 120
        assert await writer.append([b"next"]) == 121
        await writer.close()
        backend.truncate(LOG, 10**9)
        assert sequences(backend.read(LOG, 121)) == [121]

    run(scenario())


def test_truncate_of_unknown_or_empty_log_is_a_no_op(harness: Harness) -> None:
    harness.backend.truncate("no-such-log", 100)
    writer = harness.backend.open_writer(LOG)
    harness.backend.truncate(LOG, 100)
    assert writer.last_sequence == 0
    run(writer.close())
    assert list(harness.backend.read(LOG, 1)) == []


def test_min_last_sequence_on_a_new_log(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG, min_last_sequence=41)
        assert writer.last_sequence == 41
        assert await writer.append([b"first"]) == 42
        await writer.close()
        writer = harness.restart().open_writer(LOG)
        assert writer.last_sequence == 42
        await writer.close()

    run(scenario())
    assert list(harness.backend.read(LOG, 1)) == [LogRecord(42, b"first")]


def test_min_last_sequence_survives_restart_without_appends(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG, min_last_sequence=9)
        await writer.close()
        writer = harness.restart().open_writer(LOG)
        assert writer.last_sequence == 9
        assert await writer.append([b"a"]) == 10
        await writer.close()

    run(scenario())


def test_min_last_sequence_raises_but_never_lowers_the_numbering(harness: Harness) -> None:
    async def scenario() -> None:
        await fill(harness.backend, 3)
        writer = harness.backend.open_writer(LOG, min_last_sequence=2)
        assert writer.last_sequence == 3
        await writer.close()
        writer = harness.backend.open_writer(LOG, min_last_sequence=100)
        assert writer.last_sequence == 100
        assert await writer.append([b"late"]) == 101
        await writer.close()
        writer = harness.restart().open_writer(LOG)
        assert writer.last_sequence == 101
        await writer.close()

    run(scenario())
    # Records already held stay readable; the numbering jumps.
    assert sequences(harness.backend.read(LOG, 1)) == [1, 2, 3, 101]
    assert sequences(harness.backend.read(LOG, 50)) == [101]


def test_min_last_sequence_must_not_be_negative(harness: Harness) -> None:
    with pytest.raises(ValueError):
        harness.backend.open_writer(LOG, min_last_sequence=-1)


def test_second_writer_fences_the_first(harness: Harness) -> None:
    async def scenario() -> None:
        first = harness.backend.open_writer(LOG)
        assert await first.append([b"a", b"b"]) == 2
        second = harness.backend.open_writer(LOG)
        assert second.last_sequence == 2
        with pytest.raises(LogFencedError):
            await first.append([b"lost"])
        with pytest.raises(LogFencedError):
            await first.append([b"lost again"])
        assert await second.append([b"c"]) == 3
        await first.close()  # must not disturb the new owner
        assert await second.append([b"d"]) == 4
        await second.close()

    run(scenario())
    assert [r.payload for r in harness.backend.read(LOG, 1)] == [b"a", b"b", b"c", b"d"]


def test_fenced_error_is_an_unavailable_error(harness: Harness) -> None:
    async def scenario() -> None:
        first = harness.backend.open_writer(LOG)
        harness.backend.open_writer(LOG)
        with pytest.raises(UnavailableError):
            await first.append([b"x"])

    run(scenario())


def test_an_append_after_the_takeover_is_known_not_to_be_in_the_log(harness: Harness) -> None:
    # The next owner (a new backend over the same state: another client for Pulsar) has fenced
    # the log before the old writer's append: that append fails, and says that none of its
    # records is in the log, so its callers may retry them with the new owner.
    async def scenario() -> None:
        old = harness.backend.open_writer(LOG)
        assert await old.append([b"a", b"b"]) == 2
        new = harness.restart().open_writer(LOG)
        with pytest.raises(LogFencedError) as fenced:
            await old.append([b"lost"])
        assert not fenced.value.maybe_persisted, fenced.value
        assert await new.append([b"c"]) == 3
        await old.close()
        await new.close()

    run(scenario())
    assert [r.payload for r in harness.backend.read(LOG, 1)] == [b"a", b"b", b"c"]


def test_payload_sizes_round_trip(harness: Harness) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB
    payloads = [b"", big, b"\x00", b"", bytes(range(256)), big[:-1]]

    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        assert await writer.append(payloads[:3]) == 3
        assert await writer.append(payloads[3:]) == 6
        await writer.close()

    run(scenario())
    expected = [LogRecord(i, p) for i, p in enumerate(payloads, start=1)]
    assert list(harness.backend.read(LOG, 1)) == expected
    assert list(harness.restart().read(LOG, 1)) == expected


def test_payloads_are_copied(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        buffer = bytearray(b"before")
        await writer.append([bytes(buffer), buffer])  # type: ignore[list-item]
        buffer[:] = b"after!"
        await writer.close()

    run(scenario())
    assert [r.payload for r in harness.backend.read(LOG, 1)] == [b"before", b"before"]


def test_delete_removes_the_log_and_fences_its_writer(harness: Harness) -> None:
    async def scenario() -> None:
        await fill(harness.backend, 30, group=3)
        writer = harness.backend.open_writer(LOG)
        harness.backend.delete(LOG)
        with pytest.raises(LogFencedError):
            await writer.append([b"after delete"])
        await writer.close()
        assert list(harness.backend.read(LOG, 1)) == []
        fresh = harness.restart().open_writer(LOG)
        assert fresh.last_sequence == 0
        assert await fresh.append([b"new"]) == 1
        await fresh.close()
        harness.backend.delete(LOG)
        harness.backend.delete(LOG)  # idempotent
        harness.backend.delete("never-existed")

    run(scenario())
    assert list(harness.backend.read(LOG, 1)) == []


def test_logs_are_independent(harness: Harness) -> None:
    async def scenario() -> None:
        a = harness.backend.open_writer("a")
        b = harness.backend.open_writer("b")
        assert await a.append([b"a1"]) == 1
        assert await b.append([b"b1", b"b2"]) == 2
        assert await a.append([b"a2"]) == 2
        harness.backend.delete("b")
        assert await a.append([b"a3"]) == 3
        await a.close()
        await b.close()

    run(scenario())
    assert [r.payload for r in harness.backend.read("a", 1)] == [b"a1", b"a2", b"a3"]


def test_closed_writer_refuses_appends_and_close_is_idempotent(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        await writer.append([b"a"])
        await writer.close()
        await writer.close()
        with pytest.raises(UnavailableError):
            await writer.append([b"b"])
        reopened = harness.backend.open_writer(LOG)
        assert reopened.last_sequence == 1
        await reopened.close()

    run(scenario())


def test_failed_append_makes_the_writer_unusable(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        assert await writer.append([b"a", b"b"]) == 2
        harness.fail_next_append(LOG)
        with pytest.raises(UnavailableError):
            await writer.append([b"c", b"d"])
        assert writer.last_sequence == 2
        with pytest.raises(UnavailableError):
            await writer.append([b"e"])  # nothing may follow a possibly partial group
        await writer.close()
        reopened = harness.restart().open_writer(LOG)
        # The failed group may or may not be durable, but the numbering stays consecutive.
        assert reopened.last_sequence in (2, 4)
        last = await reopened.append([b"f"])
        assert last == reopened.last_sequence
        await reopened.close()
        held = sequences(harness.backend.read(LOG, 1))
        assert held == list(range(1, last + 1))

    run(scenario())


def test_cancelled_append_makes_the_writer_unusable(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        await writer.append([b"a"])
        task = asyncio.create_task(writer.append([b"b", b"c"]))
        await asyncio.sleep(0)  # the append is now in flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(UnavailableError):
            await writer.append([b"d"])
        await writer.close()
        reopened = harness.backend.open_writer(LOG)
        assert reopened.last_sequence in (1, 3)
        await reopened.close()
        assert sequences(harness.backend.read(LOG, 1)) == list(range(1, reopened.last_sequence + 1))

    run(scenario())


def test_overlapping_appends_are_refused(harness: Harness) -> None:
    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        first = asyncio.create_task(writer.append([b"a"]))
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError):
            await writer.append([b"b"])
        assert await first == 1
        assert await writer.append([b"c"]) == 2
        await writer.close()

    run(scenario())


def test_follower_reads_on_as_the_writer_appends(harness: Harness) -> None:
    # The follower is another backend over the same logs (another server, for Pulsar).
    reader = harness.make()

    async def scenario() -> None:
        writer = harness.backend.open_writer(LOG)
        await writer.append([payload(s) for s in range(1, 11)])
        follower = reader.follow(LOG, 4)
        try:
            polled = follower.poll(100)
            assert polled.records == [LogRecord(s, payload(s)) for s in range(4, 11)]
            assert polled.at_end
            assert follower.poll(100).records == []
            await writer.append([payload(s) for s in range(11, 14)])
            polled = follower.poll(2)  # bounded: more is there
            assert sequences(iter(polled.records)) == [11, 12]
            assert not polled.at_end
            polled = follower.poll(100)
            assert sequences(iter(polled.records)) == [13]
            assert polled.at_end
        finally:
            follower.close()
            await writer.close()

    run(scenario())


def test_follower_of_a_log_that_does_not_exist_yet(harness: Harness) -> None:
    follower = harness.make().follow(LOG, 1)
    try:
        polled = follower.poll(100)
        assert polled.records == [] and polled.at_end
        run(fill(harness.backend, 3))
        assert sequences(iter(follower.poll(100).records)) == [1, 2, 3]
    finally:
        follower.close()


def test_follower_goes_on_across_a_takeover(harness: Harness) -> None:
    reader = harness.make()

    async def scenario() -> None:
        first = harness.backend.open_writer(LOG)
        await first.append([payload(s) for s in range(1, 6)])
        follower = reader.follow(LOG, 1)
        try:
            assert sequences(iter(follower.poll(100).records)) == [1, 2, 3, 4, 5]
            second = harness.restart().open_writer(LOG)  # the next owner fences the first
            with pytest.raises(LogFencedError):
                await first.append([b"stray"])
            await second.append([payload(s) for s in range(6, 9)])
            polled = follower.poll(100)
            assert polled.records == [LogRecord(s, payload(s)) for s in range(6, 9)]
            assert polled.at_end
            await second.close()
        finally:
            follower.close()

    run(scenario())


def test_a_writer_opened_where_a_follower_read_the_log_reads_all_of_it(
    harness: Harness,
) -> None:
    # (Pulsar: the new writer's recovery scan begins near the end, where the follower's reading
    # left a record start indexed; reads from before it must still yield every record.)
    run(fill(harness.backend, 300, group=7))
    taker = harness.make()
    follower = taker.follow(LOG, 1)
    try:
        while not follower.poll(50).at_end:
            pass
    finally:
        follower.close()

    async def scenario() -> None:
        writer = taker.open_writer(LOG)
        assert writer.last_sequence == 300
        for start in (290, 1, 150):
            tail = list(taker.read(LOG, start))
            assert tail == [LogRecord(s, payload(s)) for s in range(start, 301)]
        assert await writer.append([b"next"]) == 301
        await writer.close()

    run(scenario())
