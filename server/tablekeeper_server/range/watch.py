"""Live change feeds of one range: watchers of one key or an lkey range of one pkey.

`WatchHub.publish` is called by the range after each applied batch with the batch's
`ChangeEvent`s (see `range.events`); the hub keeps the most recent events in a bounded ring and
hands matching events to every registered watcher. A watcher starting at an older revision
first catches up from the ring if it still covers that revision, else from the range's durable
event history (its store); a revision at or below what the history has trimmed raises
`CompactedError` carrying the oldest available revision. So the ring is only a cache: what it
drops is still served, from the store, until the durable history trims it.

Memory is bounded in bytes, because events carry whole values (and the previous value):
- the ring of one range holds at most `ring_events` events and `ring_bytes_max` bytes
  (`--max-history-bytes`), dropping its oldest events first;
- the rings of all ranges of a server share one `HistoryBudget` (`--max-history-bytes-total`):
  when a publish takes the total over it, the oldest events of the *largest* ring are dropped
  (repeatedly, largest first), so one busy range cannot starve the rings of quiet ones and a
  range never loses its ring to the others while it is the small one;
- each watcher buffers at most `queue_max` undelivered events and `queue_bytes_max` bytes
  (`--max-watcher-queue-bytes`) of them, not counting the batch being published: a watcher that
  had drained its queue is never cancelled by one large group commit, only one that had not
  drained it is. Beyond that it is cancelled with `WatcherTooSlowError` (gRPC
  RESOURCE_EXHAUSTED) naming the revision to resume from;
- events go out in batches of at most `SEND_BYTES_MAX` (at least one event), and catch-up from
  the store reads pages of at most `CATCH_UP_PAGE` events and `CATCH_UP_BYTES` bytes.

Catch-up never misses or repeats an event: the watcher registers for live events *before* it
reads the backlog (both on the range's event loop), and delivers live events only after the
last position (revision, index) it has delivered. Closing the range ends every watcher with
`UnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tablekeeper_server.errors import (
    CompactedError,
    TableKeeperError,
    UnavailableError,
    WatcherTooSlowError,
)
from tablekeeper_server.range.events import ChangeEvent, EventHistory
from tablekeeper_server.range.limits import Limits

RING_EVENTS = 4096
QUEUE_EVENTS_MAX = 10_000
CATCH_UP_PAGE = 1000
CATCH_UP_BYTES = 4 * 1024 * 1024
SEND_BYTES_MAX = 1024 * 1024
_INDEX_MAX = 2**32 - 1
_EVENT_OVERHEAD = 200
"""Bytes an event costs beyond its key and values (the objects around them), estimated."""
_RECORD_OVERHEAD = 100


def event_bytes(event: ChangeEvent) -> int:
    """What one event holds in memory, estimated: key, new and previous value, objects."""
    size = _EVENT_OVERHEAD + len(event.key)
    if event.record is not None:
        size += _RECORD_OVERHEAD + len(event.record.value)
    if event.prev is not None:
        size += _RECORD_OVERHEAD + len(event.prev.value)
    return size


def _chunks(events: list[ChangeEvent], bytes_max: int) -> list[list[ChangeEvent]]:
    """`events` cut into runs of at most `bytes_max` bytes (at least one event each)."""
    out: list[list[ChangeEvent]] = []
    run: list[ChangeEvent] = []
    size = 0
    for event in events:
        cost = event_bytes(event)
        if run and size + cost > bytes_max:
            out.append(run)
            run, size = [], 0
        run.append(event)
        size += cost
    if run:
        out.append(run)
    return out


T = TypeVar("T")

CONVERTED_EVENTS_MAX = 4096
CONVERTED_BYTES_MAX = 8 * 1024 * 1024


class ConvertedEvents(Generic[T]):
    """Recent changes in a front-end's wire form, so a change is converted once however many
    watchers receive it (they all get it within a moment of each other). Bounded in entries and
    in bytes (events carry whole values): emptied when either bound is reached."""

    def __init__(
        self, entries_max: int = CONVERTED_EVENTS_MAX, bytes_max: int = CONVERTED_BYTES_MAX
    ) -> None:
        self._entries_max = entries_max
        self._bytes_max = bytes_max
        self._converted: dict[Hashable, T] = {}
        self._bytes = 0

    def get(self, key: Hashable, event: ChangeEvent, convert: Callable[[], T]) -> T:
        """The converted form of `event` (`key` names the event and the form), converting it
        on first use."""
        converted = self._converted.get(key)
        if converted is None:
            converted = convert()
            cost = event_bytes(event)
            if len(self._converted) >= self._entries_max or self._bytes + cost > self._bytes_max:
                self._converted.clear()
                self._bytes = 0
            self._converted[key] = converted
            self._bytes += cost
        return converted


class HistoryBudget:
    """The bytes of change events that the rings of all ranges of one server hold together.

    One object per server (built by the container registry), shared by every `WatchHub` on the
    server's event loop. When a publish takes `used` over `bytes_max`, the oldest events of the
    largest ring are dropped until it fits again (see the module docstring)."""

    def __init__(self, bytes_max: int = Limits().history_bytes_total_max) -> None:
        self.bytes_max = max(1, bytes_max)
        self.used = 0
        self.evicted = 0
        """Events dropped from some ring to keep the total within `bytes_max`."""
        self._hubs: set[WatchHub] = set()

    def join(self, hub: WatchHub) -> None:
        self._hubs.add(hub)

    def leave(self, hub: WatchHub) -> None:
        self._hubs.discard(hub)

    def make_room(self) -> None:
        while self.used > self.bytes_max:
            largest: WatchHub | None = None
            second = 0
            for hub in self._hubs:
                size = hub.ring_bytes
                if largest is None or size > largest.ring_bytes:
                    if largest is not None:
                        second = max(second, largest.ring_bytes)
                    largest = hub
                else:
                    second = max(second, size)
            if largest is None or largest.ring_bytes == 0:
                return  # nothing left to drop (the accounting is off): give up, never loop
            # Down to the second largest ring (or until the total fits), then look again.
            while self.used > self.bytes_max and largest.ring_bytes > 0:
                largest.drop_oldest()
                self.evicted += 1
                if largest.ring_bytes < second:
                    break


@dataclass(frozen=True, slots=True)
class KeySpan:
    """Store keys [start, end) a watcher follows."""

    start: bytes
    end: bytes

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.start <= key < self.end


@dataclass(eq=False)
class Watcher:
    """One watch stream's registration: its span, undelivered live events and its end."""

    span: KeySpan
    queue_max: int
    queue_bytes_max: int = Limits().watcher_queue_bytes_max
    pending: deque[ChangeEvent] = field(default_factory=deque)
    pending_bytes: int = 0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    error: TableKeeperError | None = None
    last: tuple[int, int] = (0, _INDEX_MAX)
    on_ready: Callable[[], None] | None = None
    """Told when events are queued or the watcher ends, instead of `wakeup`: how a stream that
    serves many watchers learns which of them have something to send."""

    def _ready(self) -> None:
        if self.on_ready is not None:
            self.on_ready()  # a shared stream's watch: nothing waits on `wakeup`
        else:
            self.wakeup.set()

    def offer(self, events: Sequence[ChangeEvent], sizes: Sequence[int]) -> bool:
        """Queue matching events (`sizes`: their `event_bytes`, worked out once for every
        watcher); False if the queue was already over its bound when they came (then the
        watcher is cancelled and its queue freed). Runs once per watcher for every change."""
        pending = self.pending
        behind, behind_bytes = len(pending), self.pending_bytes
        if behind >= self.queue_max or behind_bytes >= self.queue_bytes_max:
            self.pending.clear()
            self.pending_bytes = 0
            self.fail(
                WatcherTooSlowError(
                    f"watcher fell behind by {behind} events ({behind_bytes} bytes; the limits "
                    f"are {self.queue_max} events and {self.queue_bytes_max} bytes, "
                    f"--max-watcher-queue-bytes) and was cancelled; resume from revision "
                    f"{self.last[0]}"
                )
            )
            return False
        start, end = self.span.start, self.span.end
        added = 0
        for i, event in enumerate(events):
            if start <= event.key < end:
                pending.append(event)
                added += sizes[i]
        if added:
            self.pending_bytes = behind_bytes + added
            self._ready()
        return True

    def take(self, bytes_max: int) -> list[ChangeEvent]:
        """The oldest queued events, at most `bytes_max` bytes of them (at least one)."""
        pending = self.pending
        if self.pending_bytes <= bytes_max and pending:  # all of them (the usual case)
            everything = list(pending)
            pending.clear()
            self.pending_bytes = 0
            return everything
        taken: list[ChangeEvent] = []
        size = 0
        while pending:
            cost = event_bytes(pending[0])
            if taken and size + cost > bytes_max:
                break
            taken.append(pending.popleft())
            size += cost
        self.pending_bytes = max(0, self.pending_bytes - size) if pending else 0
        return taken

    def fail(self, error: TableKeeperError) -> None:
        if self.error is None:
            self.error = error
        self._ready()


class WatchHub:
    """The watchers of one range. Lives on the range's event loop."""

    def __init__(
        self,
        name: str,
        *,
        ring_events: int = RING_EVENTS,
        queue_max: int = QUEUE_EVENTS_MAX,
        limits: Limits | None = None,
        budget: HistoryBudget | None = None,
    ) -> None:
        """`limits`: `history_bytes_max` bounds the ring, `watcher_queue_bytes_max` each
        watcher's queue. `budget`: the server's shared bound on all rings (None: no shared
        bound, e.g. in unit tests)."""
        limits = limits or Limits()
        self.name = name
        self.queue_max = queue_max
        self.queue_bytes_max = limits.watcher_queue_bytes_max
        self.ring_bytes_max = limits.history_bytes_max
        self.ring_bytes = 0
        self._ring: deque[ChangeEvent] = deque()
        self._ring_sizes: deque[int] = deque()
        """`event_bytes` of each event in `_ring`, computed once as it joins."""
        self._ring_events = max(1, ring_events)
        self._ring_floor = 0
        """Events after this revision are all in the ring."""
        self._budget = budget
        self._history: EventHistory | None = None
        self._applied = 0
        self._watchers: set[Watcher] = set()
        self._closed: str | None = None

    def attach(self, history: EventHistory | None, applied: int) -> None:
        """The range opened: its history and applied revision (the ring starts empty there)."""
        self._clear_ring()
        self._history = history
        self._applied = self._ring_floor = applied
        self._closed = None
        if self._budget is not None:
            self._budget.join(self)

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    @property
    def ring_events(self) -> int:
        return len(self._ring)

    def drop_oldest(self) -> None:
        """Drop the oldest event of the ring (it stays in the store's history)."""
        event = self._ring.popleft()
        self._ring_floor = max(self._ring_floor, event.revision)
        cost = self._ring_sizes.popleft()
        self.ring_bytes -= cost
        if self._budget is not None:
            self._budget.used -= cost

    def _drop_over(self) -> None:
        """`drop_oldest` until the ring is within its bounds (one update of the counts)."""
        ring, sizes = self._ring, self._ring_sizes
        events_max, bytes_max = self._ring_events, self.ring_bytes_max
        ring_bytes = self.ring_bytes
        dropped = 0
        floor = self._ring_floor
        while ring and (len(ring) > events_max or ring_bytes > bytes_max):
            revision = ring.popleft().revision
            if revision > floor:
                floor = revision
            cost = sizes.popleft()
            ring_bytes -= cost
            dropped += cost
        self._ring_floor = floor
        self.ring_bytes = ring_bytes
        if self._budget is not None:
            self._budget.used -= dropped

    def _clear_ring(self) -> None:
        if self._budget is not None:
            self._budget.used -= self.ring_bytes
        self._ring.clear()
        self._ring_sizes.clear()
        self.ring_bytes = 0

    def publish(self, events: Sequence[ChangeEvent], applied: int) -> None:
        self._applied = applied
        if not events:
            return
        ring = self._ring
        sizes = [event_bytes(event) for event in events]
        ring.extend(events)
        self._ring_sizes.extend(sizes)
        added = sum(sizes)
        self.ring_bytes += added
        if len(ring) > self._ring_events or self.ring_bytes > self.ring_bytes_max:
            self._drop_over()
        if self._budget is not None:
            self._budget.used += added
            self._budget.make_room()
        for watcher in list(self._watchers):
            if not watcher.offer(events, sizes):
                self._watchers.discard(watcher)

    def close(self, reason: str) -> None:
        """End every watcher (the range is closing or failed)."""
        self._closed = reason
        for watcher in self._watchers:
            watcher.fail(UnavailableError(f"{reason}; resume from revision {watcher.last[0]}"))
        self._watchers.clear()
        self._clear_ring()
        if self._budget is not None:
            self._budget.leave(self)

    def start(self, span: KeySpan, start_revision: int) -> tuple[Watcher, int]:
        """Register a watcher from `start_revision` (0 = after the current revision); returns
        it and the applied revision at registration. Raises `CompactedError`."""
        if self._closed is not None:
            raise UnavailableError(self._closed)
        watcher = Watcher(span, self.queue_max, self.queue_bytes_max)
        if start_revision <= 0:
            watcher.last = (self._applied, _INDEX_MAX)
        else:
            watcher.last = (start_revision - 1, _INDEX_MAX)
            self._check_compacted(watcher.last)
        self._watchers.add(watcher)
        return watcher, self._applied

    def _check_compacted(self, last: tuple[int, int]) -> None:
        history = self._history
        if history is None:
            return
        trimmed = history.trimmed_through
        if trimmed > last[0] or (trimmed == last[0] and last[1] != _INDEX_MAX):
            raise CompactedError(
                f"range {self.name}: revision {last[0] + 1} is compacted (the event history "
                f"keeps the newest {history.limit} events); the oldest available revision is "
                f"{trimmed + 1}",
                trimmed + 1,
            )

    def _backlog_page(self, watcher: Watcher) -> tuple[list[ChangeEvent], bool]:
        """The next events after `watcher.last` that were published before the watcher
        registered (unfiltered), and whether that was the last page of the backlog."""
        last = watcher.last
        if last[0] >= self._ring_floor:
            return [e for e in self._ring if e.position > last], True
        if self._history is None:
            raise CompactedError(
                f"range {self.name}: revision {last[0] + 1} is no longer held; the oldest "
                f"available revision is {self._ring_floor + 1}",
                self._ring_floor + 1,
            )
        self._check_compacted(last)
        page, done = self._history.read_page(last, CATCH_UP_PAGE, CATCH_UP_BYTES)
        return page, done

    async def catch_up(self, watcher: Watcher) -> AsyncGenerator[list[ChangeEvent], None]:
        """The watcher's events published before it registered (from the ring or the durable
        history), in batches; then live events come from `take_live`. Raises its error."""
        done = False
        while not done:
            if watcher.error is not None:  # e.g. the range closed: its store may be gone
                raise watcher.error
            page, done = self._backlog_page(watcher)
            if page:
                watcher.last = page[-1].position
                matching = [e for e in page if e.key in watcher.span]
                for chunk in _chunks(matching, SEND_BYTES_MAX):
                    yield chunk

    def take_live(self, watcher: Watcher) -> list[ChangeEvent]:
        """The watcher's next live events (after its catch-up), possibly none yet; raises its
        error once everything before the error was taken."""
        pending = watcher.pending
        if len(pending) == 1:  # the usual case: one change since the last take
            event = pending.popleft()
            watcher.pending_bytes = 0
            position = (event.revision, event.index)
            if position > watcher.last:
                watcher.last = position
                return [event]
            return []
        if watcher.error is not None and not pending:
            raise watcher.error
        last = watcher.last
        batch = watcher.take(SEND_BYTES_MAX)
        if batch and (batch[0].revision, batch[0].index) <= last:  # (events come in order)
            batch = [e for e in batch if (e.revision, e.index) > last]
        if batch:
            tail = batch[-1]
            watcher.last = (tail.revision, tail.index)
        return batch

    def stop(self, watcher: Watcher) -> None:
        """Unregister a watcher (it receives nothing more)."""
        self._watchers.discard(watcher)

    async def events(self, watcher: Watcher) -> AsyncGenerator[list[ChangeEvent], None]:
        """The watcher's events in order, in batches. Raises its error when it ends; always
        unregisters it."""
        try:
            async with contextlib.aclosing(self.catch_up(watcher)) as backlog:
                async for chunk in backlog:
                    yield chunk
            while True:
                if not watcher.pending and watcher.error is None:
                    watcher.wakeup.clear()
                    await watcher.wakeup.wait()
                    continue
                batch = self.take_live(watcher)
                if batch:
                    yield batch
        finally:
            self.stop(watcher)
