"""A real Apache Pulsar for the tests marked `pulsar`.

The session fixture `pulsar_service` starts one Pulsar standalone through `deploy/pulsar.sh` on
free loopback ports, in a temporary state directory, the first time a test asks for it, and
stops it at the end of the session. (The first run on a machine downloads Pulsar's jars with
`mvn` into ~/.cache; later runs start in 10-20 s.)

Or reuse a running one: `TABLEKEEPER_PULSAR_URL=pulsar://host:6650` and
`TABLEKEEPER_PULSAR_ADMIN_URL=http://host:8080`; add `TABLEKEEPER_PULSAR_DIR=<its --dir>` to let
the tests that restart Pulsar do so through `deploy/pulsar.sh` (they are skipped otherwise).

When Pulsar cannot be started the Pulsar tests are skipped, unless
`TABLEKEEPER_REQUIRE_PULSAR=1` (set by the Makefile): then they fail.

Every test works in its own Pulsar namespace (`unique_namespace`), so tests never see each
other's topics.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.server import REPO, free_port

ENV_URL = "TABLEKEEPER_PULSAR_URL"
ENV_ADMIN_URL = "TABLEKEEPER_PULSAR_ADMIN_URL"
ENV_DIR = "TABLEKEEPER_PULSAR_DIR"
ENV_REQUIRE = "TABLEKEEPER_REQUIRE_PULSAR"
SCRIPT = REPO / "deploy" / "pulsar.sh"
START_TIMEOUT_S = 600  # the first run downloads ~260 MB of jars


@dataclass
class PulsarService:
    service_url: str
    admin_url: str
    deploy_dir: Path | None
    """The `deploy/pulsar.sh --dir` of this instance when the tests may stop and start it."""

    def _ports(self) -> list[str]:
        """The --port/--http-port/--bookie-port options it was started with."""
        assert self.deploy_dir is not None
        values = dict(
            line.split("=", 1)
            for line in (self.deploy_dir / "pulsar.ports").read_text().split()
            if "=" in line
        )
        return [
            f"--port={values['RUN_PORT']}",
            f"--http-port={values['RUN_HTTP_PORT']}",
            f"--bookie-port={values['RUN_BOOKIE_PORT']}",
        ]

    def _script(self, command: str, timeout_s: float) -> str:
        assert self.deploy_dir is not None, "this Pulsar is not ours to stop or start"
        done = subprocess.run(
            [
                str(SCRIPT),
                command,
                "--dir",
                str(self.deploy_dir),
                "--timeout",
                "240",
                *self._ports(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "PULSAR_STOP_TIMEOUT": "20"},
        )
        if done.returncode != 0:
            raise RuntimeError(f"deploy/pulsar.sh {command} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    @property
    def restartable(self) -> bool:
        return self.deploy_dir is not None

    def stop(self) -> None:
        self._script("stop", 120)

    def start(self) -> None:
        """Start it again on the ports and state directory it had (after `stop`)."""
        self._script("start", 300)


def unique_namespace(prefix: str) -> str:
    """A Pulsar namespace name nobody has used: `<prefix>-<time>-<random>`."""
    return f"{prefix}-{int(time.time())}-{uuid.uuid4().hex[:8]}"


def _start_own(base: Path) -> Iterator[PulsarService]:
    deploy_dir = base / "pulsar"
    port, http_port, bookie_port = free_port(), free_port(), free_port()
    command = [
        str(SCRIPT),
        "start",
        "--dir",
        str(deploy_dir),
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--bookie-port",
        str(bookie_port),
        "--timeout",
        "240",
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"deploy/pulsar.sh start did not finish: {exc}")
        raise AssertionError("unreachable") from exc
    if done.returncode != 0:
        subprocess.run([str(SCRIPT), "stop", "--dir", str(deploy_dir)], check=False)
        _unavailable(f"deploy/pulsar.sh start failed:\n{done.stderr[-3000:]}")
    urls = done.stdout.split()
    service = PulsarService(urls[0], urls[1], deploy_dir)
    try:
        yield service
    finally:
        subprocess.run(
            [str(SCRIPT), "stop", "--dir", str(deploy_dir)],
            capture_output=True,
            check=False,
            env={**os.environ, "PULSAR_STOP_TIMEOUT": "15"},
        )


def _unavailable(reason: str) -> None:
    if os.environ.get(ENV_REQUIRE, "") not in ("", "0"):
        pytest.fail(f"Pulsar is required ({ENV_REQUIRE}) but unavailable: {reason}")
    pytest.skip(f"no Pulsar available: {reason}")


@pytest.fixture(scope="session")
def pulsar_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarService]:
    """The session's Pulsar (see the module docstring)."""
    url = os.environ.get(ENV_URL)
    if url:
        admin_url = os.environ.get(ENV_ADMIN_URL)
        if not admin_url:
            _unavailable(f"{ENV_URL} is set but {ENV_ADMIN_URL} is not")
            raise AssertionError("unreachable")
        directory = os.environ.get(ENV_DIR)
        yield PulsarService(url, admin_url, Path(directory) if directory else None)
        return
    yield from _start_own(tmp_path_factory.mktemp("pulsar-service"))
