"""The only place that reads the wall clock or waits on it. Everything else is given a `Clock`.

A `Clock` tells the time and waits: on the event loop (`sleep`, `wait`) and in worker threads
(`sleep_blocking`, `wait_blocking`). `SystemClock` does it for real; `ManualClock` only when a
test moves it, so timers, TTLs and back-offs run deterministically in virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back; for durations only."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once `seconds` have passed on this clock (at least one loop turn for <= 0)."""
        ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Wait until `event` is set or `timeout_s` passed on this clock; whether it is set."""
        ...

    def sleep_blocking(self, seconds: float) -> None:
        """`sleep` for a worker thread (blocks it)."""
        ...

    def wait_blocking(self, event: threading.Event, timeout_s: float) -> bool:
        """`wait` for a worker thread, on a `threading.Event`; whether it is set."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, timeout_s))
        return event.is_set()

    def sleep_blocking(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def wait_blocking(self, event: threading.Event, timeout_s: float) -> bool:
        return event.wait(max(0.0, timeout_s))


class ManualClock:
    """A clock tests move by hand (`advance`).

    `sleep` and `wait` on the event loop return only when `advance` has moved the clock past
    their deadline (or, for `wait`, when the event is set). The blocking forms, in a thread
    that nobody else moves time for, advance the clock themselves by the time they would wait,
    and return at once.
    """

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._mono = 0.0
        self._lock = threading.Lock()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_s(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move the clock forward; wakes every `sleep`/`wait` whose deadline has come."""
        due: list[asyncio.Future[None]] = []
        with self._lock:
            self._now_ms += int(seconds * 1000)
            self._mono += seconds
            while self._sleepers and self._sleepers[0][0] <= self._mono:
                due.append(heapq.heappop(self._sleepers)[2])
        for future in due:
            if not future.done():
                future.get_loop().call_soon_threadsafe(_wake, future)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            heapq.heappush(self._sleepers, (self._mono + seconds, next(self._order), future))
        await future

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        setter = asyncio.ensure_future(event.wait())
        sleeper = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            await asyncio.wait({setter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            setter.cancel()
            sleeper.cancel()
        return event.is_set()

    def sleep_blocking(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def wait_blocking(self, event: threading.Event, timeout_s: float) -> bool:
        if not event.is_set():
            self.advance(max(0.0, timeout_s))
        return event.is_set()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
