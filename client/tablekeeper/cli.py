"""The `tablekeeper` command: run a server, manage namespaces and tables, read and write keys.

Keys: BookKeeper's own tools and clients use the key as its own routing key, so by default
`tablekeeper put ns/t KEY VALUE` stores (pkey=KEY, lkey=KEY), which a BookKeeper client reads
back with `get(KEY)`. Pass `--pkey P` to address (P, KEY) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from tablekeeper.client import DEFAULT_SERVICE, Client
from tablekeeper.errors import TableKeeperError
from tablekeeper.table import KeyValue

if TYPE_CHECKING:
    from tablekeeper_server.cluster.zookeeper import ZkCoordinator

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
EXIT_NOT_READY = 1  # `cluster status --wait`: the cluster did not become ready in time


def _split_table(value: str) -> tuple[str, str]:
    if "/" not in value:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/TABLE, got {value!r}")
    namespace, _, table = value.partition("/")
    return namespace, table


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _render(kv: KeyValue, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {
                "pkey": kv.pkey.decode(errors="backslashreplace"),
                "lkey": kv.lkey.decode(errors="backslashreplace"),
                "value": kv.number if kv.is_number else kv.value.decode(errors="backslashreplace"),
                "is_number": kv.is_number,
                "version": kv.version,
                "create_revision": kv.create_revision,
                "mod_revision": kv.mod_revision,
            }
        )
    if kv.is_number:
        return str(kv.number)
    return kv.value.decode(errors="backslashreplace")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tablekeeper",
        description="TableKeeper: a distributed key/value table service that speaks the Apache "
        "BookKeeper table service protocol.",
        epilog="Examples:\n"
        "  tablekeeper server --data-dir ./data\n"
        "  tablekeeper ns create app\n"
        "  tablekeeper table create app/users --ranges 4\n"
        "  tablekeeper put app/users --pkey user-1 name Ada\n"
        "  tablekeeper get app/users --pkey user-1 name\n"
        "  tablekeeper scan app/users user-1\n"
        "  tablekeeper incr app/users visits 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--service",
        default=os.environ.get("TABLEKEEPER_SERVICE", DEFAULT_SERVICE),
        help="service URI bk://HOST:PORT (default $TABLEKEEPER_SERVICE or %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    server = commands.add_parser("server", help="run a standalone server in the foreground")
    try:
        from tablekeeper_server.config import add_server_arguments
    except ImportError:  # SDK installed without the server extra
        server.set_defaults(server_missing=True)
    else:
        add_server_arguments(server)

    ns = commands.add_parser("ns", help="create, get or delete a namespace")
    ns.add_argument("action", choices=["create", "get", "delete"])
    ns.add_argument("name")

    table = commands.add_parser("table", help="create, get or delete a table")
    table.add_argument("action", choices=["create", "get", "delete"])
    table.add_argument("table", type=_split_table, metavar="NAMESPACE/TABLE")
    table.add_argument(
        "--ranges",
        type=_positive_int,
        default=4,
        help="hash ranges at create, at least 1; odd counts round up (default 4)",
    )
    table.add_argument(
        "--ttl",
        type=_non_negative_int,
        default=0,
        help="seconds a key lives after its last write, 0 = forever (default 0)",
    )

    def key_command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("table", type=_split_table, metavar="NAMESPACE/TABLE")
        sub.add_argument("--pkey", help="partition (routing) key; default: the key itself")
        return sub

    put = key_command("put", "store a value")
    put.add_argument("key")
    put.add_argument("value")
    put.add_argument("--expected-version", type=int, help="-1 = must not exist; N = version N")

    get = key_command("get", "print a value (exit 1 if missing)")
    get.add_argument("key")
    get.add_argument("--json", action="store_true", help="print value and metadata as JSON")

    incr = key_command("incr", "add to a number key (created if missing); prints the total")
    incr.add_argument("key")
    incr.add_argument("amount", type=int, nargs="?", default=1)

    delete = key_command("del", "delete a key (exit 1 if it did not exist)")
    delete.add_argument("key")

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

    admin = commands.add_parser("admin", help="checkpoints and per-range status")
    admin_commands = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    admin_checkpoint = admin_commands.add_parser(
        "checkpoint", help="checkpoint ranges now and truncate their logs"
    )
    admin_checkpoint.add_argument(
        "--table",
        type=_split_table,
        metavar="NAMESPACE/TABLE",
        help="only this table's ranges (default: every open range)",
    )
    admin_commands.add_parser(
        "status", help="per range: applied position, WAL size, keys, last checkpoint"
    )

    scan = commands.add_parser("scan", help="list the keys of one pkey, in order")
    scan.add_argument("table", type=_split_table, metavar="NAMESPACE/TABLE")
    scan.add_argument("pkey")
    scan.add_argument("--start", default="", help="first lkey (inclusive)")
    scan.add_argument("--end", default=None, help="last lkey (inclusive)")
    scan.add_argument("--limit", type=int, default=None)
    scan.add_argument("--json", action="store_true")
    return parser


def _print_ranges(ranges: Any) -> None:
    header = (
        f"{'container':>9} {'table':>6} {'range':>6} {'applied':>9} {'wal bytes':>11} "
        f"{'keys~':>8} {'ckpt at':>9} {'ckpt age':>9} {'ckpt s':>7} {'uploaded':>10} "
        f"{'files up/reused':>15}"
    )
    print(header)
    for r in ranges:
        age = "never" if r.checkpoint_age_ms < 0 else f"{r.checkpoint_age_ms / 1000:.0f}s"
        print(
            f"{r.container_id:>9} {r.stream_id:>6} {r.range_id:>6} {r.applied_sequence:>9} "
            f"{r.wal_bytes:>11} {r.estimated_keys:>8} {r.checkpoint_sequence:>9} {age:>9} "
            f"{r.checkpoint_seconds:>7.3f} {r.checkpoint_bytes_uploaded:>10} "
            f"{r.checkpoint_files_uploaded:>7}/{r.checkpoint_files_reused:<7}"
            + (f"  restored from {r.restored_from}" if r.restored_from else "")
            + (f"  ERROR: {r.error}" if r.error else "")
        )


def _run(args: argparse.Namespace, client: Client) -> int:
    if args.command == "admin":
        if args.admin_command == "checkpoint":
            namespace, table = args.table if args.table else (None, None)
            response = client.checkpoint(namespace, table)
            print(f"checkpointed {len(response.ranges)} ranges")
            _print_ranges(response.ranges)
        else:
            status = client.status()
            print(
                f"{status.num_storage_containers} storage containers; checkpoints: "
                f"{status.checkpoint_store}, every {status.checkpoint_interval_s:.0f}s"
            )
            _print_ranges(status.ranges)
        return EXIT_OK
    if args.command == "ns":
        if args.action == "create":
            print(f"created namespace {args.name} (id {client.create_namespace(args.name)})")
        elif args.action == "get":
            print(f"namespace {args.name}: id {client.get_namespace(args.name)}")
        else:
            client.delete_namespace(args.name)
            print(f"deleted namespace {args.name}")
        return EXIT_OK
    if args.command == "table":
        namespace, name = args.table
        if args.action == "create":
            info = client.create_table(namespace, name, ranges=args.ranges, ttl_seconds=args.ttl)
            print(f"created table {namespace}/{name} (id {info.table_id}, {info.ranges} ranges)")
        elif args.action == "get":
            info = client.get_table(namespace, name)
            print(
                f"table {namespace}/{name}: id {info.table_id}, {info.ranges} ranges, "
                f"ttl {info.ttl_seconds}s"
            )
        else:
            client.delete_table(namespace, name)
            print(f"deleted table {namespace}/{name}")
        return EXIT_OK
    namespace, name = args.table
    table = client.table(namespace, name)
    if args.command == "scan":
        for kv in table.scan(args.pkey, args.start, args.end, limit=args.limit):
            if args.json:
                print(_render(kv, True))
            else:
                print(f"{kv.lkey.decode(errors='backslashreplace')}\t{_render(kv, False)}")
        return EXIT_OK
    pkey = args.pkey if args.pkey is not None else args.key
    if args.command == "put":
        table.put(pkey, args.key, args.value, expected_version=args.expected_version)
        return EXIT_OK
    if args.command == "get":
        found = table.get(pkey, args.key)
        if found is None:
            print(f"key {args.key!r} not found", file=sys.stderr)
            return EXIT_NOT_FOUND
        print(_render(found, args.json))
        return EXIT_OK
    if args.command == "incr":
        print(table.increment(pkey, args.key, args.amount, get_total=True))
        return EXIT_OK
    if args.command == "del":
        return EXIT_OK if table.delete(pkey, args.key) else EXIT_NOT_FOUND
    raise AssertionError(args.command)


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


def _server_containers(endpoint: str, timeout_s: float) -> frozenset[int] | str:
    from tablekeeper_proto.v1 import tablekeeper_pb2, tablekeeper_pb2_grpc

    try:
        with grpc.insecure_channel(
            endpoint, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as channel:
            stub = tablekeeper_pb2_grpc.TableKeeperStub(channel)
            info = stub.ServerInfo(tablekeeper_pb2.ServerInfoRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code().name if hasattr(exc, "code") else "error"
        return f"ServerInfo failed: {code}"
    return frozenset(int(c) for c in info.containers)


def _cluster_view(
    coordinator: ZkCoordinator, name: str, rpc_timeout_s: float = 2.0
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
            answers = pool.map(lambda s: _server_containers(s, rpc_timeout_s), servers)
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
    try:
        from tablekeeper_server.cluster.zookeeper import ClusterError, ZkCoordinator
    except ImportError:
        print("error: cluster commands need the server extra (pip install 'tablekeeper[server]')")
        return EXIT_USAGE
    coordinator = ZkCoordinator(args.zk, args.cluster)
    try:
        coordinator.start()
    except Exception as exc:
        print(f"error: cannot reach ZooKeeper at {args.zk}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.cluster_command == "init":
            created = coordinator.init_cluster(args.containers)
            state = "initialised" if created else "already initialised"
            print(f"cluster {args.cluster} {state} with {args.containers} storage containers")
            return EXIT_OK
        deadline = time.monotonic() + (args.wait or 0.0)
        while True:
            view = _cluster_view(coordinator, args.cluster)
            if args.wait is None or not view.problems() or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        _print_cluster(view)
        if args.wait is not None and view.problems():
            return EXIT_NOT_READY
        return EXIT_OK
    except (ClusterError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        coordinator.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "cluster":
        return _cluster(args)
    if args.command == "server":
        if getattr(args, "server_missing", False):
            print("error: the server is not installed (pip install 'tablekeeper[server]')")
            return EXIT_USAGE
        from tablekeeper_server.config import config_from_args
        from tablekeeper_server.main import run

        try:
            config = config_from_args(args)
        except ValueError as exc:
            parser.error(str(exc))
        return run(config)
    client: Any = None
    try:
        client = Client(args.service)
        return _run(args, client)
    except TableKeeperError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except grpc.RpcError as exc:  # the Admin service reports errors as gRPC statuses
        code = exc.code().name if hasattr(exc, "code") else "error"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        print(f"error: {code}: {details}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if client is not None:
            client.close()


if __name__ == "__main__":
    sys.exit(main())
