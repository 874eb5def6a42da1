"""The seeded simulation (tests/simulation/sim.py) over many seeds: this file's half of them,
tests/simulation/test_simulation_other_half.py the rest (tests/simulation/seeds.py).

`TABLEKEEPER_SIM_SEEDS` sets how many (default 120, run in `make test`; `make simulate
SEEDS=5000` for more); a failure names its seed, and `python -m tests.simulation --seed N
--trace` replays it exactly.
"""

from __future__ import annotations

import pytest

from tests.simulation.seeds import chunks
from tests.simulation.sim import simulate


@pytest.mark.parametrize("seeds", chunks(0), ids=lambda r: f"{r.start}-{r.stop - 1}")
def test_seeds(seeds: range) -> None:
    for seed in seeds:
        stats = simulate(seed)
        assert stats.ops > 0 and stats.acked > 0


def test_the_same_seed_replays_the_same_run() -> None:
    assert simulate(7) == simulate(7)
