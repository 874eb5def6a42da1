"""When a server checkpoints the ranges it owns (`--checkpoint-interval`, `--checkpoint-records`).

A range's log holds every command since its newest checkpoint, and whoever opens the range next
(this server after a restart, another one after a takeover) replays them all. Time alone does
not bound that tail: five minutes of a range taking 5,000 writes/s is 1.5 million commands, a
minute of replay before the range serves again. So a range is checkpointed when either is true:

- **records**: `records` commands were applied since its newest checkpoint (etcd's
  `--snapshot-count`, ZooKeeper's `snapCount`): what a takeover replays stays under that;
- **time**: it changed and `interval_s` passed since its last checkpoint (or since it opened),
  so a quiet range's log is truncated too.

"Since its newest checkpoint" is counted from this server's last checkpoint of the range, or,
before it made one, from where the range's store stood when it opened: a tail replayed at the
open is not counted, so the first checkpoint comes at most `records` commands late.

The policy looks every `tick_s` (1 s) and checkpoints the due ranges one at a time, those
furthest behind first. A range whose checkpoint failed is not tried again for `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tablekeeper_server.core.clock import Clock
from tablekeeper_server.errors import TableKeeperError
from tablekeeper_server.range.replica import Range

log = logging.getLogger(__name__)

RETRY_S = 10.0
"""How long a range whose checkpoint failed waits before the policy tries it again."""


@dataclass(frozen=True, slots=True)
class CheckpointTriggers:
    interval_s: float = 300.0
    """Checkpoint a changed range this long after its last checkpoint (0: never for time)."""
    records: int = 0
    """Checkpoint a range once it applied this many commands since its last one (0: never)."""
    tick_s: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 or self.records > 0


class CheckpointPolicy:
    def __init__(
        self,
        ranges: Callable[[], list[Range]],
        checkpoint: Callable[[Range], Awaitable[object]],
        triggers: CheckpointTriggers,
        clock: Clock,
    ) -> None:
        """`ranges()`: the ranges this server has open; `checkpoint(range)` checkpoints one
        (and truncates its log) if its container is still this server's."""
        self._ranges = ranges
        self._checkpoint = checkpoint
        self.triggers = triggers
        self._clock = clock
        self._since: dict[str, float] = {}
        """Range log name -> when it was last checkpointed (or first seen open)."""
        self._retry_at: dict[str, float] = {}
        self.checkpoints = 0

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self.triggers.tick_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("checkpoint policy: the check failed")

    def due(self, range_: Range, now: float) -> str | None:
        """Why `range_` is due for a checkpoint now, or None."""
        name = range_.name.log_name
        since = self._since.setdefault(name, now)
        if range_.checkpointer is None or range_.failed:
            return None
        if now < self._retry_at.get(name, 0.0):
            return None
        behind = range_.applied_sequence - range_.checkpointed_sequence
        if behind <= 0:
            return None
        triggers = self.triggers
        if triggers.records and behind >= triggers.records:
            return f"{behind} commands since its last checkpoint (--checkpoint-records)"
        if triggers.interval_s and now - since >= triggers.interval_s:
            return f"changed, last checkpointed {now - since:.0f}s ago (--checkpoint-interval)"
        return None

    async def check(self) -> None:
        """Checkpoint every open range that is due, furthest behind first."""
        now = self._clock.monotonic_s()
        ranges = self._ranges()
        open_names = {r.name.log_name for r in ranges}
        for gone in [n for n in self._since if n not in open_names]:  # closed or moved away
            del self._since[gone]
            self._retry_at.pop(gone, None)
        due = [(r, why) for r in ranges if (why := self.due(r, now)) is not None]
        due.sort(key=lambda item: item[0].checkpointed_sequence - item[0].applied_sequence)
        for range_, why in due:
            name = range_.name.log_name
            log.debug("checkpoint policy: range %s: %s", name, why)
            try:
                await self._checkpoint(range_)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._retry_at[name] = self._clock.monotonic_s() + RETRY_S
                if isinstance(exc, TableKeeperError):
                    log.warning("checkpoint of range %s failed: %s", name, exc.message)
                else:
                    log.exception("checkpoint of range %s failed", name)
                continue
            self.checkpoints += 1
            self._since[name] = self._clock.monotonic_s()
            self._retry_at.pop(name, None)
