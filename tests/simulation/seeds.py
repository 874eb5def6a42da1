"""Which seeds `make test` simulates, in two halves: the unit tier gives each test file to one
worker (`--dist loadfile`), so the seeds live in two files to run on both cores at once."""

from __future__ import annotations

import os

SEEDS = int(os.environ.get("TABLEKEEPER_SIM_SEEDS", "120"))
CHUNK = 20


def chunks(half: int) -> list[range]:
    """The seed chunks of `half` (0 or 1): every other chunk of 0..SEEDS."""
    starts = range(0, SEEDS, CHUNK)
    return [range(s, min(s + CHUNK, SEEDS)) for i, s in enumerate(starts) if i % 2 == half]
