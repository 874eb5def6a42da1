"""Routing: which hash range of a table a partition key belongs to.

The hash and the split follow BookKeeper's table service exactly, so a table shared with Java
clients or Java-written data routes the same way: MurmurHash3 x64_128 with seed 383242705, the
first 64-bit half read as a signed integer, and `initial_num_ranges` ranges (at least 2, odd
numbers rounded up) of width `INT64_MAX // (n // 2)`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import mmh3

HASH_SEED = 383242705
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def routing_hash(pkey: bytes) -> int:
    """BookKeeper's routing hash of a partition key (a signed 64-bit integer)."""
    return int(mmh3.hash64(pkey, seed=HASH_SEED)[0])


@dataclass(frozen=True, slots=True)
class HashRange:
    """The hash interval [start, end) of one range; the last range also holds INT64_MAX."""

    start: int
    end: int


def split_hash_space(initial_num_ranges: int, *, exact: bool = False) -> list[HashRange]:
    """Split the 64-bit hash space as BookKeeper's `ProtoUtils.split` does; `exact` (a table
    whose ranges are another protocol's shards, `StreamConfiguration.exact_num_ranges`): into
    exactly `initial_num_ranges` (at least 1) equal ranges, which for an even count is the
    same split."""
    if exact:
        n = max(1, initial_num_ranges)
        size = (INT64_MAX - INT64_MIN) // n
    else:
        n = max(2, initial_num_ranges)
        if n % 2:
            n += 1
        size = INT64_MAX // (n // 2)
    ranges = []
    start = INT64_MIN
    for i in range(n):
        end = INT64_MAX if i == n - 1 else start + size
        ranges.append(HashRange(start, end))
        start = end
    return ranges


def normalized_num_ranges(initial_num_ranges: int, *, exact: bool = False) -> int:
    """The number of ranges a table with this `initial_num_ranges` gets."""
    return len(split_hash_space(initial_num_ranges, exact=exact))


class RangeRouter:
    """Finds the range that holds a partition key: a floor lookup over the range start hashes."""

    def __init__(self, starts: Sequence[int], range_ids: Sequence[int]) -> None:
        if not starts or len(starts) != len(range_ids):
            raise ValueError("a router needs one range id per start hash")
        order = sorted(range(len(starts)), key=lambda i: starts[i])
        self._starts = [starts[i] for i in order]
        self._range_ids = [range_ids[i] for i in order]

    def route(self, pkey: bytes) -> int:
        """The id of the range holding `pkey`."""
        return self.route_hash(routing_hash(pkey))

    def route_hash(self, hash_value: int) -> int:
        index = bisect.bisect_right(self._starts, hash_value) - 1
        return self._range_ids[max(index, 0)]
