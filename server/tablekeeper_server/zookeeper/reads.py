"""ZooKeeper's reads, on the keyspace range's applied state (they are not logged).

Each function takes the range's store (read on its event loop: exactly the applied state) and
the caller's ids, and returns ZooKeeper's error code and response record, as ZooKeeper's
`FinalRequestProcessor` answers: a missing node is NONODE, a node whose ACL refuses the caller
is NOAUTH (checked after the node is found). Registering watches is the caller's (`server`):
each function says whether the node was there to watch.
"""

from __future__ import annotations

from typing import Protocol

from tablekeeper_server.core.keys import prefix_end
from tablekeeper_server.zookeeper import acl as acls
from tablekeeper_server.zookeeper import jute
from tablekeeper_server.zookeeper import protocol as zk
from tablekeeper_server.zookeeper.paths import (
    children_prefix,
    descendants_prefix,
    ephemerals_prefix,
    index_path,
    name_offset,
    node_key,
)
from tablekeeper_server.zookeeper.znode import OPEN_ACL, raw_acl, read_raw

_EMPTY_STRINGS = jute.INT.pack(0)


class Store(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def keys(self, start: bytes, end: bytes) -> list[bytes]: ...


def _allowed(node_acl: bytes, perm: int, auth: list[acls.AuthId]) -> bool:
    return node_acl == OPEN_ACL or acls.allowed(node_acl, perm, auth)


def get_data(store: Store, path: str, auth: list[acls.AuthId]) -> tuple[int, bytes]:
    raw = store.get(node_key(path))
    if raw is None:
        return zk.NO_NODE, b""
    stat, node_acl, data, _ = read_raw(raw)
    if not _allowed(node_acl, zk.READ, auth):
        return zk.NO_AUTH, b""
    return zk.OK, jute.write_buffer(data) + stat


def exists(store: Store, path: str, auth: list[acls.AuthId]) -> tuple[int, bytes]:
    raw = store.get(node_key(path))
    if raw is None:
        return zk.NO_NODE, b""
    stat, node_acl, _, _ = read_raw(raw)
    if not _allowed(node_acl, zk.READ, auth):
        return zk.NO_AUTH, b""
    return zk.OK, stat


def children(store: Store, path: str) -> list[str]:
    """The names of `path`'s children, in key order (one prefix scan)."""
    start = children_prefix(path)
    cut = name_offset(path)
    return [
        key[cut:].decode("utf-8", "surrogatepass") for key in store.keys(start, prefix_end(start))
    ]


def get_children(
    store: Store, path: str, auth: list[acls.AuthId], with_stat: bool
) -> tuple[int, bytes]:
    raw = store.get(node_key(path))
    if raw is None:
        return zk.NO_NODE, b""
    stat, node_acl, _, _ = read_raw(raw)
    if not _allowed(node_acl, zk.READ, auth):
        return zk.NO_AUTH, b""
    names = jute.write_strings(children(store, path))
    return zk.OK, names + stat if with_stat else names


def get_acl(store: Store, path: str, auth: list[acls.AuthId]) -> tuple[int, bytes]:
    raw = store.get(node_key(path))
    if raw is None:
        return zk.NO_NODE, b""
    stat, node_acl, _, _ = read_raw(raw)
    if not _allowed(node_acl, zk.READ | zk.ADMIN, auth):
        return zk.NO_AUTH, b""
    if not _allowed(node_acl, zk.ADMIN, auth):
        node_acl = acls.masked(node_acl)
    return zk.OK, node_acl + stat


def all_children_number(store: Store, path: str, auth: list[acls.AuthId]) -> tuple[int, bytes]:
    """Every descendant of `path` (ZooKeeper counts the root's as every node but the root)."""
    raw = store.get(node_key(path))
    if raw is None:
        return zk.NO_NODE, b""
    if not _allowed(raw_acl(raw), zk.READ, auth):
        return zk.NO_AUTH, b""
    total = 0
    below = 1
    while True:  # level by level: a level with no node under `path` has none below it either
        start = descendants_prefix(path, below)
        found = len(store.keys(start, prefix_end(start)))
        if not found:
            return zk.OK, jute.INT.pack(total)
        total += found
        below += 1


def ephemerals(store: Store, session_id: int, prefix_path: str | None) -> bytes:
    """The session's ephemeral nodes whose path starts with `prefix_path` (all for none, empty
    or "/"), as a GetEphemeralsResponse."""
    start = ephemerals_prefix(session_id)
    paths = [index_path(start, key) for key in store.keys(start, prefix_end(start))]
    wanted = (prefix_path or "").strip()
    if wanted and wanted != "/":
        paths = [p for p in paths if p.startswith(prefix_path or "")]
    return jute.write_strings(paths) if paths else _EMPTY_STRINGS


def node_stamps(store: Store, path: str) -> tuple[int, int] | None:
    """(mzxid, pzxid) of a node, or None if it does not exist (setWatches)."""
    raw = store.get(node_key(path))
    if raw is None:
        return None
    stat = read_raw(raw)[0]
    fields = jute.STAT.unpack(stat)
    return fields[1], fields[10]
