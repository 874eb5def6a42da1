"""The SDK's value types, in one module: what tables, watches, sessions, bulk access and the
clients hand back. Immutable; each field says what it holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tablekeeper_proto.bookkeeper import kv_pb2

Key = bytes | str
"""A key or value: bytes, or str (UTF-8 encoded)."""
CompareOp = Literal["==", "!=", ">", "<"]
"""A txn compare's operator."""


@dataclass(frozen=True, slots=True)
class ReadInfo:
    """Who answered a read with `read_from="follower"`, and how fresh the answer is."""

    replica: str
    """"follower", or "leader" (the server asked owns the range, or keeps no followers)."""
    range_id: int
    """The range that answered (0 when the server did not say)."""
    applied: int
    """The range's log position the answer reflects."""
    staleness_s: float
    """Every write acknowledged at least this long before the read is in the answer (0 from
    the leader)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key's value and metadata (version, create and mod revisions)."""

    pkey: bytes
    lkey: bytes
    value: bytes
    """The stored bytes; for a number, its 8-byte big-endian encoding."""
    number: int | None
    """The value of a number key (created by `increment`); None for a bytes key."""
    version: int
    """0 when created, +1 per update."""
    create_revision: int
    mod_revision: int

    @property
    def is_number(self) -> bool:
        """Whether the key is a number key (written by `increment`)."""
        return self.number is not None

    @staticmethod
    def from_proto(pkey: bytes, kv: kv_pb2.KeyValue) -> KeyValue:
        """A `KeyValue` of `pkey` from the wire's KeyValue message."""
        return KeyValue(
            pkey=pkey,
            lkey=kv.key,
            value=kv.value,
            number=kv.number_value if kv.is_number else None,
            version=kv.version,
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
        )


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """A namespace's name and id."""

    name: str
    namespace_id: int


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table's namespace, name, id, number of ranges and TTL."""

    namespace: str
    name: str
    table_id: int
    ranges: int
    ttl_seconds: int


@dataclass(frozen=True, slots=True)
class RangeInfo:
    """One hash range of a table: pkeys whose routing hash is in [start_hash, end_hash)."""

    range_id: int
    start_hash: int
    end_hash: int
    container_id: int


@dataclass(frozen=True, slots=True)
class TableLayout:
    """A table and its ranges."""

    namespace: str
    name: str
    table_id: int
    container_id: int
    ranges: list[RangeInfo]


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Whether a txn's compares held, and one result per applied op."""

    succeeded: bool
    """Whether every compare held (the `then` ops ran) or not (the `otherwise` ops ran)."""
    results: list[Any]
    """One entry per executed op: `KeyValue | None` (previous value) for a put, `list[KeyValue]`
    for a get or scan, the deleted count for a delete, or a `TableKeeperError` for an op that
    failed on its own (e.g. a put on a number key) while the others were applied."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch: put or delete, its key, and its revision."""

    type: Literal["put", "delete"]
    pkey: bytes
    lkey: bytes
    kv: KeyValue | None
    """The new key-value of a put; None for a delete."""
    prev: KeyValue | None
    """The previous key-value (when the watch asked for it and the key existed)."""
    revision: int
    index: int
    """Position among the changes of the same revision (a range delete changes many keys)."""


__all__ = [
    "CompareOp",
    "Key",
    "KeyValue",
    "NamespaceInfo",
    "RangeInfo",
    "TableInfo",
    "TableLayout",
    "TxnResult",
    "WatchEvent",
]
