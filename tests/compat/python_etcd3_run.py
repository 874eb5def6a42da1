"""Run python-etcd3's own test suite against a TableKeeper server, inside a network namespace
of its own (`unshare -n`; tests/compat/test_python_etcd3.py starts it).

The suite (the `tests/` of the etcd3 0.12.0 sdist) takes its endpoint from
`PYTHON_ETCD_HTTP_URL`, but some of its tests, and the etcdctl calls it makes, use etcd's
default endpoint 127.0.0.1:2379 whatever it says. In a namespace of its own that address is the
TableKeeper server this script starts, so every test talks to it, and nothing of another process
on the machine (another etcd on 2379) is reached or changed.

    unshare -n python -m tests.compat.python_etcd3_run VENV SDIST JUNIT_XML [--deselect ID]...

Exit status: the suite's (pytest's), or 3 when the server could not be started.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.server import ServerProcess

ETCD_PORT = 2379
"""etcd's default client port: the suite's tests that ignore PYTHON_ETCD_HTTP_URL use it."""
SERVER_START_TIMEOUT_S = 300.0
"""A hang guard: on a busy 2-core machine (load average 30) a start took more than 120 s."""
SUITE_TIMEOUT_S = 1200.0
ETCD_VERSION = "v3.5.0"
"""What the suite's version checks compare with (TableKeeper reports etcd 3.5.0)."""


def _loopback_up() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)


def _wait_for_etcd(deadline_s: float) -> None:
    """Until etcdctl gets an answer on the etcd port (the server's keyspace is open)."""
    etcdctl = shutil.which("etcdctl")
    assert etcdctl is not None, "etcdctl missing: apt-get install etcd-client"
    env = {**os.environ, "ETCDCTL_API": "3"}
    end = time.monotonic() + deadline_s
    while True:
        done = subprocess.run(
            [etcdctl, f"--endpoints=127.0.0.1:{ETCD_PORT}", "--command-timeout=5s", "get", "x"],
            capture_output=True,
            env=env,
            timeout=30,
        )
        if done.returncode == 0:
            return
        if time.monotonic() > end:
            raise TimeoutError(f"etcd port not answering: {done.stderr.decode()[-500:]}")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path, help="the suite's own virtualenv")
    parser.add_argument("sdist", type=Path, help="the unpacked etcd3 sdist (its tests/)")
    parser.add_argument("junit", type=Path, help="where pytest writes its JUnit XML report")
    parser.add_argument("--deselect", action="append", default=[], help="a test id to leave out")
    args = parser.parse_args(argv)
    _loopback_up()
    workdir = Path(tempfile.mkdtemp(prefix="python-etcd3-"))
    server = ServerProcess(workdir / "data", extra_args=["--etcd-port", str(ETCD_PORT)])
    try:
        try:
            server.start(timeout_s=SERVER_START_TIMEOUT_S)
            _wait_for_etcd(SERVER_START_TIMEOUT_S)
        except Exception as exc:
            print(f"no server: {exc}\n{server.log_tail()}", file=sys.stderr)
            return 3
        env = {
            **os.environ,
            "PYTHON_ETCD_HTTP_URL": f"http://127.0.0.1:{ETCD_PORT}",
            "TEST_ETCD_VERSION": ETCD_VERSION,
            # One test patches `etcdrpc.AuthStub`, a path its own test set-up puts on sys.path.
            "PYTHONPATH": str(args.sdist / "etcd3"),
        }
        command = [
            str(args.venv / "bin" / "python"),
            "-m",
            "pytest",
            "tests",
            # Its own configuration (none), not that of a project the sdist is unpacked in.
            "-c",
            str(args.sdist / "setup.cfg"),
            f"--rootdir={args.sdist}",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::DeprecationWarning",
            f"--junitxml={args.junit}",
            "-q",
            *(f"--deselect={test}" for test in args.deselect),
        ]
        done = subprocess.run(command, cwd=args.sdist, env=env, timeout=SUITE_TIMEOUT_S)
        return done.returncode
    finally:
        if server.running:
            server.stop()
        print(f"--- server log (end) ---\n{server.log_tail(20)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
