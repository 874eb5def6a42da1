"""The `tablekeeper` command, run as a subprocess against real server processes.

One server is shared by the module (each test uses its own namespace); the metrics / SIGTERM
test starts its own server with `tablekeeper server ...`, as an operator would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablekeeper import Client
from tests.support.server import REPO, TABLEKEEPER, ServerProcess, free_port

pytestmark = pytest.mark.integration

SUBCOMMANDS = ["server", "ns", "table", "put", "get", "incr", "del", "scan"]


def tk(
    *args: str, service: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `tablekeeper [--service S] ARGS...`; never raises on a non-zero exit."""
    argv = [str(TABLEKEEPER)]
    if service is not None:
        argv += ["--service", service]
    env = {k: v for k, v in os.environ.items() if k != "TABLEKEEPER_SERVICE"}
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def tk_all(*commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run several independent `tablekeeper` commands at once (they are startup-bound)."""
    env = {k: v for k, v in os.environ.items() if k != "TABLEKEEPER_SERVICE"}
    processes = [
        (
            argv,
            subprocess.Popen(
                [str(TABLEKEEPER), *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env=env,
            ),
        )
        for argv in commands
    ]
    results = []
    for argv, process in processes:
        stdout, stderr = process.communicate(timeout=60)
        results.append(subprocess.CompletedProcess(argv, process.returncode, stdout, stderr))
    return results


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], code: int, error: str) -> str:
    """Assert the command failed with `code` and `error: <error>...` on stderr; return stderr."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert error in result.stderr, result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("cli") / "data").start()
    yield server
    assert server.process is not None
    if server.process.poll() is None:
        server.stop()


@pytest.fixture
def svc(shared_server: ServerProcess) -> str:
    return shared_server.service


# --------------------------------------------------------------------------- help


def test_help_of_every_command() -> None:
    top, *subs = tk_all(["--help"], *([command, "--help"] for command in SUBCOMMANDS))
    out = ok(top)
    assert out.startswith("usage: tablekeeper")
    assert "--service" in out
    for command in SUBCOMMANDS:
        assert re.search(rf"^\s+{command}\s", out, re.MULTILINE), command
    for command, result in zip(SUBCOMMANDS, subs, strict=True):
        out = ok(result)
        assert out.startswith(f"usage: tablekeeper {command}"), out
        assert "-h, --help" in out
    server_help = ok(subs[SUBCOMMANDS.index("server")])
    for option in ("--data-dir", "--port", "--metrics-port", "--containers"):
        assert option in server_help, option
    assert "NAMESPACE/TABLE" in ok(subs[SUBCOMMANDS.index("put")])


def test_usage_errors_exit_2() -> None:
    results = tk_all(
        [],
        ["frobnicate"],
        ["get", "no-slash", "k"],
        ["incr", "ns/t", "k", "not-a-number"],
        ["ns", "rename", "x"],
        ["put", "ns/t", "k"],
        ["server", "--containers", "0", "--data-dir", "/nonexistent/never"],
        ["--service", "http://127.0.0.1:1", "ns", "get", "x"],
        ["table", "create", "ns/t", "--ranges", "0"],
        ["table", "create", "ns/t", "--ranges", "-5"],
        ["table", "create", "ns/t", "--ttl", "-1"],
        ["server", "--log-level", "verbose"],
    )
    expected = [
        "usage:",
        "invalid choice",
        "expected NAMESPACE/TABLE",
        "invalid int value",
        "invalid choice",
        "the following arguments are required: value",
        "--containers must be at least 1",
        "error: service URI must start with bk://",
        "--ranges: must be at least 1 (got 0)",
        "--ranges: must be at least 1 (got -5)",
        "--ttl: must be >= 0 (got -1)",
        "--log-level: invalid choice: 'VERBOSE'",
    ]
    for result, message in zip(results, expected, strict=True):
        assert result.returncode == 2, (result.args, result.stderr)
        assert message in result.stderr, (result.args, result.stderr)
        assert result.stdout == "", result.args


def test_server_on_a_taken_port_says_so(shared_server: ServerProcess, tmp_path: Path) -> None:
    """A taken gRPC or metrics port ends the start with exit 2 and one clear line, before the
    new server serves anything (no traceback)."""
    grpc_taken = tk_all(
        ["server", "--data-dir", str(tmp_path / "a"), "--port", str(shared_server.port)],
        [
            "server",
            "--data-dir",
            str(tmp_path / "b"),
            "--port",
            str(free_port()),
            "--metrics-port",
            str(shared_server.metrics_port),
        ],
    )
    for result in grpc_taken:
        assert result.returncode == 2, result.stderr
        assert "cannot start" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on 127.0.0.1:{shared_server.port}" in grpc_taken[0].stderr
    assert "Address already in use" in grpc_taken[1].stderr


# --------------------------------------------------------------------------- admin


def test_namespace_commands(svc: str) -> None:
    out = ok(tk("ns", "create", "cli_ns", service=svc))
    match = re.fullmatch(r"created namespace cli_ns \(id (\d+)\)\n", out)
    assert match, out
    ns_id = match.group(1)
    assert ok(tk("ns", "get", "cli_ns", service=svc)) == f"namespace cli_ns: id {ns_id}\n"
    failed(tk("ns", "create", "cli_ns", service=svc), 3, "error: NamespaceExistsError")
    failed(tk("ns", "create", "bad name", service=svc), 3, "error: InvalidNamespaceNameError")
    assert ok(tk("ns", "delete", "cli_ns", service=svc)) == "deleted namespace cli_ns\n"
    err = failed(tk("ns", "get", "cli_ns", service=svc), 3, "error: NamespaceNotFoundError")
    assert "cli_ns" in err
    failed(tk("ns", "delete", "cli_ns", service=svc), 3, "error: NamespaceNotFoundError")


def test_table_commands(svc: str) -> None:
    ok(tk("ns", "create", "cli_tables", service=svc))
    out = ok(tk("table", "create", "cli_tables/t", "--ranges", "6", service=svc))
    match = re.fullmatch(r"created table cli_tables/t \(id (\d+), 6 ranges\)\n", out)
    assert match, out
    table_id = int(match.group(1))
    out = ok(tk("table", "get", "cli_tables/t", service=svc))
    assert out == f"table cli_tables/t: id {table_id}, 6 ranges, ttl 0s\n"
    out = ok(tk("table", "create", "cli_tables/ttl", "--ranges", "2", "--ttl", "30", service=svc))
    assert "2 ranges" in out
    assert ok(tk("table", "get", "cli_tables/ttl", service=svc)).endswith("ttl 30s\n")
    with Client(svc) as client:  # the CLI really created what it said
        info = client.get_table("cli_tables", "t")
        assert (info.table_id, info.ranges) == (table_id, 6)
        assert client.get_table("cli_tables", "ttl").ttl_seconds == 30

    failed(tk("table", "create", "cli_tables/t", service=svc), 3, "error: TableExistsError")
    failed(tk("table", "create", "nope_ns/t", service=svc), 3, "error: NamespaceNotFoundError")
    failed(tk("table", "create", "cli_tables/a b", service=svc), 3, "error: InvalidTableNameError")
    out = ok(tk("table", "delete", "cli_tables/t", service=svc))
    assert out == "deleted table cli_tables/t\n"
    failed(tk("table", "get", "cli_tables/t", service=svc), 3, "error: TableNotFoundError")
    failed(tk("table", "delete", "cli_tables/t", service=svc), 3, "error: TableNotFoundError")
    failed(tk("get", "cli_tables/t", "k", service=svc), 3, "error: TableNotFoundError")
    # the default is 4 ranges
    out = ok(tk("table", "create", "cli_tables/t", service=svc))
    assert out.endswith(", 4 ranges)\n")


# --------------------------------------------------------------------------- keys


def test_put_get_json_del(svc: str) -> None:
    ok(tk("ns", "create", "cli_kv", service=svc))
    ok(tk("table", "create", "cli_kv/t", service=svc))
    t = "cli_kv/t"
    assert ok(tk("put", t, "greeting", "hello world", service=svc)) == ""
    assert ok(tk("get", t, "greeting", service=svc)) == "hello world\n"
    ok(tk("put", t, "greeting", "hi", service=svc))
    doc = json.loads(ok(tk("get", t, "greeting", "--json", service=svc)))
    assert doc["pkey"] == "greeting" and doc["lkey"] == "greeting"  # key is its own pkey
    assert doc["value"] == "hi" and doc["is_number"] is False and doc["version"] == 1
    assert doc["mod_revision"] > doc["create_revision"] > 0

    # expected version
    failed(
        tk("put", t, "greeting", "x", "--expected-version", "-1", service=svc),
        3,
        "error: KeyExistsError",
    )
    failed(
        tk("put", t, "greeting", "x", "--expected-version", "0", service=svc),
        3,
        "error: BadVersionError",
    )
    ok(tk("put", t, "greeting", "v2", "--expected-version", "1", service=svc))
    failed(
        tk("put", t, "absent", "x", "--expected-version", "0", service=svc),
        3,
        "error: KeyNotFoundError",
    )
    ok(tk("put", t, "fresh", "x", "--expected-version", "-1", service=svc))

    # missing keys: exit 1
    result = tk("get", t, "nothing-here", service=svc)
    assert result.returncode == 1 and result.stdout == ""
    assert "'nothing-here' not found" in result.stderr
    assert ok(tk("del", t, "greeting", service=svc)) == ""
    assert tk("del", t, "greeting", service=svc).returncode == 1
    assert tk("get", t, "greeting", service=svc).returncode == 1

    # what the CLI wrote is (key, key) for the SDK, and vice versa
    with Client(svc) as client:
        table = client.table("cli_kv", "t")
        kv = table.get("fresh", "fresh")
        assert kv is not None and kv.value == b"x" and kv.version == 0
        table.put("from-sdk", "from-sdk", "sdk value")
        table.put("P", "inner", "under P")
    assert ok(tk("get", t, "from-sdk", service=svc)) == "sdk value\n"
    assert ok(tk("get", t, "inner", "--pkey", "P", service=svc)) == "under P\n"
    assert tk("get", t, "inner", service=svc).returncode == 1  # other pkey


def test_incr(svc: str) -> None:
    ok(tk("ns", "create", "cli_incr", service=svc))
    ok(tk("table", "create", "cli_incr/t", service=svc))
    t = "cli_incr/t"
    assert ok(tk("incr", t, "visits", service=svc)) == "1\n"
    assert ok(tk("incr", t, "visits", "10", service=svc)) == "11\n"
    assert ok(tk("incr", t, "visits", "-20", service=svc)) == "-9\n"
    assert ok(tk("get", t, "visits", service=svc)) == "-9\n"
    doc = json.loads(ok(tk("get", t, "visits", "--json", service=svc)))
    assert doc["value"] == -9 and doc["is_number"] is True and doc["version"] == 2
    assert ok(tk("incr", t, "big", str(2**63 - 1), service=svc)) == f"{2**63 - 1}\n"
    assert ok(tk("incr", t, "big", service=svc)) == f"{-(2**63)}\n"
    failed(tk("put", t, "visits", "text", service=svc), 3, "error: BadRequestError")
    ok(tk("put", t, "word", "text", service=svc))
    failed(tk("incr", t, "word", service=svc), 3, "error: BadRequestError")
    assert ok(tk("incr", t, "c", "3", "--pkey", "P", service=svc)) == "3\n"
    assert ok(tk("del", t, "visits", service=svc)) == ""
    assert ok(tk("incr", t, "visits", "2", service=svc)) == "2\n"


def test_scan(svc: str) -> None:
    ok(tk("ns", "create", "cli_scan", service=svc))
    ok(tk("table", "create", "cli_scan/t", service=svc))
    t = "cli_scan/t"
    with Client(svc) as client:
        table = client.table("cli_scan", "t")
        for i in (3, 0, 4, 1, 2):
            table.put("user", f"k{i}", f"v{i}")
        table.put("userx", "k9", "other pkey")
    ok(tk("put", t, "k5", "v5", "--pkey", "user", service=svc))
    ok(tk("incr", t, "k6", "7", "--pkey", "user", service=svc))
    out = ok(tk("scan", t, "user", service=svc))
    assert out.splitlines() == [f"k{i}\tv{i}" for i in range(6)] + ["k6\t7"]
    out = ok(tk("scan", t, "user", "--start", "k2", "--end", "k4", service=svc))
    assert out.splitlines() == ["k2\tv2", "k3\tv3", "k4\tv4"]
    out = ok(tk("scan", t, "user", "--start", "k1", "--limit", "2", service=svc))
    assert out.splitlines() == ["k1\tv1", "k2\tv2"]
    lines = ok(tk("scan", t, "user", "--json", "--limit", "3", service=svc)).splitlines()
    docs = [json.loads(line) for line in lines]
    assert [(d["pkey"], d["lkey"], d["value"]) for d in docs] == [
        ("user", "k0", "v0"),
        ("user", "k1", "v1"),
        ("user", "k2", "v2"),
    ]
    assert ok(tk("scan", t, "nobody", service=svc)) == ""
    assert ok(tk("del", t, "k5", "--pkey", "user", service=svc)) == ""
    assert "k5" not in ok(tk("scan", t, "user", service=svc))


def test_service_from_environment(svc: str) -> None:
    env = dict(os.environ, TABLEKEEPER_SERVICE=svc)
    result = subprocess.run(
        [str(TABLEKEEPER), "ns", "create", "cli_env"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    with Client(svc) as client:
        assert client.get_namespace("cli_env") > 0


# --------------------------------------------------------------------------- server command


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        return str(response.read().decode())


def _samples(text: str, name: str) -> dict[str, float]:
    """{label string: value} of every sample of metric `name` (exact sample name)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)", line)
        if match:
            out[match.group(1) or ""] = float(match.group(2))
    return out


def _wait_serving(process: subprocess.Popen[bytes], service: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log.read_text()}")
        result = tk("ns", "get", "probe-for-readiness", service=service, timeout=30)
        if "NamespaceNotFoundError" in result.stderr:
            return  # the root range answered
        if time.monotonic() > deadline:
            pytest.fail(f"server not ready:\n{log.read_text()}")
        time.sleep(0.2)


def test_server_command_metrics_and_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [
                str(TABLEKEEPER),
                "server",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
                "--metrics-port",
                str(metrics_port),
                "--containers",
                "4",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        service = f"bk://127.0.0.1:{port}"
        _wait_serving(process, service, log)
        with Client(service) as client:
            assert client.server_info().num_storage_containers == 4
            client.create_namespace("m")
            client.create_table("m", "t", ranges=4)
            table = client.table("m", "t")
            for i in range(25):
                table.put(f"p{i % 5}", f"k{i}", "v")
            table.increment("p0", "n", 3)
            assert table.get("p1", "k1") is not None
        ok(tk("put", "m/t", "cli-key", "cli-value", service=service))

        text = _metrics(metrics_port)
        for name in (
            "tablekeeper_requests_total",
            "tablekeeper_request_seconds",
            "tablekeeper_wal_append_seconds",
            "tablekeeper_wal_append_records",
            "tablekeeper_container_ranges",
            "tablekeeper_container_keys",
        ):
            assert re.search(rf"^# HELP {name} ", text, re.MULTILINE), name

        requests = _samples(text, "tablekeeper_requests_total")
        puts = sum(v for labels, v in requests.items() if 'method="Put"' in labels)
        assert puts >= 26, requests
        assert any('method="Increment"' in labels for labels in requests)
        assert sum(_samples(text, "tablekeeper_request_seconds_count").values()) >= 28
        assert sum(_samples(text, "tablekeeper_wal_append_seconds_count").values()) >= 1
        # every write of this test was appended to a WAL
        appended = sum(_samples(text, "tablekeeper_wal_append_records_sum").values())
        assert appended >= 27
        ranges = _samples(text, "tablekeeper_container_ranges")
        assert set(ranges) == {f'{{container="{c}"}}' for c in range(4)}
        assert sum(ranges.values()) >= 4  # the table's 4 ranges, at least
        keys = _samples(text, "tablekeeper_container_keys")
        assert set(keys) == set(ranges)
        assert sum(keys.values()) > 0

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "stopped cleanly" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
