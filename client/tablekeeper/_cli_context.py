"""What the `tablekeeper` CLI's commands share: exit codes and the command context."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tablekeeper._cli_output import Printer
from tablekeeper.client import Client, Table

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
EXIT_INTERRUPTED = 130


class CommandContext:
    """What a command works with: its parsed arguments, a client and how to print."""

    def __init__(self, args: argparse.Namespace, client: Client) -> None:
        self.args = args
        self.client = client
        self.out = Printer(args.output, args.hex)

    def key(self, text: str) -> bytes:
        """A key or value from the command line (hex with --hex)."""
        return bytes.fromhex(text) if self.args.hex else text.encode()

    def value(self, text: str) -> bytes:
        if text == "-":
            raw = sys.stdin.buffer.read()
            return bytes.fromhex(raw.decode().strip()) if self.args.hex else raw
        return self.key(text)

    def table(self) -> Table:
        namespace, name = self.args.table
        return self.client.table(namespace, name)

    def pkey_lkey(self) -> tuple[bytes, bytes]:
        lkey = self.key(self.args.key)
        return (lkey if self.args.pkey is None else self.key(self.args.pkey)), lkey

    def run(self, coroutine: Any) -> Any:
        """Run a coroutine on the client's event loop (for the async-only SDK parts)."""
        return self.client.run_async(coroutine)


__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandContext",
]
