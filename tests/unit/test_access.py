"""The access rules: every RPC the server registers has a rule, and decisions are as documented."""

from __future__ import annotations

import pytest

from tablekeeper_proto.bookkeeper import kv_rpc_pb2, storage_pb2
from tablekeeper_proto.v1 import admin_pb2, session_pb2, tablekeeper_pb2, watch_pb2
from tablekeeper_server.security.access import (
    RULES,
    AccessControl,
    Permission,
    PermissionDeniedError,
    parse_permissions,
    permission_names,
)

pytestmark = pytest.mark.unit


def all_methods() -> list[str]:
    """Every method of every service the gRPC port serves (but health)."""
    services = [
        storage_pb2.DESCRIPTOR.services_by_name["RootRangeService"],
        storage_pb2.DESCRIPTOR.services_by_name["MetaRangeService"],
        storage_pb2.DESCRIPTOR.services_by_name["StorageContainerService"],
        kv_rpc_pb2.DESCRIPTOR.services_by_name["TableService"],
        tablekeeper_pb2.DESCRIPTOR.services_by_name["TableKeeper"],
        admin_pb2.DESCRIPTOR.services_by_name["Admin"],
        session_pb2.DESCRIPTOR.services_by_name["Sessions"],
        watch_pb2.DESCRIPTOR.services_by_name["Watch"],
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
