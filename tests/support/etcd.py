"""A real etcd (one member, fsync on; Debian's etcd-server) started with deploy/etcd.sh on free
loopback ports: the anchor the benchmarks compare TableKeeper with."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from tests.support.server import REPO, free_port

SCRIPT = REPO / "deploy" / "etcd.sh"


class EtcdProcess:
    def __init__(self, deploy_dir: Path | None = None) -> None:
        """`deploy_dir`: where deploy/etcd.sh keeps the member's pid file, log and data, in
        `<deploy_dir>/<port>/` (its ETCD_DEPLOY_DIR; default the repository's .deploy/etcd)."""
        self.deploy_dir = deploy_dir
        self.port = free_port()
        self.peer_port = free_port()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The member's process id (its pid file), None when not running."""
        base = self.deploy_dir or REPO / ".deploy" / "etcd"
        with contextlib.suppress(OSError, ValueError):
            return int((base / str(self.port) / "etcd.pid").read_text().strip())
        return None

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        if self.deploy_dir is not None:
            env["ETCD_DEPLOY_DIR"] = str(self.deploy_dir)
        return subprocess.run(
            [str(SCRIPT), *args, "--port", str(self.port)],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=REPO,
        )

    def start(self, wait_s: int | None = None) -> EtcdProcess:
        """Start it with an empty data directory and wait until /health is healthy (`wait_s`,
        the script's `--wait`; its default, 30 s, when None). `RuntimeError` if it does not."""
        args = ["start", "--peer-port", str(self.peer_port)]
        if wait_s is not None:
            args += ["--wait", str(wait_s)]
        done = self._run(*args)
        if done.returncode != 0:
            raise RuntimeError(f"deploy/etcd.sh start failed:\n{done.stderr}{done.stdout}")
        return self

    def stop(self) -> None:
        """Stop it (SIGTERM, SIGKILL after the script's wait); never raises."""
        self._run("stop")

    def __enter__(self) -> EtcdProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
