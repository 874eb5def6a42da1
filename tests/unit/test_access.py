"""The access rules: every RPC the server registers has a rule, and decisions are as documented."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, storage_pb2
from tablekeeper_proto.etcd import rpc_pb2
from tablekeeper_proto.oxia import client_pb2
from tablekeeper_proto.v1 import admin_pb2, session_pb2, tablekeeper_pb2, watch_pb2
from tablekeeper_server.etcd.keyspace import NAMESPACE as ETCD_KEYSPACE_NAMESPACE
from tablekeeper_server.oxia.namespaces import TABLE_NAMESPACE as OXIA_TABLE_NAMESPACE
from tablekeeper_server.security.access import (
    ETCD_NAMESPACE,
    OXIA_NAMESPACE,
    RULES,
    AccessControl,
    Permission,
    PermissionDeniedError,
    Target,
    parse_permissions,
    permission_names,
)

pytestmark = pytest.mark.unit


def all_methods() -> list[str]:
    """Every method of every service the gRPC, etcd and Oxia ports serve (but health)."""
    services = [
        storage_pb2.DESCRIPTOR.services_by_name["RootRangeService"],
        storage_pb2.DESCRIPTOR.services_by_name["MetaRangeService"],
        storage_pb2.DESCRIPTOR.services_by_name["StorageContainerService"],
        kv_rpc_pb2.DESCRIPTOR.services_by_name["TableService"],
        tablekeeper_pb2.DESCRIPTOR.services_by_name["TableKeeper"],
        admin_pb2.DESCRIPTOR.services_by_name["Admin"],
        session_pb2.DESCRIPTOR.services_by_name["Sessions"],
        watch_pb2.DESCRIPTOR.services_by_name["Watch"],
        *rpc_pb2.DESCRIPTOR.services_by_name.values(),  # etcd: KV, Watch, Lease, ..., Auth
        *client_pb2.DESCRIPTOR.services_by_name.values(),  # Oxia: OxiaClient
    ]
    return [f"/{s.full_name}/{m.name}" for s in services for m in s.methods]


def test_every_rpc_has_a_rule() -> None:
    missing = [m for m in all_methods() if m not in RULES]
    assert not missing, (
        f"RPCs without an access rule (refused to everyone but superusers): {missing}"
    )
    stale = set(RULES) - set(all_methods())
    assert not stale, f"rules for RPCs that do not exist: {stale}"


def test_permission_names() -> None:
    assert parse_permissions(["read", "WRITE"]) == Permission.READ | Permission.WRITE
    assert parse_permissions(["read,admin"]) == Permission.READ | Permission.ADMIN
    assert permission_names(7) == ["read", "write", "admin"]
    with pytest.raises(ValueError, match="unknown permission 'owner'"):
        parse_permissions(["owner"])


async def test_decisions_and_their_cache() -> None:
    lookups: list[tuple[str, str, int]] = []
    grants = {("alice", "team"): Permission.READ}
    now = [0.0]

    async def lookup(role: str, namespace: str, stream_id: int) -> tuple[str, int]:
        lookups.append((role, namespace, stream_id))
        name = namespace or "team"  # every table of this test is in "team"
        return name, int(grants.get((role, name), 0))

    access = AccessControl(lookup, lambda role: role == "root", cache_s=2.0, clock=lambda: now[0])
    header = kv_rpc_pb2.RoutingHeader(stream_id=1024, r_key=b"p")
    get = kv_rpc_pb2.RangeRequest(key=b"k", header=header)
    put = kv_rpc_pb2.PutRequest(key=b"k", value=b"v", header=header)
    table = "/bookkeeper.proto.kv.rpc.TableService/"
    await access.check("alice", table + "Range", get)
    with pytest.raises(PermissionDeniedError, match="'alice' lacks write on namespace 'team'"):
        await access.check("alice", table + "Put", put)
    assert len(lookups) == 1  # the second check used the cached decision
    grants[("alice", "team")] = Permission.READ | Permission.WRITE
    with pytest.raises(PermissionDeniedError):
        await access.check("alice", table + "Put", put)  # still cached
    now[0] = 2.5
    await access.check("alice", table + "Put", put)  # expired: looked up again
    access.forget()
    grants[("alice", "team")] = Permission(0)
    with pytest.raises(PermissionDeniedError, match="lacks read"):
        await access.check("alice", table + "Range", get)
    # Superusers skip the lookup; superuser-only methods refuse everyone else.
    await access.check("root", "/tablekeeper.v1.Admin/Status", None)
    with pytest.raises(PermissionDeniedError, match="superusers only"):
        await access.check("alice", "/tablekeeper.v1.Admin/Status", None)
    with pytest.raises(PermissionDeniedError, match="superusers only"):
        await access.check("alice", "/some.Unknown/Method", None)
    # A batch needs what each of its ops needs.
    batch = tablekeeper_pb2.BatchRequest(
        ops=[tablekeeper_pb2.BatchOp(range=get), tablekeeper_pb2.BatchOp(put=put)]
    )
    grants[("alice", "team")] = Permission.READ
    access.forget()
    with pytest.raises(PermissionDeniedError, match="lacks write"):
        await access.check("alice", "/tablekeeper.v1.TableKeeper/Batch", batch)


def test_the_front_ends_check_the_namespaces_their_data_lives_in() -> None:
    assert ETCD_NAMESPACE == ETCD_KEYSPACE_NAMESPACE
    assert OXIA_NAMESPACE == OXIA_TABLE_NAMESPACE
    assert {s.name for s in rpc_pb2.DESCRIPTOR.services_by_name.values()} >= {"KV", "Auth"}


async def _etcd_needs(method: str, request: object) -> Permission:
    """What a role needs on namespace etcd for this call: the smallest grant that passes."""
    for bits in range(8):
        grant = Permission(bits)

        async def lookup(role: str, namespace: str, stream_id: int) -> tuple[str, int]:
            assert namespace == ETCD_NAMESPACE and stream_id == 0
            return namespace, int(grant)  # noqa: B023 (called before the loop moves on)

        try:
            await AccessControl(lookup, lambda role: False, cache_s=0).check("u", method, request)
        except PermissionDeniedError:
            continue
        return grant
    raise AssertionError(f"nothing grants {method}")


async def test_etcd_reads_need_read_and_writes_need_write() -> None:
    kv = "/etcdserverpb.KV/"
    read, write = Permission.READ, Permission.WRITE
    put = rpc_pb2.PutRequest(key=b"k", value=b"v")
    assert await _etcd_needs(kv + "Range", rpc_pb2.RangeRequest(key=b"k")) == read
    assert await _etcd_needs(kv + "Put", put) == write
    assert await _etcd_needs(kv + "Put", rpc_pb2.PutRequest(key=b"k", prev_kv=True)) == read | write
    assert await _etcd_needs(kv + "DeleteRange", rpc_pb2.DeleteRangeRequest(key=b"k")) == write
    only_puts = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_put=put)])
    assert await _etcd_needs(kv + "Txn", only_puts) == write
    guarded = rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=b"k")], success=[rpc_pb2.RequestOp(request_put=put)]
    )
    assert await _etcd_needs(kv + "Txn", guarded) == read | write
    reads = rpc_pb2.TxnRequest(
        failure=[rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=b"k"))]
    )
    assert await _etcd_needs(kv + "Txn", reads) == read
    nested = rpc_pb2.TxnRequest(success=[rpc_pb2.RequestOp(request_txn=only_puts)])
    assert await _etcd_needs(kv + "Txn", nested) == write
    assert await _etcd_needs(kv + "Txn", rpc_pb2.TxnRequest()) == read
    assert await _etcd_needs("/etcdserverpb.Watch/Watch", rpc_pb2.WatchRequest()) == read
    for lease in ("LeaseGrant", "LeaseRevoke", "LeaseKeepAlive"):
        assert await _etcd_needs("/etcdserverpb.Lease/" + lease, None) == write
    assert await _etcd_needs("/etcdserverpb.Cluster/MemberList", None) == Permission(0)
    assert await _etcd_needs("/etcdserverpb.Maintenance/Status", None) == Permission(0)
    oxia = "/io.streamnative.oxia.proto.OxiaClient/"
    assert RULES[oxia + "GetShardAssignments"] == "any"
    for method, needed in (
        ("Read", read),
        ("List", read),
        ("Write", write),
        ("CreateSession", write),
    ):
        rule = RULES[oxia + method]
        assert callable(rule)
        assert rule(client_pb2.ReadRequest()) == [Target(needed, namespace=OXIA_NAMESPACE)]


async def test_only_superusers_manage_etcd_users() -> None:
    async def lookup(role: str, namespace: str, stream_id: int) -> tuple[str, int]:
        return namespace, 7  # every permission on every namespace

    access = AccessControl(lookup, lambda role: role == "root")
    for method in ("UserAdd", "UserDelete", "UserChangePassword", "UserList", "UserGet"):
        with pytest.raises(PermissionDeniedError, match="superusers only"):
            await access.check("alice", "/etcdserverpb.Auth/" + method, None)
        await access.check("root", "/etcdserverpb.Auth/" + method, None)
    await access.check("alice", "/etcdserverpb.Auth/AuthStatus", None)
