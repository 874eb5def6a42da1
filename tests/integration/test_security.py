"""TLS, mutual TLS and bearer tokens on a real server process.

Certificates come from a throw-away CA made per module (`tablekeeper_server.security.certs`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tablekeeper import (
    Client,
    PermissionDeniedError,
    RetryPolicy,
    TlsConfig,
    UnauthenticatedError,
    UnavailableError,
)
from tablekeeper_proto.bookkeeper import kv_rpc_pb2, kv_rpc_pb2_grpc, storage_pb2, storage_pb2_grpc
from tablekeeper_proto.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)
from tablekeeper_server.security.certs import issue, new_authority, write_authority
from tablekeeper_server.security.tokens import create_token
from tests.support.cluster import TestCluster
from tests.support.server import TABLEKEEPER, ServerProcess

pytestmark = pytest.mark.integration
FAST_FAIL = RetryPolicy(deadline_s=0.5)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    write_authority(directory, hosts=["127.0.0.1", "localhost"], clients=["alice", "admin"])
    # A client certificate from another CA, which the server must not trust.
    stranger = new_authority("some other CA")
    cert, key = issue(stranger, "mallory", client=True)
    (directory / "mallory.pem").write_bytes(cert)
    (directory / "mallory-key.pem").write_bytes(key)
    return directory


def secret(certs: Path) -> bytes:
    return (certs / "secret.key").read_bytes().strip()


def tls_args(certs: Path) -> list[str]:
    return ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")]


RUNTIMES = ["grpc-aio", "envoy"]
"""What serves the gRPC ports (`--runtime`): both must authenticate and authorize alike."""


@pytest.fixture(scope="module", params=RUNTIMES)
def token_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, certs: Path
) -> Iterator[ServerProcess]:
    """TLS, tokens verified with the HMAC secret, `admin` a superuser; on each runtime."""
    server = ServerProcess(
        tmp_path_factory.mktemp("token-server") / "data",
        extra_args=[
            *("--runtime", request.param),
            *tls_args(certs),
            "--auth-secret-key",
            str(certs / "secret.key"),
            "--superuser-roles",
            "admin",
        ],
        tls_files=(certs / "ca.pem", None, None),
    )
    server.start()
    with Client(server.service, tls=TlsConfig(ca=certs / "ca.pem"), token=admin(certs)) as c:
        c.create_namespace("sec")
        c.create_table("sec", "t", ranges=2)
    yield server
    server.stop()


def admin(certs: Path) -> str:
    return create_token(secret(certs), "admin")


def test_tls_and_a_valid_token_serve_every_kind_of_call(
    token_server: ServerProcess, certs: Path
) -> None:
    tls = TlsConfig(ca=certs / "ca.pem")
    with Client(token_server.service, tls=tls, token=lambda: admin(certs)) as client:
        table = client.table("sec", "t")
        table.put("p", "k", "v")
        kv_ = table.get("p", "k")
        assert kv_ is not None and kv_.value == b"v"
        with table.watch("p", start=b"") as watch:  # a server stream
            table.put("p", "w", "x")
            assert next(iter(watch)).lkey == b"w"
        session = table.session("p", 5).start()  # a bidirectional keep-alive stream
        table.put("p", "eph", "1", session=session)
        session.close()
        assert table.get("p", "eph") is None
        assert client.status().ranges is not None  # the Admin service


def test_calls_without_a_valid_token_are_refused_and_counted(
    token_server: ServerProcess, certs: Path
) -> None:
    tls = TlsConfig(ca=certs / "ca.pem")
    wrong_secret = create_token(b"s" * 40, "admin")
    valid = admin(certs)
    tampered = valid[:-4] + ("AAAA" if not valid.endswith("AAAA") else "BBBB")
    expired = create_token(secret(certs), "admin", expiry_s=-60)
    cases = {
        "no credentials": None,
        "token has expired": expired,
        "signature does not verify": wrong_secret,
        "invalid": tampered,
    }
    for message, token in cases.items():
        with Client(token_server.service, tls=tls, token=token, retry=FAST_FAIL) as client:
            with pytest.raises(UnauthenticatedError) as refused:
                client.table("sec", "t").get("p", "k")
            assert message in str(refused.value) or message == "invalid", refused.value
    metrics = token_server.metrics()
    for reason in ("anonymous", "expired", "invalid_token"):
        assert counter(metrics, "tablekeeper_auth_failures_total", reason=reason) >= 1, reason
    log = token_server.log_path.read_text(errors="replace")
    assert "refused" in log
    for token in (wrong_secret, tampered, expired):
        assert token not in log and token.split(".")[2] not in log  # never log a token


def test_every_rpc_family_refuses_anonymous_calls(token_server: ServerProcess, certs: Path) -> None:
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    header = kv_rpc_pb2.RoutingHeader(stream_id=1024, r_key=b"p")
    with grpc.secure_channel(token_server.target, credentials) as channel:
        calls: list[Any] = [
            lambda: storage_pb2_grpc.RootRangeServiceStub(channel).CreateNamespace(
                storage_pb2.CreateNamespaceRequest(name="x"), timeout=10
            ),
            lambda: kv_rpc_pb2_grpc.TableServiceStub(channel).Put(
                kv_rpc_pb2.PutRequest(key=b"k", value=b"v", header=header), timeout=10
            ),
            lambda: admin_pb2_grpc.AdminStub(channel).Status(admin_pb2.StatusRequest(), timeout=10),
            lambda: list(
                watch_pb2_grpc.WatchStub(channel).Watch(
                    watch_pb2.WatchRequest(stream_id=1024, pkey=b"p", key=b"k"), timeout=10
                )
            ),
            lambda: list(
                session_pb2_grpc.SessionsStub(channel).KeepAlive(
                    iter([session_pb2.KeepAliveRequest(stream_id=1024, pkey=b"p")]), timeout=10
                )
            ),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
        # Health checks need no credentials.
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_plaintext_client_cannot_talk_to_a_tls_port(token_server: ServerProcess) -> None:
    started = time.monotonic()
    client = Client(token_server.service, token="x", retry=FAST_FAIL)
    with client, pytest.raises(UnavailableError, match="UNAVAILABLE"):
        client.get_namespace("sec")
    # Refused, not hung: a call left hanging would have run into the policy's call timeout.
    assert time.monotonic() - started < FAST_FAIL.call_timeout_s


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_mutual_tls_roles_and_untrusted_certificates(
    tmp_path: Path, certs: Path, runtime: str
) -> None:
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            *("--runtime", runtime),
            *tls_args(certs),
            *("--tls-client-ca", str(certs / "ca.pem")),
            *("--superuser-roles", "admin"),
        ],
        tls_files=(certs / "ca.pem", certs / "alice.pem", certs / "alice-key.pem"),
    ).start()
    try:

        def as_(role: str) -> TlsConfig:
            return TlsConfig(
                ca=certs / "ca.pem", cert=certs / f"{role}.pem", key=certs / f"{role}-key.pem"
            )

        # The certificate's common name is the role.
        with Client(server.service, tls=as_("admin")) as client:
            client.create_namespace("m")
            client.create_table("m", "t", ranges=2)
            client.grant("m", "alice", ["read", "write"])
        with Client(server.service, tls=as_("alice")) as client:
            client.table("m", "t").put("p", "k", "v")
            with pytest.raises(PermissionDeniedError, match="role 'alice'"):
                client.create_namespace("n")
        # No certificate, or one the server's CA did not sign: the handshake fails.
        strangers = [
            TlsConfig(ca=certs / "ca.pem"),
            TlsConfig(
                ca=certs / "ca.pem", cert=certs / "mallory.pem", key=certs / "mallory-key.pem"
            ),
        ]
        for tls in strangers:
            client = Client(server.service, tls=tls, retry=FAST_FAIL)
            with client, pytest.raises(UnavailableError):
                client.get_namespace("m")
    finally:
        server.stop()


def test_calls_without_credentials_need_the_anonymous_role(tmp_path: Path, certs: Path) -> None:
    """Clients that cannot send tokens (the BookKeeper clients: see tests/compat) get in only
    through --anonymous-role, with what was granted to it."""
    common = ["--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"]
    server = ServerProcess(
        tmp_path / "data", extra_args=[*common, "--anonymous-role", "functions"]
    ).start()
    try:
        with Client(server.service, token=admin(certs)) as client:
            for namespace in ("public", "private"):
                client.create_namespace(namespace)
                client.create_table(namespace, "state", ranges=2)
            assert client.grant("public", "functions", ["read", "write"]) == ["read", "write"]
        with Client(server.service) as anonymous:
            anonymous.table("public", "state").put("k", "k", "v")
            denied = "'functions' lacks read on namespace 'private'"
            with pytest.raises(PermissionDeniedError, match=denied):
                anonymous.table("private", "state").put("k", "k", "v")
    finally:
        server.stop()
    refusing = ServerProcess(tmp_path / "refusing", extra_args=common).start()
    try:
        client = Client(refusing.service, retry=FAST_FAIL)
        with client, pytest.raises(UnauthenticatedError):
            client.create_namespace("public")
    finally:
        refusing.stop()


def test_permissions_per_namespace_and_role(tmp_path: Path, certs: Path) -> None:
    server = ServerProcess(
        tmp_path / "data",
        extra_args=["--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"],
    ).start()
    alice_token = create_token(secret(certs), "alice")
    try:
        with Client(server.service, token=admin(certs)) as root:
            root.create_namespace("team")
            root.create_table("team", "t", ranges=2)
            root.create_namespace("other")
            root.table("team", "t").put("p", "k", "v")
        alice = Client(server.service, token=alice_token)
        with alice:
            with pytest.raises(PermissionDeniedError, match="lacks read on namespace 'team'"):
                alice.table("team", "t")
            with Client(server.service, token=admin(certs)) as root:
                root.grant("team", "alice", ["read"])
            t = alice.table("team", "t")
            assert t.get("p", "k") is not None
            with pytest.raises(PermissionDeniedError, match="lacks write"):
                t.put("p", "k", "mine")
            with pytest.raises(PermissionDeniedError, match="lacks write"):
                t.session("p", 5).start()
            with Client(server.service, token=admin(certs)) as root:
                root.grant("team", "alice", ["write"])
            t.put("p", "k", "mine")
            with t.watch("p", start=b"") as watch:
                t.put("p", "w", "x")
                assert next(iter(watch)).lkey in (b"k", b"w")
            # Not an admin of the namespace, nor a superuser.
            for call in (
                lambda: alice.create_table("team", "t2"),
                lambda: alice.grant("team", "alice", ["admin"]),
                lambda: alice.create_namespace("mine"),
                lambda: alice.list_tables("other"),
            ):
                with pytest.raises(PermissionDeniedError):
                    call()
            with pytest.raises(grpc.RpcError) as admin_only:  # Admin.Status: raw gRPC status
                alice.status()
            assert admin_only.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with Client(server.service, token=admin(certs)) as root:
                root.grant("team", "alice", ["admin"])
                assert root.list_permissions("team") == {"alice": ["read", "write", "admin"]}
            alice.create_table("team", "t2", ranges=2)
            alice.grant("team", "bob", ["read"])
            alice.revoke("team", "alice", ["write"])
            with pytest.raises(PermissionDeniedError, match="lacks write"):
                t.put("p", "k", "again")
        # Permissions are kept in the root range: they survive a restart.
        assert server.stop() == 0
        server.start()
        with Client(server.service, token=admin(certs)) as root:
            assert root.list_permissions("team") == {
                "alice": ["read", "admin"],
                "bob": ["read"],
            }
            # A namespace deleted and created again starts with no permissions.
            root.delete_namespace("other")
            root.create_namespace("other")
            assert root.list_permissions("other") == {}
        with Client(server.service, token=alice_token) as alice_again:
            assert alice_again.table("team", "t").get("p", "k") is not None
    finally:
        server.stop()


@pytest.mark.parametrize("runtime", ["grpc-aio", "envoy"])
def test_sighup_reloads_the_certificate_without_dropping_the_server(
    runtime: str, tmp_path: Path, certs: Path
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    for name in ("server.pem", "server-key.pem"):
        (live / name).write_bytes((certs / name).read_bytes())
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            *("--runtime", runtime),
            "--tls-cert",
            str(live / "server.pem"),
            "--tls-key",
            str(live / "server-key.pem"),
        ],
        tls_files=(certs / "ca.pem", None, None),
    ).start()
    try:
        tls = TlsConfig(ca=certs / "ca.pem")
        with Client(server.service, tls=tls) as client:
            client.create_namespace("r")
            before = served_certificate(server.port)
            # A new certificate from a new CA: clients that trust only the old CA must fail.
            write_authority(tmp_path / "next", hosts=["127.0.0.1"], clients=[])
            for name in ("server.pem", "server-key.pem"):
                (live / name).write_bytes((tmp_path / "next" / name).read_bytes())
            assert server.process is not None
            server.process.send_signal(signal.SIGHUP)
            server.wait_for(lambda: served_certificate(server.port) != before, "new certificate")
            assert client.get_namespace("r") >= 0  # the open connection goes on
        with Client(server.service, tls=TlsConfig(ca=tmp_path / "next" / "ca.pem")) as client:
            assert client.get_namespace("r") >= 0
        assert server.process.poll() is None
    finally:
        server.tls_files = (tmp_path / "next" / "ca.pem", None, None)
        server.stop()


def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def counter(metrics: str, name: str, **labels: str) -> float:
    for line in metrics.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_cli_tokens_permissions_and_tls(token_server: ServerProcess, certs: Path) -> None:
    """`tablekeeper token create`, `auth grant|list|revoke`, and the CLI over TLS with a token
    from --token or TABLEKEEPER_TOKEN."""

    def tk(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TABLEKEEPER_")}
        env |= {"TABLEKEEPER_SERVICE": token_server.service}
        env |= {"TABLEKEEPER_TLS_CA": str(certs / "ca.pem")}
        if token is not None:
            env["TABLEKEEPER_TOKEN"] = token
        return subprocess.run(
            [str(TABLEKEEPER), *args], capture_output=True, text=True, env=env, timeout=60
        )

    made = tk("token", "create", "--secret-key", str(certs / "secret.key"), "--subject", "admin")
    assert made.returncode == 0, made.stderr
    admin_token = made.stdout.strip()
    carol = tk(
        "token", "create", "--secret-key", str(certs / "secret.key"), "--subject", "carol",
        "--expiry", "1h",
    ).stdout.strip()  # fmt: skip
    assert tk("ns", "create", "cli", token=admin_token).returncode == 0
    assert tk("table", "create", "cli/t", token=admin_token).returncode == 0
    denied = tk("put", "cli/t", "k", "v", token=carol)
    assert denied.returncode != 0 and "lacks" in denied.stderr, denied.stderr
    granted = tk("auth", "grant", "cli", "carol", "read", "write", token=admin_token)
    assert granted.stdout.strip() == "carol on cli: read,write", granted.stderr
    assert tk("put", "cli/t", "k", "v", "--token", carol).returncode == 0
    listed = tk("auth", "list", "cli", "-o", "json", token=admin_token)
    assert json.loads(listed.stdout)["permissions"] == {"carol": ["read", "write"]}
    revoked = tk("auth", "revoke", "cli", "carol", token=admin_token)
    assert revoked.stdout.strip() == "carol on cli: no permissions"
    assert tk("get", "cli/t", "k", token=carol).returncode != 0
    anonymous = tk("ns", "list")
    assert anonymous.returncode != 0 and "UNAUTHENTICATED" in anonymous.stderr
    (certs / "short.key").write_text("too short")
    bad = tk("token", "create", "--secret-key", str(certs / "short.key"), "--subject", "x")
    assert bad.returncode == 2 and "at least 32 bytes" in bad.stderr, bad.stderr


def test_a_tls_cluster_forwards_with_the_callers_identity(
    make_cluster: Callable[..., TestCluster], certs: Path
) -> None:
    """Three servers with TLS and tokens: any server accepts a call and forwards it (over TLS,
    with the caller's token) to the owner, which checks the caller's permissions again; the
    permissions are in the root range and survive the loss of the server that owned it."""
    cluster = make_cluster(
        containers=6,
        extra_args=[
            *tls_args(certs),
            *("--tls-ca", str(certs / "ca.pem")),
            *("--auth-secret-key", str(certs / "secret.key")),
            *("--superuser-roles", "admin"),
        ],
        tls_files=(certs / "ca.pem", None, None),
        token=admin(certs),
    ).start(3)
    tls = TlsConfig(ca=certs / "ca.pem")
    patient = RetryPolicy(deadline_s=60.0, call_timeout_s=10.0)
    with Client(cluster.service(0), tls=tls, token=admin(certs), retry=patient) as root:
        root.create_namespace("shared")
        root.create_table("shared", "t", ranges=6)
        root.grant("shared", "alice", ["read", "write"])
    alice, bob = (create_token(secret(certs), role) for role in ("alice", "bob"))
    pkeys = [f"p{n}" for n in range(30)]  # spread over every container, so most are elsewhere
    for i in range(3):
        with Client(
            cluster.service(i), tls=tls, token=alice, retry=patient, direct_routing=False
        ) as client:
            table = client.table("shared", "t")
            for pkey in pkeys:
                table.put(pkey, "k", f"via {i}")
            assert {table.get(pkey, "k").value for pkey in pkeys} == {f"via {i}".encode()}  # type: ignore[union-attr]
        with (
            Client(
                cluster.service(i), tls=tls, token=bob, retry=patient, direct_routing=False
            ) as client,
            pytest.raises(PermissionDeniedError, match="'bob' lacks read"),
        ):
            client.table("shared", "t")
        forwarded = counter(
            cluster.servers[i].metrics(), "tablekeeper_forwarded_requests_total", method="Put"
        )
        assert forwarded >= 1, f"server {i} forwarded no put"
    # The root range's owner dies: another server restores it, permissions included.
    root_owner = cluster.index(cluster.assigned_to(0) or "")
    cluster.kill(root_owner)
    survivor = next(i for i in range(3) if i != root_owner)
    with Client(cluster.service(survivor), tls=tls, token=alice, retry=patient) as client:
        table = client.table("shared", "t")
        table.put("after", "k", "failover")
        assert table.get("after", "k") is not None
    with Client(cluster.service(survivor), tls=tls, token=admin(certs), retry=patient) as root:
        assert root.list_permissions("shared") == {"alice": ["read", "write"]}


def test_a_session_belongs_to_the_role_that_created_it(
    token_server: ServerProcess, certs: Path
) -> None:
    """Knowing a session's id is not enough to close it or keep it alive: only the role that
    created it (or a superuser) may; that holds after a restart too (it is in the log)."""
    tls = TlsConfig(ca=certs / "ca.pem")
    with Client(token_server.service, tls=tls, token=admin(certs)) as root:
        for role in ("alice", "bob"):
            root.grant("sec", role, ["read", "write"])
        table_id = root.get_table("sec", "t").table_id
    alice = create_token(secret(certs), "alice")
    with Client(token_server.service, tls=tls, token=alice) as client:
        session = client.table("sec", "t").session("owned", 30).start()
        client.table("sec", "t").put("owned", "eph", "1", session=session)
        session_id = session.id
        assert session_id

    def as_role(role: str, call: str) -> grpc.StatusCode:
        token = admin(certs) if role == "admin" else create_token(secret(certs), role)
        credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        metadata = (("authorization", f"Bearer {token}"),)
        with grpc.secure_channel(token_server.target, credentials) as channel:
            stub = session_pb2_grpc.SessionsStub(channel)
            try:
                if call == "close":
                    request = session_pb2.CloseSessionRequest(
                        stream_id=table_id, pkey=b"owned", session_id=session_id
                    )
                    stub.Close(request, metadata=metadata, timeout=10)
                else:
                    keep = session_pb2.KeepAliveRequest(
                        stream_id=table_id, pkey=b"owned", session_id=session_id
                    )
                    list(stub.KeepAlive(iter([keep]), metadata=metadata, timeout=10))
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    assert as_role("bob", "keep-alive") == grpc.StatusCode.PERMISSION_DENIED
    assert as_role("bob", "close") == grpc.StatusCode.PERMISSION_DENIED
    assert as_role("alice", "keep-alive") == grpc.StatusCode.OK
    assert token_server.stop() == 0  # ownership is in the log: it survives a restart
    token_server.start()
    assert as_role("bob", "close") == grpc.StatusCode.PERMISSION_DENIED
    assert as_role("admin", "close") == grpc.StatusCode.OK  # a superuser may
    with Client(token_server.service, tls=tls, token=alice) as client:
        assert client.table("sec", "t").get("owned", "eph") is None  # closed: key gone


def test_the_etcd_and_oxia_ports_use_the_same_tls_and_tokens(tmp_path: Path, certs: Path) -> None:
    """With security on, the etcd and Oxia front-ends serve TLS with the server's certificate
    and refuse calls without credentials, as the gRPC port does."""
    from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
    from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
    from tests.support.server import free_port

    etcd_port, oxia_port = free_port(), free_port()
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            *tls_args(certs),
            *("--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"),
            *("--etcd-port", str(etcd_port), "--oxia-port", str(oxia_port)),
        ],
        tls_files=(certs / "ca.pem", None, None),
    ).start()
    try:
        credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        token = (("authorization", f"Bearer {admin(certs)}"),)

        def etcd_put(metadata: Any) -> grpc.StatusCode:
            with grpc.secure_channel(f"127.0.0.1:{etcd_port}", credentials) as channel:
                kv_stub = rpc_pb2_grpc.KVStub(channel)
                try:
                    kv_stub.Put(
                        rpc_pb2.PutRequest(key=b"k", value=b"v"), metadata=metadata, timeout=10
                    )
                except grpc.RpcError as exc:
                    return exc.code()
            return grpc.StatusCode.OK

        def oxia_assignments(metadata: Any) -> grpc.StatusCode:
            with grpc.secure_channel(f"127.0.0.1:{oxia_port}", credentials) as channel:
                stub = client_pb2_grpc.OxiaClientStub(channel)
                request = client_pb2.ShardAssignmentsRequest(namespace="default")
                try:
                    stream = stub.GetShardAssignments(request, metadata=metadata, timeout=10)
                    next(iter(stream))
                    stream.cancel()
                except grpc.RpcError as exc:
                    return exc.code()
            return grpc.StatusCode.OK

        assert etcd_put(None) == grpc.StatusCode.UNAUTHENTICATED
        assert etcd_put(token) == grpc.StatusCode.OK
        assert oxia_assignments(None) == grpc.StatusCode.UNAUTHENTICATED
        assert oxia_assignments(token) == grpc.StatusCode.OK
        with grpc.insecure_channel(f"127.0.0.1:{etcd_port}") as plaintext:  # TLS only
            with pytest.raises(grpc.RpcError) as refused:
                rpc_pb2_grpc.KVStub(plaintext).Range(
                    rpc_pb2.RangeRequest(key=b"k"), metadata=token, timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()
