"""The server's commands of the `tablekeeper` CLI: `server` (run a server), `token create`, and
`cluster init` (the cluster's metadata in ZooKeeper).

The client's CLI (`tablekeeper.cli`) never imports this package: it finds these commands through
entry points (see pyproject.toml), so an SDK-only install has no server code to import. Each
entry point is a `register(commands)` function that adds its subcommand to the subparsers it is
given and sets `run` (args -> exit code) as its handler: the `tablekeeper.cli` group's get the
CLI's top level, the `tablekeeper.cli.cluster` group's its `cluster` group (whose `status` is the
client's own: it asks the servers). The heavy imports (RocksDB, kazoo, Pulsar) happen only when
a command runs, so every `tablekeeper` invocation stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from tablekeeper_server.config import (
    HELP_EPILOG,
    ServerConfig,
    add_server_arguments,
    config_from_settings,
    printed_config,
    resolve_settings,
)
from tablekeeper_server.workers import WorkerSlot

EXIT_OK, EXIT_USAGE, EXIT_ERROR = 0, 2, 3


def register_server(commands: Any) -> None:
    """Add `server` to the CLI's subparsers (`commands`)."""
    server = commands.add_parser(
        "server",
        help="run a server in the foreground (standalone, or a member of a cluster with --zk)",
        description="Run a TableKeeper server in the foreground. Ctrl-C or SIGTERM drains\n"
        "in-flight requests, closes every range and exits 0. Settings come from flags, the\n"
        "environment and a configuration file (see the end).",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_arguments(server)

    def run(args: argparse.Namespace) -> int:
        from tablekeeper_server.extras import check_server

        try:
            resolved = resolve_settings(args, os.environ)
            config = config_from_settings(resolved, WorkerSlot.from_env(os.environ))
        except ValueError as exc:  # one line naming the setting's source, no usage dump
            print(f"tablekeeper server: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if args.print_config:
            sys.stdout.write(printed_config(config, resolved))
            return EXIT_OK
        check_server(config)  # before the imports that need the `server` extra's packages
        if config.runtime == "envoy" and (config.workers == 1 or config.worker is not None):
            _become_envoy(config)
        from tablekeeper_server.main import run as run_server

        return run_server(config)

    server.set_defaults(run=run)


ENVOY_APP = "tablekeeper_server.main:envoy_app"
"""Where Envoy's embedded interpreter finds the server (`main.envoy_app`)."""


def _become_envoy(config: ServerConfig) -> NoReturn:
    """Become Envoy, which serves the gRPC ports and runs the server in its own interpreter
    (`rpc.envoy`). Only the settings are needed for that: this process does not import the
    server's modules (`main`), which Envoy's interpreter imports again (half a second of every
    start)."""
    from tablekeeper_server.logging_setup import configure_logging
    from tablekeeper_server.rpc.envoy_launch import exec_envoy

    worker = config.worker
    configure_logging(
        config.log_level, config.log_format, worker.index if worker is not None else None
    )
    exec_envoy(config, ENVOY_APP)


def register_token(commands: Any) -> None:
    """Add `token create` to the CLI's subparsers (`commands`)."""
    token = commands.add_parser(
        "token", help="create bearer tokens for servers run with --auth-secret-key"
    )
    actions = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = actions.add_parser(
        "create",
        help="print an HS256 token whose subject is the role",
        description="Print a signed bearer token (a JWT) for ROLE, as Pulsar's `tokens create` "
        "does. Clients send it as `authorization: Bearer <token>` (--token, TABLEKEEPER_TOKEN, "
        "or the SDK's token=).",
    )
    create.add_argument(
        "--secret-key",
        type=Path,
        required=True,
        help="file with the HMAC secret the servers were given (--auth-secret-key)",
    )
    create.add_argument("--subject", required=True, metavar="ROLE", help="the role")
    create.add_argument("--expiry", help="lifetime, e.g. 90s, 15m, 1h, 7d (default: never expires)")

    def run(args: argparse.Namespace) -> int:
        from tablekeeper_server.extras import require

        require("tablekeeper token", {"jwt": "pyjwt"}, "server")
        from tablekeeper_server.security.tokens import create_token, parse_duration, read_secret

        try:
            expiry_s = parse_duration(args.expiry) if args.expiry else None
            print(create_token(read_secret(args.secret_key), args.subject, expiry_s))
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0

    create.set_defaults(run=run)


def register_cluster_init(actions: Any) -> None:
    """Add `init` to the `cluster` group of the CLI (`actions`: its subparsers). The group and
    its `status` belong to the client's CLI, which asks the servers; `init` writes the
    cluster's metadata into ZooKeeper, so it comes with the server package."""
    init = actions.add_parser(
        "init",
        help="create the cluster's metadata in ZooKeeper (once; idempotent)",
        description="Create cluster NAME's metadata in ZooKeeper with a number of storage "
        "containers. Running it again does nothing if the cluster has at least that many "
        "(`add-containers` adds more); asking for more than it has is refused.",
    )
    init.add_argument("--containers", type=int, required=True, help="number of storage containers")
    _zookeeper_arguments(init)
    init.set_defaults(run=_cluster_init)


def _zookeeper_arguments(parser: argparse.ArgumentParser) -> None:
    """--zk, --cluster and -o of the commands that write a cluster's metadata."""
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[,...]")
    parser.add_argument("--cluster", required=True, help="cluster name")
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "table"),
        default=argparse.SUPPRESS,  # else the CLI's global -o / TABLEKEEPER_OUTPUT
        help="json: one JSON object; text and table: a sentence",
    )


def register_cluster_add_containers(actions: Any) -> None:
    """Add `add-containers` to the `cluster` group of the CLI (it writes the cluster's metadata
    in ZooKeeper, so it comes with the server package, like `init`)."""
    add = actions.add_parser(
        "add-containers",
        help="raise the number of storage containers of a running cluster",
        description="Add N storage containers to cluster NAME. The servers assign them at once "
        "(see `tablekeeper cluster status`) and place new tables over all the containers; "
        "existing tables keep their ranges. Containers are never removed.",
    )
    add.add_argument("count", type=int, metavar="N", help="how many containers to add")
    _zookeeper_arguments(add)
    add.set_defaults(run=_cluster_add_containers)


def _cluster_add_containers(args: argparse.Namespace) -> int:
    from tablekeeper_server.cluster.zookeeper import ClusterError

    if args.count < 1:
        print("error: add at least one storage container", file=sys.stderr)
        return EXIT_USAGE
    coordinator = _coordinator(args)
    if isinstance(coordinator, int):
        return coordinator
    try:
        before, after = coordinator.add_containers(args.count)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        coordinator.stop()
    if getattr(args, "output", "text") == "json":
        print(json.dumps({"cluster": args.cluster, "before": before, "containers": after}))
    else:
        print(f"cluster {args.cluster}: {before} -> {after} storage containers")
    return EXIT_OK


def _coordinator(args: argparse.Namespace) -> Any:
    """A started coordinator of `args.cluster` at `args.zk`, or the exit status after an error
    (printed)."""
    from tablekeeper_server.cluster.zookeeper import ZkCoordinator
    from tablekeeper_server.core.clock import SystemClock

    try:
        coordinator = ZkCoordinator(args.zk, args.cluster, clock=SystemClock())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        coordinator.start()
    except Exception as exc:
        print(f"error: cannot reach ZooKeeper at {args.zk}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return coordinator


def _cluster_init(args: argparse.Namespace) -> int:
    from tablekeeper_server.cluster.zookeeper import ClusterError

    as_json = getattr(args, "output", "text") == "json"
    coordinator = _coordinator(args)
    if isinstance(coordinator, int):
        return coordinator
    try:
        created = coordinator.init_cluster(args.containers)
        containers = coordinator.num_containers()  # more than asked if the cluster has grown
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        coordinator.stop()
    if as_json:
        print(json.dumps({"cluster": args.cluster, "containers": containers, "created": created}))
    else:
        state = "initialised" if created else "already initialised"
        print(f"cluster {args.cluster} {state} with {containers} storage containers")
    return EXIT_OK
