"""The `tablekeeper` command for tests: `run_cli` runs it in the test's own process.

The console script's process would import the CLI (grpc, the protobuf modules, the SDK) again for
every command, a third of a second of CPU each, and the tests run hundreds; a test about the
process itself (`--help`, usage errors, Ctrl-C, `tablekeeper server`) runs the console script.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

CLI_ENVIRONMENT = (
    "TABLEKEEPER_SERVICE",
    "TABLEKEEPER_OUTPUT",
    "TABLEKEEPER_HEX",
    "TABLEKEEPER_TIMEOUT",
    "TABLEKEEPER_TLS_CA",
    "TABLEKEEPER_TLS_CERT",
    "TABLEKEEPER_TLS_KEY",
    "TABLEKEEPER_TOKEN",
)
"""The variables the CLI reads (a developer's own must not leak into a test's command)."""


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the CLI's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in CLI_ENVIRONMENT}
    return env | (extra or {})


def run_cli(
    args: list[str], env: dict[str, str] | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """`tablekeeper ARGS` as `tablekeeper.cli.main(args)` (what the console script calls) with the
    environment `cli_env(env)` and standard streams of its own (UTF-8, as the console script's
    are), returned as `subprocess.run` returns a command's result; an argparse exit (usage
    errors) is its exit status. Not thread-safe (it swaps `os.environ` and `sys.std*`)."""
    from tablekeeper.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(cli_env(env))
    own = (
        io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8"),
        io.TextIOWrapper(out, encoding="utf-8", write_through=True),
        io.TextIOWrapper(err, encoding="utf-8", write_through=True),
    )
    sys.stdin, sys.stdout, sys.stderr = own
    try:
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        for stream in own:
            stream.flush()
            stream.detach()  # (a wrapper closes its buffer when collected)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(
        ["tablekeeper", *args],
        code,
        out.getvalue().decode(errors="backslashreplace"),
        err.getvalue().decode(errors="backslashreplace"),
    )
