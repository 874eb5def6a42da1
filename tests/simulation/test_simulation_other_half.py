"""The other half of the simulation's seeds (tests/simulation/test_simulation.py has the first)."""

from __future__ import annotations

import pytest

from tests.simulation.seeds import chunks
from tests.simulation.sim import simulate


@pytest.mark.parametrize("seeds", chunks(1), ids=lambda r: f"{r.start}-{r.stop - 1}")
def test_seeds(seeds: range) -> None:
    for seed in seeds:
        stats = simulate(seed)
        assert stats.ops > 0 and stats.acked > 0
