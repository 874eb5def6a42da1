"""Helpers the benchmarks share (the process harness itself is tests/support's)."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of ascending `sorted_values`, in
    their unit; NaN when there are none."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(q / 100.0 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[index])
