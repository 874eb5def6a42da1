"""Run a command with one Pulsar standalone for all the test processes it starts.

    python -m tests.support.shared_pulsar -- make test-integration

Each pytest process (each xdist worker, each pass of a tier) starts a Pulsar of its own the first
time a test asks for `pulsar_service`: about 12 CPU-seconds for the JVMs to start, and ~1 % of a
core idle until the process ends; `make test` runs about eight such processes. This starts one
Pulsar (`PulsarService.launch`, in a temporary directory) before the command and names it to every
test process through `TABLEKEEPER_PULSAR_URL` and `TABLEKEEPER_PULSAR_ADMIN_URL`
(tests/support/pulsar_fixtures.py); it stops it when the command ends, or when this process is
interrupted or terminated. Its directory is not passed on: no test may stop or restart a Pulsar
other tests are using (a test that restarts Pulsar starts one of its own).

Tests never see each other's topics there: each works in a namespace of its own
(`unique_namespace`). Exit status: the command's; 3 when Pulsar did not start.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import FrameType

PORTS_ENV_VAR = "TABLEKEEPER_TEST_PORTS"
"""tests.support.server's: read once, when that module is first imported (see `main`)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.shared_pulsar",
        description="Run COMMAND with one Pulsar standalone named to every test process in it.",
    )
    parser.add_argument(
        "--ports",
        metavar="LOW-HIGH",
        help="where Pulsar's ports are picked (as TABLEKEEPER_TEST_PORTS, for Pulsar only: the "
        "command's test processes pick theirs as before); default: where the tests pick",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is required")
    env = dict(os.environ)
    if args.ports:  # before the test support modules pick their port range
        os.environ[PORTS_ENV_VAR] = args.ports
    from tests.support.pulsar import START_TIMEOUT_S, PulsarService
    from tests.support.pulsar_fixtures import ENV_ADMIN_URL, ENV_DIR, ENV_URL

    if env.get(ENV_URL):  # one is named already: the command uses that one
        return subprocess.call(command, env=env)

    # SIGTERM (make's, CI's) ends this process as Ctrl-C does, so Pulsar is stopped either way.
    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    with tempfile.TemporaryDirectory(prefix="tk-shared-pulsar-") as directory:
        print("starting one Pulsar for the tests (deploy/pulsar.sh)", flush=True)
        try:
            pulsar = PulsarService.launch(Path(directory) / "pulsar", timeout_s=START_TIMEOUT_S)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"Pulsar did not start: {exc}", file=sys.stderr)
            return 3
        print(f"Pulsar for the tests: {pulsar.service_url} (admin {pulsar.admin_url})", flush=True)
        env.pop(ENV_DIR, None)
        env |= {ENV_URL: pulsar.service_url, ENV_ADMIN_URL: pulsar.admin_url}
        child: subprocess.Popen[bytes] | None = None
        try:
            child = subprocess.Popen(command, env=env)
            return child.wait()
        except KeyboardInterrupt:
            if child is not None:
                child.send_signal(signal.SIGTERM)
                child.wait()
            return 130
        finally:
            pulsar.close()


if __name__ == "__main__":
    sys.exit(main())
