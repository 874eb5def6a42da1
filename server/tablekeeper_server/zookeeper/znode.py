"""A znode as the range stores it, and the `Stat` clients see.

The range's record carries czxid (`create_revision`), mzxid (`mod_revision`) and the data
version (`version`); its value is the rest of ZooKeeper's `StatPersisted` (ctime, mtime,
aversion, ephemeral owner, cversion, pzxid), the number of children, whether the data is null,
the node's ACL (its jute vector) and its data.

`cversion` is kept as ZooKeeper keeps it: the number of children ever created (it names
sequential nodes); clients see `2 * cversion - numChildren`, the number of child changes,
as `DataNode.copyStat` computes it. Versions are Java ints: they wrap, and a version that would
become -1 ("any version") becomes 0 (ZOOKEEPER-4743).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tablekeeper_server.range.records import HEADER_SIZE, StoredRecord
from tablekeeper_server.zookeeper import jute
from tablekeeper_server.zookeeper.protocol import ALL, READ, client_owner

_META = struct.Struct(">qqiqiiqBI")
"""ctime, mtime, aversion, ephemeral owner, cversion, numChildren, pzxid, flags, ACL bytes."""
_RAW = struct.Struct(">qqqBq" + _META.format[1:])
"""A stored record's header followed by the meta: reads take a stat from the raw bytes."""
_RAW_SIZE = _RAW.size
_NULL_DATA = 1

OPEN_ACL = jute.write_acls([(ALL, "world", "anyone")])
"""`Ids.OPEN_ACL_UNSAFE`, as stored."""
READ_ACL = jute.write_acls([(READ, "world", "anyone")])
"""`Ids.READ_ACL_UNSAFE`, as stored."""


def int32(value: int) -> int:
    """`value` wrapped as a Java int."""
    return (value + 2**31) % 2**32 - 2**31


def next_version(version: int) -> int:
    """The version after `version` (ZooKeeper's `checkAndIncVersion`)."""
    following = int32(version + 1)
    return 0 if following == -1 else following


@dataclass(slots=True)
class Znode:
    czxid: int
    mzxid: int
    version: int
    ctime: int
    mtime: int
    aversion: int
    owner: int
    """The ephemeral owner as ZooKeeper stores it: a session, 0, `CONTAINER_OWNER` or a TTL."""
    cversion: int
    """Children ever created (see the module docstring)."""
    children: int
    pzxid: int
    acl: bytes
    data: bytes | None

    def record(self) -> StoredRecord:
        data = self.data
        meta = _META.pack(
            self.ctime,
            self.mtime,
            self.aversion,
            self.owner,
            self.cversion,
            self.children,
            self.pzxid,
            _NULL_DATA if data is None else 0,
            len(self.acl),
        )
        return StoredRecord(
            self.czxid, self.mzxid, self.version, False, 0, meta + self.acl + (data or b"")
        )

    def stat(self) -> bytes:
        return jute.STAT.pack(
            self.czxid,
            self.mzxid,
            self.ctime,
            self.mtime,
            self.version,
            int32(2 * self.cversion - self.children),
            self.aversion,
            client_owner(self.owner),
            len(self.data or b""),
            self.children,
            self.pzxid,
        )


def record_acl(record: StoredRecord) -> bytes:
    """The ACL of a znode's record (without decoding the rest)."""
    value = record.value
    acl_len = _META.unpack_from(value)[-1]
    return value[_META.size : _META.size + acl_len]


def from_record(record: StoredRecord) -> Znode:
    value = record.value
    ctime, mtime, aversion, owner, cversion, children, pzxid, flags, acl_len = _META.unpack_from(
        value
    )
    start = _META.size
    acl = value[start : start + acl_len]
    data = None if flags & _NULL_DATA else value[start + acl_len :]
    return Znode(
        record.create_revision,
        record.mod_revision,
        record.version,
        ctime,
        mtime,
        aversion,
        owner,
        cversion,
        children,
        pzxid,
        acl,
        data,
    )


Meta = tuple[int, int, int, int, int, int, int, int, int]
"""A stored znode's meta, unpacked (`meta_of`): ctime, mtime, aversion, ephemeral owner,
cversion, numChildren, pzxid, flags, ACL bytes (the ACL, then the data, follow at `META_SIZE`)."""
META_SIZE = _META.size


def meta_of(record: StoredRecord) -> Meta:
    """The meta of a znode's record, for a write that changes a few of its fields in place
    (`with_children`, `with_data`) instead of decoding the node (`from_record`)."""
    return _META.unpack_from(record.value)


def with_children(
    record: StoredRecord, meta: Meta, cversion: int, children: int, pzxid: int
) -> StoredRecord:
    """`record` (whose meta is `meta`) with its child counters and pzxid set: what
    `Znode.record` makes of the node after a child is created or deleted."""
    ctime, mtime, aversion, owner, _, _, _, flags, acl_len = meta
    head = _META.pack(ctime, mtime, aversion, owner, cversion, children, pzxid, flags, acl_len)
    return StoredRecord(
        record.create_revision,
        record.mod_revision,
        record.version,
        False,
        0,
        head + record.value[_META.size :],
    )


def with_data(
    record: StoredRecord, meta: Meta, zxid: int, now: int, data: bytes | None
) -> StoredRecord:
    """`record` (whose meta is `meta`) after a setData of `data` at `zxid` and time `now`:
    what `Znode.record` makes of it (the next data version, mzxid and mtime)."""
    ctime, _, aversion, owner, cversion, children, pzxid, _, acl_len = meta
    head = _META.pack(
        ctime,
        now,
        aversion,
        owner,
        cversion,
        children,
        pzxid,
        _NULL_DATA if data is None else 0,
        acl_len,
    )
    value = record.value
    return StoredRecord(
        record.create_revision,
        zxid,
        next_version(record.version),
        False,
        0,
        head + value[_META.size : _META.size + acl_len] + (data or b""),
    )


def new_record(zxid: int, now: int, owner: int, acl: bytes, data: bytes | None) -> StoredRecord:
    """The record of a node created at `zxid` and time `now` (`Znode.record` of it)."""
    meta = _META.pack(now, now, 0, owner, 0, 0, zxid, _NULL_DATA if data is None else 0, len(acl))
    return StoredRecord(zxid, zxid, 0, False, 0, meta + acl + (data or b""))


def record_stat(record: StoredRecord) -> bytes:
    """The `Stat` of a znode's record (`Znode.stat` of `from_record(record)`)."""
    value = record.value
    ctime, mtime, aversion, owner, cversion, children, pzxid, flags, acl_len = _META.unpack_from(
        value
    )
    return jute.STAT.pack(
        record.create_revision,
        record.mod_revision,
        ctime,
        mtime,
        record.version,
        int32(2 * cversion - children),
        aversion,
        client_owner(owner),
        0 if flags & _NULL_DATA else len(value) - _META.size - acl_len,
        children,
        pzxid,
    )


def read_raw(raw: bytes) -> tuple[bytes, bytes, bytes | None, int]:
    """(stat, ACL, data, ephemeral owner) of a stored record's raw bytes, without building a
    record (the read path)."""
    (
        czxid,
        mzxid,
        version,
        _is_number,
        _expire,
        ctime,
        mtime,
        aversion,
        owner,
        cversion,
        children,
        pzxid,
        flags,
        acl_len,
    ) = _RAW.unpack_from(raw)
    acl_end = _RAW_SIZE + acl_len
    data = None if flags & _NULL_DATA else raw[acl_end:]
    stat = jute.STAT.pack(
        czxid,
        mzxid,
        ctime,
        mtime,
        version,
        int32(2 * cversion - children),
        aversion,
        client_owner(owner),
        len(raw) - acl_end if data is not None else 0,
        children,
        pzxid,
    )
    return stat, raw[_RAW_SIZE:acl_end], data, owner


def raw_acl(raw: bytes) -> bytes:
    acl_len = _RAW.unpack_from(raw)[-1]
    return raw[_RAW_SIZE : _RAW_SIZE + acl_len]


def raw_times(raw: bytes) -> tuple[int, int, int, int]:
    """(mtime, ephemeral owner, cversion, numChildren) of a stored record (the sweep)."""
    fields = _RAW.unpack_from(raw)
    return fields[6], fields[8], fields[9], fields[10]


assert _RAW_SIZE - _META.size == HEADER_SIZE
