"""deploy/cluster.sh end to end: start a 2-server cluster (its own ZooKeeper, the session's
Pulsar), check `status`, read and write through every server's URI with the SDK, add a third
server with `start 3`, then `stop` and check that every process is gone. Plus the script's
argument checks and the per-container owners of `tablekeeper cluster status`'s report."""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from tablekeeper import Client
from tablekeeper._cli_cluster import report
from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc
from tablekeeper_server.cluster.status import ZooKeeperView
from tablekeeper_server.cluster.zookeeper import Controller, ZkCoordinator
from tablekeeper_server.core.clock import SystemClock
from tablekeeper_server.rpc.admin import cluster_status_response
from tests.support.pulsar import PulsarService, unique_namespace
from tests.support.server import REPO, TABLEKEEPER, free_port
from tests.support.zookeeper import ZooKeeperProcess

pytestmark = pytest.mark.integration

SCRIPT = REPO / "deploy" / "cluster.sh"
CONTAINERS = 4


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
    """Where cluster.sh starts looking for server ports: below the kernel's ephemeral range, so
    no outgoing connection takes a port between the script's check and the server's bind (the
    script skips ports in use)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return random.randrange(max(1024, low - 12000), low - 2000)


def gone(pid: int) -> bool:
    """No such process, or only a zombie nobody reaped yet (it was reparented away from us)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return re.search(r"^State:\s+Z", status, re.MULTILINE) is not None


def server_rows(status: str) -> list[tuple[str, str, str]]:
    """(pid, alive, service) of each server row of `cluster.sh status`."""
    return re.findall(r"^\d+\s+(\S+)\s+(yes|no)\s+(bk://\S+)", status, re.MULTILINE)


def test_help_and_bad_arguments(tmp_path: Path) -> None:
    shown = cluster_sh("--help")
    assert shown.returncode == 0 and "start N" in shown.stdout and "--base-port" in shown.stdout
    assert cluster_sh().returncode == 2
    assert "start needs the number of servers" in cluster_sh("start").stderr
    assert cluster_sh("start", "2", "--bogus").returncode == 1
    assert "go together" in cluster_sh("start", "1", "--pulsar-url", "pulsar://x:1").stderr
    assert "only --dir" in cluster_sh("stop", "--containers", "4").stderr
    nothing = tmp_path / "nothing"
    assert cluster_sh("status", "--dir", str(nothing)).returncode == 3
    assert cluster_sh("stop", "--dir", str(nothing)).returncode == 0
    assert not nothing.exists()


@pytest.mark.pulsar
def test_start_status_use_grow_stop(tmp_path: Path, pulsar_service: PulsarService) -> None:
    directory = str(tmp_path / "cluster")
    name = f"deploy-{uuid.uuid4().hex[:6]}"
    started = cluster_sh(
        "start",
        "2",
        "--dir",
        directory,
        "--cluster",
        name,
        "--containers",
        str(CONTAINERS),
        "--zk-port",
        str(free_port()),
        "--base-port",
        str(base_port()),
        "--pulsar-url",
        pulsar_service.service_url,
        "--pulsar-admin-url",
        pulsar_service.admin_url,
        "--pulsar-namespace",
        f"public/{unique_namespace('deploy')}",
        "--timeout",
        "120",
    )
    pids: set[int] = set()
    try:
        assert started.returncode == 0, started.stderr[-5000:]
        uris = started.stdout.split()
        assert len(uris) == 2 and all(u.startswith("bk://127.0.0.1:") for u in uris), uris
        endpoints = [u.removeprefix("bk://") for u in uris]
        pids.add(int((tmp_path / "cluster" / "zookeeper" / "zookeeper.pid").read_text()))

        status = cluster_sh("status", "--dir", directory)
        assert status.returncode == 0, status.stdout + status.stderr
        out = status.stdout
        rows = server_rows(out)
        assert [(alive, service) for _, alive, service in rows] == [("yes", u) for u in uris]
        pids |= {int(pid) for pid, _, _ in rows}
        assert f"servers: {', '.join(sorted(endpoints))}" in out
        controller = re.search(r"^controller: (\S+)$", out, re.MULTILINE)
        assert controller is not None and controller.group(1) in endpoints, out
        assigned: set[int] = set()
        for endpoint in endpoints:
            line = re.search(rf"^  {re.escape(endpoint)}: \[([\d, ]*)\]$", out, re.MULTILINE)
            assert line is not None, out
            assigned |= {int(c) for c in line.group(1).split(",") if c.strip()}
        assert assigned == set(range(CONTAINERS)), out
        assert "unassigned" not in out and "ready: yes" in out, out

        # Every server answers reads and writes of keys on any container.
        with Client(uris[0]) as admin:
            admin.create_namespace("deploy")
            admin.create_table("deploy", "t", ranges=8)
        for i, uri in enumerate(uris):
            with Client(uri) as client:
                client.table("deploy", "t").put(f"key-{i}", "v", f"value-{i}")
        for uri in uris:
            with Client(uri) as client:
                table = client.table("deploy", "t")
                for i in range(len(uris)):
                    found = table.get(f"key-{i}", "v")
                    assert found is not None and found.value == f"value-{i}".encode(), uri

        # start with a larger N adds servers; the first two keep running.
        grown = cluster_sh("start", "3", "--dir", directory, "--timeout", "120")
        assert grown.returncode == 0, grown.stderr[-5000:]
        assert grown.stdout.split()[:2] == uris and len(grown.stdout.split()) == 3
        status = cluster_sh("status", "--dir", directory)
        assert status.returncode == 0, status.stdout + status.stderr
        rows = server_rows(status.stdout)
        assert [alive for _, alive, _ in rows] == ["yes"] * 3
        pids |= {int(pid) for pid, _, _ in rows}
        assert "ready: yes" in status.stdout, status.stdout
        with Client(grown.stdout.split()[2]) as client:
            found = client.table("deploy", "t").get("key-0", "v")
            assert found is not None and found.value == b"value-0"
    finally:
        stopped = cluster_sh("stop", "--dir", directory)
    assert stopped.returncode == 0, stopped.stderr
    assert pids and all(gone(pid) for pid in pids), pids
    after = cluster_sh("status", "--dir", directory)
    assert after.returncode == 3, after.stdout + after.stderr
    assert "zookeeper: " in after.stdout and "NOT RUNNING" in after.stdout
    assert [alive for _, alive, _ in server_rows(after.stdout)] == ["no"] * 3


def test_cli_status_shows_owners_and_moving_containers(tmp_path: Path) -> None:
    """`tablekeeper cluster status`'s report per container: assigned server, owner and epoch; a
    container owned by another server than its assigned one is marked moving, one nobody
    claimed unclaimed; a live server that does not answer ServerInfo makes the cluster not
    ready. The report of the view a server composes from this ZooKeeper state (its Admin
    service's ClusterStatus; here composed in-process, since no real server runs: test_cli and
    test_cluster_status ask real ones)."""
    zookeeper = ZooKeeperProcess(tmp_path / "zookeeper").start()
    server = ZkCoordinator(zookeeper.hosts, "owners", clock=SystemClock())
    try:
        server.start()
        server.init_cluster(3)
        server.register("127.0.0.1:7001")
        server.run_for_controller("127.0.0.1:7001", Controller(server).lead)
        deadline = time.monotonic() + 15
        while server.read_assignment()[0].get("127.0.0.1:7001") != frozenset(range(3)) or (
            server.controller() != "127.0.0.1:7001"
        ):
            assert time.monotonic() < deadline, "no assignment"
            time.sleep(0.05)
        server.claim(0, "127.0.0.1:7001")
        server.claim(1, "127.0.0.1:7002")
        server.claim(1, "127.0.0.1:7002")
        # Asked by a server that is not registered (so every live one is asked over the
        # network): 127.0.0.1:7001 does not listen.
        view = ZooKeeperView(server, "owners", "127.0.0.1:7999", lambda: [], peer_timeout_s=5)
        status = asyncio.run(view.view(_server_info))
    finally:
        server.stop()
        zookeeper.stop()
    lines = report(cluster_status_response(status))
    assert "servers: 127.0.0.1:7001" in lines and "controller: 127.0.0.1:7001" in lines
    assert "  127.0.0.1:7001: [0, 1, 2]" in lines
    rows = {int(line.split()[0]): line.split()[1:] for line in lines if re.match(r"^ +\d+ ", line)}
    assert rows[0] == ["127.0.0.1:7001", "127.0.0.1:7001", "(1)"]
    assert rows[1] == ["127.0.0.1:7001", "127.0.0.1:7002", "(2)", "moving"]
    assert rows[2] == ["127.0.0.1:7001", "-", "unclaimed"]
    assert lines[-1].startswith("ready: no (127.0.0.1:7001: ServerInfo failed: UNAVAILABLE")


async def _server_info(endpoint: str, timeout_s: float) -> list[int]:
    """ServerInfo of the server at `endpoint` (what a server's ClusterStatus asks its peers)."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub = tablekeeper_pb2_grpc.TableKeeperStub(channel)
        try:
            info = await stub.ServerInfo(tablekeeper_pb2.ServerInfoRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise ConnectionError(exc.code().name) from None
    return list(info.containers)
