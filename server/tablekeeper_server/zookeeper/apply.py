"""Applying ZooKeeper writes inside the range's state machine: the ZooKeeper front-end's applier
(`ZooKeeperApplier`, registered as "zookeeper"; its commands are `WalCommand.front_end` with that
applier name, their payload laid out by `commands`).

Every ZooKeeper write (create in all its modes, delete, setData, setACL, multi, and the
keyspace's own bookkeeping, see `commands`) is one logged command, applied here at its revision,
which is the write's zxid. Every check ZooKeeper makes happens here, on the state the command
finds, in ZooKeeper's order (`PrepRequestProcessor`): the session is live, the path is valid,
the ACL is well formed, the parent exists and grants the permission, the node exists or not,
the version matches, a sequential name takes the parent's cversion, an ephemeral node has no
children. A write that fails changes nothing and is answered with ZooKeeper's error code (like
ZooKeeper, it still takes a zxid). A multi applies all its operations or none: each sees the
ones before it; if one fails, the ones before it answer OK, it answers its error and the ones
after it RUNTIMEINCONSISTENCY, and nothing changes.

Stats are updated as `DataTree` does: a create sets the parent's cversion (children ever
created), pzxid and child count; a delete sets the parent's pzxid and child count; setData
bumps the data version, mzxid and mtime; setACL the ACL version.

The znode changes ZooKeeper notifies watchers of (created, deleted, data changed) are recorded
as the range's change events (`ApplyContext.record_event`), one per operation in order; the
dispatcher of watch events (`watches`) turns them into ZooKeeper's events. They are live only:
the applier keeps none in the range's durable history (`keeps_history`), which no ZooKeeper
watch reads. Stat-only changes (a
parent's counters, an ACL) are written without an event. A session's end (its close, or its
expiry found by the range's session timer) deletes its ephemeral nodes through
`ZooKeeperApplier.session_ending`, which the session applier calls in the command that ends the
session. The keyspace's bookkeeping (`paths.BOOKKEEPING`) cannot be divided by pkey: a range
holding any refuses a split.

The result depends only on the store and the command, so replay agrees. The front-end queues a
client's write with its decoded request (`prepare`, a `range.apply.FrontEndCommand`), which the
apply uses instead of decoding the logged request again; replay decodes it. A create, setData or
delete outside a multi is applied on the nodes' records directly (`_single_*`), the rest on a
`_Tree` of decoded `Znode`s; both make the same checks, writes, events and replies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from tablekeeper_proto.bookkeeper import kv_rpc_pb2
from tablekeeper_proto.v1 import wal_pb2
from tablekeeper_proto.zookeeper import apply_pb2
from tablekeeper_server.core.keys import prefix_end
from tablekeeper_server.range.apply import ApplyContext, Rejected, Response
from tablekeeper_server.range.records import StoredRecord
from tablekeeper_server.range.session_keys import session_key
from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import commands, jute
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.jute import JuteError
from tablekeeper_server.zookeeper.paths import (
    BOOKKEEPING,
    CONTAINERS,
    SECRET_KEY,
    TTLS,
    ephemeral_key,
    ephemerals_prefix,
    index_path,
    is_valid,
    node_key,
    parent_of,
)
from tablekeeper_server.zookeeper.znode import (
    META_SIZE,
    OPEN_ACL,
    READ_ACL,
    Meta,
    Znode,
    from_record,
    meta_of,
    new_record,
    next_version,
    record_stat,
    with_children,
    with_data,
)

_INDEX_RECORD_VALUE = b""
ROOT_NODES = (
    (zk.ROOT, OPEN_ACL, 1, 0),
    (zk.SYSTEM_NODE, OPEN_ACL, 2, 0),
    (zk.QUOTA_NODE, OPEN_ACL, 0, 0),
    (zk.CONFIG_NODE, READ_ACL, 0, -1),
)
"""The nodes every keyspace starts with (path, ACL, children, aversion), with ZooKeeper's zeroed
stats (its config node's ACL is set with version -1 when it is made, so its aversion is -1)."""


class _FailedError(Exception):
    """An operation fails with ZooKeeper's error `code` (nothing of its command is kept)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Tree:
    """The znodes during one command: the range's state plus this command's own changes."""

    __slots__ = (
        "auth",
        "auth_raw",
        "changed",
        "events",
        "index",
        "nodes",
        "now",
        "records",
        "ctx",
        "zxid",
    )

    def __init__(self, ctx: ApplyContext, zxid: int, now: int, auth_raw: bytes = b"") -> None:
        self.ctx = ctx
        self.zxid = zxid
        self.now = now
        self.auth_raw = auth_raw
        self.auth: list[acls.AuthId] | None = None
        self.nodes: dict[str, Znode | None] = {}
        self.records: dict[str, StoredRecord | None] = {}
        """The record of a node's present state in `nodes`, where known (a change drops it)."""
        self.changed: dict[str, None] = {}
        self.index: dict[bytes, bool] = {}
        self.events: list[tuple[bytes, StoredRecord | None, StoredRecord | None]] = []

    def ids(self) -> list[acls.AuthId]:
        if self.auth is None:
            self.auth = acls.decode_auth(self.auth_raw) if self.auth_raw else []
        return self.auth

    def get(self, path: str) -> Znode | None:
        nodes = self.nodes
        if path in nodes:
            return nodes[path]
        record = self.ctx.get(node_key(path))
        node = None if record is None else from_record(record)
        nodes[path] = node
        self.records[path] = record
        return node

    def record_of(self, path: str) -> StoredRecord | None:
        """The record of `path`'s present state (made once per state)."""
        records = self.records
        if path in records:
            return records[path]
        node = self.nodes[path]
        record = None if node is None else node.record()
        records[path] = record
        return record

    def touched(self, path: str) -> None:
        """`path`'s node was changed in place: write it, and make its record again."""
        self.changed[path] = None
        self.records.pop(path, None)

    def need(self, path: str) -> Znode:
        node = self.get(path)
        if node is None:
            raise _FailedError(zk.NO_NODE)
        return node

    def check(self, node: Znode, perm: int) -> None:
        if node.acl != OPEN_ACL and not acls.allowed(node.acl, perm, self.ids()):
            raise _FailedError(zk.NO_AUTH)

    def fixup(self, acl_list: bytes | list[jute.Acl] | None) -> bytes:
        if isinstance(acl_list, bytes):
            return acl_list  # OPEN_ACL_UNSAFE, as stored
        try:
            return acls.fixup(acl_list, self.ids())
        except acls.InvalidAclError:
            raise _FailedError(zk.INVALID_ACL) from None

    def session_live(self, session_id: int) -> None:
        if not self.ctx.session_exists(session_id):
            raise _FailedError(zk.SESSION_EXPIRED)

    def set(self, path: str, node: Znode | None) -> None:
        self.nodes[path] = node
        self.touched(path)

    def event(self, path: str, record: StoredRecord | None, prev: StoredRecord | None) -> None:
        self.events.append((node_key(path), record, prev))

    def index_owner(self, path: str, owner: int, present: bool) -> None:
        if owner == 0:
            return
        if owner == zk.CONTAINER_OWNER:
            key = CONTAINERS + path.encode("utf-8", "surrogatepass")
        elif zk.is_ttl_owner(owner):
            key = TTLS + path.encode("utf-8", "surrogatepass")
        else:
            key = ephemeral_key(owner, path)
        self.index[key] = present

    def flush(self) -> None:
        """Stage this command's writes and events in the range's apply context."""
        ctx, zxid = self.ctx, self.zxid
        for path in self.changed:
            record = self.record_of(path)
            if record is None:
                ctx.delete(node_key(path))
            else:
                ctx.put(node_key(path), record)
        for key, present in self.index.items():
            if present:
                ctx.put(key, StoredRecord(0, zxid, 0, False, 0, _INDEX_RECORD_VALUE))
            else:
                ctx.delete(key)
        for key, record, prev in self.events:
            ctx.record_event(key, record, prev)

    # ------------------------------------------------------------------ operations

    def create(
        self,
        session_id: int,
        op: int,
        path: str | None,
        data: bytes | None,
        acl_list: bytes | list[jute.Acl] | None,
        mode: int,
        ttl: int,
    ) -> tuple[str, Znode]:
        if mode not in zk.MODES:
            raise _FailedError(zk.BAD_ARGUMENTS)
        if mode in zk.TTL_MODES:
            if not 0 < ttl <= zk.TTL_MAX_MS:
                raise _FailedError(zk.BAD_ARGUMENTS)
        elif ttl >= 0:
            raise _FailedError(zk.BAD_ARGUMENTS)
        self.session_live(session_id)
        if path is None or "\0" in path or "/" not in path:
            raise _FailedError(zk.BAD_ARGUMENTS)
        fixed = self.fixup(acl_list)
        parent_path = parent_of(path)
        parent = self.need(parent_path)
        self.check(parent, zk.CREATE_PERM)
        if mode in zk.SEQUENTIAL_MODES:
            path = f"{path}{parent.cversion:010d}"
        if not is_valid(path):
            raise _FailedError(zk.BAD_ARGUMENTS)
        if self.get(path) is not None:
            raise _FailedError(zk.NODE_EXISTS)
        if zk.is_session_owner(parent.owner):
            raise _FailedError(zk.NO_CHILDREN_FOR_EPHEMERALS)
        if op == zk.CREATE_CONTAINER:
            owner = zk.CONTAINER_OWNER
        elif op == zk.CREATE_TTL:
            owner = zk.ttl_owner(ttl)
        elif mode in zk.EPHEMERAL_MODES:
            owner = session_id
        else:
            owner = 0
        zxid, now = self.zxid, self.now
        parent.cversion = (parent.cversion + 1 + 2**31) % 2**32 - 2**31
        parent.pzxid = zxid
        parent.children += 1
        self.touched(parent_path)
        node = Znode(zxid, zxid, 0, now, now, 0, owner, 0, 0, zxid, fixed, data)
        self.set(path, node)
        self.index_owner(path, owner, True)
        self.event(path, self.record_of(path), None)
        return path, node

    def delete(self, session_id: int, path: str | None, version: int) -> None:
        self.session_live(session_id)
        if path is None or "\0" in path or "/" not in path or path in zk.SPECIAL_PATHS:
            raise _FailedError(zk.BAD_ARGUMENTS)
        parent_path = parent_of(path)
        parent = self.need(parent_path)
        self.check(parent, zk.DELETE_PERM)
        node = self.need(path)
        if version != -1 and version != node.version:
            raise _FailedError(zk.BAD_VERSION)
        if node.children > 0:
            raise _FailedError(zk.NOT_EMPTY)
        self.remove(path, node, parent_path, parent)

    def remove(self, path: str, node: Znode, parent_path: str, parent: Znode) -> None:
        prev = self.record_of(path)
        parent.children -= 1
        parent.pzxid = max(parent.pzxid, self.zxid)
        self.touched(parent_path)
        self.set(path, None)
        self.index_owner(path, node.owner, False)
        self.event(path, None, prev)

    def delete_container(self, path: str | None) -> None:
        """The deleteContainer operation as ZooKeeper prepares it (for any node that is no
        plain ephemeral, with no children)."""
        if path is None or "\0" in path or "/" not in path or path in zk.SPECIAL_PATHS:
            raise _FailedError(zk.BAD_ARGUMENTS)
        node = self.need(path)
        if node.children > 0:
            raise _FailedError(zk.NOT_EMPTY)
        if zk.is_session_owner(node.owner):
            raise _FailedError(zk.BAD_VERSION)
        parent_path = parent_of(path)
        self.remove(path, node, parent_path, self.need(parent_path))

    def set_data(
        self, session_id: int, path: str | None, data: bytes | None, version: int
    ) -> Znode:
        self.session_live(session_id)
        if not is_valid(path):
            raise _FailedError(zk.BAD_ARGUMENTS)
        assert path is not None
        node = self.need(path)
        self.check(node, zk.WRITE)
        if version != -1 and version != node.version:
            raise _FailedError(zk.BAD_VERSION)
        prev = self.record_of(path)
        node.version = next_version(node.version)
        node.data = data
        node.mtime = self.now
        node.mzxid = self.zxid
        self.touched(path)
        self.event(path, self.record_of(path), prev)
        return node

    def set_acl(
        self,
        session_id: int,
        path: str | None,
        acl_list: bytes | list[jute.Acl] | None,
        version: int,
    ) -> Znode:
        self.session_live(session_id)
        if not is_valid(path):
            raise _FailedError(zk.BAD_ARGUMENTS)
        assert path is not None
        fixed = self.fixup(acl_list)
        node = self.need(path)
        self.check(node, zk.ADMIN)
        if version != -1 and version != node.aversion:
            raise _FailedError(zk.BAD_VERSION)
        node.aversion = next_version(node.aversion)
        node.acl = fixed
        self.touched(path)
        return node

    def check_version(self, session_id: int, path: str | None, version: int) -> None:
        self.session_live(session_id)
        if not is_valid(path):
            raise _FailedError(zk.BAD_ARGUMENTS)
        assert path is not None
        node = self.need(path)
        self.check(node, zk.READ)
        if version != -1 and version != node.version:
            raise _FailedError(zk.BAD_VERSION)


# ---------------------------------------------------------------------------- requests

_Operation = tuple[int, tuple[object, ...]]
"""(operation code, its decoded request fields)."""


def _read_acl(body: bytes, offset: int) -> tuple[bytes | list[jute.Acl] | None, int]:
    """An ACL vector: the stored form itself when it is OPEN_ACL_UNSAFE (the usual one, which
    needs neither decoding nor the caller's ids), else its entries."""
    end = offset + len(OPEN_ACL)
    if body[offset:end] == OPEN_ACL:
        return OPEN_ACL, end
    return jute.read_acls(body, offset)


def decode_create(op: int, body: bytes, offset: int) -> tuple[tuple[object, ...], int]:
    path, data, offset = jute.read_path_data(body, offset)
    acl_list, offset = _read_acl(body, offset)
    mode, offset = jute.read_int(body, offset)
    ttl = -1
    if op == zk.CREATE_TTL:
        ttl, offset = jute.read_long(body, offset)
    return (path, data, acl_list, mode, ttl), offset


def decode_operation(op: int, body: bytes, offset: int) -> tuple[tuple[object, ...], int]:
    """The fields of one write request (alone, or inside a multi) and the offset after it.
    Raises `JuteError` for a record that does not decode."""
    if op in zk.CREATES:
        return decode_create(op, body, offset)
    if op in (zk.DELETE, zk.CHECK):
        path, version, offset = jute.read_path_int(body, offset)
        return (path, version), offset
    if op == zk.SET_DATA:
        path, data, offset = jute.read_path_data(body, offset)
        version, offset = jute.read_int(body, offset)
        return (path, data, version), offset
    if op == zk.SET_ACL:
        path, offset = jute.read_string(body, offset)
        acl_list, offset = _read_acl(body, offset)
        version, offset = jute.read_int(body, offset)
        return (path, acl_list, version), offset
    if op == zk.DELETE_CONTAINER:
        path, offset = jute.read_string(body, offset)
        return (path,), offset
    raise JuteError(f"operation {op} is not a write")


def decode_multi(body: bytes, allowed: frozenset[int]) -> list[_Operation]:
    """The operations of a multi (or multiRead) record; `JuteError` if it does not decode or
    mixes kinds (ZooKeeper: "Mixing different kind of ops")."""
    out: list[_Operation] = []
    offset = 0
    while True:
        if offset + jute.MULTI_HEADER.size > len(body):
            raise JuteError("multi header past the end of the packet")
        op, done, _ = jute.MULTI_HEADER.unpack_from(body, offset)
        offset += jute.MULTI_HEADER.size
        if done:
            return out
        if op not in allowed:
            raise JuteError(f"operation {op} in a multi of other kinds")
        if op in zk.MULTI_READ_OPS:
            path, watch, offset = jute.read_path_flag(body, offset)
            out.append((op, (path, watch)))
            continue
        fields, offset = decode_operation(op, body, offset)
        out.append((op, fields))


def _run(tree: _Tree, session_id: int, op: int, fields: tuple[object, ...]) -> bytes:
    """Apply one operation to `tree`; its response record (raises `_FailedError`)."""
    if op in zk.CREATES:
        path, data, acl_list, mode, ttl = fields
        created, node = tree.create(
            session_id,
            op,
            path,  # type: ignore[arg-type]
            data,  # type: ignore[arg-type]
            acl_list,  # type: ignore[arg-type]
            mode,  # type: ignore[arg-type]
            ttl,  # type: ignore[arg-type]
        )
        if op == zk.CREATE:
            return jute.write_string(created)
        return jute.write_string(created) + node.stat()
    if op == zk.DELETE:
        tree.delete(session_id, fields[0], fields[1])  # type: ignore[arg-type]
        return b""
    if op == zk.SET_DATA:
        return tree.set_data(session_id, *fields).stat()  # type: ignore[arg-type]
    if op == zk.SET_ACL:
        return tree.set_acl(session_id, *fields).stat()  # type: ignore[arg-type]
    if op == zk.CHECK:
        tree.check_version(session_id, fields[0], fields[1])  # type: ignore[arg-type]
        return b""
    if op == zk.DELETE_CONTAINER:
        tree.delete_container(fields[0])  # type: ignore[arg-type]
        return b""
    raise _FailedError(zk.UNIMPLEMENTED)


# ---------------------------------------------------------------------------- single writes
#
# A write that is not part of a multi (most of them) changes one node and its parent at most,
# once each: it is applied on the nodes' records, read, checked and rewritten in place
# (`znode.meta_of`, `with_data`, `with_children`, `new_record`), without a `_Tree` and its
# `Znode`s. Each makes the same checks in the same order, stages the same writes and events and
# answers the same as `_run` on a `_Tree` (tests/unit/test_zookeeper_apply.py compares them).


def _ids(auth: bytes) -> list[acls.AuthId]:
    return acls.decode_auth(auth) if auth else []


def _require(record: StoredRecord, meta: Meta, perm: int, auth: bytes) -> None:
    """NO_AUTH unless the ACL of the znode stored as `record` (its `meta`) grants `perm` to the
    caller's ids (`auth`), or is the open ACL."""
    acl = record.value[META_SIZE : META_SIZE + meta[8]]
    if acl != OPEN_ACL and not acls.allowed(acl, perm, _ids(auth)):
        raise _FailedError(zk.NO_AUTH)


def _single_create(
    ctx: ApplyContext,
    zxid: int,
    now: int,
    session_id: int,
    auth: bytes,
    op: int,
    fields: tuple[object, ...],
) -> bytes:
    path, data, acl_list, mode, ttl = fields
    if mode not in zk.MODES:
        raise _FailedError(zk.BAD_ARGUMENTS)
    if mode in zk.TTL_MODES:
        if not 0 < ttl <= zk.TTL_MAX_MS:  # type: ignore[operator]
            raise _FailedError(zk.BAD_ARGUMENTS)
    elif ttl >= 0:  # type: ignore[operator]
        raise _FailedError(zk.BAD_ARGUMENTS)
    if ctx.get(session_key(session_id)) is None:
        raise _FailedError(zk.SESSION_EXPIRED)
    if not isinstance(path, str) or "\0" in path or "/" not in path:
        raise _FailedError(zk.BAD_ARGUMENTS)
    if isinstance(acl_list, bytes):
        fixed = acl_list  # OPEN_ACL_UNSAFE, as stored
    else:
        try:
            fixed = acls.fixup(acl_list, _ids(auth))  # type: ignore[arg-type]
        except acls.InvalidAclError:
            raise _FailedError(zk.INVALID_ACL) from None
    parent_path = parent_of(path)
    parent_key = node_key(parent_path)
    parent = ctx.get(parent_key)
    if parent is None:
        raise _FailedError(zk.NO_NODE)
    meta = meta_of(parent)
    _require(parent, meta, zk.CREATE_PERM, auth)
    cversion = meta[4]
    if mode in zk.SEQUENTIAL_MODES:
        path = f"{path}{cversion:010d}"
    if not is_valid(path):
        raise _FailedError(zk.BAD_ARGUMENTS)
    key = node_key(path)
    if ctx.get(key) is not None:
        raise _FailedError(zk.NODE_EXISTS)
    parent_owner = meta[3]
    if zk.is_session_owner(parent_owner):
        raise _FailedError(zk.NO_CHILDREN_FOR_EPHEMERALS)
    if op == zk.CREATE_CONTAINER:
        owner = zk.CONTAINER_OWNER
    elif op == zk.CREATE_TTL:
        owner = zk.ttl_owner(ttl)  # type: ignore[arg-type]
    elif mode in zk.EPHEMERAL_MODES:
        owner = session_id
    else:
        owner = 0
    record = new_record(zxid, now, owner, fixed, data)  # type: ignore[arg-type]
    ctx.put(
        parent_key,
        with_children(parent, meta, (cversion + 1 + 2**31) % 2**32 - 2**31, meta[5] + 1, zxid),
    )
    ctx.put(key, record)
    if owner != 0:
        _index(ctx, zxid, path, owner, True)
    ctx.record_event(key, record, None)
    if op == zk.CREATE:
        return jute.write_string(path)
    return jute.write_string(path) + record_stat(record)


def _single_delete(
    ctx: ApplyContext, zxid: int, session_id: int, auth: bytes, path: object, version: object
) -> bytes:
    if ctx.get(session_key(session_id)) is None:
        raise _FailedError(zk.SESSION_EXPIRED)
    if not isinstance(path, str) or "\0" in path or "/" not in path or path in zk.SPECIAL_PATHS:
        raise _FailedError(zk.BAD_ARGUMENTS)
    parent_path = parent_of(path)
    parent_key = node_key(parent_path)
    parent = ctx.get(parent_key)
    if parent is None:
        raise _FailedError(zk.NO_NODE)
    meta = meta_of(parent)
    _require(parent, meta, zk.DELETE_PERM, auth)
    key = node_key(path)
    prev = ctx.get(key)
    if prev is None:
        raise _FailedError(zk.NO_NODE)
    if version != -1 and version != prev.version:
        raise _FailedError(zk.BAD_VERSION)
    node_meta = meta_of(prev)
    if node_meta[5] > 0:
        raise _FailedError(zk.NOT_EMPTY)
    ctx.put(parent_key, with_children(parent, meta, meta[4], meta[5] - 1, max(meta[6], zxid)))
    ctx.delete(key)
    owner = node_meta[3]
    if owner != 0:
        _index(ctx, zxid, path, owner, False)
    ctx.record_event(key, None, prev)
    return b""


def _single_set_data(
    ctx: ApplyContext,
    zxid: int,
    now: int,
    session_id: int,
    auth: bytes,
    path: object,
    data: object,
    version: object,
) -> bytes:
    if ctx.get(session_key(session_id)) is None:
        raise _FailedError(zk.SESSION_EXPIRED)
    if not isinstance(path, str) or not is_valid(path):
        raise _FailedError(zk.BAD_ARGUMENTS)
    key = node_key(path)
    prev = ctx.get(key)
    if prev is None:
        raise _FailedError(zk.NO_NODE)
    meta = meta_of(prev)
    _require(prev, meta, zk.WRITE, auth)
    if version != -1 and version != prev.version:
        raise _FailedError(zk.BAD_VERSION)
    record = with_data(prev, meta, zxid, now, data)  # type: ignore[arg-type]
    ctx.put(key, record)
    ctx.record_event(key, record, prev)
    return record_stat(record)


def _index(ctx: ApplyContext, zxid: int, path: str, owner: int, present: bool) -> None:
    """`_Tree.index_owner` and its flush, for a single write (`owner` is not 0)."""
    if owner == zk.CONTAINER_OWNER:
        key = CONTAINERS + path.encode("utf-8", "surrogatepass")
    elif zk.is_ttl_owner(owner):
        key = TTLS + path.encode("utf-8", "surrogatepass")
    else:
        key = ephemeral_key(owner, path)
    if present:
        ctx.put(key, StoredRecord(0, zxid, 0, False, 0, _INDEX_RECORD_VALUE))
    else:
        ctx.delete(key)


_MULTI_RESULT_TYPE = {
    zk.CREATE: zk.CREATE,
    zk.CREATE2: zk.CREATE2,
    zk.CREATE_TTL: zk.CREATE2,
    zk.CREATE_CONTAINER: zk.CREATE2,
    zk.DELETE: zk.DELETE,
    zk.SET_DATA: zk.SET_DATA,
    zk.CHECK: zk.CHECK,
}
_MULTI_END = jute.MULTI_HEADER.pack(-1, True, -1)


def _multi(tree: _Tree, session_id: int, operations: list[_Operation]) -> bytes:
    parts: list[bytes] = []
    for index, (op, fields) in enumerate(operations):
        try:
            response = _run(tree, session_id, op, fields)
        except _FailedError as failed:
            errors = [
                0 if i < index else failed.code if i == index else zk.RUNTIME_INCONSISTENCY
                for i in range(len(operations))
            ]
            tree.changed.clear()
            tree.index.clear()
            tree.events.clear()
            return (
                b"".join(
                    jute.MULTI_HEADER.pack(zk.ERROR, False, err) + jute.INT.pack(err)
                    for err in errors
                )
                + _MULTI_END
            )
        parts.append(jute.MULTI_HEADER.pack(_MULTI_RESULT_TYPE[op], False, 0))
        parts.append(response)
    parts.append(_MULTI_END)
    return b"".join(parts)


class Applied:
    """The response to an applied ZooKeeper command: its `result` (`commands.result`), with
    the range's SUCCESS header. A plain object rather than an `ApplyResult` message (which
    `SerializeToString` gives): one is made per write, and the front-end only reads `result`.
    A command the range failed is answered `error_response`'s `ApplyResult` instead."""

    __slots__ = ("result",)

    header = kv_rpc_pb2.ResponseHeader()
    """SUCCESS (shared by every instance: never change it)."""

    def __init__(self, result: bytes) -> None:
        self.result = result

    def SerializeToString(self, *, deterministic: bool = False) -> bytes:  # noqa: N802
        message = apply_pb2.ApplyResult(result=self.result)
        return message.SerializeToString(deterministic=deterministic)


NAME = "zookeeper"
"""The applier's registered name, written into every command of it: never rename it."""


class ZooKeeperApplier:
    """Applies the ZooKeeper front-end's commands (see the module docstring)."""

    name = NAME
    ops: tuple[str, ...] = ()
    keeps_history = False
    """ZooKeeper's watches are live only (a reconnecting client's `setWatches` compares the
    nodes' stats, not past changes): the range's durable event history, a quarter of a write's
    apply, would never be read."""

    def apply(self, ctx: ApplyContext, command: wal_pb2.WalCommand) -> Response | Rejected:
        return Applied(_apply(ctx, ctx.revision, ctx.now_ms, command.front_end.payload, None))

    def apply_payload(
        self, ctx: ApplyContext, payload: bytes, prepared: object
    ) -> Response | Rejected:
        """`apply` of the command carrying `payload`; `prepared`: `Prepared` (the front-end's
        decoding of it, see `prepare`) or None."""
        return Applied(_apply(ctx, ctx.revision, ctx.now_ms, payload, prepared))  # type: ignore[arg-type]

    def check_payload(self, payload: bytes, context: Callable[[], ApplyContext]) -> None:
        return None  # as `check`

    def error_response(self, command: wal_pb2.WalCommand, code: int) -> Response:
        return apply_pb2.ApplyResult(header=kv_rpc_pb2.ResponseHeader(code=code))  # type: ignore[arg-type]

    def check(self, command: wal_pb2.WalCommand, context: Callable[[], ApplyContext]) -> None:
        return None  # the front-end checks a request's structure before it is logged

    def refuse_split(self, ctx: ApplyContext, seal: wal_pb2.RangeSeal) -> str | None:
        if next(ctx.scan(BOOKKEEPING, prefix_end(BOOKKEEPING)), None) is not None:
            return "this range holds a ZooKeeper keyspace: splitting it is not supported"
        return None

    def session_ending(self, ctx: ApplyContext, session_id: int) -> Callable[[], None] | None:
        """The deletion of session `session_id`'s ephemeral nodes, for the command that ends the
        session (its close or expiry; `range.session_apply.SessionEnding`): looks them up now
        (the lookup scans, before anything is staged) and returns what deletes them, with their
        parents' updates and their events; None if it has none."""
        prefix = ephemerals_prefix(session_id)
        paths = [index_path(prefix, key) for key, _ in ctx.scan(prefix, prefix_end(prefix))]
        if not paths:
            return None

        def finish() -> None:
            tree = _Tree(ctx, ctx.revision, ctx.now_ms)
            for path in paths:
                node = tree.get(path)
                if node is not None and node.owner == session_id:
                    parent_path = parent_of(path)
                    parent = tree.get(parent_path)
                    if parent is not None:
                        tree.remove(path, node, parent_path, parent)
                        continue
                tree.index[ephemeral_key(session_id, path)] = False
            tree.flush()

        return finish


Prepared = tuple[int, int, bytes, object]
"""A REQUEST command's session id, operation code and caller's ids (`commands.unpack_request`)
and its decoded record: the fields of `decode_operation`, or a multi's operations
(`decode_multi`)."""


def prepare(session_id: int, op: int, auth: bytes, frame: bytes) -> tuple[bytes, Prepared]:
    """The payload of a client's write (`commands.request`; `frame`: the request after its
    length, from its xid on) and its decoding for the apply (`FrontEndCommand.prepared`),
    made together so that they always agree. Raises `JuteError` for a record that does not
    decode (nothing is logged then)."""
    record: object
    if op == zk.MULTI:
        record = decode_multi(frame[8:], zk.MULTI_WRITE_OPS)
    else:
        record = decode_operation(op, frame, 8)[0]
    return commands.request(session_id, op, auth, frame[8:]), (session_id, op, auth, record)


def _apply(
    ctx: ApplyContext, revision: int, now: int, payload: bytes, prepared: Prepared | None
) -> bytes:
    """Apply one ZooKeeper command at `revision` (its zxid), accepted at `now` (ms); its
    result (`commands.result`). `prepared`: the front-end's decoding of `payload` (`prepare`),
    or None to decode it here."""
    if prepared is not None:
        session_id, op, auth, record = prepared
        return _request(ctx, revision, now, session_id, op, auth, record)
    if not payload:
        return commands.result(zk.MARSHALLING_ERROR, revision)
    kind = payload[0]
    if kind == commands.REQUEST:
        session_id, op, auth, body = commands.unpack_request(payload)
        try:
            if op == zk.MULTI:
                decoded: object = decode_multi(body, zk.MULTI_WRITE_OPS)
            else:
                decoded = decode_operation(op, body, 0)[0]
        except JuteError:
            return commands.result(zk.MARSHALLING_ERROR, revision)
        return _request(ctx, revision, now, session_id, op, auth, decoded)
    if kind == commands.INIT:
        _init(ctx, revision, payload[1:])
        return commands.result(zk.OK, revision)
    if kind == commands.SWEEP:
        _sweep(ctx, revision, now, payload[1:].decode("utf-8", "surrogatepass"))
        return commands.result(zk.OK, revision)
    return commands.result(zk.MARSHALLING_ERROR, revision)


def _request(
    ctx: ApplyContext,
    revision: int,
    now: int,
    session_id: int,
    op: int,
    auth: bytes,
    record: object,
) -> bytes:
    """Apply a client's write (a REQUEST command) whose record decoded as `record`."""
    try:
        if op == zk.SET_DATA:
            path, data, version = cast(tuple[object, object, object], record)
            response = _single_set_data(ctx, revision, now, session_id, auth, path, data, version)
        elif op in zk.CREATES:
            response = _single_create(
                ctx,
                revision,
                now,
                session_id,
                auth,
                op,
                record,  # type: ignore[arg-type]
            )
        elif op == zk.DELETE:
            path, version = cast(tuple[object, object], record)
            response = _single_delete(ctx, revision, session_id, auth, path, version)
        else:
            tree = _Tree(ctx, revision, now, auth)
            if op == zk.MULTI:
                response = _multi(tree, session_id, record)  # type: ignore[arg-type]
            else:
                response = _run(tree, session_id, op, record)  # type: ignore[arg-type]
            tree.flush()
    except _FailedError as failed:
        return commands.result(failed.code, revision)
    except JuteError:
        return commands.result(zk.MARSHALLING_ERROR, revision)
    return commands.result(zk.OK, revision, response)


def _init(ctx: ApplyContext, revision: int, secret: bytes) -> None:
    """Create the keyspace's first nodes and its secret, each if missing (no events: they are
    there before any client)."""
    for path, acl, children, aversion in ROOT_NODES:
        key = node_key(path)
        if ctx.get(key) is None:
            ctx.put(key, Znode(0, 0, 0, 0, 0, aversion, 0, 0, children, 0, acl, b"").record())
    if ctx.get(SECRET_KEY) is None:
        ctx.put(SECRET_KEY, StoredRecord(0, revision, 0, False, 0, secret))


def _sweep(ctx: ApplyContext, revision: int, now: int, path: str) -> None:
    """Delete the container or TTL node `path` if it is still due (see `commands`); forget
    its index entry if it is no longer one."""
    tree = _Tree(ctx, revision, now)
    node = tree.get(path)
    container_key = CONTAINERS + path.encode("utf-8", "surrogatepass")
    ttl_key = TTLS + path.encode("utf-8", "surrogatepass")
    if node is None or node.children > 0:
        if node is None:
            for key in (container_key, ttl_key):
                if ctx.get(key) is not None:
                    ctx.delete(key)
        return
    if node.owner == zk.CONTAINER_OWNER:
        due = node.cversion > 0
    elif zk.is_ttl_owner(node.owner):
        due = now - node.mtime > zk.ttl_of(node.owner)
    else:
        due = False
        for key in (container_key, ttl_key):
            if ctx.get(key) is not None:
                ctx.delete(key)
    if due:
        parent_path = parent_of(path)
        parent = tree.get(parent_path)
        if parent is not None:
            tree.remove(path, node, parent_path, parent)
            tree.flush()
