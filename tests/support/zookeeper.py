"""A real ZooKeeper for tests and benchmarks, started with deploy/zookeeper.sh on a free port."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.server import REPO, free_port


class ZooKeeperProcess:
    def __init__(
        self,
        state_dir: Path,
        *,
        env: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> None:
        """`env`: extra environment variables for deploy/zookeeper.sh (merged into
        `os.environ`), e.g. `TK_PYTHON`, the Python with kazoo it checks readiness with.
        `host`, `netns`: the address it binds, in that network namespace (tests/robustness)."""
        self.state_dir = state_dir
        self.port = free_port()
        self.env = env
        self.host = host
        self.netns = netns

    @property
    def hosts(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The ZooKeeper JVM's process id while started (its pid file), else None."""
        try:
            return int((self.state_dir / "zookeeper.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def _run(self, *args: str, timeout_s: float = 120) -> str:
        in_netns = ["ip", "netns", "exec", self.netns] if self.netns else []
        result = subprocess.run(
            [*in_netns, str(REPO / "deploy" / "zookeeper.sh"), *args, "--dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **self.env} if self.env is not None else None,
        )
        if result.returncode != 0:
            raise RuntimeError(f"zookeeper.sh {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout.strip()

    def start(self, timeout_s: int | None = None) -> ZooKeeperProcess:
        """Start it and wait until it serves: `timeout_s` is the script's `--timeout` (its
        default, 60 s, when None)."""
        args = ["start", "--port", str(self.port), "--host", self.host]
        if timeout_s is not None:
            args += ["--timeout", str(timeout_s)]
        self._run(*args, timeout_s=max(120, (timeout_s or 0) + 60))
        return self

    def stop(self) -> None:
        self._run("stop")
