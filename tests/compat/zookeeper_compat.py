"""What the ZooKeeper compatibility modules (tests/compat/test_zookeeper_*.py) share: a
standalone TableKeeper serving ZooKeeper's protocol (`--zookeeper-port`) beside a real ZooKeeper
(deploy/zookeeper.sh, Debian's), each module starting its own pair; and building a Maven driver
module offline (online only the first time)."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.support.caches import pulsar_classpath
from tests.support.server import ServerProcess, free_port
from tests.support.zookeeper import ZooKeeperProcess

# Stated for tests whose module starts a server of its own (skipped in the cluster pass; the
# ZooKeeper port in a cluster is tests/integration/test_zookeeper_cluster.py's) and that speak no
# gRPC (skipped in the pass on another gRPC runtime).
STANDALONE_REASON = "a standalone server of its own, with --zookeeper-port"
RUNTIME_REASON = "ZooKeeper's protocol is served by no gRPC runtime"


@dataclass
class ZooKeeperPair:
    """TableKeeper's ZooKeeper port and a real ZooKeeper, both on 127.0.0.1."""

    server: ServerProcess
    port: int
    zookeeper: ZooKeeperProcess

    @property
    def tablekeeper_hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def zookeeper_hosts(self) -> str:
        return self.zookeeper.hosts

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            self.zookeeper.stop()


def start_tablekeeper(data_dir: Path, *more: str) -> tuple[ServerProcess, int]:
    """A standalone server with a ZooKeeper port configured as deploy/zookeeper.sh configures
    the real one: tickTime 100 ms, session timeouts from 1 s to 60 s."""
    port = free_port()
    server = ServerProcess(
        data_dir,
        extra_args=[
            *("--zookeeper-port", str(port), "--zookeeper-tick-time", "100ms"),
            *("--zookeeper-min-session-timeout", "1s", "--zookeeper-max-session-timeout", "60s"),
            *more,
        ],
    ).start(timeout_s=120)
    return server, port


def zookeeper_3_9() -> dict[str, str]:
    """deploy/zookeeper.sh's environment for ZooKeeper 3.9.3, the server of the client Pulsar
    4.0.7 ships (its jars are among Pulsar's, `deploy/pulsar.sh fetch`), instead of Debian's
    3.8: the release TableKeeper's port follows where 3.8 and 3.9 differ (a create2 in a multi
    answered with its stat, ZOOKEEPER-4026; watches of different modes on one path kept apart,
    ZOOKEEPER-4466; a persistent recursive watch removed by its own type, ZOOKEEPER-4472)."""
    return {"ZK_CLASSPATH": pulsar_classpath()}


def start_pair(
    state_dir: Path,
    *,
    zookeeper_env: dict[str, str] | None = None,
    server_args: tuple[str, ...] = (),
) -> ZooKeeperPair:
    """`zookeeper_env`: for deploy/zookeeper.sh (e.g. `zookeeper_3_9()`, ZK_EXTRA_OPTS; none:
    Debian's ZooKeeper); `server_args`: more arguments for `tablekeeper server`."""
    zookeeper = ZooKeeperProcess(state_dir / "zookeeper", env=zookeeper_env)
    with ThreadPoolExecutor(1) as pool:  # the two start at once
        starting = pool.submit(zookeeper.start, 120)
        try:
            server, port = start_tablekeeper(state_dir / "data", *server_args)
        except BaseException:
            starting.result()
            zookeeper.stop()
            raise
        try:
            starting.result()
        except BaseException:
            server.stop()
            zookeeper.stop()
            raise
    return ZooKeeperPair(server, port, zookeeper)


def maven_classpath(module: Path, jar: Path) -> str:
    """The classpath of a Maven driver module (`jar` and its dependencies), built here unless
    it is up to date (`make zookeeper-compat-build` builds it before the suite)."""
    listing = module / "target" / "classpath.txt"
    sources = [module / "pom.xml", *module.glob("src/**/*.java")]
    fresh = (
        jar.exists()
        and listing.exists()
        and all(
            s.stat().st_mtime <= min(jar.stat().st_mtime, listing.stat().st_mtime) for s in sources
        )
    )
    if not fresh:
        mvn = shutil.which("mvn")
        assert mvn, "the ZooKeeper Java compatibility tests need mvn and java (17) on PATH"
        goals = ["-q", "-B", "package", "dependency:build-classpath"]
        goals.append(f"-Dmdep.outputFile={listing}")
        done = subprocess.run([mvn, "-o", *goals], cwd=module, capture_output=True, text=True)
        if done.returncode != 0:  # offline failed: the first run fetches from Maven Central
            done = subprocess.run([mvn, *goals], cwd=module, capture_output=True, text=True)
        assert done.returncode == 0, f"mvn failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return f"{jar}:{listing.read_text().strip()}"
