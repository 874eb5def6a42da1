"""The compat suite's clusters (`TABLEKEEPER_TEST_CLUSTER=N`), started with deploy/cluster.sh.

tests/support/cluster.py cannot be used in the compat process: it imports `tablekeeper_proto`
and `tablekeeper_server`, whose protos clash with the BookKeeper client's (see __init__.py).
deploy/cluster.sh does the same from the outside: `tablekeeper cluster init`, N servers on one
ZooKeeper and one Pulsar namespace, and a wait until every container is served.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.pulsar import PulsarService
from tests.support.server import REPO, TABLEKEEPER, ServerProcess, free_port

CLUSTER_ENV = "TABLEKEEPER_TEST_CLUSTER"
SCRIPT = REPO / "deploy" / "cluster.sh"
ENV = {**os.environ, "TK_TABLEKEEPER": str(TABLEKEEPER), "TK_PYTHON": sys.executable}


def cluster_size() -> int:
    """N from `TABLEKEEPER_TEST_CLUSTER=N`; 0 (standalone servers) when unset."""
    return int(os.environ.get(CLUSTER_ENV, "0") or 0)


@dataclass(frozen=True)
class ClusterServer:
    """One server of a `DeployedCluster`: what the protocol tests need of a `ServerProcess`.

    cluster.sh owns the process (it runs under setsid), so there is no `stop`/`start` here."""

    index: int
    """cluster.sh's number of the server (1..N)."""
    port: int
    metrics_port: int
    pid: int
    log_path: Path

    @property
    def service(self) -> str:
        return f"bk://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def running(self) -> bool:
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


Server = ServerProcess | ClusterServer
"""What a compat test's `server` is: a standalone server or one server of a cluster."""


def running(server: Server) -> bool:
    """Whether the server's process is still alive."""
    if isinstance(server, ClusterServer):
        return server.running()
    return server.process is not None and server.process.poll() is None


@dataclass
class DeployedCluster:
    """A `deploy/cluster.sh` cluster in `directory`, on a running ZooKeeper and Pulsar."""

    directory: Path
    name: str
    zk_hosts: str
    pulsar: PulsarService
    servers: list[ClusterServer] = field(default_factory=list)

    def _command(self, *args: str) -> list[str]:
        return [str(SCRIPT), *args, "--dir", str(self.directory)]

    def _run(self, *args: str, timeout_s: float) -> str:
        done = subprocess.run(
            self._command(*args),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=ENV,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"deploy/cluster.sh {args[0]} failed ({done.returncode}):\n{done.stderr[-6000:]}"
            )
        return done.stdout

    def start(self, n: int, timeout_s: float = 120.0) -> DeployedCluster:
        """Start `n` servers (cluster name `name`, Pulsar namespace public/`name`) and return
        once every container is served by its assigned server."""
        out = self._run(
            "start",
            str(n),
            "--cluster",
            self.name,
            "--zk",
            self.zk_hosts,
            "--pulsar-url",
            self.pulsar.service_url,
            "--pulsar-admin-url",
            self.pulsar.admin_url,
            "--base-port",
            str(free_port()),
            "--timeout",
            f"{timeout_s:.0f}",
            timeout_s=timeout_s + 60,
        )
        uris = out.split()
        self.servers = [self._server(i) for i in range(1, n + 1)]
        assert uris == [s.service for s in self.servers], (uris, self.servers)
        return self

    def _server(self, index: int) -> ClusterServer:
        directory = self.directory / "servers" / str(index)
        ports = dict(
            line.split("=", 1) for line in (directory / "ports").read_text().split() if "=" in line
        )
        return ClusterServer(
            index=index,
            port=int(ports["GRPC_PORT"]),
            metrics_port=int(ports["METRICS_PORT"]),
            pid=int((directory / "server.pid").read_text()),
            log_path=directory / "server.log",
        )

    def stop(self) -> None:
        """SIGTERM every server and wait (cluster.sh leaves ZooKeeper and Pulsar running)."""
        self._run("stop", timeout_s=120)

    def stop_in_background(self) -> StopInProgress:
        """`stop`, without waiting: `StopInProgress.wait` checks it finished well."""
        self.directory.mkdir(parents=True, exist_ok=True)
        log_path = self.directory / "stop.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                self._command("stop"), stdout=log, stderr=subprocess.STDOUT, env=ENV
            )
        return StopInProgress(self, process, log_path)

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- server {s.index} ({s.target}, {s.log_path}):\n{s.log_tail(lines)}"
            for s in self.servers
        )


@dataclass
class StopInProgress:
    cluster: DeployedCluster
    process: subprocess.Popen[bytes]
    log_path: Path

    def wait(self, timeout_s: float = 120.0) -> None:
        """Wait for the stop; `RuntimeError` if it failed or a server still runs."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = -1
        alive = [s.target for s in self.cluster.servers if s.running()]
        if code != 0 or alive:
            raise RuntimeError(
                f"deploy/cluster.sh stop --dir {self.cluster.directory} failed ({code}),"
                f" still running: {alive}:\n{self.log_path.read_text(errors='replace')[-6000:]}"
            )
