"""The automatic split policy (`--split-keys`, `--split-writes`; off by default).

Every `--split-check-interval` each server looks at the table ranges it has open: a range whose
store holds more than `max_keys` keys (RocksDB's estimate, which also counts up to about ten
thousand change events of its watch history), or that applied more than `max_writes_per_s`
commands per second since the last look, is split (`Splitter.split`, on the owner of the table's
meta range: `split` here is what the Admin service's SplitRange does). One split at a time per
server. A range whose split is refused (a table of the etcd or Oxia front-end, a range with
sessions, a table at `--max-table-ranges`: any error that is not retryable) is not asked again
until the server restarts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tablekeeper_server.catalog.meta import MIN_DATA_RANGE_ID
from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import TableKeeperError
from tablekeeper_server.range.replica import Range

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SplitThresholds:
    max_keys: int = 0
    """Split a range holding more keys than this (0: never for its size)."""
    max_writes_per_s: float = 0.0
    """Split a range applying more commands per second than this (0: never for its load)."""
    interval_s: float = 30.0

    @property
    def enabled(self) -> bool:
        return self.max_keys > 0 or self.max_writes_per_s > 0


class SplitPolicy:
    def __init__(
        self,
        ranges: Callable[[], list[Range]],
        split: Callable[[int, int], Awaitable[object]],
        thresholds: SplitThresholds,
        clock: Clock,
    ) -> None:
        """`ranges()`: the open ranges of this server; `split(stream_id, range_id)` splits one
        (wherever the table's meta range is)."""
        self._ranges = ranges
        self._split = split
        self.thresholds = thresholds
        self._clock = clock
        self._seen: dict[tuple[int, int], tuple[float, int]] = {}
        """(stream, range) -> (when, applied position) at the last look."""
        self._refused: set[tuple[int, int]] = set()
        self.splits = 0

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self.thresholds.interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("split policy: the check failed")

    def over(self, range_: Range, now: float) -> str | None:
        """Why `range_` is due for a split now (and remember this look), or None."""
        key = (range_.name.stream_id, range_.name.range_id)
        thresholds = self.thresholds
        applied = range_.applied_sequence
        before = self._seen.get(key)
        self._seen[key] = (now, applied)
        if thresholds.max_keys and (keys := range_.estimate_num_keys()) > thresholds.max_keys:
            return f"about {keys} keys (--split-keys {thresholds.max_keys})"
        if thresholds.max_writes_per_s and before is not None and now > before[0]:
            rate = (applied - before[1]) / (now - before[0])
            if rate > thresholds.max_writes_per_s:
                return f"{rate:.0f} writes/s (--split-writes {thresholds.max_writes_per_s:g})"
        return None

    async def check(self) -> None:
        """Look at every open table range once; split the first one over a threshold."""
        now = self._clock.monotonic_s()
        due: tuple[Range, str] | None = None
        for range_ in self._ranges():
            name = range_.name
            key = (name.stream_id, name.range_id)
            if name.range_id < MIN_DATA_RANGE_ID or key in self._refused:
                continue  # a root or meta range, or one whose split was refused
            if range_.failed or range_.sealed is not None:
                continue
            why = self.over(range_, now)
            if why is not None and due is None:
                due = (range_, why)
        if due is None:
            return
        range_, why = due
        name = range_.name
        log.info("split policy: splitting range %s: %s", name.log_name, why)
        try:
            await self._split(name.stream_id, name.range_id)
        except TableKeeperError as exc:
            if exc.retryable:
                log.info("split policy: range %s not split now: %s", name.log_name, exc.message)
            else:
                self._refused.add((name.stream_id, name.range_id))
                log.info("split policy: range %s stays whole: %s", name.log_name, exc.message)
        else:
            self.splits += 1
            self._seen.pop((name.stream_id, name.range_id), None)
