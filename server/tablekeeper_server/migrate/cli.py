"""`tablekeeper import zookeeper`: copy a ZooKeeper tree into TableKeeper's Oxia or etcd
front-end, in the layout Pulsar's and BookKeeper's metadata drivers read (`migrate.targets`).
An entry point of the `tablekeeper.cli` group: it needs kazoo (`tablekeeper[cluster]`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tablekeeper_server.core.clock import SystemClock

_CLOCK = SystemClock()  # progress and elapsed time of an offline command


EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3

IMPORT_HELP = """\
Copy every persistent znode of a ZooKeeper tree (data and hierarchy) into an Oxia namespace
or an etcd keyspace of TableKeeper, in exactly the layout Pulsar's `oxia://` and `etcd:`
metadata drivers read: each znode a key named by its path (parents included), its data the
value. Ephemeral znodes (live sessions' locks and registrations) are skipped and listed: their
owners create them again. ZooKeeper's /zookeeper subtree is skipped.

The counters of sequential znodes carry on: a parent whose children were created and deleted
(ledger ids under /ledgers/idgen, /counters/...) is written again as many times as ZooKeeper
numbered children under it (its cversion), so the next ledger id is above every old one.

Procedure (see the README, "Moving Pulsar or BookKeeper off ZooKeeper"): stop the brokers and
bookies, run this (with --verify), restart them with metadataStoreUrl=oxia://HOST:PORT (or
etcd:http://HOST:PORT) and, for bookies, metadataServiceUri=metadata-store:oxia://HOST:PORT.

A target that already has keys under / is refused unless --force (which overwrites the keys
ZooKeeper has). Progress goes to stderr; the summary to stdout (-o json: one JSON object).
Exit 0 ok, 1 --verify found differences, 2 usage, 3 error."""


def register_import(commands: Any) -> None:
    """Add `import` (with its `zookeeper` source) to the CLI's subparsers."""
    parser = commands.add_parser(
        "import",
        help="copy a ZooKeeper tree into TableKeeper's Oxia or etcd front-end (Pulsar's layout)",
        description="Import metadata from another store into TableKeeper.",
    )
    sources = parser.add_subparsers(dest="import_source", required=True, metavar="SOURCE")
    zookeeper = sources.add_parser(
        "zookeeper",
        help="a ZooKeeper tree, e.g. Pulsar's or BookKeeper's metadata",
        description=IMPORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    zookeeper.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="HOST:PORT[/CHROOT]",
        help="ZooKeeper connect string; a /chroot imports that subtree as the root",
    )
    zookeeper.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="URL",
        help="oxia://HOST:PORT[/NAMESPACE] (TableKeeper's --oxia-port; namespace default) or "
        "etcd:http://HOST:PORT (its --etcd-port): what Pulsar's metadataStoreUrl will be",
    )
    zookeeper.add_argument(
        "--dry-run", action="store_true", help="read ZooKeeper and say what would be written"
    )
    zookeeper.add_argument(
        "--verify", action="store_true", help="afterwards, compare both trees znode by znode"
    )
    zookeeper.add_argument(
        "--verify-only", action="store_true", help="only compare (an import done before)"
    )
    zookeeper.add_argument(
        "--force", action="store_true", help="import into a target that has keys already"
    )
    zookeeper.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="PATH",
        help="leave this subtree out (repeatable; /zookeeper always is)",
    )
    zookeeper.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "table"),
        default=argparse.SUPPRESS,
        help="json: the summary as one JSON object",
    )
    zookeeper.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    zookeeper.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from tablekeeper_server.extras import require

    require("tablekeeper import zookeeper", {"kazoo": "kazoo", "xxhash": "xxhash"}, "cluster")
    from tablekeeper_server.migrate.importer import (
        DIFFERENCES_SHOWN_MAX,
        TargetNotEmptyError,
        sequence_parents,
        verify_tree,
        write_tree,
    )
    from tablekeeper_server.migrate.targets import TargetError, parse_target
    from tablekeeper_server.migrate.zookeeper import SKIPPED_BY_DEFAULT, connect, read_tree

    quiet = args.quiet

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    try:
        target = None if args.dry_run else parse_target(args.target)
    except ValueError as exc:
        print(f"error: --to {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TargetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    summary: dict[str, Any] = {"from": args.source, "to": args.target}
    started = _CLOCK.monotonic_s()
    try:
        zk = connect(args.source)
    except ConnectionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        say(f"reading the tree at {args.source} ...")
        tree = read_tree(
            zk,
            skip=(*SKIPPED_BY_DEFAULT, *args.skip),
            progress=lambda n, e: say(f"read {n:,} persistent znodes ({e} ephemeral skipped)"),
        )
    except Exception as exc:
        print(f"error: reading {args.source}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        zk.stop()
        zk.close()
    parents = sequence_parents(tree)
    summary.update(
        znodes=len(tree.nodes),
        bytes=tree.bytes,
        ephemeral_skipped=[path for path, _ in tree.ephemeral],
        subtrees_skipped=tree.skipped,
        sequence_parents={n.path: n.cversion for n in parents},
    )
    for path, owner in tree.ephemeral:
        say(f"skipped ephemeral {path} (session 0x{owner:x})")
    if parents:
        say(
            "sequence counters to carry on: "
            + ", ".join(f"{n.path} ({n.cversion})" for n in parents[:10])
            + (", ..." if len(parents) > 10 else "")
        )
    if args.dry_run:
        summary["dry_run"] = True
        _print(args, summary, f"would write {len(tree.nodes):,} keys ({tree.bytes:,} bytes)")
        return EXIT_OK
    assert target is not None
    try:
        if not args.verify_only:
            say(f"writing {len(tree.nodes):,} keys into {target.describe()} ...")
            written = write_tree(tree, target, force=args.force, say=say)
            summary.update(keys_written=written.keys, write_seconds=round(written.seconds, 3))
        if args.verify or args.verify_only:
            say("verifying ...")
            check = verify_tree(tree, target, say=say)
            summary.update(
                verified=check.checked, differences=check.differences[:DIFFERENCES_SHOWN_MAX]
            )
            for difference in check.differences[:DIFFERENCES_SHOWN_MAX]:
                say(f"DIFFERENT: {difference}")
            if not check.ok:
                summary["seconds"] = round(_CLOCK.monotonic_s() - started, 3)
                _print(
                    args,
                    summary,
                    f"{len(check.differences)} differences between {args.source} and "
                    f"{target.describe()}",
                )
                return EXIT_DIFFERENT
    except TargetNotEmptyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except TargetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        target.close()
    summary["seconds"] = round(_CLOCK.monotonic_s() - started, 3)
    verb = "verified" if args.verify_only else "imported"
    _print(
        args,
        summary,
        f"{verb} {len(tree.nodes):,} znodes ({tree.bytes:,} bytes) from {args.source} into "
        f"{target.describe()}"
        + (", every one the same" if args.verify or args.verify_only else "")
        + f"; {len(tree.ephemeral)} ephemeral skipped",
    )
    return EXIT_OK


def _print(args: argparse.Namespace, summary: dict[str, Any], text: str) -> None:
    if getattr(args, "output", "text") == "json":
        print(json.dumps(summary))
    else:
        print(text)
