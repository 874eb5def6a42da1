"""What the Oxia Java client's tests and the Pulsar-on-Oxia tests share (tests/compat/
test_oxia_client.py, test_oxia_pulsar.py): a standalone server with `--oxia-port`, and the Java
driver (tests/compat/oxia/OxiaDriver.java) compiled against Pulsar's jars."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.caches import pulsar_classpath
from tests.support.server import ServerProcess, free_port

DRIVER_SOURCE = Path(__file__).parent / "OxiaDriver.java"
RUN_TIMEOUT_S = 300.0


@dataclass
class Oxia:
    server: ServerProcess
    address: str
    java_classpath: str

    def driver(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                "java",
                "-Xmx128m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                self.java_classpath,
                "OxiaDriver",
                self.address,
                *args,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *args: str) -> str:
        process = self.driver(*args)
        out, err = process.communicate(timeout=RUN_TIMEOUT_S)
        assert process.returncode == 0, f"driver {args}:\n{out}\n{err[-6000:]}"
        return out


@contextmanager
def oxia_server(tmp_path_factory: pytest.TempPathFactory, *, driver: bool) -> Iterator[Oxia]:
    """A started standalone server with an Oxia port, stopped at the end; with `driver`, the
    Java driver compiled (`Oxia.driver` runs it)."""
    classpath = pulsar_classpath()
    if driver:
        classes = tmp_path_factory.mktemp("oxia-driver")
        subprocess.run(
            ["javac", "-d", str(classes), "-cp", classpath, str(DRIVER_SOURCE)],
            check=True,
            timeout=RUN_TIMEOUT_S,
        )
        classpath = f"{classpath}:{classes}"
    port = free_port()
    server = ServerProcess(
        tmp_path_factory.mktemp("oxia") / "data", extra_args=["--oxia-port", str(port)]
    )
    server.start()
    try:
        yield Oxia(server, f"127.0.0.1:{port}", classpath)
    finally:
        server.stop()
