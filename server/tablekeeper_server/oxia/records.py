"""What an Oxia record keeps besides the range's own record fields.

The range's `StoredRecord` already has what Oxia's version needs most: `mod_revision` gives the
`version_id` (see `version_id`) and `version` is the `modifications_count` (0 when created, +1
per put). The rest of Oxia's version (created and modified timestamps, session id, client
identity) is packed in front of the value.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tablekeeper_proto.oxia import client_pb2
from tablekeeper_server.range.records import StoredRecord

_META = struct.Struct(">qqqBI")  # created ms, modified ms, session id, flags, identity length
_HAS_SESSION = 1
_HAS_IDENTITY = 2


@dataclass(frozen=True, slots=True)
class OxiaMeta:
    created_ms: int
    modified_ms: int
    session_id: int | None
    client_identity: str | None


def pack(meta: OxiaMeta, value: bytes) -> bytes:
    identity = (meta.client_identity or "").encode()
    flags = (_HAS_SESSION if meta.session_id is not None else 0) | (
        _HAS_IDENTITY if meta.client_identity is not None else 0
    )
    header = _META.pack(
        meta.created_ms, meta.modified_ms, meta.session_id or 0, flags, len(identity)
    )
    return header + identity + value


def unpack(raw: bytes) -> tuple[OxiaMeta, bytes]:
    created, modified, session_id, flags, length = _META.unpack_from(raw)
    start = _META.size
    identity = raw[start : start + length].decode()
    meta = OxiaMeta(
        created,
        modified,
        session_id if flags & _HAS_SESSION else None,
        identity if flags & _HAS_IDENTITY else None,
    )
    return meta, raw[start + length :]


def version_id(record: StoredRecord) -> int:
    """Oxia's version id of a record: the shard's log offset of the write that last changed it
    (per shard, only growing), as Oxia numbers offsets, from 0 — the range's revisions count
    from 1, so a fresh shard's first write has version id 0, as on Oxia. Derived when read,
    never stored: records written before keep their revisions and read the same way."""
    return record.mod_revision - 1


def fill_version(version: client_pb2.Version, record: StoredRecord) -> bytes:
    """Set `version` (a message in the response being built: no copy) from a stored Oxia
    record, as `version_of(record, unpack(record.value)[0])` would be; return the record's
    value. The per-key path of reads: no `OxiaMeta` in between."""
    raw = record.value
    created, modified, session_id, flags, length = _META.unpack_from(raw)
    version.version_id = record.mod_revision - 1
    version.modifications_count = record.version
    version.created_timestamp = created
    version.modified_timestamp = modified
    start = _META.size
    if flags & _HAS_SESSION:
        version.session_id = session_id
    if flags & _HAS_IDENTITY:
        version.client_identity = raw[start : start + length].decode()
    return raw[start + length :]


def version_of(record: StoredRecord, meta: OxiaMeta) -> client_pb2.Version:
    version = client_pb2.Version(
        version_id=version_id(record),
        modifications_count=record.version,
        created_timestamp=meta.created_ms,
        modified_timestamp=meta.modified_ms,
    )
    if meta.session_id is not None:
        version.session_id = meta.session_id
    if meta.client_identity is not None:
        version.client_identity = meta.client_identity
    return version
