"""Live change feeds of one range: watchers of one key or an lkey range of one pkey.

`WatchHub.publish` is called by the range after each applied batch with the batch's
`ChangeEvent`s (see `range.events`); the hub keeps the most recent events in a bounded ring and
hands matching events to every registered watcher. A watcher starting at an older revision
first catches up from the ring if it still covers that revision, else from the range's durable
event history (its store); a revision at or below what the history has trimmed raises
`CompactedError` carrying the oldest available revision.

Catch-up never misses or repeats an event: the watcher registers for live events *before* it
reads the backlog (both on the range's event loop), and delivers live events only after the
last position (revision, index) it has delivered. Each watcher buffers at most `queue_max`
undelivered live events; beyond that it is cancelled with `WatcherTooSlowError` naming the
revision to resume from. Closing the range ends every watcher with `UnavailableError`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from tablekeeper_server.errors import (
    CompactedError,
    TableKeeperError,
    UnavailableError,
    WatcherTooSlowError,
)
from tablekeeper_server.range.events import ChangeEvent, EventHistory

RING_EVENTS = 4096
QUEUE_EVENTS_MAX = 10_000
CATCH_UP_PAGE = 1000
_INDEX_MAX = 2**32 - 1


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
    pending: deque[ChangeEvent] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    error: TableKeeperError | None = None
    last: tuple[int, int] = (0, _INDEX_MAX)

    def offer(self, events: Sequence[ChangeEvent]) -> bool:
        """Queue matching events; False if that overflowed the bound (then it is cancelled)."""
        added = False
        for event in events:
            if event.key in self.span:
                self.pending.append(event)
                added = True
        if len(self.pending) > self.queue_max:
            self.pending.clear()
            self.fail(
                WatcherTooSlowError(
                    f"watcher fell behind by more than {self.queue_max} events and was "
                    f"cancelled; resume from revision {self.last[0]}"
                )
            )
            return False
        if added:
            self.wakeup.set()
        return True

    def fail(self, error: TableKeeperError) -> None:
        if self.error is None:
            self.error = error
        self.wakeup.set()


class WatchHub:
    """The watchers of one range. Lives on the range's event loop."""

    def __init__(
        self, name: str, *, ring_events: int = RING_EVENTS, queue_max: int = QUEUE_EVENTS_MAX
    ) -> None:
        self.name = name
        self.queue_max = queue_max
        self._ring: deque[ChangeEvent] = deque(maxlen=max(1, ring_events))
        self._ring_floor = 0
        """Events after this revision are all in the ring."""
        self._history: EventHistory | None = None
        self._applied = 0
        self._watchers: set[Watcher] = set()
        self._closed: str | None = None

    def attach(self, history: EventHistory | None, applied: int) -> None:
        """The range opened: its history and applied revision (the ring starts empty there)."""
        self._history = history
        self._applied = self._ring_floor = applied
        self._closed = None

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    def publish(self, events: Sequence[ChangeEvent], applied: int) -> None:
        self._applied = applied
        if not events:
            return
        ring = self._ring
        for event in events:
            if len(ring) == ring.maxlen:
                self._ring_floor = max(self._ring_floor, ring[0].revision)
            ring.append(event)
        for watcher in list(self._watchers):
            if not watcher.offer(events):
                self._watchers.discard(watcher)

    def close(self, reason: str) -> None:
        """End every watcher (the range is closing or failed)."""
        self._closed = reason
        for watcher in self._watchers:
            watcher.fail(UnavailableError(f"{reason}; resume from revision {watcher.last[0]}"))
        self._watchers.clear()

    def start(self, span: KeySpan, start_revision: int) -> tuple[Watcher, int]:
        """Register a watcher from `start_revision` (0 = after the current revision); returns
        it and the applied revision at registration. Raises `CompactedError`."""
        if self._closed is not None:
            raise UnavailableError(self._closed)
        watcher = Watcher(span, self.queue_max)
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
        page = self._history.read(last, CATCH_UP_PAGE)
        return page, len(page) < CATCH_UP_PAGE

    async def events(self, watcher: Watcher) -> AsyncGenerator[list[ChangeEvent], None]:
        """The watcher's events in order, in batches. Raises its error when it ends; always
        unregisters it."""
        try:
            done = False
            while not done:
                if watcher.error is not None:  # e.g. the range closed: its store may be gone
                    raise watcher.error
                page, done = self._backlog_page(watcher)
                if page:
                    watcher.last = page[-1].position
                    matching = [e for e in page if e.key in watcher.span]
                    if matching:
                        yield matching
            while True:
                if watcher.error is not None and not watcher.pending:
                    raise watcher.error
                if not watcher.pending:
                    watcher.wakeup.clear()
                    await watcher.wakeup.wait()
                    continue
                batch = [e for e in watcher.pending if e.position > watcher.last]
                watcher.pending.clear()
                if batch:
                    watcher.last = batch[-1].position
                    yield batch
        finally:
            self._watchers.discard(watcher)
