"""Client-side routing: which range of a table holds a partition key.

The server routes a pkey by BookKeeper's hash: MurmurHash3 x64_128 with seed 383242705, the first
64-bit half read as a signed integer, looked up (floor) among the ranges' start hashes. Knowing
this lets a reader plan only the ranges that can hold a set of pkeys (the Spark connector's pkey
pushdown). The hash is implemented here in pure Python so the SDK needs no extra dependency;
`mmh3` is used instead when it is installed (the server's extra installs it).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence

from tablekeeper.types import RangeInfo

HASH_SEED = 383242705
_M64 = 0xFFFF_FFFF_FFFF_FFFF
_C1 = 0x87C3_7B91_1142_53D5
_C2 = 0x4CF5_AD43_2745_937F
_BLOCK = struct.Struct("<QQ")


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51_AFD7_ED55_8CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CE_B9FE_1A85_EC53) & _M64
    k ^= k >> 33
    return k


def murmur3_x64_128_h1(data: bytes, seed: int = HASH_SEED) -> int:
    """The first 64-bit half of MurmurHash3 x64_128, signed (what `mmh3.hash64(...)[0]` is)."""
    h1 = h2 = seed & 0xFFFF_FFFF
    n_blocks = len(data) // 16
    for i in range(n_blocks):
        k1, k2 = _BLOCK.unpack_from(data, i * 16)
        k1 = _rotl((k1 * _C1) & _M64, 31)
        h1 ^= (k1 * _C2) & _M64
        h1 = (_rotl(h1, 27) + h2) & _M64
        h1 = (h1 * 5 + 0x52DC_E729) & _M64
        k2 = _rotl((k2 * _C2) & _M64, 33)
        h2 ^= (k2 * _C1) & _M64
        h2 = (_rotl(h2, 31) + h1) & _M64
        h2 = (h2 * 5 + 0x3849_5AB5) & _M64
    tail = data[n_blocks * 16 :]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
    h1 ^= len(data)
    h2 ^= len(data)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 = (h1 + h2) & _M64
    return h1 - (1 << 64) if h1 >= 1 << 63 else h1


def _python_routing_hash(pkey: bytes) -> int:
    return murmur3_x64_128_h1(pkey, HASH_SEED)


try:
    import mmh3

    def routing_hash(pkey: bytes) -> int:
        """BookKeeper's routing hash of a partition key (a signed 64-bit integer)."""
        return int(mmh3.hash64(pkey, seed=HASH_SEED)[0])

except ImportError:  # pragma: no cover - depends on the installation
    routing_hash = _python_routing_hash


class RangeRouter:
    """Finds the range that holds a pkey: a floor lookup over the ranges' start hashes."""

    def __init__(self, ranges: Sequence[RangeInfo]) -> None:
        if not ranges:
            raise ValueError("a table has at least one range")
        self.ranges = sorted(ranges, key=lambda r: r.start_hash)
        self._starts = [r.start_hash for r in self.ranges]

    def route(self, pkey: bytes) -> RangeInfo:
        """The range that serves `pkey` (by the hash of the pkey)."""
        index = bisect.bisect_right(self._starts, routing_hash(pkey)) - 1
        return self.ranges[max(index, 0)]


__all__ = ["HASH_SEED", "RangeInfo", "RangeRouter", "murmur3_x64_128_h1", "routing_hash"]
