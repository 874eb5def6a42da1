"""`tablekeeper server --workers N`: N server processes that share this host's containers.

One Python process serves about one core (the interpreter's lock); a host with more cores runs
more processes. The supervisor (the process started by `tablekeeper server`) holds the data
directory's lock, picks a port for each worker, starts them and watches them:

- worker `i` hosts containers `c` with `c % N == i` (worker 0 has the root range) and listens on
  its own port; worker 0 on `--port`, the others on free loopback ports picked at start;
- `GetStorageContainerEndpoint` names each container's worker, so clients that route (the SDK,
  the BookKeeper Java client) go straight to it; a request that reaches the wrong worker (the
  BookKeeper Python client sends everything to `--port`) is forwarded, as in cluster mode;
- worker 0 reports SERVING once every worker does, so a client that waited for it finds all of
  them;
- a worker that dies (a crash, kill -9) is started again on the same port and recovers its
  containers from their logs; SIGTERM/SIGINT stop every worker gracefully; SIGHUP is passed on
  (TLS certificates are re-read).

Every worker runs with the supervisor's configuration, passed as flags (`config.worker_command`):
settings from a configuration file or `TABLEKEEPER_SERVER_*` variables reach the workers as
they reached the supervisor, and a file edited while the server runs changes no worker that
restarts (each worker's command line shows the whole configuration it runs with).

The workers own disjoint containers, hence disjoint range logs, stores and checkpoints in the
shared data directory; nothing is shared between the processes but that directory.
The etcd and Oxia ports work as in cluster mode: worker 0 listens on the configured ports,
every other worker on free ones; an etcd keyspace is served by the worker owning its range's
container (the others, worker 0 included, pass calls through to it), and each Oxia shard's
leader is the worker owning its container. Not in worker mode: cluster mode (`--zk`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger(__name__)

ENV_VAR = "TABLEKEEPER_WORKER"
"""How the supervisor tells a worker process its slot (internal; JSON)."""
RESTART_DELAY_S = 1.0
CRASH_LOOP_RESTARTS = 5
"""A worker that dies this many times in a row, each within `CRASH_LOOP_WINDOW_S` of its start,
stops the server (something is wrong that restarting does not fix)."""
CRASH_LOOP_WINDOW_S = 30.0
EXIT_REFUSED = 3
"""A worker's exit status when it refuses to start on damaged data (`main.run`): not restarted."""


@dataclass(frozen=True)
class WorkerSlot:
    """Which worker this process is, and every worker's endpoint (`host:port`), by index."""

    index: int
    endpoints: tuple[str, ...]
    frontends: tuple[dict[str, str], ...] = field(default=(), hash=False)
    """By worker index: front-end name (an etcd keyspace, `oxia`) -> that worker's address of it
    (worker 0 has the configured ports, the others free ones)."""

    @property
    def count(self) -> int:
        return len(self.endpoints)

    @property
    def port(self) -> int:
        return int(self.endpoints[self.index].rsplit(":", 1)[1])

    def owns(self, container_id: int) -> bool:
        return container_id % self.count == self.index

    def owner_of(self, container_id: int) -> str:
        return self.endpoints[container_id % self.count]

    def siblings(self) -> list[str]:
        return [e for i, e in enumerate(self.endpoints) if i != self.index]

    def frontends_of(self, endpoint: str) -> dict[str, str] | None:
        """The front-end addresses of the worker at `endpoint` (None: no such worker)."""
        if endpoint not in self.endpoints:
            return None
        index = self.endpoints.index(endpoint)
        return self.frontends[index] if index < len(self.frontends) else {}

    def frontend_port(self, name: str) -> int | None:
        """This worker's port of front-end `name` (None: not served)."""
        own = self.frontends[self.index] if self.index < len(self.frontends) else {}
        address = own.get(name)
        return None if address is None else int(address.rsplit(":", 1)[1])

    def to_env(self) -> str:
        return json.dumps(
            {
                "index": self.index,
                "endpoints": list(self.endpoints),
                "frontends": list(self.frontends),
            }
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerSlot | None:
        raw = (os.environ if environ is None else environ).get(ENV_VAR)
        if not raw:
            return None
        doc = json.loads(raw)
        return cls(
            int(doc["index"]),
            tuple(str(e) for e in doc["endpoints"]),
            tuple({str(k): str(v) for k, v in f.items()} for f in doc.get("frontends", ())),
        )


def _end_with_parent() -> None:
    """In a worker, before it runs: get SIGTERM when the supervisor dies, even by kill -9 (Linux
    `prctl(PR_SET_PDEATHSIG)`), so no worker outlives it holding ports and containers."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def resolve_workers(requested: int) -> int:
    """`--workers 0` means one per core."""
    return requested if requested > 0 else max(1, os.cpu_count() or 1)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Worker:
    def __init__(self, slot: WorkerSlot, argv: list[str], env: Mapping[str, str]) -> None:
        self.slot = slot
        self._argv = argv
        self._env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.quick_deaths = 0

    def start(self) -> None:
        env = dict(self._env, **{ENV_VAR: self.slot.to_env()})
        self.process = subprocess.Popen(self._argv, env=env, preexec_fn=_end_with_parent)
        self.started_at = time.monotonic()
        log.info(
            "worker %d started (pid %d) on %s",
            self.slot.index,
            self.process.pid,
            self.slot.endpoints[self.slot.index],
        )

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)


def supervise(
    *,
    workers: int,
    bind_host: str,
    advertised_host: str,
    port: int,
    argv: list[str],
    env: Mapping[str, str],
    frontend_ports: Mapping[str, int] | None = None,
) -> int:
    """Run `workers` worker processes (each `argv` in environment `env`, told its slot in
    `ENV_VAR`) until SIGTERM/SIGINT; return the exit status. The caller holds the data
    directory's lock. Every (re)start of a worker uses the same `argv` and `env`: a worker
    started again runs with the configuration the supervisor started with. `frontend_ports`:
    front-end name -> its configured port (worker 0's; the others get free ones)."""
    ports = [port] + [_free_port(bind_host) for _ in range(workers - 1)]
    endpoints = tuple(f"{advertised_host}:{p}" for p in ports)
    frontends = tuple(
        {
            name: f"{advertised_host}:{public if i == 0 else _free_port(bind_host)}"
            for name, public in (frontend_ports or {}).items()
        }
        for i in range(workers)
    )
    children = [_Worker(WorkerSlot(i, endpoints, frontends), argv, env) for i in range(workers)]
    stopping: list[int] = []

    def on_stop(signum: int, _: FrameType | None) -> None:
        if not stopping:
            log.info("stopping %d workers (%s)", workers, signal.Signals(signum).name)
        stopping.append(signum)
        for child in children:
            child.signal(signal.SIGTERM)

    def on_hup(signum: int, _: FrameType | None) -> None:
        for child in children:
            child.signal(signum)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    log.info("starting %d workers: %s", workers, ", ".join(endpoints))
    for child in children:
        child.start()
    status = 0
    while True:
        running = 0
        for child in children:
            process = child.process
            if process is None:
                continue
            code = process.poll()
            if code is None:
                running += 1
                continue
            if stopping:
                if code != 0:
                    log.warning("worker %d exited with status %d", child.slot.index, code)
                    status = status or code
                child.process = None
                continue
            status = _after_death(child, code)
            if status:
                on_stop(signal.SIGTERM, None)
            else:
                running += 1
        if stopping and running == 0:
            break
        time.sleep(0.1)
    log.info("all workers stopped")
    return status


def _after_death(child: _Worker, code: int) -> int:
    """A worker exited on its own: start it again (0), or say why the server must stop."""
    index = child.slot.index
    if code == EXIT_REFUSED:
        log.error("worker %d refused to start on damaged data: stopping the server", index)
        return EXIT_REFUSED
    lived = time.monotonic() - child.started_at
    child.quick_deaths = child.quick_deaths + 1 if lived < CRASH_LOOP_WINDOW_S else 1
    if child.quick_deaths >= CRASH_LOOP_RESTARTS:
        log.error(
            "worker %d died %d times within %.0fs of starting: stopping the server",
            index,
            child.quick_deaths,
            CRASH_LOOP_WINDOW_S,
        )
        return 2
    log.warning(
        "worker %d exited with status %d after %.1fs; starting it again (its containers "
        "recover from their logs)",
        index,
        code,
        lived,
    )
    time.sleep(RESTART_DELAY_S)
    child.start()
    return 0


def worker_argv(server_args: list[str]) -> list[str]:
    """The command line of a worker: this process's program (the `tablekeeper` script) with
    `server` and `server_args` (the supervisor's whole configuration, as flags)."""
    return [sys.executable, sys.argv[0], "server", *server_args]
