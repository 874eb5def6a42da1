"""A real server configured by a TOML file, the environment and flags (flag > environment > file >
default), its /metrics labelled by namespace and table within `metrics-max-tables`, and
`--workers` workers running with exactly the supervisor's configuration."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tablekeeper import Client
from tablekeeper.errors import TableKeeperError
from tablekeeper_proto.bookkeeper import storage_pb2, storage_pb2_grpc
from tests.support.server import SERVER_COMMAND, ServerProcess

pytestmark = pytest.mark.integration

ENV = "TABLEKEEPER_SERVER_"
CONFIG = """\
containers = 3                  # the environment says 5, and wins
checkpoint-interval = "7m"
max-open-ranges = 37
metrics-port = 1                # the harness's --metrics-port flag wins
metrics-max-tables = 2

[limits]
max-value-bytes = "1KiB"
"""
ENVIRONMENT = {f"{ENV}CONTAINERS": "5", f"{ENV}MAX_TXN_OPS": "9"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("config")
    config = root / "tk.toml"
    config.write_text(CONFIG)
    server = ServerProcess(root / "data", extra_args=["--config", str(config)], env=ENVIRONMENT)
    server.start()
    yield server
    server.stop()


def _by_table(text: str, name: str) -> dict[tuple[str, str], float]:
    pattern = rf'^{name}{{namespace="([^"]*)",table="([^"]*)"}} (\S+)$'
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(pattern, text, re.M)}


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_settings_come_from_the_flags_the_environment_and_the_file(server: ServerProcess) -> None:
    with Client(server.service) as client:
        status = client.status()
        assert status.num_storage_containers == 5  # environment over file
        assert status.checkpoint_interval_s == 420  # file, with its unit
        client.create_namespace("limits")
        table = client.table("limits", client.create_table("limits", "t").name)
        table.put("k", "k", b"x" * 1024)
        with pytest.raises(TableKeeperError, match="limit is 1024"):  # [limits] of the file
            table.put("k", "k", b"x" * 1025)
        client.delete_table("limits", "t")  # its metric labels are for the test below
    text = server.metrics()  # on the --metrics-port flag's port, not the file's port 1
    assert _gauge(text, "tablekeeper_max_open_ranges") == 37


def test_print_config_shows_each_settings_source(tmp_path: Path) -> None:
    config = tmp_path / "tk.toml"
    config.write_text(CONFIG)
    result = subprocess.run(
        [str(SERVER_COMMAND), "server", "--config", str(config), "--port", "4999",
         "--print-config"],
        env={**os.environ, **ENVIRONMENT},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "port = 4999  # from command line" in lines
    assert f"containers = 5  # from env {ENV}CONTAINERS" in lines
    assert f'checkpoint-interval = "7m"  # from {config}: checkpoint-interval' in lines
    assert f'max-value-bytes = "1KiB"  # from {config}: limits.max-value-bytes' in lines
    assert "max-batch-ops = 10000" in lines


def test_a_bad_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "tk.toml"
    config.write_text('checkpoint-interval = "5 minutes"\n')
    result = subprocess.run(
        [str(SERVER_COMMAND), "server", "--config", str(config), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"tablekeeper server: error: {config}: checkpoint-interval: not a duration: "
        "'5 minutes' (seconds, or e.g. 250ms, 90s, 5m, 1h)\n"
    )


def test_metrics_are_labelled_by_namespace_and_table_within_the_bound(
    server: ServerProcess,
) -> None:
    """The file allows 2 table label pairs: a third table is counted under <other> until a
    labelled table is deleted."""

    def write(client: Client, namespace: str, name: str) -> None:
        table = client.table(namespace, client.create_table(namespace, name).name)
        for i in range(20):  # pkeys on every range of the table
            table.put(f"p{i}", "k", "v")

    def wait_for(what: str, condition: dict[tuple[str, str], bool]) -> None:
        def holds() -> bool:
            text = server.metrics()
            wal = _by_table(text, "tablekeeper_range_wal_bytes")
            return (
                all((wal.get(key, 0) > 0) == wanted for key, wanted in condition.items())
                and ("<unknown>", "<unknown>") not in wal
            )

        server.wait_for(holds, what)

    with Client(server.service) as client:
        client.create_namespace("m1")
        client.create_namespace("m2")
        # One table at a time, so which of them get the two labels is certain.
        write(client, "m1", "a")
        wait_for("m1/a labelled", {("m1", "a"): True})
        write(client, "m1", "b")
        wait_for("m1/b labelled", {("m1", "b"): True})
        write(client, "m2", "c")
        wait_for("m2/c under <other>", {("<other>", "<other>"): True, ("m2", "c"): False})

        text = server.metrics()
        ranges = _by_table(text, "tablekeeper_table_open_ranges")
        assert ranges[("m1", "a")] >= 2 and ranges[("m1", "b")] >= 2  # the tables' ranges
        assert ranges[("<system>", "<root>")] == 1 and ranges[("<system>", "<meta>")] == 5
        assert _gauge(text, "tablekeeper_metrics_folded_tables") >= 1
        assert 'range="' not in text

        # Deleted, m1/a's ranges are dropped: its series go and m2/c takes its label.
        client.delete_table("m1", "a")
        wait_for("m1/a gone, m2/c labelled", {("m1", "a"): False, ("m2", "c"): True})


def _children(pid: int) -> list[int]:
    return sorted(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


def _worker_endpoint(target: str, container: int) -> str:
    with grpc.insecure_channel(target) as channel:
        stub = storage_pb2_grpc.StorageContainerServiceStub(channel)
        request = storage_pb2.GetStorageContainerEndpointRequest(
            requests=[storage_pb2.OneStorageContainerEndpointRequest(storage_container=container)]
        )
        endpoint = stub.GetStorageContainerEndpoint(request, timeout=30).responses[0].endpoint
    return f"{endpoint.rw_endpoint.hostname}:{endpoint.rw_endpoint.port}"


def _worker_flags(pid: int) -> list[bytes]:
    """A worker's command line; on `--runtime envoy` (the process is Envoy) the flags the
    server inside it runs with."""
    if Path(f"/proc/{pid}/exe").resolve().name == "envoy":
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        [flags] = [
            v.partition(b"=")[2] for v in environ if v.startswith(b"TABLEKEEPER_ENVOY_ARGV=")
        ]
        return [flag.encode() for flag in json.loads(flags)]
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def test_workers_run_with_the_supervisors_configuration(
    tmp_path: Path, server_factory: list[ServerProcess]
) -> None:
    config = tmp_path / "tk.toml"
    config.write_text('workers = 2\ncontainers = 4\ncheckpoint-interval = "7m"\n')
    supervisor = ServerProcess(
        tmp_path / "data",
        extra_args=["--config", str(config)],
        env={f"{ENV}MAX_OPEN_RANGES": "33"},
    )
    server_factory.append(supervisor)
    supervisor.start()
    assert supervisor.process is not None
    pid = supervisor.process.pid
    workers = _children(pid)
    assert len(workers) == 2
    for worker in workers:
        argv = _worker_flags(worker)
        assert b"--checkpoint-interval=7m" in argv and b"--max-open-ranges=33" in argv
        assert b"--config" not in argv
        environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
        assert not any(v.startswith(ENV.encode()) for v in environ)

    # Worker 1 (container 1), killed, restarts with the configuration the supervisor read,
    # not with the file as it is now.
    second = _worker_endpoint(supervisor.target, 1)
    with Client(f"bk://{second}") as client:
        assert client.status().checkpoint_interval_s == 420
    config.write_text('workers = 2\ncontainers = 4\ncheckpoint-interval = "9m"\n')
    killed = workers[1]
    os.kill(killed, signal.SIGKILL)
    supervisor.wait_for(
        lambda: len(_children(pid)) == 2 and killed not in _children(pid), "worker 1 restarted"
    )
    supervisor.wait_for(lambda: _serving(second), "the restarted worker serving")
    with Client(f"bk://{second}") as client:
        assert client.status().checkpoint_interval_s == 420
    restarted = next(w for w in _children(pid) if w not in workers)  # exec'd by now
    assert b"--checkpoint-interval=7m" in _worker_flags(restarted)
    assert supervisor.stop() == 0


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
