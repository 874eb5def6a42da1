"""The `tablekeeper` command: manage namespaces and tables, read, write, scan and watch keys,
hold sessions, show the cluster's state; `server`, `token` and `cluster init` come from the
server package when it is installed.

Keys: BookKeeper's own tools and clients use the key as its own routing key, so by default
`tablekeeper put ns/t KEY VALUE` stores (pkey=KEY, lkey=KEY), which a BookKeeper client reads
back with `get(KEY)`. Pass `--pkey P` to address (P, KEY) instead.

Global flags (`--service`, `-o/--output`, `--hex`, `--timeout`) go before or after the command,
and each has an environment variable (`TABLEKEEPER_SERVICE`, ...) that a flag overrides.

Commands of other packages: every entry point of the `tablekeeper.cli` group is a function
`register(commands)` that adds its subcommand to `commands` (the CLI's argparse subparsers)
and sets `run` (a function of the parsed args returning the exit code) as its handler; those
of the `tablekeeper.cli.cluster` group add theirs to the `cluster` group the same way. The
server package registers `server`, `token` and `cluster init` this way (`tablekeeper_server.cli`);
this package never imports it. Without it, those commands say how to install it (`cluster
init` without being listed: `cluster` then shows `status` alone, which asks the servers and
needs nothing else). A plugin cannot replace a command of this package.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from tablekeeper._cli_cluster import cluster
from tablekeeper._cli_completion import SHELLS, script
from tablekeeper._cli_context import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CommandContext,
)
from tablekeeper._cli_output import OUTPUT_FORMATS, Printer, line
from tablekeeper._cli_streams import scan_table, session, watch
from tablekeeper._transport import RetryPolicy
from tablekeeper.client import DEFAULT_SERVICE, Client
from tablekeeper.errors import TableKeeperError
from tablekeeper.security import TlsConfig
from tablekeeper.table import KeyValue
from tablekeeper.watch import CompactedError

PLUGIN_GROUP = "tablekeeper.cli"
CLUSTER_PLUGIN_GROUP = "tablekeeper.cli.cluster"
SERVER_COMMANDS = {
    "server": "run a server in the foreground",
    "token": "create bearer tokens for servers run with --auth-secret-key",
    "import": "copy a ZooKeeper tree into TableKeeper's Oxia or etcd front-end",
}
"""Commands the server package provides (through `PLUGIN_GROUP`), named here only to say how to
get them when it is missing."""
SERVER_CLUSTER_COMMANDS = {"init": "create the cluster's metadata in ZooKeeper"}
"""The same for the `cluster` group (through `CLUSTER_PLUGIN_GROUP`)."""
ADMIN_PLUGIN_GROUP = "tablekeeper.cli.admin"
SERVER_ADMIN_COMMANDS = {
    "backup": "copy the service, a namespace or a table into a backup, online",
    "restore": "restore a backup into a server that is not running",
}
"""The same for the `admin` group (through `ADMIN_PLUGIN_GROUP`, whose entry points take the
global flags' parser too: `register(subparsers, common)`)."""


# ---------------------------------------------------------------------------------- arguments


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


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text})")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The flags every command takes. On the top parser they carry the defaults (from the
    environment); on each subcommand they are SUPPRESSed, so they only override when given
    after the command (`tablekeeper get ns/t k -o json`)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--service",
        default=default(os.environ.get("TABLEKEEPER_SERVICE", DEFAULT_SERVICE)),
        metavar="URI",
        help=f"service URI bk://HOST:PORT[,HOST:PORT...] (env TABLEKEEPER_SERVICE; default "
        f"{DEFAULT_SERVICE})",
    )
    parser.add_argument(
        "-o",
        "--output",
        default=default(os.environ.get("TABLEKEEPER_OUTPUT", "text")),
        choices=OUTPUT_FORMATS,
        help="text (default), json (one object per line) or table (env TABLEKEEPER_OUTPUT)",
    )
    parser.add_argument(
        "--hex",
        action="store_true",
        default=default(_env_flag("TABLEKEEPER_HEX")),
        help="keys and values given and printed as hex, for binary data (env TABLEKEEPER_HEX=1)",
    )
    for flag, env, text in (
        ("--tls-ca", "TABLEKEEPER_TLS_CA", "PEM CA that signed the server's certificate: talk TLS"),
        ("--tls-cert", "TABLEKEEPER_TLS_CERT", "PEM client certificate, for servers wanting one"),
        ("--tls-key", "TABLEKEEPER_TLS_KEY", "PEM private key of --tls-cert"),
    ):
        parser.add_argument(
            flag, default=default(os.environ.get(env)), metavar="FILE", help=f"{text} (env {env})"
        )
    parser.add_argument(
        "--token",
        default=default(os.environ.get("TABLEKEEPER_TOKEN")),
        help="bearer token sent with every call (env TABLEKEEPER_TOKEN; see `tablekeeper token`)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=default(os.environ.get("TABLEKEEPER_TIMEOUT")),
        metavar="SECONDS",
        help="give up a call (retries included) after SECONDS (env TABLEKEEPER_TIMEOUT; "
        "default 30); a watch or keep-alive runs until stopped",
    )


class _Commands:
    """Adds subcommands that take the global flags too."""

    def __init__(self, subparsers: Any, common: argparse.ArgumentParser) -> None:
        self.subparsers = subparsers
        self.common = common

    def add(self, name: str, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self.subparsers.add_parser(
            name, help=help_text, parents=[self.common], **kwargs
        )
        return parser

    def group(self, parser: argparse.ArgumentParser, dest: str) -> _Commands:
        sub = parser.add_subparsers(dest=dest, required=True, metavar="ACTION")
        return _Commands(sub, self.common)


def _table_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "table", type=_split_table, metavar="NAMESPACE/TABLE", help="the table, e.g. app/users"
    )


def _pkey_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pkey", help="partition (routing) key of the key; default: the key itself"
    )


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
        "  tablekeeper get app/users --pkey user-1 name -o json\n"
        "  tablekeeper scan app/users user-1\n"
        "  tablekeeper watch app/users --pkey user-1 '' --prefix\n"
        "  tablekeeper incr app/users visits 1\n"
        "  source <(tablekeeper completion bash)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, suppress=False)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = _Commands(subparsers, common)
    _add_plugins(subparsers, PLUGIN_GROUP, SERVER_COMMANDS, reserved=_CLIENT_COMMANDS)
    _add_cluster_commands(commands)
    _add_catalog_commands(commands)
    _add_key_commands(commands)
    _add_stream_commands(commands)
    _add_admin_commands(commands)
    _add_auth_commands(commands)
    completion = commands.add(
        "completion",
        "print a shell completion script",
        description="Print a completion script for bash or zsh. Load it in the current shell "
        "with `source <(tablekeeper completion bash)`, or save it where your shell loads "
        "completions from (e.g. /etc/bash_completion.d/tablekeeper).",
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("tablekeeper")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _add_plugins(
    subparsers: Any,
    group: str,
    expected: Mapping[str, str],
    *,
    reserved: Sequence[str] = (),
    path: str = "",
    listed: bool = True,
    common: argparse.ArgumentParser | None = None,
) -> None:
    """Commands of installed packages (entry-point `group`), added to `subparsers` (the
    commands under `path`, e.g. "cluster"). An `expected` command (name -> help) whose package
    is missing gets a stand-in that says how to install it (listed in the help only if
    `listed`); a command whose package fails to load gets one that says why, so the other
    commands keep working. Entry points named like a `reserved` command are ignored."""
    found: set[str] = set()
    order = list(expected)
    entry_points = sorted(
        importlib.metadata.entry_points(group=group),
        key=lambda e: (order.index(e.name) if e.name in order else len(order), e.name),
    )
    for entry_point in entry_points:
        if entry_point.name in found or entry_point.name in reserved:
            continue  # the same distribution seen twice on sys.path, or not its command
        module = entry_point.value.partition(":")[0]
        name = f"{path} {entry_point.name}".strip()
        try:
            register = entry_point.load()
            if common is not None:
                register(subparsers, common)
            else:
                register(subparsers)
        except Exception as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name in (
                module,
                module.partition(".")[0],
            ):
                continue  # its package is not installed
            reason = f"cannot load it from {entry_point.value}: {type(exc).__name__}: {exc}"
            help_text = "(broken, see its error)" if listed else None
            _stand_in(subparsers, entry_point.name, name, help_text, reason)
        found.add(entry_point.name)
    for command, help_text in expected.items():
        if command not in found:
            install = "pip install 'tablekeeper[server]'"
            reason = f"it comes with the server, which is not installed: {install}"
            shown = f"{help_text} (needs the server: {install})" if listed else None
            _stand_in(subparsers, command, f"{path} {command}".strip(), shown, reason)


def _stand_in(subparsers: Any, command: str, name: str, help_text: str | None, reason: str) -> None:
    """Command `command` (`tablekeeper NAME`) that only explains why it cannot run (exit 2); it
    accepts any arguments. Without `help_text` it is not listed in the help."""

    def run(args: argparse.Namespace) -> int:
        print(f"error: `tablekeeper {name}`: {reason}", file=sys.stderr)
        return EXIT_USAGE

    listing = {} if help_text is None else {"help": help_text}
    stand_in = subparsers.add_parser(command, add_help=False, **listing)
    stand_in.set_defaults(run=run, stand_in=True)


def _add_cluster_commands(commands: _Commands) -> None:
    parser = commands.add(
        "cluster",
        "the cluster's state (status); init or grow it in ZooKeeper (with the server)",
        description="`status` asks a server of --service for the cluster's state (no ZooKeeper "
        "needed here). `init` creates a cluster's metadata in ZooKeeper and `add-containers` "
        "raises its number of storage containers; they come with the server package.",
    )
    actions = commands.group(parser, "cluster_command")
    _add_plugins(
        actions.subparsers,
        CLUSTER_PLUGIN_GROUP,
        SERVER_CLUSTER_COMMANDS,
        path="cluster",
        listed=False,
    )
    status = actions.add(
        "status",
        "live servers, the controller, the assignment, what each server serves and each "
        "container's owner",
        description="Ask the servers of --service (in order, until one answers) for the "
        "cluster's state: its live servers, controller and container assignment, the "
        "containers each live server reports serving (its ServerInfo), and per container its "
        "owner and ownership epoch (containers whose owner is not the assigned server are "
        "marked 'moving', those their owner let go of 'released'). The cluster is ready when "
        "every container is assigned to a live server and every live server serves exactly "
        "the containers assigned to it. A standalone server reports itself (with --workers, "
        "each worker). -o json prints one JSON object; text and table the report.",
    )
    status.add_argument(
        "--wait",
        type=_non_negative_float,
        default=None,
        metavar="SECONDS",
        help="ask until the cluster is ready, at most SECONDS (0 = ask once); exit 1 if it is "
        "not ready by then (without --wait the exit code ignores readiness)",
    )


def _add_catalog_commands(commands: _Commands) -> None:
    ns = commands.group(commands.add("ns", "create, get, list or delete namespaces"), "action")
    for action, help_text in (
        ("create", "create a namespace"),
        ("get", "print a namespace's id (exit 3 if it does not exist)"),
    ):
        ns.add(action, help_text).add_argument("name", help="namespace name")
    ns_delete = ns.add(
        "delete",
        "delete a namespace (with --force, also its tables and their keys)",
        description="Delete a namespace. One that still has tables is refused unless --force "
        "is given, which deletes its tables and all their keys too.",
    )
    ns_delete.add_argument("name", help="namespace name")
    ns_delete.add_argument(
        "--force", action="store_true", help="delete the namespace even if it has tables"
    )
    ns.add("list", "list every namespace, by name")

    table = commands.group(
        commands.add("table", "create, get, list, split or delete tables"), "action"
    )
    create = table.add("create", "create a table")
    _table_arg(create)
    create.add_argument(
        "--ranges",
        type=_positive_int,
        default=4,
        help="hash ranges, at least 1; odd counts round up to even, except in namespace oxia "
        "(Oxia namespaces: exactly that many shards) (default 4)",
    )
    create.add_argument(
        "--ttl",
        type=_non_negative_int,
        default=0,
        help="seconds a key lives after its last write, 0 = forever (default 0)",
    )
    _table_arg(table.add("get", "print a table's id, ranges and TTL"))
    _table_arg(table.add("delete", "delete a table and all its keys"))
    split = table.add(
        "split",
        "split a table range into two, online",
        description="Split one range of a table into two halves of its hash interval while "
        "the table serves: the range is sealed, copied into its two children from its "
        "checkpoint, and the table switches to them. Requests to that range pause meanwhile "
        "(they are refused as retryable and resent). Prints the children and the pause.",
    )
    _table_arg(split)
    split.add_argument(
        "--range",
        type=_positive_int,
        default=0,
        dest="range_id",
        metavar="ID",
        help="the range to split (see `table get`; default: the widest range)",
    )
    table.add("list", "list a namespace's tables, by name").add_argument(
        "namespace", help="namespace name"
    )


def _add_key_commands(commands: _Commands) -> None:
    def key_command(name: str, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub = commands.add(name, help_text, **kwargs)
        _table_arg(sub)
        _pkey_arg(sub)
        sub.add_argument("key", help="the key (lkey)")
        return sub

    put = key_command("put", "store a value")
    put.add_argument("value", help="the value; - reads it from stdin (all of it, as bytes)")
    put.add_argument(
        "--expected-version",
        type=int,
        help="-1 = the key must not exist; N = its version must be N",
    )
    put.add_argument(
        "--ttl",
        type=_positive_float,
        metavar="SECONDS",
        help="the key disappears SECONDS after this write (overrides the table's TTL)",
    )
    put.add_argument(
        "--session",
        type=_positive_int,
        metavar="ID",
        help="make the key ephemeral: deleted when session ID (see `session create`) closes "
        "or expires; the session must be on the key's range",
    )

    get = key_command("get", "print a value (exit 1 if missing)")
    get.add_argument("--json", action="store_true", help="same as -o json")
    get.add_argument(
        "--read-from",
        choices=("leader", "follower"),
        default="leader",
        help="follower: answered by the server asked, from its copy of the range (cluster "
        "mode; see --max-staleness); says on stderr who answered and how stale (default leader)",
    )
    get.add_argument(
        "--max-staleness",
        type=_non_negative_float,
        metavar="SECONDS",
        help="with --read-from follower: include every write acknowledged SECONDS before "
        "(default 5; 0 = linearizable)",
    )

    incr = key_command("incr", "add to a number key (created if missing); prints the total")
    incr.add_argument("amount", type=int, nargs="?", default=1, help="what to add (default 1)")

    delete = key_command("del", "delete a key and say so (exit 1 if it did not exist)")
    delete.add_argument(
        "--expected-version",
        type=int,
        help="delete only if the key's version is N (else exit 3, BadVersionError)",
    )

    scan = commands.add(
        "scan",
        "list the keys of one pkey in order, or of the whole table",
        description="With PKEY: the keys of that pkey, in lkey order (one consistent read per "
        "page). Without: every key of the table, range by range (pkeys in no particular "
        "order), printed as pkey, lkey, value.",
    )
    _table_arg(scan)
    scan.add_argument("pkey", nargs="?", help="the pkey to scan; omit to scan the whole table")
    scan.add_argument("--start", default="", help="first lkey (inclusive; needs PKEY)")
    scan.add_argument("--end", default=None, help="last lkey (inclusive; needs PKEY)")
    scan.add_argument("--limit", type=_positive_int, default=None, help="print at most N keys")
    scan.add_argument("--json", action="store_true", help="same as -o json")


def _add_stream_commands(commands: _Commands) -> None:
    watch = commands.add(
        "watch",
        "print the changes of a key, or of the keys under a prefix of a pkey",
        description="Print each change (PUT or DELETE) of one key, or with --prefix of every "
        "lkey under --pkey that starts with KEY (KEY '' = the whole pkey), in revision order, "
        "until Ctrl-C or --count changes. Starts from now, or from --rev (older changes come "
        "from the range's event history). Once watching, a line 'watching ... from revision "
        "N' goes to stderr.",
    )
    _table_arg(watch)
    _pkey_arg(watch)
    watch.add_argument("key", help="the key, or with --prefix the lkey prefix")
    watch.add_argument("--prefix", action="store_true", help="watch every lkey starting with KEY")
    watch.add_argument(
        "--rev",
        type=_positive_int,
        default=None,
        metavar="REVISION",
        help="start with the changes at REVISION (default: changes from now on)",
    )
    watch.add_argument(
        "--count", type=_positive_int, default=None, help="exit after N changes (default: never)"
    )
    watch.add_argument("--prev-kv", action="store_true", help="also print each previous value")

    session = commands.group(
        commands.add(
            "session",
            "create, keep alive or close a session (for ephemeral keys: put --session)",
            description="A session lives on the range of a pkey and has a TTL; keys put with "
            "it (put --session ID, on the same range) are deleted when it is closed or expires. "
            "`create` does not keep it alive: run `keep-alive` (until Ctrl-C) beside it.",
        ),
        "action",
    )
    create = session.add("create", "create a session and print its id")
    keep_alive = session.add(
        "keep-alive", "keep a session alive until Ctrl-C (or --count keep-alives)"
    )
    close = session.add("close", "close a session (deletes its ephemeral keys)")
    for sub in (create, keep_alive, close):
        _table_arg(sub)
        sub.add_argument("pkey", help="the pkey whose range holds the session")
    create.add_argument(
        "--ttl",
        type=_positive_float,
        required=True,
        metavar="SECONDS",
        help="the session expires SECONDS after its last keep-alive",
    )
    for sub in (keep_alive, close):
        sub.add_argument("id", type=_positive_int, help="session id (from `session create`)")
    keep_alive.add_argument(
        "--count", type=_positive_int, default=None, help="exit after N keep-alives"
    )


def _add_auth_commands(commands: _Commands) -> None:
    auth = commands.group(
        commands.add("auth", "grant, revoke or list roles' permissions on a namespace"), "action"
    )
    grant = auth.add("grant", "give a role permissions on a namespace")
    revoke = auth.add("revoke", "take a role's permissions (all, if none are named)")
    listing = auth.add("list", "roles and their permissions on a namespace")
    for sub in (grant, revoke, listing):
        sub.add_argument("namespace", help="namespace name")
    for sub in (grant, revoke):
        sub.add_argument("role", help="the role (a token's subject or a certificate's name)")
    grant.add_argument("permissions", nargs="+", help="read, write and/or admin")
    revoke.add_argument("permissions", nargs="*", help="read, write and/or admin (default all)")


def _add_admin_commands(commands: _Commands) -> None:
    admin = commands.group(
        commands.add("admin", "checkpoints, per-range status, backup and restore"), "action"
    )
    _add_plugins(
        admin.subparsers,
        ADMIN_PLUGIN_GROUP,
        SERVER_ADMIN_COMMANDS,
        path="admin",
        common=commands.common,
    )
    checkpoint = admin.add("checkpoint", "checkpoint ranges now and truncate their logs")
    checkpoint.add_argument(
        "--table",
        type=_split_table,
        metavar="NAMESPACE/TABLE",
        help="only this table's ranges (default: every open range)",
    )
    admin.add("status", "per range: applied position, WAL size, keys, last checkpoint")


# ---------------------------------------------------------------------------------- commands


def _ns(ctx: CommandContext) -> int:
    client, out, args = ctx.client, ctx.out, ctx.args
    if args.action == "list":
        found = client.list_namespaces()
        out.listing(
            ["namespace", "id"],
            [{"namespace": n.name, "id": n.namespace_id} for n in found],
            [n.name for n in found],
        )
        return EXIT_OK
    name = args.name
    if args.action == "create":
        ns_id = client.create_namespace(name)
        out.doc({"namespace": name, "id": ns_id}, f"created namespace {name} (id {ns_id})")
    elif args.action == "get":
        ns_id = client.get_namespace(name)
        out.doc({"namespace": name, "id": ns_id}, f"namespace {name}: id {ns_id}")
    else:
        tables = [t.name for t in client.list_tables(name)]
        if tables and not args.force:
            print(
                f"error: namespace {name} is not empty ({len(tables)} tables: "
                f"{', '.join(tables)}); --force deletes it with its tables",
                file=sys.stderr,
            )
            return EXIT_ERROR
        client.delete_namespace(name)
        also = f" and its {len(tables)} tables ({', '.join(tables)})" if tables else ""
        out.doc(
            {"namespace": name, "deleted": True, "tables_deleted": tables},
            f"deleted namespace {name}{also}",
        )
    return EXIT_OK


def _table_doc(info: Any) -> dict[str, Any]:
    return {
        "namespace": info.namespace,
        "table": info.name,
        "id": info.table_id,
        "ranges": info.ranges,
        "ttl_seconds": info.ttl_seconds,
    }


def _table(ctx: CommandContext) -> int:
    client, out, args = ctx.client, ctx.out, ctx.args
    if args.action == "list":
        found = client.list_tables(args.namespace)
        out.listing(
            ["table", "id", "ranges", "ttl_seconds"],
            [_table_doc(info) for info in found],
            [info.name for info in found],
        )
        return EXIT_OK
    namespace, name = args.table
    if args.action == "create":
        info = client.create_table(namespace, name, ranges=args.ranges, ttl_seconds=args.ttl)
        text = f"created table {namespace}/{name} (id {info.table_id}, {info.ranges} ranges)"
        out.doc(_table_doc(info), text)
    elif args.action == "get":
        info = client.get_table(namespace, name)
        ranges = client.layout(namespace, name).ranges  # current: splits add ranges
        text = (
            f"table {namespace}/{name}: id {info.table_id}, {len(ranges)} ranges "
            f"({', '.join(str(r.range_id) for r in ranges)}), ttl {info.ttl_seconds}s"
        )
        doc = _table_doc(info)
        doc["ranges"] = len(ranges)
        doc["range_ids"] = [r.range_id for r in ranges]
        out.doc(doc, text)
    elif args.action == "split":
        split = client.split_range(namespace, name, args.range_id)
        children = [
            {
                "range_id": c.range_id,
                "container": c.storage_container_id,
                "start_hash": c.start_hash_key,
                "end_hash": c.end_hash_key,
            }
            for c in split.children
        ]
        text = (
            f"split range {split.parent_range_id} of {namespace}/{name} into "
            + " and ".join(f"{c['range_id']} (container {c['container']})" for c in children)
            + f": {split.keys_copied} keys copied, requests paused {split.paused_seconds:.3f}s"
        )
        doc = {
            "namespace": namespace,
            "table": name,
            "parent_range_id": split.parent_range_id,
            "children": children,
            "sealed_sequence": split.sealed_sequence,
            "keys_copied": split.keys_copied,
            "paused_seconds": round(split.paused_seconds, 6),
        }
        out.doc(doc, text)
    else:
        client.delete_table(namespace, name)
        out.doc(
            {"namespace": namespace, "table": name, "deleted": True},
            f"deleted table {namespace}/{name}",
        )
    return EXIT_OK


def _put(ctx: CommandContext) -> int:
    args, out = ctx.args, ctx.out
    table = ctx.table()
    pkey, lkey = ctx.pkey_lkey()
    value = ctx.value(args.value)
    session = None
    if args.session is not None:
        session = table.session(pkey, ttl_s=1.0)
        session.async_session.id = args.session  # an existing session: only its id is sent
    prev = table.put(
        pkey,
        lkey,
        value,
        expected_version=args.expected_version,
        ttl_s=args.ttl,
        session=session,
        prev_kv=out.output != "text",
    )
    doc = {
        "pkey": out.bytes_text(pkey),
        "lkey": out.bytes_text(lkey),
        "prev": None if prev is None else out.kv_doc(prev),
    }
    out.doc(doc, None)
    return EXIT_OK


def _get(ctx: CommandContext) -> int:
    out = Printer("json", ctx.args.hex) if ctx.args.json else ctx.out
    pkey, lkey = ctx.pkey_lkey()
    args = ctx.args
    if args.max_staleness is not None and args.read_from != "follower":
        raise ValueError("--max-staleness goes with --read-from follower")
    if args.read_from == "follower":
        found, info = ctx.table().get_with_info(
            pkey, lkey, read_from="follower", max_staleness_s=args.max_staleness
        )
        print(
            f"read from the {info.replica} (range {info.range_id} at {info.applied}, "
            f"at most {info.staleness_s:.3f}s stale)",
            file=sys.stderr,
        )
    else:
        found = ctx.table().get(pkey, lkey)
    if found is None:
        print(f"key {args.key!r} not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    out.doc(out.kv_doc(found), str(out.value_of(found)))
    return EXIT_OK


def _incr(ctx: CommandContext) -> int:
    out = ctx.out
    pkey, lkey = ctx.pkey_lkey()
    total = ctx.table().increment(pkey, lkey, ctx.args.amount, get_total=True)
    doc = {"pkey": out.bytes_text(pkey), "lkey": out.bytes_text(lkey), "total": total}
    out.doc(doc, str(total))
    return EXIT_OK


def _del(ctx: CommandContext) -> int:
    out = ctx.out
    pkey, lkey = ctx.pkey_lkey()
    deleted = ctx.table().delete(pkey, lkey, expected_version=ctx.args.expected_version)
    where = "" if ctx.args.pkey is None else f" (pkey {ctx.args.pkey})"
    if not deleted:
        print(f"key {ctx.args.key!r}{where} not found: nothing deleted", file=sys.stderr)
        if out.output == "text":
            return EXIT_NOT_FOUND
    doc = {"pkey": out.bytes_text(pkey), "lkey": out.bytes_text(lkey), "deleted": deleted}
    out.doc(doc, f"deleted {ctx.args.key}{where}")
    return EXIT_OK if deleted else EXIT_NOT_FOUND


def _scan(ctx: CommandContext) -> int:
    args = ctx.args
    out = Printer("json", args.hex) if args.json else ctx.out
    if args.pkey is None:
        if args.start or args.end is not None:
            print("error: --start and --end need a PKEY", file=sys.stderr)
            return EXIT_USAGE
        rows: Iterator[KeyValue] = scan_table(ctx, args.limit)
    else:
        end = None if args.end is None else ctx.key(args.end)
        rows = ctx.table().scan(ctx.key(args.pkey), ctx.key(args.start), end, limit=args.limit)
    whole = args.pkey is None
    columns = ["pkey", "lkey", "value"] if whole else ["lkey", "value"]
    columns += ["version", "mod_revision"]
    if out.table:
        out.listing(columns, [out.kv_doc(kv) for kv in rows], [])
        return EXIT_OK
    for kv in rows:
        if out.json:
            out.doc(out.kv_doc(kv), None)
        else:
            prefix = f"{out.bytes_text(kv.pkey)}\t" if whole else ""
            line(f"{prefix}{out.bytes_text(kv.lkey)}\t{out.value_of(kv)}")
    return EXIT_OK


def _admin(ctx: CommandContext) -> int:
    client, out = ctx.client, ctx.out
    if ctx.args.action == "checkpoint":
        namespace, table = ctx.args.table if ctx.args.table else (None, None)
        response = client.checkpoint(namespace, table)
        if out.json:
            _print_json_message(response)
        else:
            line(f"checkpointed {len(response.ranges)} ranges")
            _print_ranges(response.ranges)
    else:
        status = client.status()
        if out.json:
            _print_json_message(status)
        else:
            when = (
                [f"every {status.checkpoint_interval_s:.0f}s"]
                if status.checkpoint_interval_s
                else []
            )
            if status.checkpoint_records:
                when.append(f"after {status.checkpoint_records} commands")
            line(
                f"{status.num_storage_containers} storage containers; checkpoints: "
                f"{status.checkpoint_store}, {' or '.join(when) or 'only on demand'}"
                + (f"; runtime: {status.runtime}" if status.runtime else "")
            )
            _print_ranges(status.ranges)
    return EXIT_OK


def _auth(ctx: CommandContext) -> int:
    client, out, args = ctx.client, ctx.out, ctx.args
    if args.action == "list":
        grants = client.list_permissions(args.namespace)
        if out.json:
            line(json.dumps({"namespace": args.namespace, "permissions": grants}))
        else:
            for role, permissions in grants.items():
                line(f"{role}\t{','.join(permissions)}")
        return EXIT_OK
    change = client.grant if args.action == "grant" else client.revoke
    now = change(args.namespace, args.role, args.permissions)
    if out.json:
        line(json.dumps({"namespace": args.namespace, "role": args.role, "permissions": now}))
    else:
        line(f"{args.role} on {args.namespace}: {','.join(now) or 'no permissions'}")
    return EXIT_OK


def _print_json_message(message: Any) -> None:
    from google.protobuf.json_format import MessageToDict

    line(json.dumps(MessageToDict(message, preserving_proto_field_name=True)))


def _print_ranges(ranges: Any) -> None:
    header = (
        f"{'container':>9} {'table':>6} {'range':>6} {'applied':>9} {'wal bytes':>11} "
        f"{'keys~':>8} {'ckpt at':>9} {'ckpt age':>9} {'ckpt s':>7} {'uploaded':>10} "
        f"{'files up/reused':>15}"
    )
    line(header)
    for r in ranges:
        age = "never" if r.checkpoint_age_ms < 0 else f"{r.checkpoint_age_ms / 1000:.0f}s"
        line(
            f"{r.container_id:>9} {r.stream_id:>6} {r.range_id:>6} {r.applied_sequence:>9} "
            f"{r.wal_bytes:>11} {r.estimated_keys:>8} {r.checkpoint_sequence:>9} {age:>9} "
            f"{r.checkpoint_seconds:>7.3f} {r.checkpoint_bytes_uploaded:>10} "
            f"{r.checkpoint_files_uploaded:>7}/{r.checkpoint_files_reused:<7}"
            + (f"  restored from {r.restored_from}" if r.restored_from else "")
            + (f"  ERROR: {r.error}" if r.error else "")
        )


_HANDLERS: dict[str, Callable[[CommandContext], int]] = {
    "ns": _ns,
    "table": _table,
    "put": _put,
    "get": _get,
    "incr": _incr,
    "del": _del,
    "scan": _scan,
    "watch": watch,
    "session": session,
    "admin": _admin,
    "auth": _auth,
    "cluster": cluster,
}
_CLIENT_COMMANDS = (*_HANDLERS, "completion")
"""This package's commands: no plugin may take their names."""
_STREAMING = ("watch", "session")
"""Commands that run until Ctrl-C: an interrupt is how they end, so it exits 0."""


def _retry_policy(timeout_s: float | None) -> RetryPolicy:
    if timeout_s is None:
        return RetryPolicy()
    return RetryPolicy(deadline_s=timeout_s, call_timeout_s=timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "stand_in", False):  # stand-ins take any arguments
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.output not in OUTPUT_FORMATS:  # a bad TABLEKEEPER_OUTPUT (argparse checks flags)
        parser.error(
            f"TABLEKEEPER_OUTPUT: invalid choice {args.output!r} (choose from text, json, table)"
        )
    if getattr(args, "run", None) is not None:  # a command of another package
        return int(args.run(args))
    if args.command == "completion":
        sys.stdout.write(script(parser, args.shell))
        return EXIT_OK
    client: Client | None = None
    try:
        tls = (
            TlsConfig(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
            if args.tls_ca or args.tls_cert
            else None
        )
        client = Client(args.service, retry=_retry_policy(args.timeout), tls=tls, token=args.token)
        return _HANDLERS[args.command](CommandContext(args, client))
    except KeyboardInterrupt:
        return EXIT_OK if args.command in _STREAMING else EXIT_INTERRUPTED
    except CompactedError as exc:
        print(
            f"error: CompactedError: {exc} (oldest revision held: {exc.oldest_revision})",
            file=sys.stderr,
        )
        return EXIT_ERROR
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
    except BrokenPipeError:  # `tablekeeper scan ... | head`: the reader is gone, so stop
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    finally:
        if client is not None:
            client.close()


if __name__ == "__main__":
    sys.exit(main())
