"""The server's commands of the `tablekeeper` CLI: `server` (run a server) and `cluster
init|status` (cluster metadata in ZooKeeper).

The client's CLI (`tablekeeper.cli`) never imports this package: it finds these commands through
the `tablekeeper.cli` entry-point group (see pyproject.toml), so an SDK-only install has no
server code to import. Each entry point is a `register(commands)` function that adds its
subcommand to the CLI's subparsers and sets `run` (args -> exit code) as its handler. The heavy
imports (RocksDB, kazoo, Pulsar) happen only when a command runs, so every `tablekeeper`
invocation stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from tablekeeper_server.config import (
    HELP_EPILOG,
    add_server_arguments,
    config_from_settings,
    printed_config,
    resolve_settings,
)
from tablekeeper_server.workers import WorkerSlot

if TYPE_CHECKING:
    from tablekeeper_server.cluster.zookeeper import ZkCoordinator

EXIT_OK, EXIT_USAGE, EXIT_ERROR = 0, 2, 3
EXIT_NOT_READY = 1  # `cluster status --wait`: the cluster did not become ready in time


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
        from tablekeeper_server.main import run as run_server

        return run_server(config)

    server.set_defaults(run=run)


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


def register_cluster(commands: Any) -> None:
    """Add `cluster init|status` to the CLI's subparsers (`commands`)."""
    cluster = commands.add_parser(
        "cluster", help="cluster metadata in ZooKeeper: init once, then status"
    )
    cluster_commands = cluster.add_subparsers(
        dest="cluster_command", required=True, metavar="ACTION"
    )
    cluster_init = cluster_commands.add_parser(
        "init", help="create the cluster's metadata (once; idempotent)"
    )
    cluster_status = cluster_commands.add_parser(
        "status",
        help="live servers, the controller, the assignment, what each server serves and each "
        "container's owner",
        description="Print the cluster's live servers, controller and container assignment, the "
        "containers each live server reports serving (its ServerInfo), and per container its "
        "owner and ownership epoch (containers whose owner is not the assigned server are "
        "marked 'moving', those their owner let go of 'released'). The cluster is ready when "
        "every container is assigned to a live server and every live server serves exactly the "
        "containers assigned to it.",
    )
    for sub in (cluster_init, cluster_status):
        sub.add_argument("--zk", required=True, help="ZooKeeper connect string, HOST:PORT[,...]")
        sub.add_argument("--cluster", required=True, help="cluster name")
        sub.add_argument(
            "-o",
            "--output",
            choices=("text", "json", "table"),
            default=argparse.SUPPRESS,  # else the CLI's global -o / TABLEKEEPER_OUTPUT
            help="json: one JSON object; text and table: the report for people",
        )
    cluster_init.add_argument(
        "--containers", type=int, required=True, help="number of storage containers (fixed)"
    )
    cluster_status.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="poll until the cluster is ready, at most SECONDS (0 = check once); exit 1 if it "
        "is not ready by then (without --wait the exit code ignores readiness)",
    )
    cluster.set_defaults(run=_cluster)


@dataclass
class _ClusterView:
    """One snapshot of a cluster: ZooKeeper's view plus what each live server says it serves."""

    name: str
    containers: int
    servers: list[str]
    controller: str | None
    assignment: dict[str, frozenset[int]]
    revision: int
    owners: dict[int, tuple[str, int, bool] | None]
    """Per container: (owner endpoint, ownership epoch, released by that owner) or None."""
    serving: dict[str, frozenset[int] | str]
    """Per live server: the containers its ServerInfo lists, or why it could not be asked."""

    def assigned_to(self) -> dict[int, str]:
        return {c: server for server, cs in self.assignment.items() for c in cs}

    def problems(self) -> list[str]:
        """Why the cluster is not ready (empty when ready)."""
        found: list[str] = []
        assigned = self.assigned_to()
        unassigned = sorted(set(range(self.containers)) - set(assigned))
        if unassigned:
            found.append(f"containers {unassigned} are unassigned")
        for server, owned in sorted(self.assignment.items()):
            if owned and server not in self.servers:
                found.append(f"{server} is assigned {sorted(owned)} but is not live")
        for server in self.servers:
            serving = self.serving.get(server, "not asked")
            wanted = self.assignment.get(server, frozenset())
            if isinstance(serving, str):
                found.append(f"{server}: {serving}")
            elif serving != wanted:
                found.append(f"{server} serves {sorted(serving)}, assigned {sorted(wanted)}")
        return found


@dataclass(frozen=True)
class _Credentials:
    """How `cluster status` asks the servers: the CLI's global --tls-ca/--tls-cert/--tls-key
    (TLS when a CA is given) and --token (env TABLEKEEPER_TLS_CA, ..., TABLEKEEPER_TOKEN)."""

    tls: grpc.ChannelCredentials | None = None
    token: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> _Credentials:
        ca, cert, key = (getattr(args, f, None) for f in ("tls_ca", "tls_cert", "tls_key"))
        tls = None
        if ca:
            tls = grpc.ssl_channel_credentials(
                root_certificates=Path(ca).read_bytes(),
                private_key=Path(key).read_bytes() if key else None,
                certificate_chain=Path(cert).read_bytes() if cert else None,
            )
        return cls(tls, getattr(args, "token", None) or None)

    def channel(self, endpoint: str) -> grpc.Channel:
        options = [("grpc.use_local_subchannel_pool", 1)]
        if self.tls is not None:
            return grpc.secure_channel(endpoint, self.tls, options=options)
        return grpc.insecure_channel(endpoint, options=options)


def _server_containers(
    endpoint: str, timeout_s: float, credentials: _Credentials
) -> frozenset[int] | str:
    from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc

    token = credentials.token
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    try:
        with credentials.channel(endpoint) as channel:
            stub = tablekeeper_pb2_grpc.TableKeeperStub(channel)
            info = stub.ServerInfo(
                tablekeeper_pb2.ServerInfoRequest(), metadata=metadata, timeout=timeout_s
            )
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "error"
        hint = "" if credentials.tls is not None else " (a TLS server? pass --tls-ca)"
        return f"ServerInfo failed: {code}{hint if code == 'UNAVAILABLE' else ''}"
    return frozenset(int(c) for c in info.containers)


def _cluster_view(
    coordinator: ZkCoordinator,
    name: str,
    credentials: _Credentials,
    rpc_timeout_s: float = 2.0,
) -> _ClusterView:
    containers = int(coordinator.num_containers())
    assignment, revision = coordinator.read_assignment()
    servers = list(coordinator.live_servers())
    owners: dict[int, tuple[str, int, bool] | None] = {}
    for container in range(containers):
        owner = coordinator.owner(container)
        owners[container] = None if owner is None else (owner.endpoint, owner.epoch, owner.released)
    serving: dict[str, frozenset[int] | str] = {}
    if servers:
        with ThreadPoolExecutor(max_workers=min(len(servers), 16)) as pool:
            answers = pool.map(lambda s: _server_containers(s, rpc_timeout_s, credentials), servers)
            serving = dict(zip(servers, answers, strict=True))
    return _ClusterView(
        name=name,
        containers=containers,
        servers=servers,
        controller=coordinator.controller(),
        assignment=dict(assignment),
        revision=revision,
        owners=owners,
        serving=serving,
    )


def _view_doc(view: _ClusterView) -> dict[str, Any]:
    """`cluster status -o json`: the same facts as the text report."""
    containers = []
    assigned = view.assigned_to()
    for container in range(view.containers):
        owner = view.owners.get(container)
        containers.append(
            {
                "container": container,
                "assigned_to": assigned.get(container),
                "owner": None if owner is None else owner[0],
                "epoch": None if owner is None else owner[1],
                "released": None if owner is None else owner[2],
            }
        )
    problems = view.problems()
    return {
        "cluster": view.name,
        "containers": view.containers,
        "servers": view.servers,
        "controller": view.controller,
        "assignment_revision": view.revision,
        "assignment": {server: sorted(cs) for server, cs in sorted(view.assignment.items())},
        "serving": {
            server: serving if isinstance(serving, str) else sorted(serving)
            for server, serving in view.serving.items()
        },
        "owners": containers,
        "ready": not problems,
        "problems": problems,
    }


def _print_cluster(view: _ClusterView) -> None:
    print(f"cluster {view.name}: {view.containers} storage containers")
    print(f"servers: {', '.join(view.servers) or '(none)'}")
    print(f"controller: {view.controller or '(none)'}")
    print(f"assignment (revision {view.revision}):")
    for server, owned in sorted(view.assignment.items()):
        print(f"  {server}: {sorted(owned)}")
    assigned = view.assigned_to()
    unassigned = sorted(set(range(view.containers)) - set(assigned))
    if unassigned:
        print(f"  unassigned: {unassigned}")
    print("serving (ServerInfo of each live server):")
    for server in view.servers:
        serving = view.serving.get(server, "not asked")
        print(f"  {server}: {serving if isinstance(serving, str) else sorted(serving)}")
    if not view.servers:
        print("  (no live servers)")
    print("containers:")
    rows: list[tuple[int, str, str, str]] = []
    for container in range(view.containers):
        target = assigned.get(container, "-")
        owner = view.owners.get(container)
        if owner is None:
            rows.append((container, target, "-", "unclaimed" if target != "-" else ""))
        else:
            notes = ["moving"] if owner[0] != target else []
            notes += ["released"] if owner[2] else []
            rows.append((container, target, f"{owner[0]} ({owner[1]})", " ".join(notes)))
    target_width = max(len("assigned to"), *(len(r[1]) for r in rows))
    owner_width = max(len("owner (epoch)"), *(len(r[2]) for r in rows))
    print(f"  {'container':>9}  {'assigned to':<{target_width}}  owner (epoch)")
    for container, target, shown, note in rows:
        line = f"  {container:>9}  {target:<{target_width}}  {shown:<{owner_width}}  {note}"
        print(line.rstrip())
    problems = view.problems()
    print("ready: yes" if not problems else f"ready: no ({'; '.join(problems)})")


def _cluster(args: argparse.Namespace) -> int:
    from tablekeeper_server.cluster.zookeeper import ClusterError, ZkCoordinator

    as_json = getattr(args, "output", "text") == "json"
    credentials = _Credentials.from_args(args)
    coordinator = ZkCoordinator(args.zk, args.cluster)
    try:
        coordinator.start()
    except Exception as exc:
        print(f"error: cannot reach ZooKeeper at {args.zk}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.cluster_command == "init":
            created = coordinator.init_cluster(args.containers)
            if as_json:
                doc = {"cluster": args.cluster, "containers": args.containers, "created": created}
                print(json.dumps(doc))
                return EXIT_OK
            state = "initialised" if created else "already initialised"
            print(f"cluster {args.cluster} {state} with {args.containers} storage containers")
            return EXIT_OK
        deadline = time.monotonic() + (args.wait or 0.0)
        while True:
            view = _cluster_view(coordinator, args.cluster, credentials)
            if args.wait is None or not view.problems() or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if as_json:
            print(json.dumps(_view_doc(view)))
        else:
            _print_cluster(view)
        if args.wait is not None and view.problems():
            return EXIT_NOT_READY
        return EXIT_OK
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        coordinator.stop()
