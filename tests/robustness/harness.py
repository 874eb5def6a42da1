"""One robustness run: a real cluster in network namespaces of its own, real clients of every
protocol recording what they saw, a nemesis, and the checker's verdict.

    with Environment(Path("/tmp/r")) as env:            # ZooKeeper, Pulsar, 3 servers
        result = run_seed(env, seed=7, duration_s=30, out_dir=Path("/tmp/r/seed-7"))
        print(result.report())

The environment (tests/robustness/netns.py has the network): ZooKeeper and Pulsar
(deploy/zookeeper.sh, deploy/pulsar.sh) and each server (tests/support ServerProcess, cluster
mode with `--log pulsar`, `--etcd-port` and `--oxia-port`) in a namespace of its own; the clients
and this process in the root namespace. A run (`run_seed`) uses keys of its own (prefixed with
the seed), so one environment serves many runs. Everything it starts it stops, and the
namespaces go, on every way out (`close`; a killed harness's leftovers are reaped by the next).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tablekeeper import Client
from tablekeeper.errors import NamespaceExistsError, TableExistsError
from tests.robustness import nemesis as nemesis_module
from tests.robustness.netns import Network, Node
from tests.support.caches import pulsar_classpath
from tests.support.cluster import TestCluster
from tests.support.oxia import shard_leaders
from tests.support.pulsar import PulsarService
from tests.support.server import REPO, SERVER_COMMAND, ServerProcess, free_port
from tests.support.zookeeper import ZooKeeperProcess

ROBUST = REPO / "tests" / "robustness"
SDK_TABLE = ("robust", "t")


@functools.cache
def zookeeper_port_supported() -> bool:
    """Whether this tree's server speaks ZooKeeper's protocol (`--zookeeper-port`): then the runs
    add a kazoo workload (tests/robustness/zk_workload.py) to the others."""
    done = subprocess.run(
        [str(SERVER_COMMAND), "server", "--help"], capture_output=True, text=True, timeout=120
    )
    return "--zookeeper-port" in done.stdout


def available_protocols() -> tuple[str, ...]:
    """The protocols a run drives: every one this tree's server speaks."""
    return ("sdk", "etcd", "oxia", *(("zk",) if zookeeper_port_supported() else ()))


# ---------------------------------------------------------------------- the client programs


@dataclass(frozen=True)
class Tools:
    checker: Path
    etcdload: Path
    java_classpath: str
    """Pulsar's jars (which include oxia-client 0.6.2) and the compiled OxiaWorkload."""


def _newer(target: Path, sources: Sequence[Path]) -> bool:
    return target.exists() and all(
        target.stat().st_mtime >= s.stat().st_mtime for s in sources if s.exists()
    )


def build_tools(bin_dir: Path) -> Tools:
    """Build the checker and the etcd workload (Go; modules from the Go module proxy, offline
    once cached) and compile the Oxia workload against Pulsar's jars (`deploy/pulsar.sh
    fetch`), each only when its sources changed."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("go is not installed (the checker and the etcd workload are Go)")
    go_sources = [ROBUST / "go.mod", ROBUST / "go.sum", *ROBUST.glob("*/*.go")]
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    for name in ("checker", "etcdload"):
        if not _newer(bin_dir / name, go_sources):
            subprocess.run(
                [go, "build", "-o", str(bin_dir / name), f"./{name}"],
                cwd=ROBUST, check=True, timeout=900, env=env,
            )  # fmt: skip
    classpath = pulsar_classpath()
    classes = bin_dir / "oxia-classes"
    source = ROBUST / "oxia" / "OxiaWorkload.java"
    if not _newer(classes / "OxiaWorkload.class", [source]):
        classes.mkdir(exist_ok=True)
        subprocess.run(
            ["javac", "-d", str(classes), "-cp", classpath, str(source)], check=True, timeout=600
        )
    return Tools(bin_dir / "checker", bin_dir / "etcdload", f"{classpath}:{classes}")


# ---------------------------------------------------------------------- the cluster


class NetnsCluster(TestCluster):
    """A `TestCluster` whose servers each run in a network namespace of their own (`nodes`)."""

    def __init__(self, base_dir: Path, pulsar: PulsarService, nodes: list[Node], **kw: object):
        super().__init__(base_dir, pulsar, **kw)  # type: ignore[arg-type]
        self.nodes = nodes
        self.etcd_ports: list[int] = []
        self.oxia_ports: list[int] = []
        self.zk_ports: list[int] = []

    def add_server(
        self, extra_args: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> ServerProcess:
        server = self.make_server(extra_args, env)
        server.start(self.start_timeout_s)
        return server

    def make_server(
        self, extra_args: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> ServerProcess:
        """A server in the next node's namespace, not started yet."""
        index = len(self.servers)
        node = self.nodes[index]
        etcd_port, oxia_port = free_port(), free_port()
        self.etcd_ports.append(etcd_port)
        self.oxia_ports.append(oxia_port)
        front_ends = [f"--etcd-port={etcd_port}", f"--oxia-port={oxia_port}"]
        if zookeeper_port_supported():
            self.zk_ports.append(free_port())
            front_ends.append(f"--zookeeper-port={self.zk_ports[-1]}")
        args = [a for a in self.server_args() if not a.startswith("--host=")]
        server = ServerProcess(
            self.base_dir / f"server-{index}",
            extra_args=[
                *args,
                f"--host={node.address}",
                *front_ends,
                *self.extra_args,
                *extra_args,
            ],
            env={**(self.env or {}), **(env or {})} or None,
            host=node.address,
            netns=node.netns,
        )
        self.servers.append(server)
        return server


class Environment(nemesis_module.Environment):
    """ZooKeeper, Pulsar and `servers` servers, each in a network namespace of its own."""

    def __init__(
        self,
        base_dir: Path,
        *,
        servers: int = 3,
        containers: int = 4,
        session_timeout_s: float = 2.0,
    ) -> None:
        self.base_dir = base_dir
        self.server_total = servers
        self.containers = containers
        self.session_timeout_s = session_timeout_s
        self.sdk_table = SDK_TABLE
        self.network: Network | None = None
        self.zookeeper: ZooKeeperProcess | None = None
        self.pulsar: PulsarService | None = None
        self.cluster: NetnsCluster | None = None

    # -- life cycle

    def start(self) -> Environment:
        """Start everything and wait until the cluster is ready, the SDK table exists and the
        Oxia namespace serves. On any failure, everything started is stopped again."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        net = self.network = Network.create()
        zk_node, pulsar_node = net.add_node("zk"), net.add_node("pulsar")
        server_nodes = [net.add_node(f"s{i}") for i in range(self.server_total)]
        self.zookeeper = ZooKeeperProcess(
            self.base_dir / "zookeeper", host=zk_node.address, netns=zk_node.netns
        )
        pulsar_box: list[PulsarService | BaseException] = []

        def start_pulsar() -> None:
            try:
                pulsar_box.append(
                    PulsarService.launch(
                        self.base_dir / "pulsar",
                        timeout_s=300,
                        host=pulsar_node.address,
                        netns=pulsar_node.netns,
                    )
                )
            except BaseException as exc:
                pulsar_box.append(exc)

        pulsar_thread = threading.Thread(target=start_pulsar, name="start-pulsar")
        pulsar_thread.start()
        try:
            self.zookeeper.start()
        finally:
            pulsar_thread.join()
        outcome = pulsar_box[0]
        if isinstance(outcome, BaseException):
            raise outcome
        self.pulsar = outcome
        slow = [self.slow_file(i) for i in range(self.server_total)]
        cluster = self.cluster = NetnsCluster(
            self.base_dir / "cluster",
            outcome,
            server_nodes,
            containers=self.containers,
            zk_session_timeout_s=self.session_timeout_s,
            zk_hosts=self.zookeeper.hosts,
            start_timeout_s=120.0,
        )
        cluster.init()
        made = [
            cluster.make_server(
                env={
                    "TABLEKEEPER_FAILPOINTS": (
                        f"wal.append=delay:0.3:{slow[i]},wal.sync=delay:0.3:{slow[i]}"
                    )
                }
            )
            for i in range(self.server_total)
        ]
        for server in made:  # all at once: each spends seconds starting up
            server.launch()
        for server in made:
            server.wait_serving(180)
        cluster.wait_ready(180)
        with Client(cluster.service_all()) as client:
            with contextlib.suppress(NamespaceExistsError):
                client.create_namespace(SDK_TABLE[0], timeout=60)
            with contextlib.suppress(TableExistsError):
                client.create_table(*SDK_TABLE, ranges=4, timeout=60)
        shard_leaders(self.oxia_address(), "default", timeout_s=120)

    def close(self) -> None:
        """Stop the servers, Pulsar and ZooKeeper, remove the namespaces. Never raises."""
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.heal()
            for server in self.cluster.servers:  # a paused one takes no SIGTERM
                if server.process is not None and server.running:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(server.process.pid, 18)  # SIGCONT
            with contextlib.suppress(Exception):
                self.cluster.close()
            self.cluster = None
        if self.pulsar is not None:
            with contextlib.suppress(Exception):
                self.pulsar.close()
            self.pulsar = None
        if self.zookeeper is not None:
            with contextlib.suppress(Exception):
                self.zookeeper.stop()
            self.zookeeper = None
        if self.network is not None:
            self.network.close()
            self.network = None

    def __enter__(self) -> Environment:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses

    @property
    def live_cluster(self) -> NetnsCluster:
        assert self.cluster is not None, "the environment is not started"
        return self.cluster

    def service(self) -> str:
        return self.live_cluster.service_all()

    def etcd_endpoints(self) -> list[str]:
        c = self.live_cluster
        return [f"{s.host}:{port}" for s, port in zip(c.servers, c.etcd_ports, strict=True)]

    def zk_hosts_of_servers(self) -> str:
        """Every server's ZooKeeper port, as a ZooKeeper connect string."""
        c = self.live_cluster
        return ",".join(f"{s.host}:{port}" for s, port in zip(c.servers, c.zk_ports, strict=True))

    def oxia_address(self, i: int = 0) -> str:
        c = self.live_cluster
        return f"{c.servers[i].host}:{c.oxia_ports[i]}"

    # -- what the nemesis needs

    def server_count(self) -> int:
        return len(self.live_cluster.servers)

    def server_target(self, i: int) -> str:
        return self.live_cluster.endpoint(i)

    def server_pid(self, i: int) -> int | None:
        process = self.live_cluster.servers[i].process
        return process.pid if process is not None and process.poll() is None else None

    def server_index(self, endpoint: str) -> int:
        return self.live_cluster.index(endpoint)

    def assigned_to(self, container: int) -> str | None:
        return self.live_cluster.assigned_to(container)

    def kill(self, i: int) -> None:
        self.live_cluster.kill(i)

    def stop(self, i: int) -> None:
        self.live_cluster.stop(i, timeout_s=60)

    def restart(self, i: int) -> None:
        server = self.live_cluster.servers[i]
        if server.running:
            return
        server.start(180)

    def cut(self, i: int, what: tuple[str, ...]) -> None:
        assert self.network is not None
        nodes = self.network.nodes
        victim = nodes[f"s{i}"]
        others: list[Node | str] = []
        for part in what:
            if part == "zk":
                others.append(nodes["zk"])
            elif part == "pulsar":
                others.append(nodes["pulsar"])
            elif part == "peers":
                others += [n for name, n in nodes.items() if name.startswith("s") and n != victim]
            elif part == "clients":
                others.append(self.network.host_address)
            else:
                raise ValueError(f"cannot cut a server from {part!r}")
        self.network.cut(victim, others)

    def heal(self) -> None:
        if self.network is not None:
            self.network.heal()

    def slow_file(self, i: int) -> Path:
        return self.base_dir / f"slow-log-s{i}"

    def wait_ready(self, timeout_s: float) -> None:
        self.live_cluster.wait_ready(timeout_s)


# ---------------------------------------------------------------------- one run


@dataclass
class RunResult:
    seed: int
    out_dir: Path
    histories: list[Path]
    verdict: str
    """ok | illegal | undecided | error (a workload failed, or the checker could not run)"""
    checker_output: str
    visualizations: list[str]
    nemesis_log: Path
    faults: list[str]
    problems: list[str] = field(default_factory=list)
    replay: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok" and not self.problems

    def report(self) -> str:
        lines = [
            f"robustness seed {self.seed}: {self.verdict}"
            + (f" ({len(self.problems)} problems)" if self.problems else ""),
            f"  histories: {', '.join(str(h) for h in self.histories)}",
            f"  nemesis log: {self.nemesis_log}",
            f"  faults: {'; '.join(self.faults) or 'none'}",
        ]
        lines += [f"  visualization: {v}" for v in self.visualizations]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += ["  checker:"] + [f"    {line}" for line in self.checker_output.splitlines()]
        if self.replay:
            lines.append(f"  replay: {self.replay}")
        return "\n".join(lines)


def run_seed(
    env: Environment,
    tools: Tools,
    seed: int,
    out_dir: Path,
    *,
    duration_s: float = 30.0,
    kinds: Sequence[str] = nemesis_module.KINDS,
    protocols: Sequence[str] | None = None,
    clients: int = 4,
    keys: int = 6,
    rate: float = 15.0,
    replay: str = "",
) -> RunResult:
    """Run every protocol's workload for `duration_s` while the nemesis injects `kinds` (drawn
    from `seed`), then check the histories. Keys are the seed's own."""
    out_dir.mkdir(parents=True, exist_ok=True)
    protocols = available_protocols() if protocols is None else protocols
    prefix = f"s{seed}-{int(time.time())}-"
    histories = {p: out_dir / f"{p}-history.jsonl" for p in protocols}
    commands = {
        "sdk": [
            sys.executable, "-m", "tests.robustness.sdk_workload",
            "--service", env.service(), "--table", "/".join(SDK_TABLE),
            "--out", str(histories.get("sdk", "")), "--clients", str(clients),
            "--keys", str(keys), "--duration", str(duration_s), "--seed", str(seed),
            "--rate", str(rate), "--prefix", prefix,
        ],
        "etcd": [
            str(tools.etcdload), "-endpoints", ",".join(env.etcd_endpoints()),
            "-out", str(histories.get("etcd", "")), "-clients", str(clients),
            "-keys", str(keys), "-duration", f"{duration_s}s", "-seed", str(seed),
            "-rate", str(rate), "-prefix", f"robust/{prefix}",
        ],
        "oxia": [
            "java", "-Xmx192m", "-XX:TieredStopAtLevel=1", "-cp", tools.java_classpath,
            "OxiaWorkload", env.oxia_address(), str(histories.get("oxia", "")), str(clients),
            str(keys), str(duration_s), str(seed), str(rate), f"/robust/{prefix}",
        ],
        "zk": [
            sys.executable, "-m", "tests.robustness.zk_workload",
            "--hosts", env.zk_hosts_of_servers() if "zk" in protocols else "",
            "--out", str(histories.get("zk", "")), "--clients", str(clients),
            "--keys", str(keys), "--duration", str(duration_s), "--seed", str(seed),
            "--rate", str(rate), "--prefix", f"/robust/{prefix}",
        ],
    }  # fmt: skip
    nemesis_log = out_dir / "nemesis.jsonl"
    nemesis_log.write_text("")
    nem = nemesis_module.Nemesis(env, seed, tuple(kinds), nemesis_log)
    problems: list[str] = []
    processes: dict[str, subprocess.Popen[bytes]] = {}
    stop = threading.Event()
    try:
        for proto in protocols:
            log = open(out_dir / f"{proto}-workload.log", "wb")  # noqa: SIM115 (the child's)
            processes[proto] = subprocess.Popen(
                commands[proto], stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )
            log.close()
        started = time.monotonic()
        if "zk" in processes:  # its znodes are created before its clients start: no fault then
            _wait_started(out_dir / "zk-workload.log", processes["zk"], stop)
        # The clients connect and warm up for a moment before the first fault, and the last
        # fault is healed a few seconds before they stop, so every run also sees recovery.
        stop.wait(min(3.0, duration_s / 10))
        if kinds:
            nem.run(started + duration_s - 3.0, stop)
        for proto, process in processes.items():
            try:
                code = process.wait(timeout=duration_s + 180)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                code = -9
                problems.append(f"{proto} workload still running {duration_s + 180:.0f}s in")
            if code != 0:
                tail = (out_dir / f"{proto}-workload.log").read_text(errors="replace")[-2000:]
                problems.append(f"{proto} workload exited {code}: {tail}")
    finally:
        stop.set()
        nem.heal_all()
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    problems += nem.errors
    faults = [f"{e.kind} on {e.target}: {e.detail}" for e in nem.events]
    present = [h for h in histories.values() if h.exists() and h.stat().st_size > 0]
    verdict, output, visualizations = check_histories(
        tools, present, out_dir / "visualization", nemesis_log
    )
    if problems and verdict == "ok":
        verdict = "error"
    return RunResult(
        seed, out_dir, present, verdict, output, visualizations, nemesis_log, faults, problems,
        replay,
    )  # fmt: skip


ZK_SETUP_TIMEOUT_S = 180.0
"""How long the ZooKeeper workload may take to create its znodes (set-up: a busy machine may
take its time; faults wait for it)."""


def _wait_started(log: Path, process: subprocess.Popen[bytes], stop: threading.Event) -> None:
    """Until the workload writing `log` has printed STARTED (its set-up is done), exited (the
    run reports why), or `ZK_SETUP_TIMEOUT_S` passed (the run goes on; faults may then meet the
    set-up, and the run reports what that did)."""
    deadline = time.monotonic() + ZK_SETUP_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        if b"STARTED" in log.read_bytes():
            return
        stop.wait(0.1)


def check_histories(
    tools: Tools, histories: Sequence[Path], viz_dir: Path, nemesis_log: Path | None = None
) -> tuple[str, str, list[str]]:
    """Run the checker: (verdict, its output, the visualisations it wrote)."""
    if not histories:
        return "error", "no history was written", []
    command = [str(tools.checker), "-out", str(viz_dir), "-timeout", "180s"]
    if nemesis_log is not None:
        command += ["-nemesis", str(nemesis_log)]
    done = subprocess.run(
        [*command, *map(str, histories)], capture_output=True, text=True, timeout=1800
    )
    output = (done.stdout + done.stderr).strip()
    verdict = {0: "ok", 1: "illegal", 2: "undecided"}.get(done.returncode, "error")
    visualizations = re.findall(r"visualization=(\S+)", done.stdout)
    return verdict, output, visualizations


def summarize(records_path: Path) -> dict[str, int]:
    """Counts of a history's statuses (for reports)."""
    counts: dict[str, int] = {}
    with open(records_path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                status = json.loads(line)["status"]
                counts[status] = counts.get(status, 0) + 1
    return counts
