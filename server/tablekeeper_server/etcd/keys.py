"""Where an etcd keyspace lives in its range, and etcd's view of a stored record.

The keyspace is one pkey (`KEYSPACE_PKEY`) of one range: every etcd key is an lkey under it, so
the range's revisions are the keyspace's revisions and a prefix is one ordered scan. TableKeeper
counts a key's first version as 0 (BookKeeper's convention); etcd counts it as 1, so etcd sees
`version + 1`. A delete removes the record, so a re-created key starts again at version 1, as in
etcd.
"""

from __future__ import annotations

from tablekeeper_proto.etcd import kv_pb2
from tablekeeper_server.core.keys import pkey_prefix, prefix_end, system_key
from tablekeeper_server.range.records import StoredRecord

KEYSPACE_PKEY = b""
PREFIX = pkey_prefix(KEYSPACE_PKEY)
END = prefix_end(PREFIX)
COMPACTED_KEY = system_key(b"etcd-compacted")
"""The revision of the keyspace's last Compact (a number record; missing: never compacted)."""


def span(key: bytes, range_end: bytes) -> tuple[bytes, bytes]:
    """The store interval [start, end) of etcd's `key`..`range_end` (exclusive end; empty: the
    single key; `\\x00`: every key from `key` on)."""
    start = PREFIX + key
    if not range_end:
        return start, start + b"\x00"
    if range_end == b"\x00":
        return start, END
    return start, PREFIX + range_end


def etcd_key(store_key: bytes) -> bytes:
    return store_key[len(PREFIX) :]


def to_kv(
    store_key: bytes, record: StoredRecord, lease: int, *, keys_only: bool = False
) -> kv_pb2.KeyValue:
    kv = kv_pb2.KeyValue(
        key=etcd_key(store_key),
        create_revision=record.create_revision,
        mod_revision=record.mod_revision,
        version=record.version + 1,
        lease=lease,
    )
    if not keys_only:
        kv.value = record.value
    return kv
