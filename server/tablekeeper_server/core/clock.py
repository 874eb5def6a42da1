"""The only place that reads the wall clock. Everything else is given a `Clock`."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back; for durations only."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._mono = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_s(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now_ms += int(seconds * 1000)
        self._mono += seconds
