"""WatchHub: catch-up from ring and history without gaps or repeats, compaction, slow watchers,
and the change feed of a real `Range` (memory log and store)."""

from __future__ import annotations

import asyncio

import pytest

from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_server.core.keys import pkey_prefix, prefix_end
from tablekeeper_server.errors import CompactedError, UnavailableError, WatcherTooSlowError
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.limits import Limits
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.state_machine import RangeStateMachine
from tablekeeper_server.range.watch import (
    SEND_BYTES_MAX,
    ConvertedEvents,
    HistoryBudget,
    KeySpan,
    WatchHub,
    event_bytes,
)
from tablekeeper_server.storage.memory import MemoryKvStore
from tests.support.appliers import APPLIERS
from tests.unit.test_state_machine import NOW, delete, put

pytestmark = pytest.mark.unit

ALL = KeySpan(pkey_prefix(b"p"), prefix_end(pkey_prefix(b"p")))


class Feed:
    def __init__(
        self,
        limit: int = 10_000,
        ring: int = 4096,
        queue_max: int = 10_000,
        limits: Limits | None = None,
        budget: HistoryBudget | None = None,
    ) -> None:
        store = MemoryKvStore()
        self.sm = RangeStateMachine(store, APPLIERS, history=EventHistory(store, limit=limit))
        self.hub = WatchHub(
            "r", ring_events=ring, queue_max=queue_max, limits=limits, budget=budget
        )
        self.hub.attach(self.sm.history, 0)
        self.seq = 0

    def apply(self, *commands: wal_pb2.WalCommand) -> None:
        batch = []
        for command in commands:
            self.seq += 1
            command.timestamp_ms = NOW
            batch.append((self.seq, command))
        self.sm.apply_batch(batch)
        self.hub.publish(self.sm.last_events, self.sm.applied_sequence)


async def collect(hub: WatchHub, span: KeySpan, start: int, n: int) -> list[tuple[int, int]]:
    watcher, _ = hub.start(span, start)
    out: list[tuple[int, int]] = []
    async for batch in hub.events(watcher):
        out += [e.position for e in batch]
        if len(out) >= n:
            break
    return out


@pytest.mark.parametrize("ring", [4096, 3])
async def test_catch_up_then_live_exactly_once(ring: int) -> None:
    feed = Feed(ring=ring)
    for i in range(20):
        feed.apply(put(b"k%d" % (i % 4)))
    task = asyncio.create_task(collect(feed.hub, ALL, 5, 16 + 10 + 4))
    await asyncio.sleep(0)
    for i in range(10):
        feed.apply(put(b"x%d" % i))
        await asyncio.sleep(0)
    feed.apply(delete(b"k", b"k9"))  # 4 keys, one revision
    got = await asyncio.wait_for(task, 5)
    assert got == [(r, 0) for r in range(5, 31)] + [(31, i) for i in range(4)]
    assert feed.hub.watchers == 0


async def test_single_key_span_and_from_now() -> None:
    feed = Feed()
    feed.apply(put(b"a"), put(b"b"))
    key = pkey_prefix(b"p") + b"b"
    task = asyncio.create_task(collect(feed.hub, KeySpan(key, key + b"\x00"), 0, 2))
    await asyncio.sleep(0)
    feed.apply(put(b"a"), put(b"b"), put(b"c"), put(b"b"))
    assert await asyncio.wait_for(task, 5) == [(4, 0), (6, 0)]


async def test_compacted_revision_names_the_oldest_available() -> None:
    feed = Feed(limit=5, ring=2)
    for i in range(12):
        feed.apply(put(b"k%d" % i))
    with pytest.raises(CompactedError) as info:
        feed.hub.start(ALL, 3)
    assert info.value.oldest_revision == 8
    assert await collect(feed.hub, ALL, 8, 5) == [(r, 0) for r in range(8, 13)]


async def test_slow_watcher_is_cancelled_with_a_reason() -> None:
    feed = Feed(queue_max=5)
    watcher, _ = feed.hub.start(ALL, 0)
    for i in range(7):
        feed.apply(put(b"k%d" % i))
    assert feed.hub.watchers == 0
    with pytest.raises(WatcherTooSlowError, match="resume from revision"):
        async for _ in feed.hub.events(watcher):
            pass


async def test_close_ends_watchers() -> None:
    feed = Feed()
    watcher, _ = feed.hub.start(ALL, 0)
    feed.hub.close("range r closed")
    with pytest.raises(UnavailableError, match="closed"):
        async for _ in feed.hub.events(watcher):
            pass
    with pytest.raises(UnavailableError):
        feed.hub.start(ALL, 0)


async def test_close_during_catch_up_stops_reading_the_history() -> None:
    feed = Feed(ring=2)
    for i in range(3000):
        feed.apply(put(b"k%d" % i))
    watcher, _ = feed.hub.start(ALL, 1)
    events = feed.hub.events(watcher)
    first = await events.__anext__()
    assert len(first) == 1000  # one history page
    feed.hub.close("range r closed")
    with pytest.raises(UnavailableError):
        await events.__anext__()


KIB = 1024
BIG = b"v" * (100 * KIB)


async def test_ring_is_bounded_in_bytes_and_older_events_come_from_the_store() -> None:
    feed = Feed(limits=Limits(history_bytes_max=350 * KIB))
    for i in range(20):
        feed.apply(put(b"k", BIG + b"%d" % i))  # each event: value and previous value
    assert feed.hub.ring_bytes <= 350 * KIB
    assert feed.hub.ring_events == 1  # ~200 KiB each
    # Older revisions than the ring holds are still served exactly once, from the store.
    got = await asyncio.wait_for(collect(feed.hub, ALL, 1, 20), 5)
    assert got == [(r, 0) for r in range(1, 21)]


async def test_shared_budget_drops_the_oldest_events_of_the_largest_ring() -> None:
    budget = HistoryBudget(1000 * KIB)
    limits = Limits(history_bytes_max=2000 * KIB)  # the shared budget binds first
    busy, quiet = Feed(limits=limits, budget=budget), Feed(limits=limits, budget=budget)
    quiet.apply(put(b"q", BIG))
    quiet_bytes = quiet.hub.ring_bytes
    for i in range(30):
        busy.apply(put(b"k%d" % (i % 3), BIG))
        assert budget.used == busy.hub.ring_bytes + quiet.hub.ring_bytes <= 1000 * KIB
    assert quiet.hub.ring_bytes == quiet_bytes  # the busy range gave up its own events
    assert busy.hub.ring_bytes > 600 * KIB and budget.evicted > 0
    # Every event is still served, from ring or store, in order.
    got = await asyncio.wait_for(collect(busy.hub, ALL, 1, 30), 5)
    assert got == [(r, 0) for r in range(1, 31)]
    busy.hub.close("range closed")
    assert budget.used == quiet.hub.ring_bytes


async def test_a_watcher_over_its_queue_bytes_is_cancelled_one_that_drains_is_not() -> None:
    feed = Feed(limits=Limits(watcher_queue_bytes_max=250 * KIB))
    slow, _ = feed.hub.start(ALL, 0)
    fast, _ = feed.hub.start(ALL, 0)
    received: list[tuple[int, int]] = []

    async def drain() -> None:
        async for batch in feed.hub.events(fast):
            received.extend(e.position for e in batch)

    task = asyncio.create_task(drain())
    await asyncio.sleep(0)
    # One group commit larger than the queue bound: nobody is cancelled for it.
    feed.apply(*(put(b"k%d" % i, BIG) for i in range(4)))
    assert feed.hub.watchers == 2
    for i in range(4):
        for _ in range(5):  # let the draining watcher take its batches
            await asyncio.sleep(0)
        feed.apply(put(b"x%d" % i, BIG))
    assert feed.hub.watchers == 1  # the one that never read
    with pytest.raises(WatcherTooSlowError, match="max-watcher-queue-bytes"):
        async for _ in feed.hub.events(slow):
            pass
    assert slow.pending_bytes == 0 and not slow.pending
    for _ in range(5):
        await asyncio.sleep(0)
    assert received == [(r, 0) for r in range(1, 9)]
    task.cancel()


async def test_events_go_out_in_batches_of_bounded_bytes() -> None:
    feed = Feed()
    watcher, _ = feed.hub.start(ALL, 0)
    feed.apply(*(put(b"k%d" % i, BIG) for i in range(25)))
    sizes = []
    async for batch in feed.hub.events(watcher):
        assert sum(event_bytes(e) for e in batch) <= SEND_BYTES_MAX
        sizes.append(len(batch))
        if sum(sizes) == 25:
            break
    assert len(sizes) > 1


def test_converted_events_are_converted_once_and_bounded_in_bytes() -> None:
    """A change is converted once for all its watchers; large values do not pile up (the
    cache empties before holding more than its bytes)."""
    cache: ConvertedEvents[str] = ConvertedEvents(entries_max=100, bytes_max=10 * 1024 * 1024)
    conversions: list[int] = []

    def event(revision: int, size: int) -> ChangeEvent:
        record = StoredRecord(revision, revision, 0, False, 0, b"x" * size)
        return ChangeEvent(revision, 0, b"k", record, record)

    def get(e: ChangeEvent) -> str:
        def convert() -> str:
            conversions.append(e.revision)
            return f"event {e.revision}"

        return cache.get(("r", e.revision), e, convert)

    small = event(1, 10)
    assert [get(small) for _ in range(1000)] == ["event 1"] * 1000
    assert conversions == [1]
    big = [event(r, 1024 * 1024) for r in range(2, 30)]  # ~2 MiB each with the previous value
    for e in big:
        assert get(e) == f"event {e.revision}"
    assert cache._bytes <= 10 * 1024 * 1024
    assert len(cache._converted) <= 5
    assert sum(event_bytes(e) for e in big[-len(cache._converted) :]) == cache._bytes
