"""Znode paths: ZooKeeper's validity rules, and where a znode lives in the keyspace's range.

A znode is one key of the keyspace's pkey (`KEYSPACE_PKEY`): its depth (the number of `/` in
its path, 0 for the root) as 4 big-endian bytes, then its path in UTF-8. The children of a node
at depth d are exactly the keys that start with depth d + 1 and the node's path plus `/` (a
name holds no `/`), so getChildren is one prefix scan that reads no grandchild, however deep
the subtree below.

The keyspace's own bookkeeping (the session index of ephemeral nodes, the containers and TTL
nodes to sweep, the session-password key) lives under the range's system prefix, where it makes
no change event.
"""

from __future__ import annotations

import struct
from functools import lru_cache

from tablekeeper_server.core.keys import pkey_prefix, prefix_end, system_key

KEYSPACE_PKEY = b""
PREFIX = pkey_prefix(KEYSPACE_PKEY)
END = prefix_end(PREFIX)
_DEPTH = struct.Struct(">I")
_SESSION = struct.Struct(">q")

BOOKKEEPING = system_key(b"zk-")
"""Every system key of the ZooKeeper front-end starts with this (a split refuses a range
holding any)."""
SECRET_KEY = system_key(b"zk-secret")
"""The keyspace's secret (random bytes from its first command): session passwords are keyed
by it."""
EPHEMERALS = system_key(b"zk-eph/")
CONTAINERS = system_key(b"zk-ctr/")
TTLS = system_key(b"zk-ttl/")


def depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


@lru_cache(maxsize=65536)
def node_key(path: str) -> bytes:
    """The store key of the node at `path` (remembered for the paths used lately: every read
    and write asks it, often more than once)."""
    return PREFIX + _DEPTH.pack(depth(path)) + path.encode("utf-8", "surrogatepass")


def children_prefix(path: str) -> bytes:
    """The keys of `path`'s children start with this."""
    base = path if path == "/" else path + "/"
    return PREFIX + _DEPTH.pack(depth(path) + 1) + base.encode("utf-8", "surrogatepass")


def descendants_prefix(path: str, below: int) -> bytes:
    """The keys of `path`'s descendants `below` levels down (1: its children) start with this."""
    base = path if path == "/" else path + "/"
    return PREFIX + _DEPTH.pack(depth(path) + below) + base.encode("utf-8", "surrogatepass")


def path_of(key: bytes) -> str:
    """The path of a node key."""
    return key[len(PREFIX) + _DEPTH.size :].decode("utf-8", "surrogatepass")


def name_offset(path: str) -> int:
    """Where a child's name starts in its node key, for children of `path`."""
    base = path if path == "/" else path + "/"
    return len(PREFIX) + _DEPTH.size + len(base.encode("utf-8", "surrogatepass"))


def parent_of(path: str) -> str:
    """The parent of a path with at least one `/` ("/" for a node right under the root)."""
    cut = path.rfind("/")
    return path[:cut] if cut > 0 else "/"


def ephemerals_prefix(session_id: int) -> bytes:
    return EPHEMERALS + _SESSION.pack(session_id)


def ephemeral_key(session_id: int, path: str) -> bytes:
    return EPHEMERALS + _SESSION.pack(session_id) + path.encode("utf-8", "surrogatepass")


def index_path(prefix: bytes, key: bytes) -> str:
    return key[len(prefix) :].decode("utf-8", "surrogatepass")


def is_valid(path: str | None) -> bool:
    """ZooKeeper's `PathUtils.validatePath`: absolute, no empty, `.` or `..` segment, no trailing
    `/` (except the root), no control, private-use or surrogate characters. Java counts in
    UTF-16 units, so a character beyond the Basic Multilingual Plane (a surrogate pair there) is
    refused too."""
    if not path or path[0] != "/":
        return False
    if len(path) == 1:
        return True
    if path[-1] == "/":
        return False
    if path.isascii() and path.isprintable() and "//" not in path and "/." not in path:
        return True  # the common case; the loop below decides the rest
    last = "/"
    for i in range(1, len(path)):
        c = path[i]
        code = ord(c)
        if code == 0:
            return False
        if c == "/" and last == "/":
            return False
        if c == "." and last == "/" and (i + 1 == len(path) or path[i + 1] == "/"):
            return False  # "."
        if (
            c == "."
            and last == "."
            and path[i - 2] == "/"
            and (i + 1 == len(path) or path[i + 1] == "/")
        ):
            return False  # ".."
        if 0 < code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xF8FF or code >= 0xFFF0:
            return False
        last = c
    return True
