"""What `pip install` of each extra really gives, in a fresh virtualenv: `tablekeeper` alone is
the SDK and CLI (grpcio + protobuf, no server dependencies); `tablekeeper[server]` runs a
standalone server without kazoo or pulsar-client; asking that server for cluster mode or Pulsar
says, in one line, which extra to install. The project is built into a wheel once (as it would
be published), and the installs of that wheel run in order in one virtualenv (SDK, then the
server extra on top). The virtualenv has no pip of its own: the project's pip installs into it
(`pip --python`), so its listing holds only what the wheel brought."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.server import REPO, ServerProcess, free_port

pytestmark = pytest.mark.integration

SERVER_ONLY = ["rocksdict", "prometheus-client", "grpcio-health-checking", "pyjwt", "uvloop"]
"""Distributions of the `server` extra: none of them in an SDK-only install."""
CLUSTER_ONLY = ["kazoo", "pulsar-client"]
"""Distributions of the `cluster` extra beyond `server`."""
CLUSTER_HINT = "pip install 'tablekeeper[cluster]'"


@dataclass
class Venv:
    root: Path
    wheel: Path
    """The project's wheel, built from a copy of its packaging inputs."""

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def run(self, *argv: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )

    def pip(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "pip", "--python", self.bin("python"), *argv)

    def pip_install(self, requirement: str) -> None:
        done = self.pip("install", "-q", requirement)
        assert done.returncode == 0, done.stderr[-4000:]

    def installed(self) -> set[str]:
        done = self.pip("list", "--format", "freeze")
        assert done.returncode == 0, done.stderr
        # Canonical names (PEP 503): pip lists e.g. prometheus_client for prometheus-client.
        return {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() for line in done.stdout.split()}

    def tablekeeper(self, *argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run(self.bin("tablekeeper"), *argv, timeout_s=timeout_s)


def _copy_source(dest: Path) -> Path:
    """The files setuptools builds the distribution from: pyproject.toml, README.md and the
    three package roots, without caches or earlier build output."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for license_file in REPO.glob("LICEN[CS]E*"):
        shutil.copy2(license_file, dest / license_file.name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.pyc")
    for tree in ("client", "server", "proto/gen"):
        shutil.copytree(REPO / tree, dest / tree, ignore=ignore)
    return dest


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])


def _build_wheel(source: Path, dest: Path) -> Path:
    """`pip wheel` of the project, with the setuptools of the environment running the tests."""
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dest), str(source)])  # fmt: skip
    (wheel,) = dest.glob("tablekeeper-*.whl")
    return wheel


@pytest.fixture(scope="module")
def sdk_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh virtualenv with `pip install tablekeeper` (the wheel)."""
    base = tmp_path_factory.mktemp("packaging")
    _run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")])
    venv = Venv(base / "venv", _build_wheel(_copy_source(base / "src"), base / "dist"))
    venv.pip_install(str(venv.wheel))
    return venv


@pytest.fixture(scope="module")
def server_venv(sdk_venv: Venv) -> Venv:
    """The same virtualenv after `pip install 'tablekeeper[server]'` (tests after the SDK's)."""
    sdk_venv.pip_install(f"{sdk_venv.wheel}[server]")
    return sdk_venv


def test_the_sdk_installs_alone(sdk_venv: Venv) -> None:
    venv = sdk_venv
    installed = venv.installed()
    assert "rocksdict" not in installed, "runs before the tests that install the server extra"
    assert {"tablekeeper", "grpcio", "protobuf"} <= installed, installed
    assert not installed & {*SERVER_ONLY, *CLUSTER_ONLY}, installed

    imported = venv.run(
        venv.bin("python"),
        "-c",
        "import sys, tablekeeper; from tablekeeper import Client; "
        "print(sorted(m for m in sys.modules if m.startswith('tablekeeper_server')))",
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"  # the SDK does not load the server package

    helped = venv.tablekeeper("--help")
    assert helped.returncode == 0, helped.stderr
    assert "server" in helped.stdout and "put" in helped.stdout
    # The server's code is installed (one distribution) but not its packages: one clear line.
    refused = venv.tablekeeper("server", "--data-dir", str(venv.root.parent / "sdk-data"))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: tablekeeper server: rocksdict, prometheus-client, grpcio-health-checking, "
        "grpcio-reflection, mmh3, pyjwt are not installed: pip install 'tablekeeper[server]'"
    ]
    assert not (venv.root.parent / "sdk-data").exists()
    assert venv.tablekeeper("server", "--help").returncode == 0
    token = venv.tablekeeper("token", "create", "--secret-key", "/nonexistent", "--subject", "r")
    assert (token.returncode, token.stderr.strip().splitlines()) == (
        2,
        ["error: tablekeeper token: pyjwt is not installed: pip install 'tablekeeper[server]'"],
    )


def test_the_server_extra_runs_a_standalone_server(server_venv: Venv) -> None:
    venv = server_venv
    installed = venv.installed()
    assert set(SERVER_ONLY) <= installed, installed
    assert not installed & set(CLUSTER_ONLY), installed

    data_dir = venv.root.parent / "server-data"
    server = ServerProcess(data_dir)
    with open(server.log_path, "ab") as log:
        server.process = subprocess.Popen(
            [
                venv.bin("tablekeeper"),
                "server",
                "--data-dir",
                str(data_dir),
                "--port",
                str(server.port),
                "--metrics-port",
                str(server.metrics_port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        server.wait_serving(60)
        svc = ("--service", server.service)
        for argv in (("ns", "create", "pkg"), ("table", "create", "pkg/t")):
            created = venv.tablekeeper(*svc, *argv)
            assert created.returncode == 0, created.stderr
        put = venv.tablekeeper(*svc, "put", "pkg/t", "greeting", "hello")
        assert put.returncode == 0, put.stderr
        got = venv.tablekeeper(*svc, "get", "pkg/t", "greeting")
        assert (got.returncode, got.stdout) == (0, "hello\n"), got.stderr
    finally:
        server.stop()
    # Without the envoy extra the default runtime falls back to grpc.aio, and says so.
    assert "--runtime auto: pyvoy is not installed" in server.log_path.read_text()
    loaded = venv.run(venv.bin("python"), "-c", "import kazoo")
    assert loaded.returncode != 0 and "No module named 'kazoo'" in loaded.stderr


PULSAR_ARGS = (
    "--log",
    "pulsar",
    "--checkpoint-store",
    "pulsar",
    "--pulsar-url",
    "pulsar://127.0.0.1:{port}",
    "--pulsar-admin-url",
    "http://127.0.0.1:{port}",
)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ("server", "--zk", "127.0.0.1:{port}", "--cluster", "c", *PULSAR_ARGS),
            "--zk, --log pulsar, --checkpoint-store pulsar: kazoo, pulsar-client are",
        ),
        (("server", *PULSAR_ARGS), "--log pulsar, --checkpoint-store pulsar: pulsar-client is"),
        (
            ("cluster", "init", "--zk", "127.0.0.1:{port}", "--cluster", "c", "--containers", "2"),
            "cluster mode (ZooKeeper): kazoo is",
        ),
    ],
)
def test_cluster_features_name_the_extra_to_install(
    server_venv: Venv, argv: tuple[str, ...], message: str
) -> None:
    port = str(free_port())  # nothing listens there, and nothing may be contacted anyway
    args = [a.replace("{port}", port) for a in argv]
    data_dir = server_venv.root.parent / f"cluster-data-{port}"
    if args[0] == "server":
        args += ["--data-dir", str(data_dir), "--port", str(free_port()), "--metrics-port", "0"]
    refused = server_venv.tablekeeper(*args)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.strip().splitlines() == [
        f"error: {message} not installed: {CLUSTER_HINT}"
    ]
    assert not data_dir.exists()  # refused before it started anything


def test_the_envoy_runtime_names_its_extra(server_venv: Venv) -> None:
    data_dir = server_venv.root.parent / "envoy-data"
    refused = server_venv.tablekeeper(
        *("server", "--runtime", "envoy", "--data-dir", str(data_dir)),
        *("--port", str(free_port()), "--metrics-port", "0"),
    )
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.strip().splitlines() == [
        "error: --runtime envoy: pyvoy is not installed: pip install 'tablekeeper[envoy]'"
    ]
    assert not data_dir.exists()  # refused before it started anything
