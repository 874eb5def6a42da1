"""`tablekeeper server --runtime envoy`: the server's gRPC ports (main, etcd, Oxia) on Envoy.

A grpc.aio call costs this machine's Python server a few hundred µs of CPU before TableKeeper
does anything (benchmarks/grpc_floor.py); most of it is grpcio's C core, its Cython glue and
the event loop's wake-ups. pyvoy hosts a Python ASGI application inside an Envoy process: Envoy
parses HTTP/2 in C++ and hands each call to Python as one ASGI request, which `rpc.asgi` serves
with the same handlers and interceptors as the grpc.aio server would (measured: RESULTS.md,
"Envoy as the main port's HTTP/2" and the sections after it).

How the process runs: `run` calls `exec_envoy` (`rpc.envoy_launch`), which replaces the
`tablekeeper server` process with Envoy (same pid: kill -9 kills the server, and a worker keeps
its supervisor's parent-death signal), configured with one listener on the server's gRPC
ports whose only HTTP filter is pyvoy's, running `main.envoy_app` (an `EnvoyApp` below). Envoy's
embedded interpreter imports `main` for it; the ASGI lifespan startup runs `main.serve` with
the exact settings of the process that exec'd (as flags, in TABLEKEEPER_ENVOY_ARGV) on pyvoy's
event loop, which runs off the main thread. Envoy
listens on the etcd keyspaces' and Oxia's ports too, and the app serves each call with the
services of the port it came in on (`rpc.listen.GrpcPort`); metrics and everything else run as
in the grpc.aio runtime, in the same process.

SIGTERM / SIGINT: Envoy's own handling closes every client connection at once (it drains only
when told to through its admin interface), which would cut the calls in flight and, in a
cluster, hand the containers over only after that. So `exec_envoy` blocks both signals before
the exec: the mask is inherited by Envoy and every thread it starts, the signals stay pending,
and a thread of the server takes them with `sigwaitinfo` (`_Signals`, which logs the sender).
The server then stops as on grpc.aio: containers handed over, new calls refused, calls in
flight answered (up to `--shutdown-grace`), ranges closed, "stopped cleanly"; only then is
SIGTERM let through to Envoy's handler, which ends the lifespan and the process (exit 0).

TLS: Envoy terminates it on the main port with the server's certificate (and, with a client
CA, requires and verifies client certificates; their common names are roles as on grpc.aio).
Envoy reads the certificate, its key and the client CA from secret files the server writes
(`write_tls_secrets`: under the data directory, mode 0600) and watches their directory; SIGHUP,
blocked and taken like SIGTERM, makes the server re-read the configured files and rewrite the
secrets, so new connections get the new certificate while open ones go on, as on grpc.aio.
Envoy's admin interface is off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import grpc

from tablekeeper_server.cluster.errors import ClusterError
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.rpc.asgi import GrpcAsgi, Receive, Scope, Send, refuse
from tablekeeper_server.rpc.envoy_launch import (
    ARGV_ENV_VAR,
    RELOAD_SIGNAL,
    STOP_SIGNALS,
    tls_dir,
    write_tls_secrets,
)

if TYPE_CHECKING:
    from tablekeeper_server.config import ServerConfig
    from tablekeeper_server.rpc.listen import GrpcPort
    from tablekeeper_server.security.tls import TlsFiles

log = logging.getLogger(__name__)

ENVOY_EXIT_WAIT_S = 30.0
"""How long the server waits for Envoy to end the process after a graceful stop."""


Serve = Callable[..., Coroutine[Any, Any, None]]
"""`main.serve`: `serve(config, *, stop, on_port)`."""
ServeFailure: TypeAlias = CorruptionError | ClusterError | OSError
"""Why `serve` could not start or go on (`main.failure_exit_code` logs it)."""


class EnvoyApp:
    """The ASGI application Envoy runs: the server through the lifespan, calls through the
    `GrpcAsgi` of the port they came in on (Envoy listens on every gRPC port of the server).
    Made by the composition root (`main.envoy_app`), which hands it `serve` and the exit code of
    a server that cannot start (`failure_exit_code`): this module does not import `main`."""

    def __init__(self, serve: Serve, failure_exit_code: Callable[[ServeFailure], int]) -> None:
        self._run = serve
        self._failure_exit_code = failure_exit_code
        self._ports: dict[int, GrpcAsgi] = {}
        self._stop = asyncio.Event()
        self._server: asyncio.Task[None] | None = None
        self._signals: _Signals | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            port = scope["server"][1]
            served = self._ports.get(port)
            if served is None:  # a front-end still opening (the main port is there first)
                await refuse(send, grpc.StatusCode.UNAVAILABLE, f"port {port} is not serving yet")
                return
            await served(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self._start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._stop.set()
                if self._server is not None:
                    await self._server
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _start(self) -> None:
        from tablekeeper_server.config import (
            add_server_arguments,
            config_from_settings,
            resolve_settings,
        )
        from tablekeeper_server.gc_tuning import tune_garbage_collector
        from tablekeeper_server.logging_setup import configure_logging
        from tablekeeper_server.workers import WorkerSlot

        tune_garbage_collector()  # Envoy's process: its Python is the server's
        parser = argparse.ArgumentParser(prog="tablekeeper server")
        add_server_arguments(parser)
        args = parser.parse_args(json.loads(os.environ[ARGV_ENV_VAR]))
        config = config_from_settings(resolve_settings(args, {}), WorkerSlot.from_env())
        worker = config.worker
        configure_logging(
            config.log_level, config.log_format, worker.index if worker is not None else None
        )
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_port(port: GrpcPort) -> None:
            self._ports[port.port] = port.asgi()
            if not started.done():  # the main port: calls are taken from now on
                started.set_result(None)

        self._server = asyncio.create_task(self._serve(config, on_port))
        self._signals = _Signals.start(self._stop, config)
        await asyncio.wait([self._server, started], return_when=asyncio.FIRST_COMPLETED)

    async def _serve(self, config: ServerConfig, on_port: Callable[[GrpcPort], None]) -> None:
        """`serve` until the lifespan ends; a server that cannot start or go on ends the
        process with `run`'s exit codes (Envoy would otherwise go on serving nothing)."""
        try:
            await self._run(config, stop=self._stop, on_port=on_port)
        except (CorruptionError, ClusterError, OSError) as exc:
            _exit(self._failure_exit_code(exc))
        except BaseException:
            log.exception("the server failed")
            _exit(1)
        if not self._stop.is_set():
            _exit(0)
        if self._signals is not None and self._signals.received is not None:
            self._signals.end_envoy()  # the server has stopped: now Envoy may end the process


class _Signals:
    """Takes SIGTERM / SIGINT (and SIGHUP with TLS), which `exec_envoy` left blocked and so
    pending, on a thread of its own (`sigwaitinfo`): the first stop signal stops the server
    gracefully through `stop` (`end_envoy` then lets SIGTERM through to Envoy's handler);
    SIGHUP rewrites the TLS secrets from the configured files."""

    def __init__(self, stop: asyncio.Event, tls: tuple[TlsFiles, Path] | None) -> None:
        self._stop = stop
        self._tls = tls
        self._loop = asyncio.get_running_loop()
        self.received: signal.Signals | None = None

    @classmethod
    def start(cls, stop: asyncio.Event, config: ServerConfig) -> _Signals | None:
        """Start taking the signals; None when they are not blocked here (an Envoy that was
        not started by `exec_envoy`: its own handling applies)."""
        if not STOP_SIGNALS.issubset(signal.pthread_sigmask(signal.SIG_BLOCK, ())):
            log.warning("SIGTERM is not blocked: Envoy will cut calls in flight when it stops")
            return None
        files = config.security.tls_files()
        signals = cls(stop, (files, tls_dir(config)) if files is not None else None)
        threading.Thread(target=signals._take, name="signals", daemon=True).start()
        return signals

    def _take(self) -> None:
        taken = STOP_SIGNALS | ({RELOAD_SIGNAL} if self._tls is not None else set())
        while True:
            info = signal.sigwaitinfo(taken)
            received = signal.Signals(info.si_signo)
            if received == RELOAD_SIGNAL:
                self._reload()
            elif self.received is not None:
                log.info("%s (from %s): already stopping", received.name, _sender(info))
            else:
                self.received = received
                log.info("%s (from %s): stopping gracefully", received.name, _sender(info))
                self._loop.call_soon_threadsafe(self._stop.set)

    def _reload(self) -> None:
        assert self._tls is not None
        files, directory = self._tls
        try:
            write_tls_secrets(files, directory)
        except (OSError, ValueError) as exc:
            log.error("TLS reload failed, keeping the current certificate: %s", exc)
            return
        log.info("TLS: certificate files re-read (%s)", files.cert)

    def end_envoy(self) -> None:
        """Deliver SIGTERM to Envoy's handler (from a thread that unblocks it for itself), which
        ends the lifespan and the process; exit 0 directly if that has not happened within
        `ENVOY_EXIT_WAIT_S`."""

        def deliver() -> None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            threading.Event().wait(ENVOY_EXIT_WAIT_S)
            log.warning("Envoy did not end the process after SIGTERM: exiting")
            _exit(0)

        threading.Thread(target=deliver, name="end-envoy", daemon=True).start()


def _sender(info: signal.struct_siginfo) -> str:
    """Who sent a signal, for the log: its pid and command, as far as /proc still tells."""
    if info.si_pid <= 0:
        return "the kernel"
    try:
        command = Path(f"/proc/{info.si_pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
    except OSError:
        command = b""
    if not command:  # gone, or exiting
        return f"pid {info.si_pid}, exited"
    return f"pid {info.si_pid}: {command.decode(errors='replace')[:200]}"


def _exit(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
