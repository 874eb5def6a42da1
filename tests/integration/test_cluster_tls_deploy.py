"""`deploy/cluster.sh start N --tls` end to end: the script makes a throw-away CA, starts a
2-server cluster serving TLS (its own ZooKeeper, the session's Pulsar), says how to point clients
at it, and every server serves reads and writes over TLS (forwarding between them over TLS too);
a plaintext client is refused; `stop` ends every process. Plus: TLS is fixed at the first start.
"""

from __future__ import annotations

import os
import random
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tablekeeper import Client, RetryPolicy, TlsConfig, UnavailableError
from tests.support.pulsar import PulsarService, unique_namespace
from tests.support.server import REPO, TABLEKEEPER, free_port

pytestmark = pytest.mark.integration

SCRIPT = REPO / "deploy" / "cluster.sh"


def cluster_sh(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={
            **os.environ,
            "TK_TABLEKEEPER": str(TABLEKEEPER),
            "TK_PYTHON": sys.executable,
            "TK_CLUSTER_STOP_TIMEOUT": "20",
        },
    )


def base_port() -> int:
    """Below the kernel's ephemeral range (see test_cluster_deploy.base_port)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return random.randrange(max(1024, low - 12000), low - 2000)


def gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return re.search(r"^State:\s+Z", status, re.MULTILINE) is not None


def test_tls_is_chosen_at_the_first_start(tmp_path: Path) -> None:
    plaintext = tmp_path / "plaintext"
    plaintext.mkdir()
    (plaintext / "cluster.env").write_text("TLS=0\n")  # as a first start without --tls records
    refused = cluster_sh("start", "1", "--dir", str(plaintext), "--tls")
    assert refused.returncode == 1
    assert "was started with plaintext (no --tls), not --tls" in refused.stderr
    assert "only --dir" in cluster_sh("stop", "--tls").stderr
    assert "--tls" in cluster_sh("--help").stdout


@pytest.mark.pulsar
def test_start_a_tls_cluster_use_it_and_stop(tmp_path: Path, pulsar_service: PulsarService) -> None:
    directory = tmp_path / "cluster"
    started = cluster_sh(
        "start",
        "2",
        "--tls",
        *("--dir", str(directory)),
        *("--cluster", f"tls-{uuid.uuid4().hex[:6]}"),
        *("--containers", "4"),
        *("--zk-port", str(free_port())),
        *("--base-port", str(base_port())),
        *("--pulsar-url", pulsar_service.service_url),
        *("--pulsar-admin-url", pulsar_service.admin_url),
        *("--pulsar-namespace", f"public/{unique_namespace('tlsdeploy')}"),
        *("--timeout", "120"),
    )
    pids: set[int] = set()
    try:
        assert started.returncode == 0, started.stderr[-5000:]
        uris = started.stdout.split()
        assert len(uris) == 2 and all(u.startswith("bk://127.0.0.1:") for u in uris), uris
        pids.add(int((directory / "zookeeper" / "zookeeper.pid").read_text()))
        for i in (1, 2):
            pids.add(int((directory / "servers" / str(i) / "server.pid").read_text()))
        ca = directory / "tls" / "ca.pem"
        # How to point the CLI and the SDK at it.
        assert f"export TABLEKEEPER_TLS_CA={ca}" in started.stderr
        assert f"--tls-ca {ca}" in started.stderr
        assert stat.S_IMODE((directory / "tls" / "server-key.pem").stat().st_mode) == 0o600
        assert "TLS=1" in (directory / "cluster.env").read_text()

        tls = TlsConfig(ca=ca)
        with Client(uris[0], tls=tls) as admin:
            admin.create_namespace("tlsdeploy")
            admin.create_table("tlsdeploy", "t", ranges=8)
        for i, uri in enumerate(uris):  # keys on every container: some calls are forwarded
            with Client(uri, tls=tls) as client:
                for n in range(8):
                    client.table("tlsdeploy", "t").put(f"key-{i}-{n}", "v", f"value-{i}")
        for uri in uris:
            with Client(uri, tls=tls) as client:
                table = client.table("tlsdeploy", "t")
                for i in range(len(uris)):
                    for n in range(8):
                        found = table.get(f"key-{i}-{n}", "v")
                        assert found is not None and found.value == f"value-{i}".encode(), uri
        plaintext = Client(uris[0], retry=RetryPolicy(deadline_s=1.0))
        with plaintext, pytest.raises(UnavailableError):
            plaintext.table("tlsdeploy", "t").get("key-0-0", "v")

        # The CLI, told the CA by the environment, as the script says.
        cli = subprocess.run(
            [str(TABLEKEEPER), "get", "tlsdeploy/t", "v", "--pkey", "key-1-0"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "TABLEKEEPER_SERVICE": uris[1], "TABLEKEEPER_TLS_CA": str(ca)},
            check=False,
        )
        assert cli.returncode == 0 and "value-1" in cli.stdout, cli.stdout + cli.stderr

        status = cluster_sh("status", "--dir", str(directory))
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"tls: on, CA {ca}" in status.stdout
        # `tablekeeper cluster status` asked every server over TLS: each serves what it was
        # assigned (no "ServerInfo failed"), so the cluster is ready.
        assert "ready: yes" in status.stdout and "ServerInfo failed" not in status.stdout, (
            status.stdout
        )
        # Started again without --tls: the recorded TLS stays (nothing to start, ready at once).
        again = cluster_sh("start", "2", "--dir", str(directory), "--timeout", "60")
        assert again.returncode == 0 and again.stdout.split() == uris, again.stderr[-3000:]
    finally:
        stopped = cluster_sh("stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stderr
    assert len(pids) == 3 and all(gone(pid) for pid in pids), pids
