"""A real Apache Pulsar standalone, started through `deploy/pulsar.sh` (`PulsarService.launch`)
or a running one named by its URLs.

The tests get theirs from the session fixture `pulsar_service` (tests/support/pulsar_fixtures.py:
one Pulsar on free loopback ports for the whole session, or a running one named by
`TABLEKEEPER_PULSAR_URL` and `TABLEKEEPER_PULSAR_ADMIN_URL`); the benchmarks use the classes
here directly (this module does not import pytest). The first run on a machine downloads
Pulsar's jars with `mvn` into ~/.cache; later runs start in 10-20 s.

Every test works in its own Pulsar namespace (`unique_namespace`), so tests never see each
other's topics.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support.server import REPO, free_port

SCRIPT = REPO / "deploy" / "pulsar.sh"
START_TIMEOUT_S = 600  # the first run downloads ~260 MB of jars


@dataclass
class PulsarService:
    service_url: str
    admin_url: str
    deploy_dir: Path | None
    """The `deploy/pulsar.sh --dir` of this instance when the tests may stop and start it."""
    env: dict[str, str] | None = None
    """Extra environment variables for `deploy/pulsar.sh` (merged into `os.environ`), e.g.
    `TK_PYTHON`, the Python with pulsar-client it checks the broker with."""
    host: str = "127.0.0.1"
    netns: str | None = None
    """The address it binds and the network namespace it runs in (tests/robustness)."""

    @classmethod
    def launch(
        cls,
        deploy_dir: Path,
        *,
        timeout_s: int = 240,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> PulsarService:
        """Start a Pulsar standalone on free loopback ports with its state in `deploy_dir` and
        wait (`timeout_s`, the script's `--timeout`) until it serves. `RuntimeError` (with the
        script's stderr) if it does not start; `close` it at the end. `host` and `netns`: bind
        that address, inside that network namespace, instead of 127.0.0.1."""
        port, http_port, bookie_port = free_port(), free_port(), free_port()
        command = [
            *_in_netns(netns),
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
            str(timeout_s),
            "--host",
            host,
        ]
        service = cls("", "", deploy_dir, env, host, netns)
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=max(START_TIMEOUT_S, timeout_s + 60),
            check=False,
            env=service._env(),
        )
        urls = done.stdout.split()
        service.service_url = next((u for u in urls if u.startswith("pulsar://")), "")
        service.admin_url = next((u for u in urls if u.startswith("http://")), "")
        if done.returncode != 0 or not service.service_url or not service.admin_url:
            service.close()
            raise RuntimeError(f"deploy/pulsar.sh start failed:\n{done.stderr[-3000:]}")
        return service

    def _env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **(self.env or {}), **extra}

    @property
    def pid(self) -> int | None:
        """The broker's process id when started through `deploy/pulsar.sh` (its pid file)."""
        if self.deploy_dir is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            return int((self.deploy_dir / "pulsar.pid").read_text().strip())
        return None

    def server_args(self, namespace: str) -> list[str]:
        """The `tablekeeper server` flags putting its log and checkpoints on this Pulsar, in
        `namespace` (TENANT/NAMESPACE)."""
        return [
            "--log=pulsar",
            "--checkpoint-store=pulsar",
            f"--pulsar-url={self.service_url}",
            f"--pulsar-admin-url={self.admin_url}",
            f"--pulsar-namespace={namespace}",
        ]

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
            f"--host={self.host}",
        ]

    def _script(self, command: str, timeout_s: float, wait_s: int = 240) -> str:
        """Run deploy/pulsar.sh `command` on this instance; `wait_s` is its --timeout (how long
        `start` waits until the broker serves), `timeout_s` bounds the whole script."""
        assert self.deploy_dir is not None, "this Pulsar is not ours to stop or start"
        done = subprocess.run(
            [
                *_in_netns(self.netns),
                str(SCRIPT),
                command,
                "--dir",
                str(self.deploy_dir),
                "--timeout",
                str(wait_s),
                *self._ports(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=self._env(PULSAR_STOP_TIMEOUT="20"),
        )
        if done.returncode != 0:
            raise RuntimeError(f"deploy/pulsar.sh {command} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    @property
    def restartable(self) -> bool:
        return self.deploy_dir is not None

    def stop(self) -> None:
        self._script("stop", 120)

    def start(self, timeout_s: int = 240) -> None:
        """Start it again on the ports and state directory it had (after `stop`), waiting up to
        `timeout_s` until it serves."""
        self._script("start", timeout_s + 60, wait_s=timeout_s)

    def close(self) -> None:
        """Stop it for good (when started here; a given one is left alone); never raises."""
        if self.deploy_dir is None:
            return
        subprocess.run(
            [*_in_netns(self.netns), str(SCRIPT), "stop", "--dir", str(self.deploy_dir)],
            capture_output=True,
            check=False,
            env=self._env(PULSAR_STOP_TIMEOUT="15"),
        )


def _in_netns(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def unique_namespace(prefix: str) -> str:
    """A Pulsar namespace name nobody has used: `<prefix>-<time>-<random>`."""
    return f"{prefix}-{int(time.time())}-{uuid.uuid4().hex[:8]}"
