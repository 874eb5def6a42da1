"""The `tablekeeper` console script: `tablekeeper.cli.main`, except that `tablekeeper server …`
goes straight to the server package's command.

A server started by hand, by a service manager or by a test pays for whatever its CLI process
imports before the server itself starts (and with Envoy, the default runtime, that process only
parses the flags and becomes Envoy). The full CLI (`tablekeeper.cli`) loads grpc, the protobuf
modules and the SDK to offer every command; `server` needs none of them, so it gets a parser of
its own here, built from the same entry point (`tablekeeper.cli`'s `server`) as the full CLI's.
Anything else, and `server` when the server package is missing or fails to load, goes to the
full CLI, which says what to install.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Sequence

SERVER = "server"
PLUGIN_GROUP = "tablekeeper.cli"
"""`tablekeeper.cli.PLUGIN_GROUP` (the commands of other packages), named again here so that this
module does not import that one."""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [SERVER]:
        parser = _server_parser()
        if parser is not None:
            parsed = parser.parse_args(args)
            return int(parsed.run(parsed))
    from tablekeeper.cli import main as full_cli

    return full_cli(args)


def _server_parser() -> argparse.ArgumentParser | None:
    """`tablekeeper` with the server package's `server` command alone (None: not installed, or
    it fails to load; the full CLI then explains)."""
    found = importlib.metadata.entry_points(group=PLUGIN_GROUP, name=SERVER)
    if not found:
        return None
    entry = next(iter(found))  # the same distribution may be on sys.path twice
    parser = argparse.ArgumentParser(prog="tablekeeper")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    try:
        entry.load()(commands)
    except Exception:  # the full CLI loads it again, and reports why it fails
        return None
    return parser
