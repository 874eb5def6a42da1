"""Security of the etcd and Oxia ports on a real server process: etcd's users, `Authenticate` and
token metadata (raw gRPC and etcdctl), and the per-namespace permissions both front-ends check
(namespace `etcd` for the etcd API, namespace `oxia` for the Oxia protocol).

One TLS server with HMAC tokens (`admin` a superuser) for the module; each test uses users and
keys of its own. etcd's Go client is exercised in tests/compat/test_etcd_clientv3.py.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest

from tablekeeper import Client, TlsConfig
from tablekeeper_proto.etcd import rpc_pb2, rpc_pb2_grpc
from tablekeeper_proto.oxia import client_pb2, client_pb2_grpc
from tablekeeper_server.security.certs import write_authority
from tablekeeper_server.security.tokens import create_token
from tests.support.server import ServerProcess, free_port

pytestmark = pytest.mark.integration
ETCDCTL = shutil.which("etcdctl")
AUTH_FAILED = "etcdserver: authentication failed, invalid user ID or password"
Metadata = tuple[tuple[str, str], ...]


@dataclass
class Secured:
    server: ServerProcess
    certs: Path
    etcd: str
    oxia: str

    @property
    def secret(self) -> bytes:
        return (self.certs / "secret.key").read_bytes().strip()

    def bearer(self, role: str, expiry_s: float | None = None) -> Metadata:
        return (("authorization", f"Bearer {create_token(self.secret, role, expiry_s)}"),)

    def channel(self, address: str) -> grpc.Channel:
        credentials = grpc.ssl_channel_credentials((self.certs / "ca.pem").read_bytes())
        return grpc.secure_channel(address, credentials)

    def client(self) -> Client:
        """The SDK on the gRPC port, as the superuser (to grant and revoke)."""
        token = create_token(self.secret, "admin")
        return Client(self.server.service, tls=TlsConfig(ca=self.certs / "ca.pem"), token=token)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    certs = tmp_path_factory.mktemp("certs")
    write_authority(certs, hosts=["127.0.0.1", "localhost"], clients=[])
    etcd_port, oxia_port = free_port(), free_port()
    server = ServerProcess(
        tmp_path_factory.mktemp("front-end-security") / "data",
        extra_args=[
            *("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server-key.pem")),
            *("--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"),
            *("--etcd-port", str(etcd_port), "--oxia-port", str(oxia_port)),
        ],
        tls_files=(certs / "ca.pem", None, None),
    ).start()
    try:
        yield Secured(server, certs, f"127.0.0.1:{etcd_port}", f"127.0.0.1:{oxia_port}")
    finally:
        server.stop()


def failure(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------- etcd users


def test_superusers_manage_users_who_authenticate_with_their_password(secured: Secured) -> None:
    alice, bob = unique("alice"), unique("bob")
    admin = secured.bearer("admin")
    with secured.channel(secured.etcd) as channel:
        auth = rpc_pb2_grpc.AuthStub(channel)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=alice, password="pw-a"), metadata=admin)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=bob, password="pw-b"), metadata=admin)
        users = auth.UserList(rpc_pb2.AuthUserListRequest(), metadata=admin).users
        assert {alice, bob} <= set(users)
        assert list(auth.UserGet(rpc_pb2.AuthUserGetRequest(name=alice), metadata=admin).roles) == [
            alice
        ]
        again = failure(
            lambda: auth.UserAdd(
                rpc_pb2.AuthUserAddRequest(name=alice, password="x"), metadata=admin
            )
        )
        assert again.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert again.details() == "etcdserver: user name already exists"
        missing = failure(
            lambda: auth.UserGet(rpc_pb2.AuthUserGetRequest(name="nobody"), metadata=admin)
        )
        assert missing.details() == "etcdserver: user name not found"

        # Authenticate needs no credentials; the token's subject is the user (= the role).
        token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name=alice, password="pw-a")).token
        claims = jwt.decode(token, secured.secret, algorithms=["HS256"])
        assert claims["sub"] == alice and claims["exp"] > 0
        for name, password in ((alice, "wrong"), ("nobody", "pw-a"), ("", "")):
            refused = failure(
                functools.partial(
                    auth.Authenticate, rpc_pb2.AuthenticateRequest(name=name, password=password)
                )
            )
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.details() == AUTH_FAILED

        # A user who is not a superuser may not manage users (its token in `token` metadata,
        # where etcd's clients send it).
        as_alice = (("token", token),)
        denied = failure(
            lambda: auth.UserAdd(
                rpc_pb2.AuthUserAddRequest(name="x", password="x"), metadata=as_alice
            )
        )
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "superusers only" in denied.details()
        assert failure(lambda: auth.UserList(rpc_pb2.AuthUserListRequest())).code() == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        status = auth.AuthStatus(rpc_pb2.AuthStatusRequest(), metadata=as_alice)
        assert status.enabled

        # A new password replaces the old one; a deleted user cannot authenticate.
        auth.UserChangePassword(
            rpc_pb2.AuthUserChangePasswordRequest(name=alice, password="pw-a2"), metadata=admin
        )
        assert (
            failure(
                lambda: auth.Authenticate(rpc_pb2.AuthenticateRequest(name=alice, password="pw-a"))
            ).details()
            == AUTH_FAILED
        )
        auth.Authenticate(rpc_pb2.AuthenticateRequest(name=alice, password="pw-a2"))
        auth.UserDelete(rpc_pb2.AuthUserDeleteRequest(name=bob), metadata=admin)
        assert (
            failure(
                lambda: auth.Authenticate(rpc_pb2.AuthenticateRequest(name=bob, password="pw-b"))
            ).details()
            == AUTH_FAILED
        )
        roles = failure(lambda: auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="r"), metadata=admin))
        assert roles.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "tablekeeper auth grant etcd" in roles.details()

    metrics = secured.server.log_path.read_text(errors="replace")
    assert "pw-a" not in metrics and "pw-b" not in metrics  # passwords are never logged
    assert "etcd Authenticate refused" in metrics


def test_expired_and_foreign_tokens_get_etcds_invalid_auth_token(secured: Secured) -> None:
    """etcd's clients fetch a new token only when told exactly this."""
    expired = create_token(secured.secret, "admin", expiry_s=-60)
    foreign = create_token(b"f" * 40, "admin")
    with secured.channel(secured.etcd) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        for token in (expired, foreign, "not-a-token"):
            request = rpc_pb2.RangeRequest(key=b"k")
            refused = failure(functools.partial(kv.Range, request, metadata=(("token", token),)))
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
            assert refused.details() == "etcdserver: invalid auth token"
    log = secured.server.log_path.read_text(errors="replace")
    assert expired not in log and foreign not in log


def test_users_survive_a_restart(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    write_authority(certs, hosts=["127.0.0.1"], clients=[])
    etcd_port = free_port()
    server = ServerProcess(
        tmp_path / "data",
        extra_args=[
            *("--auth-secret-key", str(certs / "secret.key"), "--superuser-roles", "admin"),
            *("--etcd-port", str(etcd_port)),
        ],
    ).start()
    admin = (("authorization", f"Bearer {create_token(secure_secret(certs), 'admin')}"),)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{etcd_port}") as channel:
            rpc_pb2_grpc.AuthStub(channel).UserAdd(
                rpc_pb2.AuthUserAddRequest(name="dora", password="pw"), metadata=admin
            )
        server.restart()
        with grpc.insecure_channel(f"127.0.0.1:{etcd_port}") as channel:
            auth = rpc_pb2_grpc.AuthStub(channel)
            assert auth.Authenticate(rpc_pb2.AuthenticateRequest(name="dora", password="pw")).token
            assert list(auth.UserList(rpc_pb2.AuthUserListRequest(), metadata=admin).users) == [
                "dora"
            ]
    finally:
        server.stop()


def secure_secret(certs: Path) -> bytes:
    return (certs / "secret.key").read_bytes().strip()


def test_without_authentication_the_etcd_port_answers_as_etcd_does(tmp_path: Path) -> None:
    """etcd's clients given a user and password go on without a token when the server says
    authentication is not enabled; users cannot be added then (they would be a back door once
    authentication is turned on)."""
    etcd_port = free_port()
    server = ServerProcess(tmp_path / "data", extra_args=["--etcd-port", str(etcd_port)]).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{etcd_port}") as channel:
            auth = rpc_pb2_grpc.AuthStub(channel)
            for call in (
                lambda: auth.Authenticate(rpc_pb2.AuthenticateRequest(name="u", password="p")),
                lambda: auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password="p")),
            ):
                refused = failure(call)
                assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert refused.details() == "etcdserver: authentication is not enabled"
            assert not auth.AuthStatus(rpc_pb2.AuthStatusRequest()).enabled
        if ETCDCTL is not None:
            endpoint = f"127.0.0.1:{etcd_port}"
            assert etcdctl(endpoint, "--user", "u:p", "put", "k", "v").returncode == 0
            assert etcdctl(endpoint, "--user", "u:p", "get", "k").stdout.split() == ["k", "v"]
    finally:
        server.stop()


# ---------------------------------------------------------------------------------- etcdctl


def etcdctl(
    endpoint: str, *args: str, cacert: Path | None = None
) -> subprocess.CompletedProcess[str]:
    assert ETCDCTL is not None
    tls = [f"--cacert={cacert}"] if cacert is not None else []
    return subprocess.run(
        [ETCDCTL, f"--endpoints={endpoint}", "--dial-timeout=10s", *tls, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ETCDCTL_API": "3"},
        check=False,
    )


def test_etcdctl_logs_in_and_is_held_to_its_permissions_on_namespace_etcd(
    secured: Secured,
) -> None:
    # `make test-integration` installs it (Debian etcd-client); missing, the test fails.
    assert ETCDCTL is not None, "etcdctl missing: make etcd-client"
    writer, reader = unique("writer"), unique("reader")
    key = unique("/app/")
    with secured.channel(secured.etcd) as channel:
        auth = rpc_pb2_grpc.AuthStub(channel)
        for name in (writer, reader):
            auth.UserAdd(
                rpc_pb2.AuthUserAddRequest(name=name, password=f"{name}-pw"),
                metadata=secured.bearer("admin"),
            )

    def run(user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return etcdctl(
            secured.etcd, f"--user={user}:{user}-pw", *args, cacert=secured.certs / "ca.pem"
        )

    # No permission yet: refused, naming what is missing; nothing written.
    refused = run(writer, "put", key, "v1")
    assert refused.returncode != 0 and "lacks write on namespace 'etcd'" in refused.stderr
    assert "lacks read on namespace 'etcd'" in run(writer, "get", key).stderr
    with secured.client() as client:
        client.grant("etcd", writer, ["read", "write"])
        client.grant("etcd", reader, ["read"])
    # Grants apply to the next call on the etcd port.
    done = run(writer, "put", key, "v1")
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr
    assert run(writer, "get", key).stdout.split() == [key, "v1"]
    assert run(reader, "get", key).stdout.split() == [key, "v1"]
    denied = run(reader, "put", key, "v2")
    assert denied.returncode != 0 and "lacks write on namespace 'etcd'" in denied.stderr
    assert "lacks write" in run(reader, "del", key).stderr
    assert "lacks write" in run(reader, "lease", "grant", "10").stderr
    assert run(reader, "get", key).stdout.split() == [key, "v1"]  # the refused put wrote nothing

    # A wrong password, and no credentials at all.
    wrong = etcdctl(
        secured.etcd, f"--user={writer}:nope", "get", key, cacert=secured.certs / "ca.pem"
    )
    assert wrong.returncode != 0 and "invalid user ID or password" in wrong.stderr
    anonymous = etcdctl(secured.etcd, "get", key, cacert=secured.certs / "ca.pem")
    assert anonymous.returncode != 0 and "no credentials" in anonymous.stderr

    # Revoked: refused again at once.
    with secured.client() as client:
        client.revoke("etcd", writer, [])
    assert "lacks write" in run(writer, "put", key, "v3").stderr


# ---------------------------------------------------------------------------------- Oxia


def _oxia_shard(stub: client_pb2_grpc.OxiaClientStub, metadata: Metadata) -> int:
    stream = stub.GetShardAssignments(
        client_pb2.ShardAssignmentsRequest(namespace="default"), metadata=metadata
    )
    first = next(iter(stream))
    stream.cancel()
    return int(first.namespaces["default"].assignments[0].shard)


def test_oxia_calls_need_read_or_write_on_namespace_oxia(secured: Secured) -> None:
    role = unique("carol")
    caller = secured.bearer(role)
    admin = secured.bearer("admin")
    key = unique("/oxia-sec/")
    with secured.channel(secured.oxia) as channel:
        stub = client_pb2_grpc.OxiaClientStub(channel)
        shard = _oxia_shard(stub, caller)  # connecting needs only authentication

        def write(metadata: Metadata, value: bytes) -> Any:
            request = client_pb2.WriteRequest(
                shard=shard, puts=[client_pb2.PutRequest(key=key, value=value)]
            )
            return stub.Write(request, metadata=metadata, timeout=10)

        def read(metadata: Metadata) -> Any:
            request = client_pb2.ReadRequest(
                shard=shard, gets=[client_pb2.GetRequest(key=key, include_value=True)]
            )
            (response,) = list(stub.Read(request, metadata=metadata, timeout=10))
            return response.gets[0]

        denied = failure(lambda: write(caller, b"v1"))
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"role {role!r} lacks write on namespace 'oxia'" in denied.details()
        assert "lacks read" in failure(lambda: read(caller)).details()
        assert read(admin).status == client_pb2.KEY_NOT_FOUND  # nothing was written
        session = client_pb2.CreateSessionRequest(shard=shard, session_timeout_ms=5000)
        assert failure(lambda: stub.CreateSession(session, metadata=caller)).code() == (
            grpc.StatusCode.PERMISSION_DENIED
        )

        with secured.client() as client:
            client.grant("oxia", role, ["read"])
        assert read(caller).status == client_pb2.KEY_NOT_FOUND
        assert "lacks write" in failure(lambda: write(caller, b"v1")).details()
        with secured.client() as client:
            client.grant("oxia", role, ["write"])
        assert write(caller, b"v1").puts[0].status == client_pb2.OK
        got = read(caller)
        assert got.status == client_pb2.OK and got.value == b"v1"


def test_an_etcd_watch_needs_read(secured: Secured) -> None:
    """A bidirectional stream is authorized message by message: a watch by a role without read
    ends PERMISSION_DENIED; with read it gets its events."""
    role = unique("watcher")
    key = unique("/watched/").encode()
    with secured.channel(secured.etcd) as channel:
        watch = rpc_pb2_grpc.WatchStub(channel)
        create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key))

        def first_response() -> rpc_pb2.WatchResponse:
            stream = watch.Watch(iter([create]), metadata=secured.bearer(role), timeout=10)
            response: rpc_pb2.WatchResponse = next(iter(stream))
            stream.cancel()
            return response

        denied = failure(first_response)
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "lacks read on namespace 'etcd'" in denied.details()
        with secured.client() as client:
            client.grant("etcd", role, ["read"])
        assert first_response().created
