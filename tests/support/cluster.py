"""A real TableKeeper cluster: a ZooKeeper of its own (`ZooKeeperProcess`, or a running one
given as `zk_hosts`), a Pulsar (`PulsarService`; for tests the session's `pulsar_service`, one
fresh namespace per cluster) and N `ServerProcess`es started with the cluster flags.

    from tests.support.cluster import TestCluster

    def test_failover(make_cluster: Callable[..., TestCluster]) -> None:
        c = make_cluster(containers=4).start(2)
        c.kill(0)
        c.wait_ready(30)
        assert c.assignment() == {c.endpoint(1): frozenset(range(4))}

The fixtures (`make_cluster`, function-scoped, and `cluster_fixture(n)` for a module-scoped
started cluster) are in tests/support/cluster_fixtures.py; this module does not import pytest,
so the benchmarks use the same classes. Servers are indexed from 0 in start order. A server's
endpoint (`HOST:PORT`, how it registers in ZooKeeper and how the assignment names it) stays the
same across `restart`. Tests that use this need Pulsar: mark them `pulsar` (and `integration`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
from kazoo.exceptions import KazooException

from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc
from tablekeeper_server.cluster.zookeeper import Ownership, ZkCoordinator
from tablekeeper_server.core.clock import SystemClock
from tests.support.pulsar import PulsarService, unique_namespace
from tests.support.server import ServerProcess, stop_all
from tests.support.zookeeper import ZooKeeperProcess


class TestCluster:
    """N servers of one cluster. Not thread-safe; one test drives it."""

    __test__ = False  # a helper, not a test class

    def __init__(
        self,
        base_dir: Path,
        pulsar: PulsarService,
        *,
        containers: int = 8,
        name: str | None = None,
        zk_session_timeout_s: float = 2.0,
        checkpoint_interval_s: float | None = None,
        pulsar_namespace: str | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        start_timeout_s: float = 120.0,
        tls_files: tuple[Path, Path | None, Path | None] | None = None,
        token: str | None = None,
        zk_hosts: str | None = None,
    ) -> None:
        """`tls_files` (CA, client cert, client key) and `token`: how the harness itself reaches
        servers started with TLS and authentication (in `extra_args`). `zk_hosts`: a running
        ZooKeeper (HOST:PORT) to use instead of starting one; `close` leaves it running."""
        self.base_dir = base_dir
        self.pulsar = pulsar
        self.containers = containers
        self.name = name or f"test-{uuid.uuid4().hex[:8]}"
        self.zk_session_timeout_s = zk_session_timeout_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self.pulsar_namespace = pulsar_namespace or f"public/{unique_namespace('cluster')}"
        self.extra_args = list(extra_args)
        self.env = env
        self.start_timeout_s = start_timeout_s
        self.tls_files = tls_files
        self.token = token
        self._zk_hosts = zk_hosts
        self.zookeeper = ZooKeeperProcess(base_dir / "zookeeper") if zk_hosts is None else None
        self.servers: list[ServerProcess] = []
        self._admin: ZkCoordinator | None = None
        self._zk_started = False

    # ------------------------------------------------------------------ life cycle

    def start(self, n: int, timeout_s: float = 180.0) -> TestCluster:
        """`init`, start `n` servers and wait until ready. If that fails, everything started
        is stopped again (a caller's `with` or fixture teardown never runs for a failed start)."""
        try:
            self.init()
            for _ in range(n):
                self.add_server()
            self.wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def init(self) -> TestCluster:
        """Start ZooKeeper (unless given `zk_hosts`), open the harness's own session and
        initialise the cluster with `containers` containers; no server yet (`add_server`)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.zookeeper is not None:
            self.zookeeper.start()
            self._zk_started = True
        admin = ZkCoordinator(self.zk_hosts, self.name, session_timeout_s=10.0, clock=SystemClock())
        admin.start()
        self._admin = admin
        admin.init_cluster(self.containers)
        return self

    def server_args(self) -> list[str]:
        """The cluster flags every server of this cluster gets (before `extra_args`)."""
        args = [
            "--zk",
            self.zk_hosts,
            "--cluster",
            self.name,
            f"--zk-session-timeout={self.zk_session_timeout_s:g}",
            *self.pulsar.server_args(self.pulsar_namespace),
            "--host=127.0.0.1",
        ]
        if self.checkpoint_interval_s is not None:
            args.append(f"--checkpoint-interval={self.checkpoint_interval_s:g}")
        return args

    def add_server(
        self, extra_args: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> ServerProcess:
        """Start one more server (free ports, its own data dir); returns when its gRPC health
        is SERVING, i.e. it is registered. Does not wait for containers: see `wait_ready`."""
        index = len(self.servers)
        merged_env = {**(self.env or {}), **(env or {})}
        server = ServerProcess(
            self.base_dir / f"server-{index}",
            extra_args=[*self.server_args(), *self.extra_args, *extra_args],
            env=merged_env or None,
            tls_files=self.tls_files,
        )
        self.servers.append(server)
        server.start(self.start_timeout_s)
        return server

    def kill(self, i: int) -> float:
        """kill -9 server `i`: its ZooKeeper session ends only when it times out. Returns the
        wall-clock time the signal was sent."""
        return self.servers[i].kill()

    def stop(self, i: int, timeout_s: float = 30.0) -> int:
        """SIGTERM server `i` and wait; returns its exit code."""
        return self.servers[i].stop(timeout_s)

    def restart(self, i: int) -> ServerProcess:
        """Start server `i` again (same ports, data dir and endpoint) after `kill` or `stop`; a
        running one is stopped first. Returns when it is SERVING (registered)."""
        server = self.servers[i]
        if self.alive(i):
            server.stop()
        return server.start(self.start_timeout_s)

    def alive(self, i: int) -> bool:
        return self.servers[i].running

    def zk_restart(self, down_s: float = 0.0) -> None:
        """Stop ZooKeeper, keep it down `down_s` seconds, start it again on the same port and
        data directory (sessions that have not timed out survive, as in production)."""
        assert self.zookeeper is not None, "the ZooKeeper was given (zk_hosts), not started here"
        self.zookeeper.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.zookeeper.start()

    def close(self) -> None:
        """Stop every server (SIGTERM all at once, SIGKILL after 15 s), then ZooKeeper (if
        started here)."""
        stop_all(self.servers, 15)
        if self._admin is not None:
            with contextlib.suppress(Exception):  # ZooKeeper may be down: the session just ends
                self._admin.stop()
            self._admin = None
        if self._zk_started:
            assert self.zookeeper is not None
            self.zookeeper.stop()
            self._zk_started = False

    def __enter__(self) -> TestCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ addresses

    @property
    def zk_hosts(self) -> str:
        if self.zookeeper is None:
            assert self._zk_hosts is not None
            return self._zk_hosts
        return self.zookeeper.hosts

    def service(self, i: int) -> str:
        """Server `i`'s service URI, bk://127.0.0.1:PORT."""
        return self.servers[i].service

    def endpoint(self, i: int) -> str:
        """Server `i`'s endpoint as registered in ZooKeeper: 127.0.0.1:PORT."""
        return self.servers[i].target

    def index(self, endpoint: str) -> int:
        """The index of the server registered as `endpoint`."""
        for i, server in enumerate(self.servers):
            if server.target == endpoint:
                return i
        raise KeyError(endpoint)

    def service_all(self) -> str:
        """One URI naming every server of the cluster: bk://HOST:PORT,HOST:PORT,..."""
        return "bk://" + ",".join(server.target for server in self.servers)

    # ------------------------------------------------------------------ coordination state

    @property
    def admin(self) -> ZkCoordinator:
        """The test's own ZooKeeper session (read-only use)."""
        assert self._admin is not None, "cluster not started"
        return self._admin

    def assignment(self) -> dict[str, frozenset[int]]:
        """endpoint -> containers, as the controller last wrote it (empty entries dropped)."""
        assignment, _ = self.admin.read_assignment()
        return {server: owned for server, owned in assignment.items() if owned}

    def assigned_to(self, container: int) -> str | None:
        for server, owned in self.assignment().items():
            if container in owned:
                return server
        return None

    def controller(self) -> str | None:
        """The endpoint of the elected controller."""
        return self.admin.controller()

    def live_servers(self) -> list[str]:
        return self.admin.live_servers()

    def owner(self, container: int) -> Ownership | None:
        """`owners/<container>`: its current owner and ownership epoch."""
        return self.admin.owner(container)

    def serving(self, i: int, timeout_s: float = 2.0) -> frozenset[int]:
        """The containers server `i` reports SERVING (its ServerInfo)."""
        return server_info_containers(self.endpoint(i), timeout_s, self.tls_files, self.token)

    # ------------------------------------------------------------------ readiness

    def not_ready(self, *, balanced: bool = False) -> list[str]:
        """Why the cluster is not ready; empty when every container is assigned to a live
        server, every running server is registered, and every live server serves exactly its
        assigned containers (ServerInfo); with `balanced`, also when the running servers'
        container counts differ by at most one (the controller has rebalanced)."""
        problems: list[str] = []
        admin = self.admin
        assignment, revision = admin.read_assignment()
        live = admin.live_servers()
        assigned = {c: s for s, owned in assignment.items() for c in owned}
        missing = sorted(set(range(self.containers)) - set(assigned))
        if missing:
            problems.append(f"unassigned containers {missing} (assignment revision {revision})")
        if balanced:
            loads = {s.target: len(assignment.get(s.target, ())) for s in self.servers if s.running}
            if loads and max(loads.values()) - min(loads.values()) > 1:
                problems.append(f"unbalanced: containers per server {loads}")
        for server, owned in sorted(assignment.items()):
            if owned and server not in live:
                problems.append(f"{server} is assigned {sorted(owned)} but not live")
        for i, process in enumerate(self.servers):
            if self.alive(i) and process.target not in live:
                problems.append(f"server {i} ({process.target}) runs but is not registered")
        for endpoint in live:
            wanted = assignment.get(endpoint, frozenset())
            try:
                served = server_info_containers(endpoint, 1.0, self.tls_files, self.token)
            except grpc.RpcError as exc:
                problems.append(f"{endpoint}: ServerInfo failed: {_code(exc)}")
                continue
            if served != wanted:
                problems.append(f"{endpoint} serves {sorted(served)}, assigned {sorted(wanted)}")
        return problems

    def wait_ready(self, timeout_s: float = 120.0, *, balanced: bool = False) -> None:
        """Wait until `not_ready(balanced=...)` is empty; `TimeoutError` with the reasons and the
        end of every server's log otherwise. A dead server that is still registered keeps the
        cluster not ready until its session times out and the controller moves its containers."""
        deadline = time.monotonic() + timeout_s
        problems: list[str] = []
        while True:
            try:
                problems = self.not_ready(balanced=balanced)
            except KazooException as exc:  # ZooKeeper restarting, session moving
                problems = [f"ZooKeeper: {type(exc).__name__}: {exc}"]
            if not problems:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cluster {self.name} not ready after {timeout_s}s: {'; '.join(problems)}\n"
                    + self.log_tails()
                )
            time.sleep(0.2)

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- server {i} ({server.target}, {server.log_path}):\n{server.log_tail(lines)}"
            for i, server in enumerate(self.servers)
        )


def _code(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    return code.name if code is not None else str(exc)


def server_info_containers(
    endpoint: str,
    timeout_s: float = 2.0,
    tls_files: tuple[Path, Path | None, Path | None] | None = None,
    token: str | None = None,
) -> frozenset[int]:
    """The containers the server at `endpoint` reports serving (`TableKeeper/ServerInfo`);
    raises `grpc.RpcError` if it does not answer."""
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.initial_reconnect_backoff_ms", 50)]
    if tls_files is None:
        channel = grpc.insecure_channel(endpoint, options=options)
    else:
        ca, cert, key = tls_files
        credentials = grpc.ssl_channel_credentials(
            ca.read_bytes(),
            key.read_bytes() if key else None,
            cert.read_bytes() if cert else None,
        )
        channel = grpc.secure_channel(endpoint, credentials, options=options)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with channel:
        stub = tablekeeper_pb2_grpc.TableKeeperStub(channel)
        info = stub.ServerInfo(
            tablekeeper_pb2.ServerInfoRequest(), timeout=timeout_s, metadata=metadata
        )
    return frozenset(int(c) for c in info.containers)
