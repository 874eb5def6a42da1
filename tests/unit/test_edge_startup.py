"""The front-ends' shared startup retry loop (`edge.startup`): it retries on the injected clock,
pausing longer each time up to its bound, until the work is done."""

from __future__ import annotations

import pytest

from tablekeeper_server.core.clock import ManualClock
from tablekeeper_server.edge.startup import retry_until_done

pytestmark = pytest.mark.unit


class RecordingClock(ManualClock):
    """Each sleep is recorded and passes at once (the time moves by what it asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.advance(seconds)


async def test_the_work_is_retried_on_the_clock_until_it_is_done() -> None:
    clock = RecordingClock()
    attempts = 0

    async def attempt() -> None:
        nonlocal attempts
        attempts += 1
        if attempts < 6:
            raise ConnectionError("the root range has no owner yet")

    await retry_until_done("the test's table", attempt, clock, pause_s_max=0.5)
    assert attempts == 6
    assert clock.pauses == [0.1, 0.2, 0.4, 0.5, 0.5]  # doubling, held at the bound
