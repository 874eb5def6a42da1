"""etcd's own performance check, `etcdctl check perf` (its small load: 60 s of 150 writes/s from
50 clients, judged on throughput, slowest request and spread), against a fresh TableKeeper
server's etcd port: `make etcd-check-perf` (LOAD=m|l|xl: `python benchmarks/etcd_check_perf.py
--load m`). Prints etcdctl's verdict lines; exits with etcdctl's status. A timing check on a
shared machine: a benchmark, not a test."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.server import ServerProcess, free_port  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", default="s", choices=["s", "m", "l", "xl"])
    args = parser.parse_args()
    etcdctl = shutil.which("etcdctl")
    assert etcdctl is not None, "etcdctl missing: apt-get install etcd-client"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="etcd-check-perf-") as workdir:
        server = ServerProcess(Path(workdir) / "data", extra_args=["--etcd-port", str(port)])
        server.start(timeout_s=120)
        try:
            done = subprocess.run(
                [etcdctl, f"--endpoints=127.0.0.1:{port}", "check", "perf", f"--load={args.load}"],
                capture_output=True,
                text=True,
                env={**os.environ, "ETCDCTL_API": "3"},
                timeout=900,
            )
        finally:
            server.stop()
    for line in (done.stdout + done.stderr).splitlines():
        verdict = line.rsplit("\r", 1)[-1].strip()  # the progress bar redraws with \r
        if verdict.startswith(("PASS", "FAIL")) or "Throughput" in verdict:
            print(verdict)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
