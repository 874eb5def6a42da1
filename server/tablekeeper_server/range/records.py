"""The stored form of one key: its metadata and value, packed with `struct` (hot path)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

# create_revision, mod_revision, version, is_number, expire_ms
_HEADER = struct.Struct(">qqqBq")
_NUMBER = struct.Struct(">q")
HEADER_SIZE = _HEADER.size
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""Revisions, versions, expiry times and numbers are stored as signed 64-bit integers."""


@dataclass(slots=True)
class StoredRecord:
    create_revision: int
    mod_revision: int
    version: int
    is_number: bool
    expire_ms: int
    """0 for no expiry; otherwise the key is invisible from this time (ms since the epoch) on."""
    value: bytes
    """The bytes of a bytes key; the 8-byte big-endian value of a number key."""

    @property
    def number(self) -> int:
        return int(_NUMBER.unpack(self.value)[0])

    def is_live(self, now_ms: int) -> bool:
        return self.expire_ms == 0 or now_ms < self.expire_ms

    def encode(self) -> bytes:
        header = _HEADER.pack(
            self.create_revision, self.mod_revision, self.version, self.is_number, self.expire_ms
        )
        return header + self.value


def decode_record(raw: bytes) -> StoredRecord:
    create, mod, version, is_number, expire = _HEADER.unpack_from(raw)
    return StoredRecord(create, mod, version, bool(is_number), expire, raw[HEADER_SIZE:])


def encode_number(value: int) -> bytes:
    return _NUMBER.pack(value)


def wrap_int64(value: int) -> int:
    """Two's-complement 64-bit wrap-around, as Java's long addition does."""
    return (value + 2**63) % 2**64 - 2**63
