"""Authentication on the etcd and Oxia ports in cluster mode: etcd's users live in the root range
(its Auth calls are answered by the root range's owner, whichever server they reach), and both
front-ends read permissions from the root range wherever it is. Two TLS servers with HMAC
tokens, real ZooKeeper and Pulsar; the root range's owner is killed with SIGKILL at the end.

A grant made through one server reaches another's decisions within `ACCESS_CACHE_S` (as on the
gRPC port): the tests wait for it as a condition."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from tablekeeper import Client, TlsConfig
from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tablekeeper_server.security.certs import write_authority
from tablekeeper_server.security.tokens import create_token
from tests.support.cluster import TestCluster
from tests.support.routes import etcd_keyspace_container
from tests.support.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.pulsar]

ETCDCTL = shutil.which("etcdctl")
WAIT_S = 90.0
T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]


def until(check: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    """`check()` until it returns something (a grant reaching a cached decision, a failover)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@dataclass
class Secured:
    """A TLS cluster with HMAC tokens (`admin` a superuser) whose servers serve a front-end."""

    cluster: TestCluster
    certs: Path
    ports: list[int]
    """Each server's front-end port."""

    @property
    def secret(self) -> bytes:
        return (self.certs / "secret.key").read_bytes().strip()

    def bearer(self, role: str) -> Metadata:
        return (("authorization", f"Bearer {create_token(self.secret, role)}"),)

    def channel(self, port: int) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials((self.certs / "ca.pem").read_bytes())
        return grpc.secure_channel(f"127.0.0.1:{port}", credentials)

    def client(self, i: int) -> Client:
        """The SDK on server `i`'s gRPC port, as the superuser (to grant)."""
        tls = TlsConfig(ca=self.certs / "ca.pem")
        return Client(self.cluster.service(i), tls=tls, token=create_token(self.secret, "admin"))


def secured_cluster(
    make_cluster: Callable[..., TestCluster], tmp_path: Path, containers: int, front_end: str
) -> Secured:
    """Two servers, each with `--FRONT_END-port`."""
    certs = tmp_path / "certs"
    write_authority(certs, hosts=["127.0.0.1", "localhost"], clients=[])
    cluster = make_cluster(
        containers=containers,
        extra_args=[
            *("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")),
            *("--tls-ca", str(certs / "ca.pem")),  # servers verify each other with it
            *("--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"),
        ],
        tls_files=(certs / "ca.pem", None, None),
        token=create_token((certs / "secret.key").read_bytes().strip(), "admin"),
    ).init()
    ports = []
    for _ in range(2):
        ports.append(free_port())
        cluster.add_server([f"--{front_end}-port", str(ports[-1])])
    cluster.wait_ready(WAIT_S)
    return Secured(cluster, certs, ports)


def test_etcd_users_live_with_the_root_range_wherever_they_log_in(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    # `make test-integration` installs it (Debian etcd-client); missing, the test fails.
    assert ETCDCTL is not None, "etcdctl missing: make etcd-client"
    # Three containers on two servers: the root range (container 0) and the keyspace's range
    # (the first table made) end up on different servers (cluster.placement, catalog.meta).
    secured = secured_cluster(make_cluster, tmp_path, 3, "etcd")
    cluster, admin = secured.cluster, secured.bearer("admin")
    root_owner = cluster.index(cluster.assigned_to(0) or "")
    via = 1 - root_owner  # owns the keyspace, not the root range where users are kept
    with secured.channel(secured.ports[via]) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        until(
            lambda: _answered(lambda: kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=admin)),
            "the etcd keyspace",
        )
    with secured.channel(cluster.servers[0].port) as channel:
        keyspace = etcd_keyspace_container(channel, metadata=admin)
    assert cluster.index(cluster.assigned_to(keyspace) or "") == via

    def etcdctl(i: int, *args: str) -> subprocess.CompletedProcess[str]:
        assert ETCDCTL is not None
        return subprocess.run(
            [
                *(ETCDCTL, f"--endpoints=127.0.0.1:{secured.ports[i]}"),
                *(f"--cacert={secured.certs / 'ca.pem'}", *args),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ETCDCTL_API": "3"},
            check=False,
        )

    # A user added through the server that does not own the root range is kept in it.
    with secured.channel(secured.ports[via]) as channel:
        auth = rpc_pb2_grpc.AuthStub(channel)
        auth.UserAdd(
            rpc_pb2.AuthUserAddRequest(name="erin", password="erin-pw"), metadata=admin, timeout=10
        )
        with pytest.raises(grpc.RpcError) as exists:
            auth.UserAdd(
                rpc_pb2.AuthUserAddRequest(name="erin", password="x"), metadata=admin, timeout=10
            )
        assert exists.value.details() == "etcdserver: user name already exists"
    with secured.channel(secured.ports[root_owner]) as channel:
        listed = rpc_pb2_grpc.AuthStub(channel).UserList(
            rpc_pb2.AuthUserListRequest(), metadata=admin, timeout=10
        )
    assert list(listed.users) == ["erin"]

    # etcdctl logs in through either server; what erin may do comes from the root range.
    refused = etcdctl(via, "--user=erin:erin-pw", "put", "/sec/a", "1")
    assert refused.returncode != 0 and "lacks write on namespace 'etcd'" in refused.stderr
    wrong = etcdctl(via, "--user=erin:nope", "get", "/sec/a")
    assert wrong.returncode != 0 and "invalid user ID or password" in wrong.stderr
    with secured.client(root_owner) as client:
        client.grant("etcd", "erin", ["read", "write"])
    for i in (via, root_owner):
        done = until(
            lambda i=i: _ok(etcdctl(i, "--user=erin:erin-pw", "put", f"/sec/{i}", str(i))),  # type: ignore[misc]
            f"the grant to reach server {i}",
        )
        assert done.stdout.strip() == "OK"
    listing = etcdctl(via, "--user=erin:erin-pw", "get", "/sec/", "--prefix")
    assert listing.stdout.split() == ["/sec/0", "0", "/sec/1", "1"], listing.stderr

    # The root range's owner dies: the survivor reopens it with the users; erin logs in again.
    cluster.kill(root_owner)
    cluster.wait_ready(WAIT_S)
    assert cluster.index(cluster.assigned_to(0) or "") == via
    logged_in = until(
        lambda: _ok(etcdctl(via, "--user=erin:erin-pw", "get", "/sec/", "--prefix")),
        "the root range to reopen on the survivor",
        timeout_s=WAIT_S,
    )
    assert logged_in.stdout.split() == ["/sec/0", "0", "/sec/1", "1"]


def test_oxia_permissions_are_read_from_the_root_range_wherever_it_is(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    secured = secured_cluster(make_cluster, tmp_path, 4, "oxia")
    cluster = secured.cluster
    channels = {f"127.0.0.1:{port}": secured.channel(port) for port in secured.ports}
    try:
        carol = secured.bearer("carol")
        asked = client_pb2_grpc.OxiaClientStub(channels[f"127.0.0.1:{secured.ports[0]}"])
        # Every shard, at its leader: on one server the root range is local, on the other not.
        leaders = until(
            lambda: _shard_leaders(asked, carol, set(channels)), "every Oxia shard's leader"
        )
        assert {leaders[s] for s in leaders} == set(channels), leaders

        def write(shard: int, metadata: Metadata) -> Any:
            request = client_pb2.WriteRequest(
                shard=shard, puts=[client_pb2.PutRequest(key=f"/sec/{shard}", value=b"v")]
            )
            stub = client_pb2_grpc.OxiaClientStub(channels[leaders[shard]])
            return stub.Write(request, metadata=metadata, timeout=10)

        for shard in leaders:
            with pytest.raises(grpc.RpcError) as denied:
                write(shard, carol)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "role 'carol' lacks write on namespace 'oxia'" in (denied.value.details() or "")
        with secured.client(0) as client:
            client.grant("oxia", "carol", ["write"])
        for shard in leaders:
            written = until(
                lambda shard=shard: _answered(lambda: write(shard, carol)),  # type: ignore[misc]
                f"carol's grant to reach shard {shard}'s leader",
            )
            assert written.puts[0].status == client_pb2.OK
        assert cluster.alive(0) and cluster.alive(1)
    finally:
        for channel in channels.values():
            channel.close()


def _answered(call: Callable[[], T]) -> T | None:
    """The answer, or None while the call gets a retryable refusal (a grant not yet seen, an
    owner not yet found)."""
    try:
        return call()
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED):
            return None
        raise


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str] | None:
    return done if done.returncode == 0 else None


def _shard_leaders(
    stub: client_pb2_grpc.OxiaClientStub, metadata: Metadata, servers: set[str]
) -> dict[int, str] | None:
    """Shard -> its leader's Oxia address, for namespace `default`, once every leader is one of
    `servers` (None before; connecting needs only authentication)."""
    stream = stub.GetShardAssignments(
        client_pb2.ShardAssignmentsRequest(namespace="default"), metadata=metadata
    )
    try:
        first = next(iter(stream))
    except grpc.RpcError as exc:  # namespace default is made in the background: not yet
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None
    finally:
        stream.cancel()
    leaders = {int(a.shard): a.leader for a in first.namespaces["default"].assignments}
    return leaders if set(leaders.values()) <= servers else None
