"""How a range lays out keys in its store.

A table key is `(pkey, lkey)`. The stored key is `0x01`, the pkey's length as 4 bytes big-endian,
the pkey, then the lkey. The length prefix keeps every pkey's keys contiguous and unambiguous even
when keys contain 0x00 (BookKeeper's `0x01 + r_key + 0x00 + key` layout is not: pkey `a` would
also scan keys of pkey `a\\x00b`). Keys with an empty pkey are stored as `0x00` + lkey. Keys
starting with `0xff` hold the range's own bookkeeping (see `SYSTEM_PREFIX`).
"""

from __future__ import annotations

import struct

_PKEY_TAG = b"\x01"
_NO_PKEY_TAG = b"\x00"
_LEN = struct.Struct(">I")
SYSTEM_PREFIX = b"\xff"


def pkey_prefix(pkey: bytes) -> bytes:
    """The prefix every stored key of `pkey` starts with."""
    if not pkey:
        return _NO_PKEY_TAG
    return _PKEY_TAG + _LEN.pack(len(pkey)) + pkey


def store_key(pkey: bytes, lkey: bytes) -> bytes:
    return pkey_prefix(pkey) + lkey


def split_store_key(key: bytes) -> tuple[bytes, bytes]:
    """`(pkey, lkey)` of a stored table key (the inverse of `store_key`)."""
    if key[:1] == _NO_PKEY_TAG:
        return b"", key[1:]
    if key[:1] != _PKEY_TAG or len(key) < 1 + _LEN.size:
        raise ValueError(f"not a table key: {key[:16]!r}")
    (length,) = _LEN.unpack_from(key, 1)
    start = 1 + _LEN.size
    return key[start : start + length], key[start + length :]


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (prefix never all 0xff)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1])


def system_key(name: bytes) -> bytes:
    return SYSTEM_PREFIX + name


SEQUENCE_DIGITS = 20
"""The decimal digits a sequential put appends to its key prefix (the pkey's counter)."""
