"""Protobuf's base-128 varints, for the hot paths that write protobuf's encoding by hand (the
watch port's updates, a front-end's log records): `varint(n)`, and `length(n)` for a length
field, which takes the one- and two-byte varints from a table built once."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """The varint of `value` (a negative int64 as protobuf encodes it: ten bytes)."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))
_CONTINUED = tuple(bytes((n | 0x80,)) for n in range(0x80))
SMALL_VARINTS = _ONE_BYTE + tuple(low + high for high in _ONE_BYTE[1:] for low in _CONTINUED)
"""The varints of 0..16383 (one or two bytes): nearly every length. Built from byte pairs
(through `varint` the table cost every server start 30 ms)."""


def length(n: int) -> bytes:
    """The varint of the length `n`."""
    return SMALL_VARINTS[n] if n < 16384 else varint(n)
