"""What a role may do: per-namespace permissions, and the one table that says what each RPC needs.

Permissions are bits per (namespace, role), kept in the root range (`RootCatalog`):
- `read`: get, scan, watch, the table's ranges, the namespace and its tables;
- `write`: put, delete, increment, txn (txns also need `read`), sessions;
- `admin`: create and delete tables, grant and revoke permissions on the namespace.
Superusers (`--superuser-roles`, and servers calling each other) may do everything, and only they
create or delete namespaces and call the server-wide admin RPCs (status, cluster status,
checkpoint).

The etcd and Oxia front-ends are checked against the TableKeeper namespace their data lives in:
`etcd` (the keyspace is table `etcd/keyspace`) and `oxia` (Oxia namespace N is table `oxia/N`, so
one grant covers every Oxia namespace). Reads need `read`; writes, leases and sessions `write`;
what a client calls to connect (etcd's MemberList and Status, Oxia's shard assignments) only
authentication; managing etcd users is for superusers.

`RULES` maps every method to what it needs; a method missing from it is refused, so a new RPC
cannot slip through unchecked. Decisions are cached for `cache_s` per (role, namespace or
table): a grant or revoke made on this server applies at once (the cache is cleared), one made
through another server within `cache_s`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any


class Permission(enum.IntFlag):
    READ = 1
    WRITE = 2
    ADMIN = 4


NAMES = {"read": Permission.READ, "write": Permission.WRITE, "admin": Permission.ADMIN}


def parse_permissions(names: Iterable[str]) -> Permission:
    bits = Permission(0)
    for name in names:
        for part in filter(None, (p.strip().lower() for p in name.split(","))):
            if part not in NAMES:
                raise ValueError(f"unknown permission {part!r} (read, write, admin)")
            bits |= NAMES[part]
    return bits


def permission_names(bits: int) -> list[str]:
    return [name for name, bit in NAMES.items() if bits & bit]


class PermissionDeniedError(Exception):
    """The role lacks a permission; the message says which, on what."""


@dataclass(frozen=True)
class Target:
    """What a request touches: a namespace by name, or a table by id (its namespace is looked
    up), needing `needed`."""

    needed: Permission
    namespace: str = ""
    stream_id: int = 0


ANY = "any"
"""Any authenticated caller."""
SUPERUSER = "superuser"
Rule = Callable[[Any], list[Target]] | str


def _stream(needed: Permission) -> Rule:
    return lambda r: [Target(needed, stream_id=r.header.stream_id)]


def _batch(request: Any) -> list[Target]:
    needs: dict[int, Permission] = {}
    for op in request.ops:
        kind = op.WhichOneof("op")
        if kind is None:
            continue
        inner = getattr(op, kind)
        needed = {
            "range": Permission.READ,
            "txn": Permission.READ | Permission.WRITE,
        }.get(kind, Permission.WRITE)
        stream_id = inner.header.stream_id
        needs[stream_id] = needs.get(stream_id, Permission(0)) | needed
    return [Target(needed, stream_id=stream_id) for stream_id, needed in needs.items()]


def _get_stream(request: Any) -> list[Target]:
    if request.HasField("stream_name"):
        return [Target(Permission.READ, namespace=request.stream_name.namespace_name)]
    return [Target(Permission.READ, stream_id=request.stream_id)]


def _watch_many(request: Any) -> list[Target]:
    """Each watch created on the stream reads its table; ending one needs nothing."""
    if request.WhichOneof("request") == "create":
        return [Target(Permission.READ, stream_id=request.create.watch.stream_id)]
    return []


def _etcd(needed: Permission) -> Rule:
    return lambda r: [Target(needed, namespace=ETCD_NAMESPACE)]


def _etcd_with_prev(request: Any) -> list[Target]:
    """A put or delete; returning the previous value (`prev_kv`) reads too, as in etcd."""
    needed = Permission.WRITE | (Permission.READ if request.prev_kv else Permission(0))
    return [Target(needed, namespace=ETCD_NAMESPACE)]


def _etcd_txn_needs(txn: Any) -> Permission:
    needed = Permission.READ if len(txn.compare) else Permission(0)
    for op in (*txn.success, *txn.failure):
        kind = op.WhichOneof("request")
        if kind == "request_range":
            needed |= Permission.READ
        elif kind in ("request_put", "request_delete_range"):
            needed |= Permission.WRITE
            if getattr(op, kind).prev_kv:
                needed |= Permission.READ
        elif kind == "request_txn":
            needed |= _etcd_txn_needs(op.request_txn)
    return needed


def _etcd_txn(request: Any) -> list[Target]:
    """Compares and range ops read; puts and deletes write (an empty txn reads)."""
    return [Target(_etcd_txn_needs(request) or Permission.READ, namespace=ETCD_NAMESPACE)]


def _oxia(needed: Permission) -> Rule:
    return lambda r: [Target(needed, namespace=OXIA_NAMESPACE)]


ETCD_NAMESPACE = "etcd"
OXIA_NAMESPACE = "oxia"
_ROOT = "/bookkeeper.proto.storage.RootRangeService/"
_TABLE = "/bookkeeper.proto.kv.rpc.TableService/"
_TK = "/tablekeeper.v1.TableKeeper/"
_ADMIN = "/tablekeeper.v1.Admin/"
_OXIA = "/io.streamnative.oxia.proto.OxiaClient/"
RULES: dict[str, Rule] = {
    _ROOT + "CreateNamespace": SUPERUSER,
    _ROOT + "DeleteNamespace": SUPERUSER,
    _ROOT + "GetNamespace": lambda r: [Target(Permission.READ, namespace=r.name)],
    _ROOT + "CreateStream": lambda r: [Target(Permission.ADMIN, namespace=r.ns_name)],
    _ROOT + "DeleteStream": lambda r: [Target(Permission.ADMIN, namespace=r.ns_name)],
    _ROOT + "GetStream": _get_stream,
    "/bookkeeper.proto.storage.MetaRangeService/GetActiveRanges": lambda r: [
        Target(Permission.READ, stream_id=r.stream_id)
    ],
    "/bookkeeper.proto.storage.StorageContainerService/GetStorageContainerEndpoint": ANY,
    _TABLE + "Range": _stream(Permission.READ),
    _TABLE + "Put": _stream(Permission.WRITE),
    _TABLE + "Delete": _stream(Permission.WRITE),
    _TABLE + "Increment": _stream(Permission.WRITE),
    _TABLE + "Txn": _stream(Permission.READ | Permission.WRITE),
    _TK + "ServerInfo": ANY,
    _TK + "Batch": _batch,
    _TK + "ScanRange": lambda r: [Target(Permission.READ, stream_id=r.stream_id)],
    "/tablekeeper.v1.Watch/Watch": lambda r: [Target(Permission.READ, stream_id=r.stream_id)],
    "/tablekeeper.v1.Watch/WatchMany": _watch_many,
    "/tablekeeper.v1.Sessions/Create": lambda r: [Target(Permission.WRITE, stream_id=r.stream_id)],
    "/tablekeeper.v1.Sessions/Close": lambda r: [Target(Permission.WRITE, stream_id=r.stream_id)],
    "/tablekeeper.v1.Sessions/KeepAlive": lambda r: [
        Target(Permission.WRITE, stream_id=r.stream_id)
    ],
    _ADMIN + "Checkpoint": SUPERUSER,
    _ADMIN + "Status": SUPERUSER,
    _ADMIN + "ClusterStatus": SUPERUSER,
    _ADMIN + "ListNamespaces": ANY,
    _ADMIN + "ListTables": lambda r: [Target(Permission.READ, namespace=r.namespace)],
    _ADMIN + "Grant": lambda r: [Target(Permission.ADMIN, namespace=r.namespace)],
    _ADMIN + "Revoke": lambda r: [Target(Permission.ADMIN, namespace=r.namespace)],
    _ADMIN + "ListPermissions": lambda r: [Target(Permission.ADMIN, namespace=r.namespace)],
    _ADMIN + "CheckAccess": SUPERUSER,  # servers asking the root's owner
    _ADMIN + "SplitRange": SUPERUSER,
    _ADMIN + "SealRange": SUPERUSER,  # the server running a split, asking a range's owner
    _ADMIN + "BackupRange": SUPERUSER,
    # The etcd v3 API (--etcd-port).
    "/etcdserverpb.KV/Range": _etcd(Permission.READ),
    "/etcdserverpb.KV/Put": _etcd_with_prev,
    "/etcdserverpb.KV/DeleteRange": _etcd_with_prev,
    "/etcdserverpb.KV/Txn": _etcd_txn,
    "/etcdserverpb.KV/Compact": _etcd(Permission.WRITE),
    "/etcdserverpb.Watch/Watch": _etcd(Permission.READ),
    "/etcdserverpb.Lease/LeaseGrant": _etcd(Permission.WRITE),
    "/etcdserverpb.Lease/LeaseRevoke": _etcd(Permission.WRITE),
    "/etcdserverpb.Lease/LeaseKeepAlive": _etcd(Permission.WRITE),
    "/etcdserverpb.Lease/LeaseTimeToLive": _etcd(Permission.READ),
    "/etcdserverpb.Lease/LeaseLeases": _etcd(Permission.READ),
    "/etcdserverpb.Cluster/MemberList": ANY,
    "/etcdserverpb.Maintenance/Alarm": ANY,
    "/etcdserverpb.Maintenance/Status": ANY,
    "/etcdserverpb.Maintenance/Defragment": _etcd(Permission.ADMIN),
    "/etcdserverpb.Maintenance/Snapshot": _etcd(Permission.ADMIN),
    "/etcdserverpb.Maintenance/HashKV": _etcd(Permission.READ),
    "/etcdserverpb.Auth/Authenticate": ANY,  # needs no credentials at all (auth.py)
    "/etcdserverpb.Auth/AuthStatus": ANY,
    **{
        "/etcdserverpb.Auth/" + method: SUPERUSER
        for method in (
            "AuthEnable",
            "AuthDisable",
            "UserAdd",
            "UserGet",
            "UserList",
            "UserDelete",
            "UserChangePassword",
            "UserGrantRole",
            "UserRevokeRole",
            "RoleAdd",
            "RoleGet",
            "RoleList",
            "RoleDelete",
            "RoleGrantPermission",
            "RoleRevokePermission",
        )
    },
    # The Oxia client protocol (--oxia-port).
    _OXIA + "GetShardAssignments": ANY,
    _OXIA + "Write": _oxia(Permission.WRITE),
    _OXIA + "WriteStream": _oxia(Permission.WRITE),
    _OXIA + "Read": _oxia(Permission.READ),
    _OXIA + "List": _oxia(Permission.READ),
    _OXIA + "RangeScan": _oxia(Permission.READ),
    _OXIA + "GetSequenceUpdates": _oxia(Permission.READ),
    _OXIA + "GetNotifications": _oxia(Permission.READ),
    _OXIA + "CreateSession": _oxia(Permission.WRITE),
    _OXIA + "KeepAlive": _oxia(Permission.WRITE),
    _OXIA + "CloseSession": _oxia(Permission.WRITE),
}

AccessLookup = Callable[[str, str, int], Awaitable[tuple[str, int]]]
"""(role, namespace name, stream id) -> (namespace name, the role's permission bits); raises
the catalog's not-found errors."""


ACCESS_CACHE_S = 2.0
"""How long a permission decision is kept (a grant through another server applies within it)."""


class AccessControl:
    def __init__(
        self,
        lookup: AccessLookup,
        is_superuser: Callable[[str | None], bool],
        *,
        cache_s: float = ACCESS_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self._is_superuser = is_superuser
        self._cache_s = cache_s
        self._clock = clock
        self._cache: dict[tuple[str, str, int], tuple[float, str, int]] = {}

    def is_superuser(self, role: str | None) -> bool:
        return self._is_superuser(role)

    def forget(self) -> None:
        """Drop cached decisions (a grant or revoke went through this server)."""
        self._cache.clear()

    async def check(self, role: str, method: str, request: Any) -> None:
        """Raise `PermissionDeniedError` unless `role` may make this call."""
        if self._is_superuser(role):
            return
        rule = RULES.get(method)
        if rule is None or rule == SUPERUSER:
            raise PermissionDeniedError(f"role {role!r} may not call {method} (superusers only)")
        if rule == ANY:
            return
        assert callable(rule)
        for target in rule(request):
            await self._check_target(role, target)

    async def _check_target(self, role: str, target: Target) -> None:
        key = (role, target.namespace, target.stream_id)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self._cache_s:
            namespace, bits = cached[1], cached[2]
        else:
            namespace, bits = await self._lookup(role, target.namespace, target.stream_id)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = (now, namespace, bits)
        missing = target.needed & ~Permission(bits)
        if missing:
            raise PermissionDeniedError(
                f"role {role!r} lacks {'+'.join(permission_names(missing))} on namespace "
                f"{namespace!r}"
            )
