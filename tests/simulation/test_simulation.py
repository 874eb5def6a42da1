"""The seeded simulation (tests/simulation/sim.py) over many seeds.

`TABLEKEEPER_SIM_SEEDS` sets how many (default 120, run in `make test`; `make simulate
SEEDS=5000` for more); a failure names its seed, and `python -m tests.simulation --seed N
--trace` replays it exactly.
"""

from __future__ import annotations

import os

import pytest

from tests.simulation.sim import simulate

SEEDS = int(os.environ.get("TABLEKEEPER_SIM_SEEDS", "120"))
CHUNK = 25


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_seeds(first: int) -> None:
    for seed in range(first, min(first + CHUNK, SEEDS)):
        stats = simulate(seed)
        assert stats.ops > 0 and stats.acked > 0


def test_the_same_seed_replays_the_same_run() -> None:
    assert simulate(7) == simulate(7)
