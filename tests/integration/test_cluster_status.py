"""`tablekeeper cluster status` and the Admin service's ClusterStatus on real servers: a
standalone server answers for itself, `--workers` for every worker, and a TLS cluster with
tokens asks its peers over TLS with its own credentials (superusers only). The CLI needs
neither ZooKeeper nor the server package for it.

(`tests/integration/test_cli.py` covers a plaintext cluster, an address that does not answer
and `--wait` on a cluster that is not ready; `test_cluster_tls_deploy.py` covers
`deploy/cluster.sh --tls status`.)
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tablekeeper import (
    Client,
    PermissionDeniedError,
    TlsConfig,
    UnauthenticatedError,
)
from tablekeeper_server.security.certs import write_authority
from tablekeeper_server.security.tokens import create_token
from tests.support.cluster import TestCluster
from tests.support.server import TABLEKEEPER, ServerProcess
from tests.unit.test_client_imports import _cli_without_server

pytestmark = pytest.mark.integration

CLI_ENVIRONMENT_PREFIX = "TABLEKEEPER_"


def tk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`tablekeeper ARGS...` with only the given TABLEKEEPER_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(CLI_ENVIRONMENT_PREFIX)}
    return subprocess.run(
        [str(TABLEKEEPER), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean | (env or {}),
        check=False,
    )


@pytest.fixture
def standalone(tmp_path: Path, server_factory: list[ServerProcess]) -> ServerProcess:
    server = ServerProcess(tmp_path / "data", extra_args=["--containers", "4"])
    server_factory.append(server)
    return server.start()


def test_a_standalone_server_reports_itself(standalone: ServerProcess) -> None:
    """One server, every container assigned to it and owned by it (epoch 0), no cluster name
    and no controller; ready once it serves them all."""
    me = standalone.target
    with Client(standalone.service) as client:
        status = client.cluster_status()
    assert status.cluster == "" and list(status.servers) == [me] and status.controller == ""
    assert status.ready and list(status.problems) == []
    assert [(a.server, list(a.containers)) for a in status.assignment] == [(me, [0, 1, 2, 3])]
    assert [(s.server, list(s.containers), s.error) for s in status.serving] == [
        (me, [0, 1, 2, 3], "")
    ]
    assert [
        (c.container, c.assigned_to, c.owner.endpoint, c.owner.epoch) for c in status.containers
    ] == [(c, me, me, 0) for c in range(4)]
    text = tk("--service", standalone.service, "cluster", "status", "--wait", "30")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"standalone server {me}: 4 storage containers"
    assert f"servers: {me}" in lines and "controller: (none)" in lines
    assert lines[-1] == "ready: yes"
    doc = json.loads(
        tk(
            "cluster",
            "status",
            env={"TABLEKEEPER_SERVICE": standalone.service, "TABLEKEEPER_OUTPUT": "json"},
        ).stdout
    )
    assert doc["cluster"] is None and doc["ready"] is True and doc["servers"] == [me]
    assert doc["serving"] == doc["assignment"] == {me: [0, 1, 2, 3]}


def test_the_cli_asks_without_the_server_package(standalone: ServerProcess) -> None:
    """`cluster status` in an environment where `tablekeeper_server` cannot be imported (as in
    an SDK-only install): it asks the server, and loads no server module (the script checks)."""
    result = _cli_without_server(
        "--service", standalone.service, "cluster", "status", "--wait", "30", "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["ready"] is True and doc["servers"] == [standalone.target]


def test_workers_each_report_every_worker(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    """`--workers 2`: whichever worker is asked answers for both (container c is worker
    c % 2's), having asked the other one for its ServerInfo."""
    server = ServerProcess(tmp_path / "data", extra_args=["--workers", "2", "--containers", "4"])
    server_factory.append(server)
    server.start()
    with Client(server.service) as client:
        first = client.cluster_status()
    assert first.ready, first.problems
    assert first.servers[0] != first.servers[1] and server.target in first.servers
    other = next(s for s in first.servers if s != server.target)
    assignment = {a.server: list(a.containers) for a in first.assignment}
    assert assignment == {server.target: [0, 2], other: [1, 3]}
    assert {s.server: list(s.containers) for s in first.serving} == assignment
    assert {c.container: c.owner.endpoint for c in first.containers} == {
        0: server.target,
        1: other,
        2: server.target,
        3: other,
    }
    with Client(f"bk://{other}") as client:  # the other worker, asked directly
        second = client.cluster_status()
    assert second == first


@pytest.mark.pulsar
def test_a_tls_cluster_with_tokens(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """Servers with TLS (and client certificates accepted from the CA) and tokens: the server
    asked reaches the other over TLS with its own credentials, so it reports what each serves;
    only a superuser may ask; the CLI takes the CA and token from its environment."""
    certs = tmp_path / "certs"
    write_authority(certs, hosts=["127.0.0.1", "localhost"], clients=["admin"])
    secret = (certs / "secret.key").read_bytes().strip()
    admin, alice = (create_token(secret, role) for role in ("admin", "alice"))
    cluster = make_cluster(
        containers=4,
        extra_args=[
            *("--tls-cert", str(certs / "server.pem")),
            *("--tls-key", str(certs / "server-key.pem")),
            *("--tls-ca", str(certs / "ca.pem")),
            *("--auth-secret-key", str(certs / "secret.key")),
            *("--superuser-roles", "admin"),
        ],
        tls_files=(certs / "ca.pem", None, None),
        token=admin,
    ).start(2)
    tls = TlsConfig(ca=certs / "ca.pem")
    with Client(cluster.service_all(), tls=tls, token=admin) as client:
        status = client.cluster_status()
    assert status.cluster == cluster.name and status.ready, status.problems
    assert sorted(status.servers) == sorted(cluster.endpoint(i) for i in range(2))
    serving = {s.server: (sorted(s.containers), s.error) for s in status.serving}
    assert serving == {s: (sorted(c), "") for s, c in cluster.assignment().items()}
    with (
        Client(cluster.service(1), tls=tls, token=alice) as client,
        pytest.raises(PermissionDeniedError, match="superusers only"),
    ):
        client.cluster_status()
    with Client(cluster.service(1), tls=tls) as client, pytest.raises(UnauthenticatedError):
        client.cluster_status()
    env = {
        "TABLEKEEPER_SERVICE": cluster.service_all(),
        "TABLEKEEPER_TLS_CA": str(certs / "ca.pem"),
        "TABLEKEEPER_TOKEN": admin,
    }
    result = tk("cluster", "status", "--wait", "30", "-o", "json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ready"] is True
    plaintext = tk("cluster", "status", env={"TABLEKEEPER_SERVICE": cluster.service(0)})
    assert plaintext.returncode == 3 and "UnavailableError" in plaintext.stderr
    assert len(plaintext.stderr.strip().splitlines()) == 1
