"""A real ZooKeeper for tests, started with deploy/zookeeper.sh on a free port."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.server import REPO, free_port


class ZooKeeperProcess:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.port = free_port()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, *args: str, timeout_s: float = 120) -> str:
        result = subprocess.run(
            [str(REPO / "deploy" / "zookeeper.sh"), *args, "--dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if result.returncode != 0:
            raise RuntimeError(f"zookeeper.sh {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout.strip()

    def start(self) -> ZooKeeperProcess:
        self._run("start", "--port", str(self.port))
        return self

    def stop(self) -> None:
        self._run("stop")
