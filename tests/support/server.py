"""Start and stop real TableKeeper server processes for integration tests.

Servers bind to 127.0.0.1 on free ports and log to a file next to their data directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
TABLEKEEPER = Path(sys.executable).parent / "tablekeeper"
SERVER_COMMAND = Path(os.environ.get("TABLEKEEPER_TEST_SERVER_BIN") or TABLEKEEPER)
"""What starts servers: this environment's `tablekeeper`, unless TABLEKEEPER_TEST_SERVER_BIN
names another (the SDK-at-its-floor-versions run uses a client-only environment)."""


PORTS_ENV_VAR = "TABLEKEEPER_TEST_PORTS"


def _free_ports() -> range:
    """Where `free_port` picks: below Linux's ephemeral range (32768-60999 by default), which the
    kernel hands to outgoing connections (Pulsar's, ZooKeeper's, the tests' own clients) and to
    `bind(0)`; a port picked there could be taken before the server it was picked for binds it.

    Under pytest-xdist each worker picks from its own share, so two workers never pick one port
    between one's check and its server's bind. Test runs beside each other (`make test` runs
    some passes side by side) each get their own range: `TABLEKEEPER_TEST_PORTS=LOW-HIGH`."""
    low, high = (int(p) for p in os.environ.get(PORTS_ENV_VAR, "20000-32000").split("-"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count <= 1:
        return range(low, high)
    share = (high - low) // count
    start = low + int(worker[2:]) * share
    return range(start, start + share)


FREE_PORTS = _free_ports()
_handed_out: set[int] = set()
_pick = random.Random()  # its own seed (from the OS): tests that seed `random` do not reach it


def free_port() -> int:
    """A loopback port that nothing listens on now, from `FREE_PORTS`, never the same twice in
    this process (two servers of one test never get one port)."""
    for _ in range(10_000):
        port = _pick.choice(FREE_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {FREE_PORTS}")


def _listeners(ports: list[int]) -> str:
    """The sockets on `ports` and their processes (`ss`), for an error message."""
    try:
        done = subprocess.run(
            ["ss", "-Htanp"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"\n(ss failed: {exc})"
    wanted = tuple(f":{port} " for port in ports)
    found = [line for line in done.stdout.splitlines() if any(w in line for w in wanted)]
    return f"\nsockets on ports {ports} now (ss -tanp):\n" + ("\n".join(found) or "none")


def wait_all_threads_stopped(pid: int, patience_s: float = 60.0) -> None:
    """Until every thread of process `pid` is stopped (after its SIGSTOP): `kill` returns before
    they are (each stops on its way back to user mode, one in a system call only when that
    returns), and a request sent meanwhile could still be answered."""
    give_up = time.monotonic() + patience_s
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                states.append(stat.rsplit(")", 1)[1].split()[0])  # after "pid (comm)"
        if states and all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < give_up, f"threads of {pid} not stopped: {states}"
        time.sleep(0.01)


RUNTIME_ENV_VAR = "TABLEKEEPER_TEST_RUNTIME"
"""`grpc-aio` or `envoy`: every server a test starts serves its gRPC ports with that `--runtime`
(unless the test chose one itself; by default the server's `auto`, Envoy where pyvoy is
installed): how `make test-compat` runs the real clients on grpcio's server too."""


def _runtime_args(extra_args: list[str]) -> list[str]:
    runtime = os.environ.get(RUNTIME_ENV_VAR)
    return ["--runtime", runtime] if runtime and "--runtime" not in extra_args else []


@dataclass
class ServerProcess:
    data_dir: Path
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None
    """Extra environment variables for the server process (merged into `os.environ`), e.g.
    `{"TABLEKEEPER_FAILPOINTS": "checkpoint.before_manifest=crash"}`."""
    tls_files: tuple[Path, Path | None, Path | None] | None = None
    """(CA, client certificate, client key) to reach a server started with --tls-cert (the
    health probe then uses TLS, with the client certificate for an mTLS server)."""
    host: str = "127.0.0.1"
    """The address it listens on and is reached at (its `--host` is for `extra_args` to say)."""
    netns: str | None = None
    """A network namespace to run it in (`ip netns exec`, which execs in place: the process id
    is the server's own, so signals reach it); tests/robustness puts servers in their own."""

    @property
    def service(self) -> str:
        return f"bk://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-server.log"

    @property
    def running(self) -> bool:
        """Started and not exited (yet)."""
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 120.0, *, poll_s: float = 0.1) -> ServerProcess:
        """Start the process and wait until it reports SERVING (see `wait_serving`). The
        deadline is generous: a start is set-up, and a busy machine may take its time."""
        self.launch()
        try:
            self.wait_serving(timeout_s, poll_s=poll_s)
        except BaseException:
            # Not left running: a module fixture whose start failed has no teardown, and a
            # leaked server would load the machine (and hold its ports) for every later test.
            self.kill()
            raise
        return self

    def launch(self) -> ServerProcess:
        """Start the process and return at once (it may still be recovering, or not listening
        yet); nothing polls it, so no client connection is put into reconnect backoff."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 (owned by the child process)
        in_netns = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.process = subprocess.Popen(
            [
                *in_netns,
                str(SERVER_COMMAND),
                "server",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--metrics-port",
                str(self.metrics_port),
                *self.extra_args,
                *_runtime_args(self.extra_args),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **self.env} if self.env is not None else None,
        )
        log.close()
        return self

    def wait_serving(self, timeout_s: float, *, poll_s: float = 0.1) -> None:
        """Probe the gRPC health every `poll_s` seconds until SERVING. A benchmark timing a
        start polls more often: the probe's reconnect backoff (half to twice `poll_s`) is then
        shorter too, so SERVING is seen within about `poll_s` of the fact."""
        deadline = time.monotonic() + timeout_s
        # A private subchannel pool and short reconnect backoff: the probe must not share (and
        # slow down) the connection state of clients in the same test process.
        options = [
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", round(poll_s * 500)),
            ("grpc.max_reconnect_backoff_ms", round(poll_s * 2000)),
        ]
        with self._probe_channel(options) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    tail = self.log_tail()
                    if "Address already in use" in tail:  # say who holds which port
                        tail += _listeners([self.port, self.metrics_port])
                    raise RuntimeError(f"server exited with {self.process.returncode}:\n{tail}")
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if status.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server not serving after {timeout_s}s:\n{self.log_tail()}")
                time.sleep(poll_s)

    def _probe_channel(self, options: list[tuple[str, int]]) -> grpc.Channel:
        if self.tls_files is None:
            return grpc.insecure_channel(self.target, options=options)
        ca, cert, key = self.tls_files
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.read_bytes(),
            private_key=key.read_bytes() if key else None,
            certificate_chain=cert.read_bytes() if cert else None,
        )
        return grpc.secure_channel(self.target, credentials, options=options)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 180.0) -> None:
        """Poll `condition` until it holds; fail (with the log's tail) if the process exits or
        `timeout_s` passes. The timeout is a hang guard, not a measurement."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.process.returncode} while waiting for {what}:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout_s}s:\n{self.log_tail()}")
            time.sleep(0.01)

    def metrics(self, timeout_s: float = 10.0) -> str:
        """The Prometheus text the server's metrics port serves now."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return str(reply.read().decode())

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def log_offset(self) -> int:
        """The log's current size: pass it to `log_since` to read what is written after now
        (the log accumulates across restarts)."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, offset: int) -> str:
        """The log from byte `offset` (a `log_offset`) on."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait: the graceful path. Returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def kill(self) -> float:
        """kill -9: no shutdown code runs. Returns the wall-clock time (`time.time()`) the
        signal was sent (or, if the process had exited already, now); the process is reaped."""
        assert self.process is not None
        sent = time.time()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        return sent

    def restart(self) -> ServerProcess:
        """Stop the process gracefully if it runs (after `kill` it does not), then start it again
        on the same ports and data directory. Starting beside a running process would leave the
        old one serving (and answering the health probe) while the new one cannot take the data
        directory: no restart at all."""
        if self.process is not None and self.process.poll() is None:
            self.stop()
        return self.start()


def stop_all(servers: Iterable[ServerProcess], timeout_s: float = 15.0) -> None:
    """Stop every running server of `servers`: SIGTERM to all at once, then SIGKILL to those
    still running after `timeout_s`. Never raises for a server that does not stop."""
    running = [s for s in servers if s.running]
    for server in running:
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for server in running:
        assert server.process is not None
        try:
            server.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.kill()
