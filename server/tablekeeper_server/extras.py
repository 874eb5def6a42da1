"""Which optional packages (pyproject.toml's extras) a server needs, and a one-line error naming
the extra to install when one is missing.

`pip install tablekeeper` is the SDK alone; `tablekeeper[server]` adds what a standalone server
needs (RocksDB, metrics, tokens, uvloop); `tablekeeper[cluster]` adds kazoo (cluster mode,
`--zk`, `tablekeeper cluster init`) and pulsar-client (`--log pulsar`, `--checkpoint-store
pulsar`); `tablekeeper[envoy]` adds pyvoy (`--runtime envoy`). The server imports kazoo,
pulsar and pyvoy only on those paths, so a standalone server never
needs them; this module turns "asked for a feature whose package is missing" into
`error: ... pip install 'tablekeeper[cluster]'` instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from tablekeeper_server.config import ServerConfig

EXIT_MISSING_EXTRA = 2
"""Like a usage error: the command line asks for something this installation cannot do."""

SERVER_MODULES = {
    "rocksdict": "rocksdict",
    "prometheus_client": "prometheus-client",
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "mmh3": "mmh3",
    "jwt": "pyjwt",
}
"""Top-level modules of the `server` extra that every server imports: module -> distribution.
(uvloop is optional at run time: without it the server falls back to asyncio's loop.)"""


def install_hint(extra: str) -> str:
    return f"pip install 'tablekeeper[{extra}]'"


def missing(modules: dict[str, str]) -> list[str]:
    """The distributions (values) of `modules` whose top-level module (key) is not installed."""
    return [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def fail(feature: str, packages: list[str], extra: str) -> NoReturn:
    """Print `error: FEATURE: PACKAGES is/are not installed: pip install 'tablekeeper[EXTRA]'`
    (one line, to stderr) and exit with EXIT_MISSING_EXTRA."""
    verb = "is" if len(packages) == 1 else "are"
    print(
        f"error: {feature}: {', '.join(packages)} {verb} not installed: {install_hint(extra)}",
        file=sys.stderr,
    )
    raise SystemExit(EXIT_MISSING_EXTRA)


def require(feature: str, modules: dict[str, str], extra: str) -> None:
    """Exit with the one-line error unless every module of `modules` (module -> distribution)
    is installed."""
    absent = missing(modules)
    if absent:
        fail(feature, absent, extra)


def check_server(config: ServerConfig) -> None:
    """Exit with the one-line error if `config` asks for something whose packages are missing:
    the server itself (the `server` extra), cluster mode or Pulsar (the `cluster` extra)."""
    require("tablekeeper server", SERVER_MODULES, "server")
    wanted = [  # (flag, module, distribution) of the `cluster` extra this config uses
        (flag, module, dist)
        for flag, module, dist, used in (
            ("--zk", "kazoo", "kazoo", config.cluster_mode),
            ("--log pulsar", "pulsar", "pulsar-client", config.log_backend == "pulsar"),
            (
                "--checkpoint-store pulsar",
                "pulsar",
                "pulsar-client",
                config.checkpoint_store == "pulsar",
            ),
        )
        if used
    ]
    absent = missing({module: dist for _, module, dist in wanted})
    if absent:
        flags = [flag for flag, _, dist in wanted if dist in absent]
        fail(", ".join(flags), absent, "cluster")
    if config.runtime == "envoy":
        require("--runtime envoy", {"pyvoy": "pyvoy"}, "envoy")


def require_kazoo(exc: ModuleNotFoundError, feature: str) -> NoReturn:
    """For `except ModuleNotFoundError` around a kazoo import: the one-line error when kazoo
    is what is missing, else the original error."""
    if exc.name is None or exc.name.partition(".")[0] != "kazoo":
        raise exc
    fail(feature, ["kazoo"], "cluster")
