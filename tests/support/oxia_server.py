"""A real Oxia server (`oxia standalone`), the anchor TableKeeper's Oxia front-end is measured
against: started on free loopback ports with its data in a given directory, stopped on `stop`.

The binary is built from an Oxia source checkout (`cd cmd && go build -o …/.deploy/bin/oxia .`):
the Go module proxy refuses Oxia's modules, so there is no `go install` for it. `default_binary()`
is `$OXIA_BIN`, else <repo>/.deploy/bin/oxia; callers skip the anchor with a note when it is
missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.support.server import REPO, free_port

SHARDS = 4  # TableKeeper's default namespace has 4; Oxia is started with as many


def default_binary() -> Path:
    return Path(os.environ.get("OXIA_BIN") or REPO / ".deploy" / "bin" / "oxia")


class OxiaServer:
    """`oxia standalone --shards N` (WAL fsync on, its default) on 127.0.0.1."""

    def __init__(self, binary: Path, root: Path, *, shards: int = SHARDS) -> None:
        self.binary = binary
        self.root = root
        self.shards = shards
        self.port = free_port()
        self.metrics_port = free_port()
        self.log_path = root / "oxia.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Its Prometheus endpoint."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout_s: float = 60.0) -> OxiaServer:
        """Start it and wait until its public port accepts connections; RuntimeError (with the
        log's path) if it exits first or does not listen within `timeout_s`."""
        self.root.mkdir(parents=True, exist_ok=True)
        command = [
            str(self.binary),
            "standalone",
            "--public-addr",
            self.address,
            "--metrics-addr",
            f"127.0.0.1:{self.metrics_port}",
            "--shards",
            str(self.shards),
            "--data-dir",
            str(self.root / "db"),
            "--wal-dir",
            str(self.root / "wal"),
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"Oxia exited with {self.process.returncode} ({self.log_path})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"Oxia not listening on {self.port} after {timeout_s:.0f}s "
                        f"({self.log_path})"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 20 s; never raises."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
